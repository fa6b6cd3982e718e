"""Shapes, dtypes and padding of search results."""
import numpy as np
import pytest

import knndirect as kd
from conftest import (METRICS, assert_exact_match, assert_rows_sorted, build,
                      clustered, missing_value, open_quiet, split)

D_ = 48


@pytest.fixture(scope="module", params=METRICS)
def small(request):
    metric = request.param
    base, queries = split(1500, 20, D_, seed=8000)
    index = build(base, metric)
    yield metric, base, queries, index
    index.close()


def test_single_query_returns_1d(small):
    metric, base, queries, index = small
    for exact in (False, True):
        D, I = index.search(queries[0], 10, exact=exact)
        assert D.shape == (10,) and I.shape == (10,)
        assert D.dtype == np.float32 and I.dtype == np.int64
        D2, I2 = index.search(queries[:1], 10, exact=exact)
        assert D2.shape == (1, 10)
        np.testing.assert_array_equal(I, I2[0])
        np.testing.assert_array_equal(D, D2[0])


def test_batch_shapes(small):
    metric, base, queries, index = small
    for k in (1, 3, 10, 64):
        D, I = index.search(queries, k)
        assert D.shape == (len(queries), k) and I.shape == (len(queries), k)
        assert D.dtype == np.float32 and I.dtype == np.int64
        assert (I >= 0).all()
        assert_rows_sorted(D, metric)


def test_default_k_is_10(small):
    metric, base, queries, index = small
    D, I = index.search(queries)
    assert I.shape == (len(queries), 10)


def test_k1_finds_itself(small):
    """A base vector is its own nearest neighbour (l2) / best match (cosine)."""
    metric, base, queries, index = small
    if metric == "ip":
        pytest.skip("under inner product a vector need not be its own best match")
    D, I = index.search(base[:100], 1)
    assert (I[:, 0] == np.arange(100)).mean() >= 0.97


@pytest.mark.parametrize("exact", [False, True])
def test_k_larger_than_count_pads(exact):
    for metric in METRICS:
        base = clustered(8, D_, seed=8001)
        index = build(base, metric)
        D, I = index.search(base[:3] + 0.05, 20, exact=exact)
        assert I.shape == (3, 20) and D.shape == (3, 20)
        assert (I[:, 8:] == -1).all()
        assert (D[:, 8:] == missing_value(metric)).all()
        for row in I:
            assert sorted(row[:8].tolist()) == list(range(8))
        assert_exact_match(D, I, base, base[:3] + 0.05, metric)
        index.close()


def test_huge_k_never_raises(small):
    metric, base, queries, index = small
    D, I = index.search(queries[:2], 100000)
    assert I.shape == (2, 100000)
    assert (I[:, len(base):] == -1).all()
    assert (D[:, len(base):] == missing_value(metric)).all()
    live = I[:, : len(base)]
    assert (live >= 0).all()
    for row in live:
        assert len(set(row.tolist())) == len(base)


@pytest.mark.parametrize("metric", METRICS)
@pytest.mark.parametrize("exact", [False, True])
def test_search_empty_index(metric, exact):
    index = kd.Index(D_, metric)
    q = clustered(3, D_, seed=8002)
    D, I = index.search(q, 5, exact=exact)
    assert I.shape == (3, 5) and D.shape == (3, 5)
    assert (I == -1).all()
    assert (D == missing_value(metric)).all()
    D1, I1 = index.search(q[0], 5, exact=exact)
    assert I1.shape == (5,) and (I1 == -1).all()
    assert len(index) == 0
    index.close()


@pytest.mark.parametrize("metric", METRICS)
def test_search_empty_opened_index(metric, tmp_path):
    index = kd.Index(D_, metric)
    p = tmp_path / "empty.kdx"
    index.save(p)
    index.close()
    o = open_quiet(p)
    try:
        D, I = o.search(np.ones((2, D_), np.float32), 4)
        assert (I == -1).all() and (D == missing_value(metric)).all()
    finally:
        o.close()


def test_single_vector_index():
    index = kd.Index(4, "l2")
    index.add(np.array([[1, 2, 3, 4]], np.float32), ids=[42])
    D, I = index.search(np.array([1, 2, 3, 5], np.float32), 3)
    np.testing.assert_array_equal(I, [42, -1, -1])
    np.testing.assert_allclose(D[0], 1.0, rtol=1e-6)
    assert np.isinf(D[1:]).all() and (D[1:] > 0).all()
    index.close()


def test_known_small_example_each_metric():
    v = np.array([[1, 0], [0, 2], [-3, 0], [1, 1]], np.float32)
    q = np.array([2, 0.5], np.float32)
    expect = {
        "l2": ([0, 3, 1, 2], [1.25, 1.25, 6.25, 25.25]),
        "ip": ([3, 0, 1, 2], [2.5, 2.0, 1.0, -6.0]),
    }
    for metric in ("l2", "ip", "cosine"):
        index = build(v, metric)
        for exact in (False, True):
            D, I = index.search(q, 4, exact=exact)
            if metric == "cosine":
                qn = q / np.linalg.norm(q)
                sims = (v / np.linalg.norm(v, axis=1)[:, None]) @ qn
                order = np.argsort(-sims)
                np.testing.assert_array_equal(I, order)
                np.testing.assert_allclose(D, sims[order], rtol=1e-5)
            elif metric == "l2":
                # ids 0 and 3 tie at 1.25
                assert set(I[:2].tolist()) == {0, 3}
                np.testing.assert_array_equal(I[2:], [1, 2])
                np.testing.assert_allclose(D, expect[metric][1], rtol=1e-5)
            else:
                np.testing.assert_array_equal(I, expect[metric][0])
                np.testing.assert_allclose(D, expect[metric][1], rtol=1e-5)
        index.close()


def test_zero_vector_cosine_does_not_crash():
    """A zero vector under cosine must not produce NaN results for others."""
    v = clustered(50, 8, seed=8003)
    v[10] = 0.0
    index = kd.Index(8, "cosine")
    try:
        index.add(v)
    except ValueError:
        index.close()
        return  # rejecting a zero vector for cosine is acceptable
    D, I = index.search(v[:5], 5, exact=True)
    assert not np.isnan(D).any()
    np.testing.assert_array_equal(I[:, 0], np.arange(5))
    index.close()


def test_progress_callable_reports_total():
    base = clustered(2000, 16, seed=8004)
    calls = []

    def progress(done, total):
        calls.append((done, total))
        return True

    index = kd.Index(16, "l2")
    index.add(base, progress=progress)
    assert len(index) == 2000
    assert calls, "progress callback was never called"
    assert all(t == 2000 for _, t in calls)
    dones = [d for d, _ in calls]
    assert dones == sorted(dones)
    assert dones[-1] == 2000
    index.close()


@pytest.mark.parametrize("stop_at", [1, 3])
def test_progress_cancel_stops_add(stop_at):
    """progress() returning False cancels the rest of the add: no exception,
    the chunks already added stay (1000 rows each), the others are not there,
    and the index answers over exactly what it holds."""
    base = clustered(5000, 16, seed=8005)
    before = clustered(500, 16, seed=8008)
    index = kd.Index(16, "l2")
    index.add(before)                     # ids 0..499, there before the add
    calls = []

    def progress(done, total):
        calls.append((done, total))
        return len(calls) < stop_at

    assert index.add(base, progress=progress) is None   # ids 500..5499
    kept = 1000 * stop_at
    assert calls == [(1000 * (j + 1), 5000) for j in range(stop_at)]
    assert len(index) == 500 + kept
    has = index._core.contains
    assert has(np.arange(500 + kept)).all()
    assert not has(np.arange(500 + kept, 5500)).any()
    held = np.concatenate([before, base[:kept]])
    ids = np.arange(500 + kept)
    q = clustered(20, 16, seed=8007)
    D, I = index.search(q, 5, exact=True)
    assert_exact_match(D, I, held, q, "l2", ids=ids)
    D, I = index.search(q, 5)
    assert np.isin(I, ids).all()
    np.testing.assert_array_equal(index.get_vectors(ids), held)
    # The cancelled rows can be added afterwards: nothing of them is left over.
    index.add(base[kept:])
    assert len(index) == 5500 and has(np.arange(5500)).all()
    index.close()


def test_progress_true_works_with_or_without_tqdm():
    base = clustered(300, 16, seed=8006)
    index = kd.Index(16, "l2")
    index.add(base, progress=True)
    assert len(index) == 300
    index.close()
