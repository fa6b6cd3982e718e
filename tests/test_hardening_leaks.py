"""Resources stay flat under long use: 100,000 searches (in memory, opened
with mmap, opened with O_DIRECT reads), 1,000 open/close cycles on every I/O
backend and 1,000 loads leave the resident memory, the open file descriptors,
the mappings and the threads where they were.

Under the ASan build of .ci/run (the extension compiled with
-fsanitize=address and libasan preloaded), one more test runs a workload with
LeakSanitizer on and fails on any leak whose stack passes through
knndirect's own code (leaks inside CPython itself are not ours to judge).
The C core alone is checked by LeakSanitizer in tests/c/stress_index.c."""
import ctypes
import gc
import os
import subprocess
import sys
import textwrap
import time

import pytest

import knndirect as kd
from conftest import clustered, open_quiet

if not os.path.isdir("/proc/self/fd"):
    pytest.skip("needs /proc", allow_module_level=True)

try:
    _libc = ctypes.CDLL("libc.so.6")
except OSError:  # pragma: no cover
    _libc = None


def _asan_loaded():
    with open("/proc/self/maps") as f:
        return "libasan" in f.read()


# Under AddressSanitizer freed memory waits in a quarantine and the allocator
# maps its own regions: resident memory and mappings say nothing there, so
# only descriptors and threads are compared (LeakSanitizer does the rest).
ASAN = _asan_loaded()


def _rss():
    """Resident memory in bytes, after handing free heap back to the system."""
    gc.collect()
    if _libc is not None and hasattr(_libc, "malloc_trim"):
        _libc.malloc_trim(0)
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _counts():
    with open("/proc/self/status") as f:
        threads = next(int(line.split()[1]) for line in f if line.startswith("Threads:"))
    counts = {"fds": len(os.listdir("/proc/self/fd")), "threads": threads}
    if not ASAN:
        with open("/proc/self/maps") as f:
            counts["maps"] = sum(1 for _ in f)
    return counts


def _wait_flat(before):
    """Counts after closing (worker threads take a moment to go)."""
    deadline = time.monotonic() + 5
    while True:
        now = _counts()
        if now["threads"] <= before["threads"] or time.monotonic() > deadline:
            return now
        time.sleep(0.02)


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    x = clustered(600, 16, seed=7500)
    idx = kd.Index(16, "l2", m=6, ef_construction=30)
    idx.add(x)
    path = str(tmp_path_factory.mktemp("leaks") / "small.kdx")
    idx.save(path)
    return idx, x, path


def _searches(index, x, n, extra_every=0):
    q = x[:256]
    for i in range(n):
        index.search(q[i & 255], 5)
        if extra_every and i % extra_every == 0:
            index.info()
            index.stats()
            index.get_vectors([i % 600])


def test_100k_searches_keep_memory_and_descriptors_flat(small):
    idx, x, path = small
    mm = open_quiet(path, "mmap")
    direct = open_quiet(path, "auto")
    # Searches with O_DIRECT reads cost ~100 reads each: fewer of them.
    plan = [(idx, 50000, 50), (mm, 49000, 50), (direct, 1000, 50)]
    for index, _n, every in plan:   # warm up: pools, contexts, caches
        _searches(index, x, 500, every)
    rss0, c0 = _rss(), _counts()
    t0 = time.perf_counter()
    for index, n, every in plan:
        _searches(index, x, n, every)
    took = time.perf_counter() - t0
    rss1, c1 = _rss(), _counts()
    mm.close()
    direct.close()
    grown = (rss1 - rss0) / 2**20
    print("100k searches in %.1f s; RSS %+.2f MiB; %s -> %s" % (took, grown, c0, c1))
    assert ASAN or grown < 4, "RSS grew by %.2f MiB over 100k searches" % grown
    assert c1 == c0, "descriptors, threads or mappings changed: %s -> %s" % (c0, c1)


def test_reporting_calls_do_not_leak_python_objects(small, monkeypatch):
    """info() and stats() build fresh dicts and lists on every call; 20,000
    calls leave no Python objects behind (traced by tracemalloc, which sees
    the extension's allocations too)."""
    import tracemalloc

    idx, x, path = small
    # Without io_uring the opened index reports a fallback in info().
    monkeypatch.setenv("KNNDIRECT_DISABLE_IO_URING", "1")
    o = open_quiet(path, "auto")
    assert o.info()["fallbacks"]
    for index in (idx, o):
        index.info(), index.stats(), repr(index)
    def blocks():
        gc.collect()
        return sum(st.count for st in tracemalloc.take_snapshot().statistics("filename"))

    tracemalloc.start()
    try:
        before = blocks()
        for _ in range(10000):
            for index in (idx, o):
                index.info()
                index.stats()
                len(index)
        grown = blocks() - before
    finally:
        tracemalloc.stop()
        o.close()
    # A leak of one object per call would leave 10,000 or more blocks; an
    # allocator's own table growing once is a handful.
    assert grown < 500, "20,000 info()/stats() calls left %d more memory blocks" % grown


def test_1k_open_close_cycles_release_everything(small):
    idx, x, path = small
    backends = ["auto", "threads", "pread", "mmap"]

    def cycle(i):
        o = open_quiet(path, backends[i % 4], io_depth=8,
                       preload=("graph", "codes") if i % 2 else ())
        o.search(x[i % 600], 5)
        o.close()

    for i in range(40):
        cycle(i)
    rss0, c0 = _rss(), _counts()
    for i in range(1000):
        cycle(i)
    rss1, c1 = _rss(), _wait_flat(c0)
    grown = (rss1 - rss0) / 2**20
    print("1k open/close: RSS %+.2f MiB; %s -> %s" % (grown, c0, c1))
    assert ASAN or grown < 4, "RSS grew by %.2f MiB over 1k open/close cycles" % grown
    assert c1 == c0, "descriptors, threads or mappings changed: %s -> %s" % (c0, c1)


def test_1k_loads_and_dropped_indexes_release_everything(small, tmp_path):
    idx, x, path = small
    data = idx.to_bytes()
    for _ in range(20):
        kd.load(data).close()
    rss0, c0 = _rss(), _counts()
    for i in range(1000):
        if i % 3 == 0:
            kd.load(data).close()
        elif i % 3 == 1:
            kd.load(path)        # dropped without close: freed by the GC
        else:
            o = open_quiet(path, "pread")
            o.search(x[0], 3)
            del o
    rss1, c1 = _rss(), _wait_flat(c0)
    grown = (rss1 - rss0) / 2**20
    assert ASAN or grown < 4, "RSS grew by %.2f MiB over 1k loads" % grown
    assert c1 == c0, "%s -> %s" % (c0, c1)


LSAN_CHILD = textwrap.dedent("""
    import warnings
    import numpy as np
    import knndirect as kd
    warnings.simplefilter("ignore")
    from knndirect import _core
    x = np.random.default_rng(1).standard_normal((800, 24), dtype=np.float32)
    path = __import__("sys").argv[1]
    idx = kd.Index(24, "cosine", m=6, ef_construction=20)
    idx.add(x)
    idx.save(path)
    for backend in ("auto", "threads", "pread", "mmap"):
        o = kd.open(path, io_backend=backend)
        o.search(x[:20], 5)
        o.search(x[:3], 5, exact=True)
        o.search(x[:3], 5, filter=np.arange(0, 800, 3))
        o.get_vectors(np.arange(50))
        o.info(); o.stats(); o.verify()
        if backend != "mmap":
            _core._inject_fault("eio", 0, -1)
            for call in (lambda: o.search(x[:4], 5), lambda: o.get_vectors([1, 2])):
                try:
                    call()
                except OSError:
                    pass
            _core._inject_fault("none")
        o.remove([0, 1])
        o.close()
    b = idx.to_bytes()
    for source in (b, path):
        l = kd.load(source)
        l.search(x[:2], 5)
        l.close()
    for bad in (b[:5000], b[:-10] + b"0123456789"):
        try:
            kd.load(bad)
        except ValueError:
            pass
    _core._inject_fault("enospc", 0, 1)
    try:
        idx.save(path)
    except OSError:
        pass
    _core._inject_fault("none")
    idx.remove([5])
    idx.search(x[:4], 5)
    idx.close()
""")


@pytest.mark.skipif(not _asan_loaded(), reason="needs the ASan build of the extension with "
                    "libasan preloaded (the asan stage of .ci/run)")
def test_binding_under_leak_sanitizer(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path),
               ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:exitcode=0:"
                            "fast_unwind_on_malloc=0:malloc_context_size=40:"
                            "log_path=" + str(tmp_path / "lsan"),
               LSAN_OPTIONS="report_objects=0")
    r = subprocess.run([sys.executable, "-c", LSAN_CHILD, str(tmp_path / "l.kdx")],
                       env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    reports = "".join(open(p).read() for p in tmp_path.glob("lsan*"))
    # Full stacks (slow unwinding through CPython's frames): a leak is ours
    # when a frame lies in the extension or the C core. Not what the module's
    # import sets up once (PyInit__core: its static types' method tables,
    # which CPython keeps until exit and does not free): that does not grow
    # with use, and how much of it LeakSanitizer sees depends on whether a
    # table outgrows CPython's small-object pools.
    ours = [block for block in reports.split("\n\n")
            if "leak of" in block and ("knndirect/_core." in block or "csrc/" in block)
            and "PyInit__core" not in block]
    assert not ours, "leaks through knndirect:\n" + "\n\n".join(ours)[:6000]
