"""Recall of the default two-phase search (HNSW over codes + rerank) against
numpy brute force on clustered, anisotropic data."""
import numpy as np
import pytest

import knndirect as kd
from conftest import (METRICS, assert_rows_sorted, brute_force, clustered, is_descending,
                      recall_at_k, score_matrix, split)

K = 10
NQ = 200

CASES = [(20000, 128), (10000, 768)]


@pytest.fixture(scope="module", params=CASES, ids=lambda c: "%dx%d" % c)
def dataset(request):
    n, d = request.param
    base, queries = split(n, NQ, d, seed=1000 + d)
    return base, queries


@pytest.fixture(scope="module", params=METRICS)
def case(request, dataset):
    metric = request.param
    base, queries = dataset
    # Built on one thread: the same graph, table and default every run. With
    # two threads the graph varies, and now and then so does the default's
    # pick (ip at 20,000 x 128 gave 0.9514-0.9520 in 42 builds and 0.947 in
    # 2, one of them in CI); that risk across graphs is the one the default
    # takes by design (95% confidence), measured in the benchmarks.
    index = kd.Index(base.shape[1], metric)
    index.add(base, threads=1)
    gtD, gtI = brute_force(base, queries, K, metric)
    yield metric, base, queries, index, gtD, gtI
    index.close()


def test_recall_default_parameters(case):
    """The default search reaches 0.95, measured on 2,000 fresh queries of
    the same distribution: on the fixture's 200 alone the recall itself
    varies by about +-0.006, as much as the margin the default keeps."""
    metric, base, queries, index, gtD, gtI = case
    D, I = index.search(queries, K)
    assert D.shape == (NQ, K) and I.shape == (NQ, K)
    assert D.dtype == np.float32 and I.dtype == np.int64
    n, d = base.shape
    fresh = clustered(n + 2000, d, 1000 + d)[n:]
    _, truth = brute_force(base, fresh, K, metric)
    _, I = index.search(fresh, K)
    r = recall_at_k(I, truth)
    assert r >= 0.95, "recall@10 = %.4f for %s %s (want >= 0.95)" % (r, metric, base.shape)


def test_reranked_distances_are_true_distances(case):
    """With rerank (the default), D is the full-precision metric value of the
    returned id, and rows are sorted best first."""
    metric, base, queries, index, gtD, gtI = case
    D, I = index.search(queries[:50], K)
    assert (I >= 0).all() and (I < len(base)).all()
    S = score_matrix(base, queries[:50], metric)
    true = np.take_along_axis(S, I, 1)
    scale = max(1.0, float(np.abs(S).max()))
    np.testing.assert_allclose(D, true, rtol=1e-4, atol=1e-4 * scale)
    assert_rows_sorted(D, metric)
    for row in I:
        assert len(set(row.tolist())) == K, "duplicate ids in a result row"


def test_larger_ef_does_not_hurt_recall(case):
    metric, base, queries, index, gtD, gtI = case
    r_default = recall_at_k(index.search(queries, K)[1], gtI)
    r_big = recall_at_k(index.search(queries, K, ef=400, oversample=20)[1], gtI)
    assert r_big >= 0.98, "ef=400, oversample=20 gave recall %.4f" % r_big
    assert r_big >= r_default - 0.01


def test_rerank_false_returns_estimates(case):
    """rerank=False: valid, sorted, distinct ids; recall is allowed to be lower
    but must still be far better than chance."""
    metric, base, queries, index, gtD, gtI = case
    D, I = index.search(queries[:50], K, rerank=False)
    assert D.shape == (50, K) and I.shape == (50, K)
    assert D.dtype == np.float32 and I.dtype == np.int64
    assert (I >= 0).all() and (I < len(base)).all()
    assert np.isfinite(D).all()
    assert_rows_sorted(D, metric)
    r = recall_at_k(I, gtI[:50])
    assert r >= 0.3, "rerank=False recall %.3f is no better than noise" % r


def test_a_deep_shortlist_keeps_the_beams_best(case):
    """A shortlist longer than the beam is the best of every node the beam
    scored, by estimate: its head is the beam's own best (rerank=False gives
    the same ids and estimates however deep the shortlist), and a deeper one
    holds a shallower one, so its exact top k is never farther. ef 10 with
    a shortlist of 20 narrows the gathered rows many times a search."""
    metric, base, queries, index, gtD, gtI = case
    q = queries[:100]
    for ef in (10, 40):
        D1, I1 = index.search(q, ef, ef=ef, oversample=1, rerank=False)
        for oversample in (2, 8.5):
            D, I = index.search(q, ef, ef=ef, oversample=oversample, rerank=False)
            np.testing.assert_array_equal(I, I1)
            np.testing.assert_array_equal(D, D1)
        sign = -1.0 if is_descending(metric) else 1.0
        shallow, _ = index.search(q, K, ef=ef, oversample=2)
        deep, _ = index.search(q, K, ef=ef, oversample=8)
        scale = max(1.0, float(np.abs(shallow).max()))
        assert (sign * deep <= sign * shallow + 1e-5 * scale).all()


def test_a_deep_shortlist_over_identical_vectors():
    """Thousands of rows with the same estimate cannot be split by their
    keys: the shortlist still holds distinct rows, the nearest (exact copies
    of the query) first."""
    rng = np.random.default_rng(5)
    copy = rng.standard_normal(32).astype(np.float32)
    base = np.vstack([np.tile(copy, (3000, 1)),
                      rng.standard_normal((2000, 32)).astype(np.float32)])
    index = kd.Index(32, "l2")
    index.add(base, threads=1)
    for rerank in (True, False):
        D, I = index.search(copy, K, ef=K, oversample=4, rerank=rerank)
        assert len(set(I.tolist())) == K and (I < 3000).all()
        if rerank:
            assert (D == 0).all()
    index.close()


@pytest.mark.parametrize("quantization", ["4bit", "8bit"])
def test_recall_scalar_quantization(quantization):
    # 1,000 queries: the default aims at 0.95 with 95% confidence, and on
    # 200 queries the test's own sampling error (about +-0.01) decided
    # (0.9495 once, 8-bit). One build thread: the same graph every run.
    base, queries = split(10000, 1000, 128, seed=77)
    index = kd.Index(128, "l2", quantization=quantization)
    index.add(base, threads=1)
    try:
        assert index.info()["quantization"] == quantization
        gtD, gtI = brute_force(base, queries, K, "l2")
        r = recall_at_k(index.search(queries, K)[1], gtI)
        assert r >= 0.95, "recall@10 = %.4f with quantization=%s" % (r, quantization)
    finally:
        index.close()


def test_unknown_quantization_rejected():
    with pytest.raises(ValueError):
        kd.Index(16, "l2", quantization="3bit")
