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


def read_through(path):
    """Read a file, or every file under a folder, once with O_DIRECT (past the
    page cache); returns the bytes read. This VM's disk has a cache behind it
    (the host's): blocks not read since they were written come back at about
    40 MB/s, blocks read lately at over 1 GB/s. Without this, a sweep's first
    pass at each new shortlist length measured that cache, not the system
    (26 q/s one pass, 2,185 the next). Read through, every system starts from
    the same state, as far as the host's cache holds its files (4.4 GiB at
    1M x 768 did not stay)."""
    import mmap
    buf, total = mmap.mmap(-1, 1 << 20), 0
    walk = os.walk(path) if os.path.isdir(path) else \
        [(os.path.dirname(path), None, [os.path.basename(path)])]
    for dirpath, _, files in walk:
        for f in files:
            fd = os.open(os.path.join(dirpath, f), os.O_RDONLY | getattr(os, "O_DIRECT", 0))
            try:
                while (got := os.readv(fd, [buf])) > 0:
                    total += got
            finally:
                os.close(fd)
    return total
