"""Early reads: with the io_uring backend, the likeliest part of a shortlist
is read while the graph search is still running: in three waves (up to
three quarters of it) by a search alone, once (half of it) by searches that
share the device with others. Every record read is re-scored, so the answer
is never worse than the shortlist's alone; stats() counts the early reads and
those the final shortlist did not keep."""
import math

import numpy as np
import pytest

from conftest import brute_force, build_saved, open_quiet, recall_at_k, split

N, NQ, DIM, K = 6000, 60, 128, 10
OVERSAMPLE = 8
SHORTLIST = K * OVERSAMPLE
EARLY_BACKENDS = ("io_uring",)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    base, queries = split(N, NQ, DIM, seed=7100)
    return base, queries, build_saved(tmp_path_factory, "early", base)


def _search(idx, queries, batch):
    """Answers and stats of one pass: one query per call, or one batch call
    on two threads (the pipelined path)."""
    idx.stats(reset=True)
    if batch:
        D, I = idx.search(queries, K, oversample=OVERSAMPLE, threads=2)
    else:
        rows = [idx.search(q, K, oversample=OVERSAMPLE) for q in queries]
        D = np.stack([r[0] for r in rows])
        I = np.stack([r[1] for r in rows])
    return D, I, idx.stats()


@pytest.mark.parametrize("batch", [False, True], ids=["single", "batch"])
@pytest.mark.parametrize("backend", EARLY_BACKENDS)
def test_early_reads_are_counted_and_rescored(saved, backend, batch):
    base, queries, path = saved
    idx = open_quiet(path, backend, direct_io=True)
    try:
        _search(idx, queries[:5], batch)   # a context learns the beam's length first
        D, I, s = _search(idx, queries, batch)
        rs = idx.info()["record_size"]
    finally:
        idx.close()
    alone, shared = math.ceil(SHORTLIST * 3 / 4), math.ceil(SHORTLIST / 2)
    assert s["queries"] == NQ
    if batch:
        # Each of the two workers keeps two queries going: only a worker's
        # first query can find itself alone.
        assert 0.8 * NQ * shared <= s["early_reads"] <= NQ * shared + 2 * (alone - shared), s
    else:
        # Beyond one wave's half, and at most three quarters (a beam that
        # ends sooner than usual may not reach the last waves).
        assert NQ * shared < s["early_reads"] <= NQ * alone, s
    assert 0 <= s["early_unused"] <= s["early_reads"], s
    # Re-scored: the final shortlists plus the early reads they dropped;
    # each read exactly once, and nothing else read.
    assert s["rerank_vectors"] == NQ * SHORTLIST + s["early_unused"], s
    assert s["read_ops"] == s["rerank_vectors"], s
    assert s["read_bytes"] == s["rerank_vectors"] * rs, s
    # Few early reads are wasted on this data.
    assert s["early_unused"] <= 0.1 * s["early_reads"], s


@pytest.mark.parametrize("backend", EARLY_BACKENDS)
def test_answer_never_worse_than_the_shortlist_alone(saved, backend):
    """pread reads the final shortlist only; the same graph search with early
    reads re-scores a superset of it, so each rank's distance can only be
    smaller or equal, and recall can only be higher or equal."""
    base, queries, path = saved
    ref = open_quiet(path, "pread", direct_io=True)
    idx = open_quiet(path, backend, direct_io=True)
    try:
        Dp, Ip, sp = _search(ref, queries, False)
        _search(idx, queries[:5], False)
        Du, Iu, su = _search(idx, queries, False)
    finally:
        ref.close()
        idx.close()
    assert sp["early_reads"] == 0
    assert su["early_reads"] > 0
    assert np.all(Du <= Dp * (1 + 1e-6) + 1e-6)
    gD, gI = brute_force(base, queries, K, "l2")
    assert recall_at_k(Iu, gI) >= recall_at_k(Ip, gI)
    # Where no early read was dropped, the answers are the same.
    if su["early_unused"] == 0:
        np.testing.assert_array_equal(Iu, Ip)


@pytest.mark.parametrize("backend", ["threads", "pread", "mmap", None],
                         ids=["threads", "pread", "mmap", "in_memory"])
def test_no_early_reads_but_with_io_uring(saved, backend):
    """The thread pool's workers, woken in the middle of a beam, would take
    the CPU from it; pread and mmap read synchronously."""
    base, queries, path = saved
    if backend is None:
        import knndirect as kd
        idx = kd.load(path)
    else:
        idx = open_quiet(path, backend)
    try:
        _search(idx, queries[:5], False)
        _, _, s = _search(idx, queries, False)
    finally:
        idx.close()
    assert s["early_reads"] == 0 and s["early_unused"] == 0, s
    assert s["queries"] == NQ
