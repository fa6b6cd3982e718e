"""Shared helpers and fixtures for the knndirect test suite.

Data: `clustered()` makes anisotropic, clustered float32 vectors (the shape of
real embedding data, where 1-bit codes without a rotation fail badly).
Ground truth: `brute_force()` computes the exact top-k in float64 with numpy.
"""
import os
import struct
import sys
import threading
import time
import warnings

import numpy as np
import pytest

import knndirect as kd

METRICS = ("l2", "ip", "cosine")
BACKENDS = ("auto", "io_uring", "threads", "pread", "mmap")

# Metrics where a larger value is better.
_DESCENDING = {"l2": False, "ip": True, "cosine": True}


# --------------------------------------------------------------------------
# data
# --------------------------------------------------------------------------

def repo_text(name):
    """A file of the source tree (relative to its root) as text; skips the
    calling test where the tests run outside the tree (an installed package)."""
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), name)
    if not os.path.isfile(path):
        pytest.skip(f"{name} is not here (tests run outside the source tree)")
    with open(path, encoding="utf-8") as f:
        return f.read()


def spectrum(d):
    """Per-dimension scale of a decaying spectrum: 1/sqrt(1 + i/8)."""
    return (1.0 / np.sqrt(1.0 + np.arange(d) / 8.0)).astype(np.float64)


def clustered(n, d, seed, n_clusters=64, noise=0.5, labels=False):
    """n clustered float32 vectors of dimension d (and, with labels, each
    one's cluster).

    Cluster centres ~ N(0, I) * spectrum; point = centre + noise * N(0, I) *
    spectrum.  The centres depend on (d, seed, n_clusters) only, so two calls
    with the same seed and different n draw from the same distribution.
    """
    rng = np.random.default_rng(seed)
    s = spectrum(d)
    centres = rng.standard_normal((n_clusters, d)) * s
    which = rng.integers(0, n_clusters, size=n)
    pts = centres[which] + noise * rng.standard_normal((n, d)) * s
    pts = np.ascontiguousarray(pts, dtype=np.float32)
    return (pts, which) if labels else pts


def split(n, nq, d, seed):
    """(base, queries): n base vectors and nq queries from the same
    distribution; the queries are not in the base set."""
    allv = clustered(n + nq, d, seed)
    return np.ascontiguousarray(allv[:n]), np.ascontiguousarray(allv[n:])


# --------------------------------------------------------------------------
# ground truth
# --------------------------------------------------------------------------

def is_descending(metric):
    return _DESCENDING[metric]


def missing_value(metric):
    """The D value of a missing result."""
    return np.inf if metric == "l2" else -np.inf


def score_matrix(base, queries, metric):
    """Full (nq, n) float64 matrix of metric values (squared L2, dot or
    cosine similarity)."""
    b = np.asarray(base, dtype=np.float64)
    q = np.atleast_2d(np.asarray(queries, dtype=np.float64))
    if metric == "l2":
        bn = (b * b).sum(1)
        qn = (q * q).sum(1)
        s = qn[:, None] + bn[None, :] - 2.0 * (q @ b.T)
        return np.maximum(s, 0.0)
    if metric == "ip":
        return q @ b.T
    if metric == "cosine":
        bn = np.linalg.norm(b, axis=1)
        qn = np.linalg.norm(q, axis=1)
        bn[bn == 0] = 1.0
        qn[qn == 0] = 1.0
        return (q / qn[:, None]) @ (b / bn[:, None]).T
    raise AssertionError(metric)


def topk_from_scores(S, k, metric, ids=None):
    """Top-k (values, ids) per row of a score matrix, best first."""
    n = S.shape[1]
    ids = np.arange(n, dtype=np.int64) if ids is None else np.asarray(ids, np.int64)
    key = -S if is_descending(metric) else S
    kk = min(k, n)
    if kk == 0:
        part = np.zeros((S.shape[0], 0), dtype=np.int64)
    elif kk < n:
        part = np.argpartition(key, kk - 1, axis=1)[:, :kk]
    else:
        part = np.tile(np.arange(n), (S.shape[0], 1))
    order = np.argsort(np.take_along_axis(key, part, 1), axis=1, kind="stable")
    cols = np.take_along_axis(part, order, 1)
    D = np.full((S.shape[0], k), missing_value(metric), dtype=np.float64)
    I = np.full((S.shape[0], k), -1, dtype=np.int64)
    D[:, :kk] = np.take_along_axis(S, cols, 1)
    I[:, :kk] = ids[cols]
    return D, I


def brute_force(base, queries, k, metric, ids=None):
    """Exact top-k in float64: returns (D float64 (nq, k), I int64 (nq, k))."""
    S = score_matrix(base, queries, metric)
    return topk_from_scores(S, k, metric, ids)


def recall_at_k(I, gtI):
    I = np.atleast_2d(I)
    gtI = np.atleast_2d(gtI)
    k = gtI.shape[1]
    hits = 0
    for a, b in zip(I, gtI):
        hits += len(set(a[:k].tolist()) & set(b.tolist()))
    return hits / float(gtI.size)


def assert_rows_sorted(D, metric):
    D = np.atleast_2d(np.asarray(D, dtype=np.float64))
    diffs = np.diff(D, axis=1)
    # inf - inf is nan for padded tails; ignore those positions
    diffs = np.nan_to_num(diffs, nan=0.0)
    if is_descending(metric):
        assert (diffs <= 1e-6 * (1 + np.abs(D[:, :-1]).max(initial=0))).all(), \
            "rows of D must be sorted descending for %s" % metric
    else:
        assert (diffs >= -1e-6 * (1 + np.abs(D[:, :-1]).max(initial=0))).all(), \
            "rows of D must be sorted ascending for %s" % metric


def assert_exact_match(D, I, base, queries, metric, ids=None, rtol=1e-4):
    """(D, I) must be the exact top-k: ids equal to brute force as sets per
    row (a swap is tolerated only between near-tied candidates at the k-th
    place), and D close to the true values."""
    D = np.atleast_2d(D)
    I = np.atleast_2d(I)
    k = I.shape[1]
    S = score_matrix(base, queries, metric)
    gtD, gtI = topk_from_scores(S, k, metric, ids)
    id_list = (np.arange(S.shape[1]) if ids is None else np.asarray(ids)).tolist()
    col_of = {v: j for j, v in enumerate(id_list)}
    scale = max(1.0, float(np.abs(S).max()))
    tol = rtol * scale
    for r in range(I.shape[0]):
        got = set(I[r].tolist())
        exp = set(gtI[r].tolist())
        if got == exp:
            continue
        # Tolerate only near ties at the boundary.
        kth = gtD[r, -1]
        for extra in got - exp:
            assert extra in col_of, "row %d: returned id %r is not a live id" % (r, extra)
            v = S[r, col_of[extra]]
            assert abs(v - kth) <= tol, (
                "row %d: id %d (true value %g) returned, not in the exact top-%d "
                "(k-th value %g)\n got %s\n exp %s" % (r, extra, v, k, kth,
                                                     sorted(got), sorted(exp)))
    finite = np.isfinite(gtD)
    assert np.array_equal(np.isfinite(D), finite), "padding positions differ"
    np.testing.assert_allclose(D[finite], gtD[finite], rtol=rtol, atol=tol)


def assert_same_results(a, b, rtol=1e-5):
    """Two (D, I) results: identical ids, distances within rtol."""
    Da, Ia = a
    Db, Ib = b
    assert Ia.shape == Ib.shape
    np.testing.assert_array_equal(Ia, Ib)
    fa = np.isfinite(Da)
    assert np.array_equal(fa, np.isfinite(Db))
    np.testing.assert_allclose(Da[fa], Db[fa], rtol=rtol, atol=1e-5)


def same_bytes(a, b):
    a = np.ascontiguousarray(a)
    b = np.ascontiguousarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


# --------------------------------------------------------------------------
# index helpers
# --------------------------------------------------------------------------

def with_version(blob, version):
    """The index file claiming another format version, checksums fixed."""
    from knndirect import _container
    b = bytearray(blob)
    h = _container.HEADER_BYTES
    struct.pack_into("<I", b, 8, version)
    struct.pack_into("<I", b, h - 4, _container.crc32c(bytes(b[:h - 4])))
    struct.pack_into("<I", b, len(b) - 16, version)
    return bytes(b)


def build(base, metric="l2", ids=None, **kw):
    index = kd.Index(base.shape[1], metric, **kw)
    if ids is None:
        index.add(base)
    else:
        index.add(base, ids)
    return index


def build_saved(tmp_path_factory, name, base, metric="l2", **kw):
    """Build an index over base, save it as <fresh tmp dir>/<name>.kdx and
    close it; returns the path. pytest's tmp dirs live on the root
    filesystem, where O_DIRECT works."""
    index = build(base, metric, **kw)
    path = tmp_path_factory.mktemp(name) / (name + ".kdx")
    index.save(path)
    index.close()
    return path


def has_io_uring():
    if os.environ.get("KNNDIRECT_DISABLE_IO_URING"):
        return False
    return bool(kd.features().get("io_uring"))


def open_backend(path, backend, **kw):
    """kd.open with an io backend; skips (with a reason) when the backend is
    io_uring and this build or kernel lacks it."""
    if backend == "io_uring" and not has_io_uring():
        pytest.skip("io_uring is not available here (kd.features()['io_uring'] is False)")
    return kd.open(path, io_backend=backend, **kw)


def open_quiet(path, backend="auto", **kw):
    """Like open_backend, but swallows fallback warnings (tests that check the
    warnings do so explicitly)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return open_backend(path, backend, **kw)


@pytest.fixture
def cache_bytes():
    """Set the last-level cache size builds and merges assume; detect again after."""
    yield kd._core._set_cache_bytes
    kd._core._set_cache_bytes(0)


@pytest.fixture
def beam_rule():
    """Force insertion's beam (1: 1-bit codes, -1: build codes); the core's
    rules decide again after."""
    yield kd._core._set_beam_rule
    kd._core._set_beam_rule(0)


@pytest.fixture(scope="session")
def features():
    return kd.features()


# --------------------------------------------------------------------------
# the GIL
# --------------------------------------------------------------------------

def gil_stall(fn, attempts=3, min_seconds=0.0, enough=0.0):
    """How much of fn()'s run another Python thread was kept from running.

    A ticker thread appends time stamps as fast as it can while fn() runs on
    this thread (with a 1 ms switch interval). For each attempt, the largest
    gap between consecutive stamps inside fn's window (the window's edges
    count as stamps) is divided by the window: a call that holds the GIL for
    its whole run scores about 1.0, one that releases it scores the longest
    scheduling hiccup of the ticker. Returns (best ratio, its window in
    seconds, stamps inside it, fn's result of the last attempt); the best of
    `attempts` rules out one unlucky preemption on a loaded machine, and a
    call holding the GIL fails every attempt alike. Stops early at an attempt
    scoring under `enough`. Fails the calling test if the window is shorter
    than min_seconds (the call is too quick to tell).
    """
    old = sys.getswitchinterval()
    sys.setswitchinterval(0.001)
    best = None
    out = None
    try:
        for _ in range(attempts):
            stamps, stop = [], threading.Event()

            def tick(append=stamps.append, stopped=stop.is_set, now=time.perf_counter):
                while not stopped():
                    append(now())

            t = threading.Thread(target=tick)
            t.start()
            time.sleep(0.02)
            t0 = time.perf_counter()
            try:
                out = fn()
            finally:
                t1 = time.perf_counter()
                stop.set()
                t.join()
            inside = [s for s in stamps if t0 < s < t1]
            edges = [t0] + inside + [t1]
            gap = max(b - a for a, b in zip(edges, edges[1:]))
            took = t1 - t0
            assert took >= min_seconds, (
                "the call took %.3f s, under the %.3f s needed to tell a held GIL "
                "from scheduling noise: make the test data larger" % (took, min_seconds))
            cand = (gap / took, took, len(inside))
            if best is None or cand[0] < best[0]:
                best = cand
            if best[0] < enough:
                break
    finally:
        sys.setswitchinterval(old)
    return best + (out,)


def evict_page_cache(path):
    """Write back and drop the file's pages from the page cache, so the next
    read of it goes to the device."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
