"""Dropping the page cache, so that a benchmark configuration starts cold."""
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
