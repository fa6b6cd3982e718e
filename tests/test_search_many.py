"""_core.search_many: one search over several indexes (the segments of a
collection), some in memory and some opened from disk, with removed ids.

What it must do: give the exact answer over the live union with exact=True
and under a filter; reach the recall of one index over the union with the
graph search; read ONE shortlist of ceil(k * oversample) records per query
across all segments, not one per segment; count each query once; and
release the GIL."""
import math
import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import knndirect as kd
from knndirect import _core

from conftest import (assert_exact_match, assert_rows_sorted, assert_same_results, brute_force,
                      gil_stall, missing_value, open_quiet, score_matrix)

METRICS = ("l2", "ip", "cosine")


def data(n, nq, dim, seed):
    """(base, queries) from one clustered distribution."""
    x = kd.datasets.clustered(n + nq, dim, seed=seed)
    return np.ascontiguousarray(x[:n]), np.ascontiguousarray(x[n:])


class Segments:
    """Segments of one collection over x (ids 1000 + row), the first built
    with kd.Index and the others adopting its quantizer; those in on_disk
    saved and reopened with kd.open. A few ids are removed in every
    segment, of those on disk half before the save and half after open."""

    def __init__(self, tmp_path, x, metric, nseg, on_disk=(), backend="threads",
                 remove_frac=0.05, seed=0, **kw):
        rng = np.random.default_rng(seed)
        self.x = x
        self.ids = np.arange(len(x), dtype=np.int64) + 1000
        self.live = np.ones(len(x), dtype=bool)
        self.metric = metric
        parts = np.array_split(np.arange(len(x)), nseg)
        built = []
        for rows in parts:
            ix = kd.Index(x.shape[1], metric, **kw)
            if built:
                ix._core.adopt_quantizer(built[0]._core)
            ix.add(x[rows], self.ids[rows])
            built.append(ix)
        # The collection's quantizer, kept for union() when the first
        # segment goes to disk.
        self.quantizer = kd.Index(x.shape[1], metric, **kw)
        self.quantizer._core.adopt_quantizer(built[0]._core)
        self.kw = kw
        self.indexes = []
        for s, (ix, rows) in enumerate(zip(built, parts)):
            gone = rng.choice(rows, size=int(remove_frac * len(rows)), replace=False)
            half = len(gone) // 2 if s in on_disk else len(gone)
            if half:
                ix.remove(self.ids[gone[:half]])
            if s in on_disk:
                path = tmp_path / ("seg%d.kdx" % s)
                ix.save(path)
                ix.close()
                ix = open_quiet(path, backend)
                assert ix.info()["storage"] == "disk"
                if len(gone) > half:
                    ix.remove(self.ids[gone[half:]])
            self.live[gone] = False
            self.indexes.append(ix)
        self.cores = [ix._core for ix in self.indexes]

    @property
    def live_x(self):
        return self.x[self.live]

    @property
    def live_ids(self):
        return self.ids[self.live]

    @property
    def removed_ids(self):
        return self.ids[~self.live]

    def search(self, q, k, **kw):
        return _core.search_many(self.cores, q, k, **kw)

    def union(self, same_quantizer=False):
        """One in-memory index over the live vectors, same ids and build
        parameters; with the segments' quantizer or one of its own."""
        u = kd.Index(self.x.shape[1], self.metric, **self.kw)
        if same_quantizer:
            u._core.adopt_quantizer(self.quantizer._core)
        u.add(self.live_x, self.live_ids)
        return u

    def stats(self, reset=False):
        return [ix.stats(reset=reset) for ix in self.indexes]

    def close(self):
        for ix in self.indexes:
            ix.close()
        self.quantizer.close()


def summed(stats, key):
    return sum(s[key] for s in stats)


# ----------------------------------------------------------------- exact answers


@pytest.fixture(scope="module", params=METRICS)
def mixed(request, tmp_path_factory):
    """4 segments of 1500 (dim 32), 1 and 3 on disk, ids removed in each."""
    x, q = data(6000, 40, 32, seed=11)
    segs = Segments(tmp_path_factory.mktemp("mixed"), x, request.param, 4, on_disk=(1, 3),
                    ef_construction=100)
    yield segs, q
    segs.close()


def test_exact_equals_brute_force_over_the_live_union(mixed):
    segs, q = mixed
    D, I = segs.search(q, 10, exact=True)
    assert_exact_match(D, I, segs.live_x, q, segs.metric, ids=segs.live_ids)
    # The same kernels on the same vectors: as one index over the union.
    assert_same_results((D, I), segs.union().search(q, 10, exact=True))


def test_exact_counts_one_query_each(mixed):
    segs, q = mixed
    segs.stats(reset=True)
    segs.search(q, 10, exact=True)
    st = segs.stats()
    assert st[0]["queries"] == len(q)
    assert summed(st, "queries") == len(q)
    assert all(s["exact_queries"] == len(q) for s in st), st


def test_graph_search_finds_the_exact_answer_mostly(mixed):
    segs, q = mixed
    D, I = segs.search(q, 10)
    gtD, gtI = brute_force(segs.live_x, q, 10, segs.metric, ids=segs.live_ids)
    assert kd.datasets.recall_at_k(I, gtI) >= 0.95
    assert_rows_sorted(D, segs.metric)
    # Reranked: the distances are exact ones.
    S = score_matrix(segs.live_x, q, segs.metric)
    col = {v: j for j, v in enumerate(segs.live_ids.tolist())}
    for r in range(len(q)):
        want = [S[r, col[i]] for i in I[r].tolist()]
        np.testing.assert_allclose(D[r], want, rtol=1e-4, atol=1e-4)


def test_removed_ids_never_returned(mixed):
    segs, q = mixed
    # Queries at removed vectors: each would be its own nearest neighbour.
    gone = segs.x[~segs.live][:30]
    removed = set(segs.removed_ids.tolist())
    for kw in ({}, {"exact": True}, {"rerank": False}, {"filter": segs.ids}):
        D, I = segs.search(gone, 10, **kw)
        assert not removed & set(I.ravel().tolist()), kw
        assert (I >= 0).all()


def test_threads_give_identical_results(mixed):
    segs, q = mixed
    every_third = np.ascontiguousarray(segs.ids[::3])
    for kw in ({}, {"rerank": False}, {"exact": True}, {"filter": every_third}):
        assert_same_results(segs.search(q, 10, threads=1, **kw),
                            segs.search(q, 10, threads=2, **kw), rtol=0)


# ------------------------------------------------------------------- filters


def test_filter_exact_equals_brute_force_over_allowed(mixed):
    segs, q = mixed
    rng = np.random.default_rng(5)
    allowed = rng.choice(segs.ids, size=len(segs.ids) // 3, replace=False)
    D, I = segs.search(q, 10, exact=True, filter=allowed)
    keep = np.isin(segs.ids, allowed) & segs.live
    assert_exact_match(D, I, segs.x[keep], q, segs.metric, ids=segs.ids[keep])


def test_selective_filter_equals_brute_force(mixed):
    """Few allowed ids in each segment: answered exactly, without exact=True."""
    segs, q = mixed
    rng = np.random.default_rng(6)
    allowed = rng.choice(segs.ids, size=60, replace=False)
    strangers = np.array([-5, 10**12, 999], dtype=np.int64)   # in no segment
    D, I = segs.search(q, 10, filter=np.concatenate([allowed, strangers]))
    keep = np.isin(segs.ids, allowed) & segs.live
    assert_exact_match(D, I, segs.x[keep], q, segs.metric, ids=segs.ids[keep])
    assert_same_results((D, I), segs.search(q, 10, filter=allowed))


def test_broad_filter_honoured_with_graph_search(mixed):
    segs, q = mixed
    allowed = np.ascontiguousarray(segs.ids[::2])
    strangers = np.arange(10**9, 10**9 + 50, dtype=np.int64)
    D, I = segs.search(q, 10, filter=np.concatenate([allowed, strangers]))
    keep = np.isin(segs.ids, allowed) & segs.live
    assert set(I.ravel().tolist()) <= set(segs.ids[keep].tolist())
    _, gtI = brute_force(segs.x[keep], q, 10, segs.metric, ids=segs.ids[keep])
    assert kd.datasets.recall_at_k(I, gtI) >= 0.9


def test_empty_filter_returns_nothing(mixed):
    segs, q = mixed
    for kw in ({}, {"exact": True}, {"rerank": False}):
        D, I = segs.search(q, 5, filter=np.zeros(0, dtype=np.int64), **kw)
        assert (I == -1).all()
        assert (D == missing_value(segs.metric)).all()


def test_filter_of_strangers_only_returns_nothing(mixed):
    segs, q = mixed
    D, I = segs.search(q, 5, filter=np.array([1, 2, 3], dtype=np.int64))
    assert (I == -1).all()


# --------------------------------------------------------------- estimates


def test_no_rerank_returns_sorted_estimates(mixed):
    segs, q = mixed
    segs.stats(reset=True)
    D, I = segs.search(q, 10, rerank=False)
    st = segs.stats()
    assert summed(st, "read_ops") == 0 and summed(st, "rerank_vectors") == 0
    assert summed(st, "queries") == len(q)
    assert set(I.ravel().tolist()) <= set(segs.live_ids.tolist())
    assert_rows_sorted(D, segs.metric)
    S = score_matrix(segs.live_x, q, segs.metric)
    col = {v: j for j, v in enumerate(segs.live_ids.tolist())}
    exact = np.array([[S[r, col[i]] for i in row] for r, row in enumerate(I.tolist())])
    assert not np.allclose(D, exact, rtol=1e-3, atol=1e-3), "estimates equal exact distances"
    # Estimates of the right neighbourhood all the same.
    _, gtI = brute_force(segs.live_x, q, 10, segs.metric, ids=segs.live_ids)
    assert kd.datasets.recall_at_k(I, gtI) >= 0.3


# ------------------------------------------------- one shortlist across segments


@pytest.fixture(scope="module")
def on_disk(tmp_path_factory):
    """4 segments of 2000 (dim 64), all opened from disk; 2 in memory as well."""
    x, q = data(8000, 25, 64, seed=21)
    root = tmp_path_factory.mktemp("disk")
    yield x, q, root


@pytest.mark.parametrize("backend", ["threads", "pread", "auto"])
@pytest.mark.parametrize("k,oversample", [(10, 3.0), (7, 2.5), (1, 4.0)])
def test_one_shortlist_across_segments(on_disk, tmp_path, backend, k, oversample):
    x, q, _ = on_disk
    segs = Segments(tmp_path, x, "l2", 4, on_disk=(0, 1, 2, 3), backend=backend,
                    ef_construction=64)
    try:
        shortlist = math.ceil(k * oversample)
        info = segs.indexes[0].info()
        rs = -(-info["record_size"] // info["alignment"]) * info["alignment"]   # one read
        segs.stats(reset=True)
        D, I = segs.search(q, k, oversample=oversample)
        st = segs.stats()
        # One shortlist per query in all, not one per segment...
        assert summed(st, "read_ops") == len(q) * shortlist, st
        assert summed(st, "rerank_vectors") == len(q) * shortlist, st
        assert summed(st, "read_bytes") == len(q) * shortlist * rs
        # ...drawn from more than one segment...
        assert sum(s["read_ops"] > 0 for s in st) >= 2, st
        # ...with no early reads in this path, and each query counted once.
        assert summed(st, "early_reads") == 0
        assert st[0]["queries"] == len(q) and summed(st, "queries") == len(q)
        assert all(s["exact_queries"] == 0 for s in st)
        assert (I >= 0).all()
        assert set(I.ravel().tolist()) <= set(segs.live_ids.tolist())
    finally:
        segs.close()


def test_shortlist_shared_by_memory_and_disk_segments(on_disk, tmp_path):
    x, q, _ = on_disk
    segs = Segments(tmp_path, x, "l2", 4, on_disk=(1, 2), ef_construction=64)
    try:
        segs.stats(reset=True)
        segs.search(q, 10, oversample=4.0)
        st = segs.stats()
        assert summed(st, "rerank_vectors") == len(q) * 40, st
        disk = [s for s, ix in zip(st, segs.indexes) if ix.info()["storage"] == "disk"]
        assert summed(disk, "read_ops") == summed(disk, "rerank_vectors") > 0
        assert summed(st, "queries") == len(q)
    finally:
        segs.close()


def test_one_segment_is_one_index(on_disk, tmp_path):
    """A single segment answers exactly as its own search does."""
    x, q, _ = on_disk
    segs = Segments(tmp_path, x, "cosine", 2, on_disk=(1,), ef_construction=64)
    try:
        for ix in segs.indexes:
            for kw in ({}, {"oversample": 2.0}, {"rerank": False}, {"exact": True},
                       {"filter": np.ascontiguousarray(segs.ids[::4])}, {"filter": segs.ids[:40]}):
                # The core's own search: both take the core's fixed defaults
                # (Index.search would read them from its calibration).
                want = ix._core.search(q, 10, **kw)
                assert_same_results(_core.search_many([ix._core], q, 10, **kw), want, rtol=0)
    finally:
        segs.close()


# ------------------------------------------------------------------- recall


@pytest.fixture(scope="module", params=["l2", "cosine"])
def big(request, tmp_path_factory):
    """20k x 64 in 4 segments (two on disk), and one index over the union."""
    x, q = data(20000, 200, 64, seed=31)
    segs = Segments(tmp_path_factory.mktemp("big"), x, request.param, 4, on_disk=(0, 2),
                    remove_frac=0.02)
    union = segs.union(same_quantizer=True)
    _, gtI = brute_force(segs.live_x, q, 10, request.param, ids=segs.live_ids)
    yield segs, union, q, gtI
    segs.close()
    union.close()


@pytest.mark.parametrize("oversample", [None, 5.0, 3.0])
def test_recall_matches_one_index_over_the_union(big, oversample):
    """The union shares the segments' quantizer: one fitted to a quarter of
    the data costs recall at a small oversample in one index as well."""
    segs, union, q, gtI = big
    kw = {} if oversample is None else {"oversample": oversample}
    _, I = segs.search(q, 10, **kw)
    _, Iu = union.search(q, 10, **kw)
    r, ru = kd.datasets.recall_at_k(I, gtI), kd.datasets.recall_at_k(Iu, gtI)
    if oversample is None:
        assert r >= 0.95, r
    assert r >= ru - 0.02, (r, ru)


def test_recall_at_default_matches_a_union_with_its_own_quantizer(big):
    segs, _, q, gtI = big
    union = segs.union()
    try:
        _, I = segs.search(q, 10)
        _, Iu = union.search(q, 10)
    finally:
        union.close()
    r, ru = kd.datasets.recall_at_k(I, gtI), kd.datasets.recall_at_k(Iu, gtI)
    assert r >= 0.95 and r >= ru - 0.02, (r, ru)


def test_gil_released(big):
    segs, union, q, gtI = big
    stall, took, ticks, _ = gil_stall(lambda: segs.search(q, 10, threads=1), min_seconds=0.05,
                                      enough=0.25)
    assert stall < 0.25, (
        "the ticker was stopped for %.0f%% of the %.3f s call (%d ticks): GIL held?"
        % (100 * stall, took, ticks))


def test_close_waits_for_a_running_search(big, tmp_path):
    segs, union, q, gtI = big
    extra = kd.Index(segs.x.shape[1], segs.metric)
    extra._core.adopt_quantizer(segs.indexes[1]._core)
    extra.add(segs.x[:3000], np.arange(3000, dtype=np.int64) + 10**6)
    qq = np.ascontiguousarray(np.tile(q, (3, 1)))
    out, errors = [], []

    def run():
        try:
            out.append(_core.search_many(segs.cores + [extra._core], qq, 10, threads=1))
        except Exception as e:   # pragma: no cover - reported below
            errors.append(e)

    t = threading.Thread(target=run)
    t.start()
    extra.close()   # waits until the search has left the index
    t.join()
    assert not errors, errors
    if out:   # the search may also have started after the close
        assert (out[0][1] >= 0).all()
    with pytest.raises(ValueError, match="closed"):
        _core.search_many(segs.cores + [extra._core], q, 10)


# ------------------------------------------------------------------- padding


@pytest.mark.parametrize("metric", METRICS)
def test_k_larger_than_live_count_pads(tmp_path, metric):
    x, q = data(14, 5, 16, seed=41)
    first = kd.Index(16, metric)
    first.add(x[:5], np.arange(5, dtype=np.int64))
    second = kd.Index(16, metric)
    second._core.adopt_quantizer(first._core)
    second.add(x[5:14], np.arange(5, 14, dtype=np.int64))
    second.remove([6])
    second.save(tmp_path / "small.kdx")
    second.close()
    second = open_quiet(tmp_path / "small.kdx", "threads")
    empty = kd.Index(16, metric)
    live = np.array([i for i in range(14) if i != 6])
    cores = [empty._core, first._core, second._core]
    for kw in ({}, {"exact": True}, {"rerank": False}):
        D, I = _core.search_many(cores, q, 20, **kw)
        assert D.shape == I.shape == (5, 20)
        assert (I[:, len(live):] == -1).all()
        assert (D[:, len(live):] == missing_value(metric)).all()
        for row in I:
            assert sorted(row[:len(live)].tolist()) == live.tolist()
        if not kw.get("rerank", True):
            continue
        assert_exact_match(D, I, x[live], q, metric, ids=live)
    # The empty index comes first: the queries are counted on the next one.
    empty.stats(reset=True), first.stats(reset=True), second.stats(reset=True)
    _core.search_many(cores, q, 3)
    assert (empty.stats()["queries"], first.stats()["queries"], second.stats()["queries"]) \
        == (0, 5, 0)
    second.close()


@pytest.mark.parametrize("metric", METRICS)
def test_only_empty_indexes(metric):
    a, b = kd.Index(8, metric), kd.Index(8, metric)
    q = np.ones((3, 8), dtype=np.float32)
    D, I = _core.search_many([a._core, b._core], q, 4)
    assert (I == -1).all() and (D == missing_value(metric)).all()
    assert D.dtype == np.float32 and I.dtype == np.int64 and D.shape == (3, 4)


def test_no_indexes():
    q = np.ones((3, 8), dtype=np.float32)
    D, I = _core.search_many([], q, 4)
    assert D.shape == I.shape == (3, 4)
    assert (I == -1).all() and np.isposinf(D).all()
    D, I = _core.search_many((), np.ones((0, 8), dtype=np.float32), 2)
    assert D.shape == (0, 2)


def test_no_queries(mixed):
    segs, q = mixed
    D, I = segs.search(q[:0], 10)
    assert D.shape == I.shape == (0, 10)


# -------------------------------------------------------------------- errors


@pytest.fixture(scope="module")
def pair():
    x, _ = data(300, 0, 16, seed=51)
    a = kd.Index(16, "l2")
    a.add(x[:150])
    b = kd.Index(16, "l2")
    b._core.adopt_quantizer(a._core)
    b.add(x[150:], np.arange(150, 300))
    return a, b, x[:4].copy()


def test_dims_differ(pair):
    a, b, q = pair
    c = kd.Index(8, "l2")
    c.add(np.ones((3, 8), dtype=np.float32))
    with pytest.raises(ValueError, match="dim"):
        _core.search_many([a._core, c._core], q, 3)


def test_metrics_differ(pair):
    a, b, q = pair
    c = kd.Index(16, "ip")
    c.add(np.ones((3, 16), dtype=np.float32))
    with pytest.raises(ValueError, match="metric"):
        _core.search_many([a._core, c._core], q, 3)


def test_queries_of_another_dim(pair):
    a, b, q = pair
    with pytest.raises(ValueError, match="dim"):
        _core.search_many([a._core, b._core], np.ones((2, 5), dtype=np.float32), 3)


def test_closed_index(pair):
    a, b, q = pair
    c = kd.Index(16, "l2")
    c.add(np.ones((3, 16), dtype=np.float32))
    c.close()
    with pytest.raises(ValueError, match="index is closed"):
        _core.search_many([a._core, c._core, b._core], q, 3)
    # The others were left as found: they still search (and close).
    assert _core.search_many([a._core, b._core], q, 3)[1].shape == (4, 3)


@pytest.mark.parametrize("bad", [None, 3, "ab", object()])
def test_not_a_sequence(pair, bad):
    a, b, q = pair
    with pytest.raises(TypeError):
        _core.search_many(bad, q, 3)


def test_not_an_index_in_the_list(pair):
    a, b, q = pair
    with pytest.raises(TypeError, match=r"indexes\[1\]"):
        _core.search_many([a._core, a, b._core], q, 3)   # the wrapper, not its core
    with pytest.raises(TypeError):
        _core.search_many([a._core, None], q, 3)


def test_the_same_index_twice(pair):
    a, b, q = pair
    with pytest.raises(ValueError, match="twice"):
        _core.search_many([a._core, b._core, a._core], q, 3)


@pytest.mark.parametrize("k", [0, -1])
def test_k_must_be_positive(pair, k):
    a, b, q = pair
    with pytest.raises(ValueError, match="k"):
        _core.search_many([a._core, b._core], q, k)


def test_non_finite_query(pair):
    a, b, q = pair
    bad = q.copy()
    bad[1, 2] = np.nan
    with pytest.raises(ValueError):
        _core.search_many([a._core, b._core], bad, 3)


def test_a_tuple_and_keywords(pair):
    a, b, q = pair
    want = _core.search_many([a._core, b._core], q, 3, exact=True)
    got = _core.search_many(indexes=(a._core, b._core), queries=q, k=3, ef=0, oversample=0,
                            rerank=True, exact=True, threads=1, filter=None)
    assert_same_results(got, want, rtol=0)


def test_no_reference_leaks(pair):
    """Every path of the binding, errors included, gives back what it took."""
    a, b, q = pair
    f = np.arange(0, 300, 2, dtype=np.int64)
    cores = [a._core, b._core]

    def calls():
        _core.search_many(cores, q, 3, filter=f)
        _core.search_many(tuple(cores), q, 3, exact=True)
        for bad, exc in (((cores + [None], q, 3), TypeError),
                         ((cores, np.ones((2, 5), dtype=np.float32), 3), ValueError),
                         ((cores + [a._core], q, 3), ValueError),
                         ((cores, q, 3, 0, 0.0, True, False, 0, q), TypeError)):
            with pytest.raises(exc):
                _core.search_many(*bad)

    calls()
    watched = (a._core, b._core, q, f, cores)
    before = [sys.getrefcount(o) for o in watched]
    for _ in range(200):
        calls()
    assert [sys.getrefcount(o) for o in watched] == before


# Run in a child: a deadlock there is a timeout here, not a hung test run.
OPPOSITE_ORDERS = textwrap.dedent("""
    import threading
    import numpy as np
    import knndirect as kd
    from knndirect import _core

    x = kd.datasets.clustered(5016, 16, seed=61)
    q, x = x[5000:], x[:5000]
    a = kd.Index(16, "l2", ef_construction=40)
    a.add(x[:1000], np.arange(1000))
    b = kd.Index(16, "l2", ef_construction=40)
    b._core.adopt_quantizer(a._core)
    b.add(x[1000:2000], np.arange(1000, 2000))
    stop, errors = threading.Event(), []

    def guarded(fn):
        def run():
            try:
                fn()
            except BaseException as e:
                errors.append(repr(e))
                stop.set()
        return run

    def searcher(cores):
        while not stop.is_set():
            for kw in ({}, {"exact": True}, {"rerank": False}):
                D, I = _core.search_many(cores, q, 5, threads=2, **kw)
                assert (I >= 0).all() and np.isfinite(D).all(), kw

    def writer(seg, start):
        for i in range(start, start + 1500, 50):
            seg.add(x[i:i + 50], np.arange(i, i + 50))
            seg.remove([i + 7])

    searchers = [threading.Thread(target=guarded(lambda: searcher([a._core, b._core]))),
                 threading.Thread(target=guarded(lambda: searcher([b._core, a._core])))]
    writers = [threading.Thread(target=guarded(lambda: writer(a, 2000))),
               threading.Thread(target=guarded(lambda: writer(b, 3500)))]
    for t in searchers + writers:
        t.start()
    for t in writers:
        t.join()
    stop.set()
    for t in searchers:
        t.join()
    assert not errors, errors
    D, I = _core.search_many([a._core, b._core], x[2007:5000:50].copy(), 5)
    assert not set(range(2007, 5000, 50)) & set(I.ravel().tolist())
    print("ok")
""")


def test_writers_and_searches_in_opposite_orders():
    """Searches listing the segments in both orders while a writer adds to
    and removes from each: no deadlock (the read locks prefer writers, and
    are taken in one order whatever the list's), and every answer is whole."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    try:
        r = subprocess.run([sys.executable, "-c", OPPOSITE_ORDERS], env=env,
                           capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail("deadlock: the child did not finish in 120 s")
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-3000:]
