"""Bytes read from disk: with O_DIRECT every reranked candidate costs exactly
one read of record_size bytes, and nothing else is read by a search."""
import math
import os
import time

import pytest

from conftest import build, build_saved, clustered, open_quiet, split

N, NQ = 3000, 20
RECORD_SIZE = {128: 512, 768: 4096}
DIRECT_BACKENDS = ("auto", "io_uring", "threads", "pread")


@pytest.fixture(scope="module", params=[128, 768], ids=lambda d: "d%d" % d)
def saved(request, tmp_path_factory):
    d = request.param
    base, queries = split(N, NQ, d, seed=5000 + d)
    return d, base, queries, build_saved(tmp_path_factory, "rv_%d" % d, base)


@pytest.fixture(params=DIRECT_BACKENDS)
def opened(request, saved):
    d, base, queries, path = saved
    idx = open_quiet(path, request.param, direct_io=True)
    yield d, base, queries, idx
    idx.close()


ZERO_KEYS = ("queries", "read_ops", "read_bytes", "rerank_vectors")


def _fresh(idx):
    idx.stats(reset=True)
    s = idx.stats()
    for key in ZERO_KEYS:
        assert s[key] == 0, "stats()[%r] = %r right after reset" % (key, s[key])
    return s


def test_open_uses_direct_io_and_expected_record_size(opened):
    d, base, queries, idx = opened
    info = idx.info()
    assert info["direct_io"] is True, info
    assert "no_direct_io" not in info.get("fallbacks", [])
    assert info["record_size"] == RECORD_SIZE[d]


def test_one_read_per_reranked_vector(opened):
    d, base, queries, idx = opened
    rs = idx.info()["record_size"]
    _fresh(idx)
    t0 = time.perf_counter()
    idx.search(queries, 10)
    took = time.perf_counter() - t0
    s = idx.stats()
    assert s["queries"] == NQ
    assert s["rerank_vectors"] >= NQ * 10
    assert s["read_ops"] == s["rerank_vectors"], s
    assert s["read_bytes"] == s["rerank_vectors"] * rs, s
    # O_DIRECT reads always wait for the device; the wait is summed over
    # the search threads (one per core at most), each within the call.
    assert 0.0 < s["io_wait_seconds"] <= took * (os.cpu_count() or 1), (s, took)


@pytest.mark.parametrize("k,oversample", [(10, 3.0), (10, 2.5), (7, 1.5), (1, 4.0)])
def test_shortlist_size_is_ceil_k_oversample(opened, k, oversample):
    d, base, queries, idx = opened
    rs = idx.info()["record_size"]
    _fresh(idx)
    idx.search(queries, k, oversample=oversample)
    s = idx.stats()
    shortlist = math.ceil(k * oversample)
    # Records read early that the final shortlist dropped are read (and
    # re-scored) on top of it; test_early_reads.py covers them.
    extra = s["early_unused"]
    assert s["queries"] == NQ
    assert s["rerank_vectors"] == NQ * shortlist + extra, s
    assert s["read_ops"] == NQ * shortlist + extra
    assert s["read_bytes"] == (NQ * shortlist + extra) * rs
    assert extra <= 0.1 * NQ * shortlist, s


def test_single_query_counts(opened):
    d, base, queries, idx = opened
    rs = idx.info()["record_size"]
    _fresh(idx)
    idx.search(queries[0], 10, oversample=2.0)
    s = idx.stats()
    assert s["queries"] == 1
    assert s["rerank_vectors"] == 20 + s["early_unused"]
    assert s["read_bytes"] == (20 + s["early_unused"]) * rs


def test_no_rerank_reads_nothing(opened):
    d, base, queries, idx = opened
    _fresh(idx)
    idx.search(queries, 10, rerank=False)
    s = idx.stats()
    assert s["queries"] == NQ
    assert s["read_ops"] == 0 and s["read_bytes"] == 0 and s["rerank_vectors"] == 0


def test_get_vectors_counts_reads_not_reranks(opened):
    d, base, queries, idx = opened
    rs = idx.info()["record_size"]
    _fresh(idx)
    ids = [4, 4, 17, 2999, 0, 4]
    idx.get_vectors(ids)
    s = idx.stats()
    assert s["read_ops"] == len(ids)
    assert s["read_bytes"] == len(ids) * rs
    assert s["rerank_vectors"] == 0
    assert s["queries"] == 0


def test_stats_reset_returns_then_zeroes(opened):
    d, base, queries, idx = opened
    _fresh(idx)
    idx.search(queries[:5], 10)
    before = idx.stats()
    returned = idx.stats(reset=True)
    for key in ZERO_KEYS:
        assert returned[key] == before[key], key
    assert returned["queries"] == 5
    after = idx.stats()
    for key in ZERO_KEYS:
        assert after[key] == 0, key
    # stats(reset=False) does not reset
    idx.search(queries[:3], 10)
    a = idx.stats()
    b = idx.stats()
    assert a["queries"] == b["queries"] == 3


def test_counts_accumulate_over_calls(opened):
    d, base, queries, idx = opened
    rs = idx.info()["record_size"]
    _fresh(idx)
    idx.search(queries[:4], 10, oversample=2.0)
    idx.search(queries[4:10], 5, oversample=2.0)
    s = idx.stats()
    assert s["queries"] == 10
    assert s["rerank_vectors"] == 4 * 20 + 6 * 10
    assert s["read_bytes"] == s["rerank_vectors"] * rs


def test_in_memory_index_reads_nothing(saved):
    d, base, queries, path = saved
    idx = build(base[:500], "l2")
    idx.stats(reset=True)
    idx.search(queries, 10)
    idx.get_vectors([1, 2, 3])
    s = idx.stats()
    assert s["queries"] == NQ
    assert s["read_ops"] == 0 and s["read_bytes"] == 0
    assert s["rerank_vectors"] >= NQ * 10
    idx.close()


def test_dim100_record_is_single_aligned_read(tmp_path):
    """A 400-byte vector still costs one aligned read (a padded record)."""
    base = clustered(500, 100, seed=51)
    idx = build(base, "l2")
    p = tmp_path / "d100.kdx"
    idx.save(p)
    idx.close()
    o = open_quiet(p, "threads", direct_io=True)
    info = o.info()
    rs = info["record_size"]
    assert rs >= 400
    assert 4096 % rs == 0, "a %d-byte record could straddle a 4 KiB block" % rs
    o.stats(reset=True)
    o.search(base[:5] + 0.01, 10, oversample=2.0)
    s = o.stats()
    assert s["rerank_vectors"] == 5 * 20
    assert info["direct_io"] is True
    assert s["read_ops"] == 100
    assert s["read_bytes"] == 100 * rs
    o.close()


# The documented default oversample (docs/api.md): 1-bit codes 20 up to 128
# bits, 10 up to 512, 8 above (plain 1-bit codes of 256 dims or fewer have 512, dims
# round up to 64; refined ones keep dims rounded up); 4-bit 5; 8-bit 2.
# Literals, so a changed default cannot pass by being read back.
DEFAULT_OVERSAMPLE = [("1bit", 64, 10), ("1bit", 128, 10), ("1bit", 129, 10),
                      ("1bit", 512, 10), ("1bit", 513, 8), ("1bit+4bit", 64, 20),
                      ("1bit+4bit", 129, 10), ("4bit", 128, 5), ("8bit", 128, 2)]


@pytest.mark.parametrize("quantization,dim,oversample", DEFAULT_OVERSAMPLE)
def test_default_oversample_is_the_documented_one(tmp_path, quantization, dim, oversample):
    """A default search reranks exactly k x the documented oversample."""
    base, queries = split(400, 4, dim, seed=5200 + dim)
    path = tmp_path / "d.kdx"
    idx = build(base, quantization=quantization, m=8, ef_construction=40)
    assert idx.info()["default_oversample"] == oversample
    idx.save(path)
    idx.close()
    idx = open_quiet(path, "pread", direct_io=True)
    try:
        _fresh(idx)
        idx.search(queries, k=10)
        s = idx.stats()
        assert s["rerank_vectors"] == len(queries) * 10 * oversample, s
        assert s["read_ops"] == s["rerank_vectors"], s
    finally:
        idx.close()
