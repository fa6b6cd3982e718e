"""The disk side of the benchmarks: cold starts, the process's I/O counters,
and where an index file keeps its float32 vectors."""
import os
import struct

SECTION_VECTORS = 8   # the vector section's id in the file's section table


def drop_caches():
    """sync, then drop the page cache, dentries and inodes. Returns False
    where that is not allowed (not root, or no /proc/sys)."""
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def proc_io():
    """This process's /proc/self/io counters (read_bytes: what the kernel
    read from storage for it)."""
    out = {}
    with open("/proc/self/io") as f:
        for line in f:
            key, value = line.split(":")
            out[key.strip()] = int(value)
    return out


def vector_section(path):
    """(offset, length) of an index file's vector section, from its section
    table (the footer's last 32 bytes start with the table's offset and
    count)."""
    with open(path, "rb") as f:
        f.seek(-32, os.SEEK_END)
        table_off, count = struct.unpack("<QI", f.read(12))
        f.seek(table_off)
        table = f.read(32 * count)
    for i in range(count):
        sid, _, off, length, _, _ = struct.unpack_from("<IIQQII", table, 32 * i)
        if sid == SECTION_VECTORS:
            return off, length
    raise ValueError(f"{path}: no vector section")
