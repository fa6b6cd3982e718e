"""Preload: kd.open(path, preload=...) pulls the named sections into the page
cache while it opens; the others stay out of it (their open-time checks read
them with O_DIRECT) and are read a page at a time on demand. Residency is
measured with mincore(2) on a separate mapping of the file."""
import ctypes
import os
import time

import numpy as np
import pytest

import knndirect as kd
from conftest import assert_same_results, build, evict_page_cache, open_quiet, split
from knndirect._container import read_layout

PAGE = os.sysconf("SC_PAGE_SIZE")
SECTION = {"metadata": "meta", "ids": "ids", "tombstones": "deleted", "codes": "codes",
           "levels": "levels", "level0": "level0", "upper": "upper", "vectors": "vectors",
           "calibration": "calibration"}

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]


def residency(path):
    """Fraction of each section's pages in the page cache, by name."""
    # header, table and tail only, read-ahead off: the sections stay cold
    layout = read_layout(path)
    size = layout.size
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = _libc.mmap(None, size, 1, 1, fd, 0)
        assert addr not in (None, ctypes.c_void_p(-1).value)
        npages = (size + PAGE - 1) // PAGE
        vec = (ctypes.c_ubyte * npages)()
        assert _libc.mincore(addr, size, vec) == 0
        _libc.munmap(addr, size)
    finally:
        os.close(fd)
    res = np.frombuffer(bytes(vec), dtype=np.uint8) & 1
    out = {}
    for s in layout:
        if s.length:
            out[SECTION[s.name]] = float(res[s.offset // PAGE:(s.end - 1) // PAGE + 1].mean())
    return out


evict = evict_page_cache


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    base, queries = split(12000, 10, 64, seed=9400)
    idx = build(base, "l2")
    p = tmp_path_factory.mktemp("preload") / "p.kdx"
    idx.save(p)
    expected = idx.search(queries, 10)
    idx.close()
    o = open_quiet(p, "threads")
    direct = o.info()["direct_io"]
    o.close()
    if not direct:
        pytest.skip("no O_DIRECT on this filesystem: every section lives in the page cache")
    evict(p)
    if max(residency(p).values()) > 0.05:
        pytest.skip("the page cache here ignores POSIX_FADV_DONTNEED")
    return p, queries, expected


def _open_cold(p, **kw):
    evict(p)
    return open_quiet(p, **kw)


META = ("ids", "deleted", "codes", "levels", "level0", "upper")


@pytest.mark.parametrize("preload,hot", [
    ((), ()),
    (("graph",), ("levels", "level0", "upper")),
    (("codes",), ("codes",)),
    (("ids",), ("ids", "deleted")),
    (("graph", "codes"), ("levels", "level0", "upper", "codes")),
    (("graph", "codes", "ids"), META),
])
def test_preloaded_sections_are_resident_and_others_not(saved, preload, hot):
    p, queries, expected = saved
    o = _open_cold(p, backend="threads", preload=preload)
    try:
        r = residency(p)
        assert o.info()["preload"] == list(preload)
        for name in META:
            if name not in r:
                continue
            if name in hot:
                assert r[name] > 0.95, (name, r)
            elif name != "levels":      # one byte per vector, which info() reads
                assert r[name] < 0.05, (name, r)
        assert r["vectors"] < 0.05, r
        assert_same_results(o.search(queries, 10), expected)
    finally:
        o.close()


def test_vectors_preload_only_for_the_page_cache_backends(saved):
    p, queries, expected = saved
    o = _open_cold(p, backend="threads", preload=("vectors",))
    try:
        assert o.info()["preload"] == []       # O_DIRECT reads skip the page cache
        time.sleep(0.2)
        assert residency(p)["vectors"] < 0.05
    finally:
        o.close()
    o = _open_cold(p, backend="mmap", preload=("vectors",))
    try:
        assert o.info()["preload"] == ["vectors"]
        deadline = time.monotonic() + 5
        while residency(p)["vectors"] < 0.95 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert residency(p)["vectors"] > 0.95
        assert_same_results(o.search(queries, 10), expected)
    finally:
        o.close()


def test_unknown_preload_name(saved):
    with pytest.raises(ValueError, match="preload"):
        kd.open(saved[0], preload=("everything",))


def test_preload_string_and_none(saved):
    p = saved[0]
    for preload, names in (("graph", ["graph"]), (None, []), ([], [])):
        o = open_quiet(p, "threads", preload=preload)
        assert o.info()["preload"] == names
        o.close()
