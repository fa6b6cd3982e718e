"""exact=True is brute force with full-precision distances: it must agree with
numpy, in memory and on an opened (on-disk) index."""
import numpy as np
import pytest

from conftest import (BACKENDS, METRICS, assert_exact_match, build,
                      missing_value, open_quiet, split)

N, NQ, K = 3000, 40, 10


@pytest.fixture(scope="module", params=[128, 100], ids=lambda d: "d%d" % d)
def data(request):
    d = request.param
    base, queries = split(N, NQ, d, seed=2000 + d)
    # user-given, non-sequential int64 ids
    rng = np.random.default_rng(d)
    ids = rng.choice(10 ** 12, size=N, replace=False).astype(np.int64) + 10 ** 9
    return base, queries, ids


@pytest.fixture(scope="module", params=METRICS)
def indexes(request, data, tmp_path_factory):
    metric = request.param
    base, queries, ids = data
    mem = build(base, metric, ids=ids)
    path = tmp_path_factory.mktemp("exact") / ("%s_%d.kdx" % (metric, base.shape[1]))
    mem.save(path)
    yield metric, mem, path
    mem.close()


def test_exact_in_memory(indexes, data):
    metric, mem, path = indexes
    base, queries, ids = data
    D, I = mem.search(queries, K, exact=True)
    assert D.dtype == np.float32 and I.dtype == np.int64
    assert D.shape == (NQ, K)
    assert_exact_match(D, I, base, queries, metric, ids=ids)


@pytest.mark.parametrize("backend", BACKENDS)
def test_exact_opened(indexes, data, backend):
    metric, mem, path = indexes
    base, queries, ids = data
    idx = open_quiet(path, backend)
    try:
        D, I = idx.search(queries, K, exact=True)
        assert_exact_match(D, I, base, queries, metric, ids=ids)
    finally:
        idx.close()


def test_exact_single_query(indexes, data):
    metric, mem, path = indexes
    base, queries, ids = data
    D, I = mem.search(queries[3], K, exact=True)
    assert D.shape == (K,) and I.shape == (K,)
    assert_exact_match(D[None], I[None], base, queries[3:4], metric, ids=ids)


def test_exact_k_larger_than_count(data):
    base, queries, ids = data
    for metric in METRICS:
        idx = build(base[:7], metric, ids=ids[:7])
        D, I = idx.search(queries[:5], 12, exact=True)
        assert I.shape == (5, 12)
        assert (I[:, 7:] == -1).all()
        assert (D[:, 7:] == missing_value(metric)).all()
        assert_exact_match(D, I, base[:7], queries[:5], metric, ids=ids[:7])
        idx.close()


def test_exact_k_equals_count_returns_everything(data):
    base, queries, ids = data
    idx = build(base[:50], "l2", ids=ids[:50])
    D, I = idx.search(queries[:4], 50, exact=True)
    for row in I:
        assert sorted(row.tolist()) == sorted(ids[:50].tolist())
    assert_exact_match(D, I, base[:50], queries[:4], "l2", ids=ids[:50])
    idx.close()


def test_exact_with_large_k(indexes, data):
    metric, mem, path = indexes
    base, queries, ids = data
    D, I = mem.search(queries[:5], 300, exact=True)
    assert_exact_match(D, I, base, queries[:5], metric, ids=ids)


def test_exact_duplicate_vectors():
    """Identical vectors under different ids are all returned (ties)."""
    rng = np.random.default_rng(5)
    v = rng.standard_normal((1, 32)).astype(np.float32)
    others = rng.standard_normal((100, 32)).astype(np.float32) + 5
    base = np.vstack([np.repeat(v, 4, axis=0), others])
    idx = build(base, "l2")
    D, I = idx.search(v[0], 4, exact=True)
    assert sorted(I.tolist()) == [0, 1, 2, 3]
    np.testing.assert_allclose(D, 0.0, atol=1e-5)
    idx.close()
