"""The disk side of the benchmarks: cold starts, the process's I/O counters,
and where an index file keeps its float32 vectors."""
import os


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
    table (knndirect._container: only the header, table and tail are read).
    ValueError when the file is not an index."""
    # Imported here: a script that puts a snapshot of knndirect on sys.path
    # after importing this module still gets that snapshot.
    from knndirect._container import section_range
    return section_range(path, "vectors")
