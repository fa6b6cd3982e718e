"""Property tests of the Python API (hypothesis): random dimensions, metrics,
quantizations, sizes, dtypes and layouts, ids anywhere in int64 (bounds
included), k from 1 to far beyond the index, filters with unknown ids, removes.

Checked on every example: results have the right shape and dtypes; ids are
live (and allowed by the filter) or -1, padding sits at the end with +-inf;
rows are sorted; exact search equals numpy brute force; a vector's returned
distance is its true distance; get_vectors returns what was added; a save /
load round trip answers the same. Bad input raises ValueError, TypeError or
KeyError with a message, never anything else."""
import os

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis", reason="hypothesis is not installed "
                                 "(pip install -e '.[test]')")
from hypothesis import HealthCheck, event, given, settings, strategies as st  # noqa: E402

import knndirect as kd  # noqa: E402
from conftest import (assert_exact_match, assert_rows_sorted, missing_value,  # noqa: E402
                      score_matrix)

INT64_MIN, INT64_MAX = np.iinfo(np.int64).min, np.iinfo(np.int64).max
DTYPES = [np.float32, np.float64, np.float16, np.int8, np.int32, np.uint8]
# A fixed, derandomized run by default; KNNDIRECT_HYPOTHESIS_EXAMPLES=N draws N
# fresh random examples instead (a longer hunt).
EXAMPLES = int(os.environ.get("KNNDIRECT_HYPOTHESIS_EXAMPLES", "0"))
SETTINGS = settings(max_examples=EXAMPLES or 60, deadline=None, derandomize=not EXAMPLES,
                    database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@st.composite
def cases(draw):
    dim = draw(st.integers(1, 40))
    metric = draw(st.sampled_from(["l2", "ip", "cosine"]))
    quant = draw(st.sampled_from(["1bit", "4bit", "8bit"]))
    n = draw(st.integers(0, 80))
    dtype = draw(st.sampled_from(DTYPES))
    layout = draw(st.sampled_from(["C", "F", "strided"]))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        x = rng.integers(max(info.min, -50), min(info.max, 50), size=(n, dim), endpoint=True)
    else:
        x = rng.standard_normal((n, dim)) * draw(st.sampled_from([1e-3, 1.0, 100.0]))
    x = x.astype(dtype)
    if metric == "cosine" and n:
        x[np.abs(x.astype(np.float64)).sum(1) == 0, 0] = 1   # no zero vectors for cosine
    if layout == "F":
        x = np.asfortranarray(x)
    elif layout == "strided":
        wide = np.zeros((n, 2 * dim), dtype=dtype)
        wide[:, ::2] = x
        x = wide[:, ::2]
    id_kind = draw(st.sampled_from(["default", "bounds", "random"]))
    if id_kind == "default":
        ids = None
    else:
        pool = {INT64_MIN, INT64_MAX, -1, 0, 1} if id_kind == "bounds" else set()
        while len(pool) < n:
            pool.add(int(rng.integers(INT64_MIN, INT64_MAX, endpoint=True)))
        ids = np.array(sorted(pool)[:n], dtype=np.int64)
        rng.shuffle(ids)
    nq = draw(st.integers(0, 4))
    single = draw(st.booleans()) and nq == 1
    q = rng.standard_normal((nq, dim)).astype(draw(st.sampled_from([np.float32, np.float64])))
    k = draw(st.sampled_from([1, 2, 5, 10, 33, 100, 1000]))
    ef = draw(st.sampled_from([None, 1, 16, 200, 10**6, 2**62]))
    oversample = draw(st.sampled_from([None, 1.0, 2.5, 1e6, 1e300]))
    mode = draw(st.sampled_from(["graph", "exact", "estimates", "filter"]))
    remove = draw(st.integers(0, n)) if n else 0
    return dict(dim=dim, metric=metric, quant=quant, x=x, ids=ids, q=q, single=single, k=k,
                ef=ef, oversample=oversample, mode=mode, remove=remove, seed=seed)


def _live(case):
    n = case["x"].shape[0]
    ids = np.arange(n, dtype=np.int64) if case["ids"] is None else case["ids"]
    rng = np.random.default_rng(case["seed"] + 1)
    removed = rng.choice(n, size=case["remove"], replace=False) if n else np.zeros(0, int)
    keep = np.ones(n, bool)
    keep[removed] = False
    return ids, removed, keep


def _check_result(D, I, case, live_ids, live_x, allowed=None):
    k, metric = case["k"], case["metric"]
    nq = case["q"].shape[0]
    shape = (k,) if case["single"] else (nq, k)
    assert D.shape == shape and I.shape == shape
    assert D.dtype == np.float32 and I.dtype == np.int64
    D2, I2 = np.atleast_2d(D), np.atleast_2d(I)
    ok = set(live_ids.tolist())
    if allowed is not None:
        ok &= set(allowed.tolist())
    col = {v: j for j, v in enumerate(live_ids.tolist())}
    S = score_matrix(live_x, np.atleast_2d(case["q"]), metric) if len(live_ids) else None
    for r in range(D2.shape[0]):
        # Padding is told by its distance (-1 may also be a user id here).
        found = np.isfinite(D2[r])
        nfound = int(found.sum())
        assert found[:nfound].all(), "padding must come last"
        assert set(I2[r][found].tolist()) <= ok, "returned ids must be live and allowed"
        assert len(set(I2[r][found].tolist())) == nfound, "an id appears twice"
        assert (I2[r][~found] == -1).all()
        assert (D2[r][~found] == missing_value(metric)).all()
        assert nfound == min(k, len(ok)), "%d results of k=%d with %d eligible (%s)" % (
            nfound, k, len(ok), case["mode"])
        if case["mode"] != "estimates":
            for j in np.flatnonzero(found):
                true = S[r, col[int(I2[r, j])]]
                assert abs(float(D2[r, j]) - true) <= 1e-3 * max(1.0, abs(true)), \
                    "distance of id %d: %g, true %g" % (I2[r, j], D2[r, j], true)
    assert_rows_sorted(D2, metric)


@SETTINGS
@given(cases())
def test_random_api_use(case):
    x, metric = case["x"], case["metric"]
    idx = kd.Index(case["dim"], metric, m=4, ef_construction=16, quantization=case["quant"])
    if case["ids"] is None:
        idx.add(x)
    else:
        idx.add(x, case["ids"])
    ids, removed, keep = _live(case)
    if len(removed):
        idx.remove(ids[removed])
    assert len(idx) == int(keep.sum())
    live_ids = ids[keep]
    x32 = np.ascontiguousarray(x, dtype=np.float32)
    live_x = x32[keep]

    q = case["q"][0] if case["single"] else case["q"]
    allowed = None
    kw = {"ef": case["ef"], "oversample": case["oversample"]}
    if case["mode"] == "exact":
        kw["exact"] = True
    elif case["mode"] == "estimates":
        kw["rerank"] = False
    elif case["mode"] == "filter":
        rng = np.random.default_rng(case["seed"] + 2)
        pick = ids[rng.random(len(ids)) < 0.5] if len(ids) else ids
        unknown = rng.integers(INT64_MIN, INT64_MAX, size=3, endpoint=True)
        allowed = np.concatenate([pick, unknown])
        kw["filter"] = allowed
    idx.stats(reset=True)
    D, I = idx.search(q, case["k"], **kw)
    if case["mode"] == "filter" and case["q"].shape[0]:
        # Which path the cost model took (--hypothesis-show-statistics): at
        # these sizes (80 vectors at most) nearly always the exact scan; the
        # filtered graph search is covered by test_remove_filter.py.
        event("filter answered by %s" % ("an exact scan" if idx.stats()["exact_queries"]
                                         else "the graph"))
    _check_result(D, I, case, live_ids, live_x, allowed)
    if case["mode"] == "exact" and len(live_ids) and case["q"].shape[0]:
        assert_exact_match(np.atleast_2d(D), np.atleast_2d(I), live_x, np.atleast_2d(case["q"]),
                           metric, ids=live_ids, rtol=1e-3)

    if len(live_ids):
        got = idx.get_vectors(live_ids)
        assert got.dtype == np.float32 and got.shape == (len(live_ids), case["dim"])
        assert np.array_equal(got, live_x)
    if len(removed):
        with pytest.raises(KeyError):
            idx.get_vectors(ids[removed][:1])
        with pytest.raises(KeyError):
            idx.remove(ids[removed][:1])

    again = kd.load(idx.to_bytes())
    D2, I2 = again.search(q, case["k"], **kw)
    assert np.array_equal(I, I2)
    np.testing.assert_allclose(D, D2, rtol=1e-6)
    again.close()
    idx.close()


BAD_CALLS = [
    ("wrong dim", lambda i: i.search(np.zeros(i.dim + 1), 3)),
    ("3-d queries", lambda i: i.search(np.zeros((2, 2, i.dim)), 3)),
    ("0-d query", lambda i: i.search(np.float32(1.0), 3)),
    ("string queries", lambda i: i.search(np.array([["a"] * i.dim]), 3)),
    ("object queries", lambda i: i.search(np.array([[object()] * i.dim]), 3)),
    ("complex queries", lambda i: i.search(np.zeros((1, i.dim), np.complex64), 3)),
    ("nan query", lambda i: i.search(np.full(i.dim, np.nan), 3)),
    ("inf query", lambda i: i.search(np.full(i.dim, np.inf), 3, exact=True)),
    ("k=0", lambda i: i.search(np.zeros(i.dim), 0)),
    ("k<0", lambda i: i.search(np.zeros(i.dim), -5)),
    ("k float", lambda i: i.search(np.zeros(i.dim), 2.5)),
    ("k str", lambda i: i.search(np.zeros(i.dim), "3")),
    ("ef=0", lambda i: i.search(np.zeros(i.dim), 3, ef=0)),
    ("oversample<1", lambda i: i.search(np.zeros(i.dim), 3, oversample=0.5)),
    ("oversample nan", lambda i: i.search(np.zeros(i.dim), 3, oversample=float("nan"))),
    ("threads=0", lambda i: i.search(np.zeros(i.dim), 3, threads=0)),
    ("threads beyond 32 bits", lambda i: i.search(np.zeros(i.dim), 3, threads=2**32 + 1)),
    ("float filter", lambda i: i.search(np.zeros(i.dim), 3, filter=np.array([1.5]))),
    ("2-d filter", lambda i: i.search(np.zeros(i.dim), 3, filter=np.zeros((2, 2), int))),
    ("add wrong dim", lambda i: i.add(np.zeros((2, i.dim + 1)))),
    ("add 1-d", lambda i: i.add(np.zeros(i.dim))),
    ("add nan", lambda i: i.add(np.full((1, i.dim), np.nan))),
    ("add string", lambda i: i.add(np.array([["x"] * i.dim]))),
    ("add ids too few", lambda i: i.add(np.zeros((2, i.dim)), [10**6])),
    ("add ids float", lambda i: i.add(np.zeros((1, i.dim)), [1.5])),
    ("add ids beyond int64", lambda i: i.add(np.zeros((1, i.dim)), [2**63])),
    ("add duplicate ids", lambda i: i.add(np.zeros((2, i.dim)), [10**6, 10**6])),
    ("add existing id", lambda i: i.add(np.zeros((1, i.dim)), [0])),
    ("remove unknown", lambda i: i.remove([10**9])),
    ("remove float", lambda i: i.remove([0.5])),
    ("get unknown", lambda i: i.get_vectors([10**9])),
    ("get 2-d", lambda i: i.get_vectors([[0]])),
    ("save to int", lambda i: i.save(5)),
]


@pytest.mark.parametrize("name,call", BAD_CALLS, ids=[b[0] for b in BAD_CALLS])
def test_bad_input_raises_a_clear_error(name, call):
    idx = kd.Index(6, "l2", m=4, ef_construction=16)
    idx.add(np.random.default_rng(0).standard_normal((30, 6)))
    before = (len(idx), idx.search(np.ones(6), 5))
    with pytest.raises((ValueError, TypeError, KeyError)) as ei:
        call(idx)
    assert str(ei.value).strip("'\""), "%s: the error has no message" % name
    # Nothing changed.
    assert len(idx) == before[0]
    after = idx.search(np.ones(6), 5)
    assert np.array_equal(after[1], before[1][1])
    idx.close()


@SETTINGS
@given(st.integers(-2**70, 2**70), st.sampled_from(["dim", "m", "ef_construction"]))
def test_index_parameters_never_wrap(value, name):
    """Out-of-range sizes are refused, whatever their magnitude: a value
    beyond 32 bits is not silently taken modulo 2^32."""
    try:
        idx = kd.Index(value) if name == "dim" else kd.Index(8, **{name: value})
    except (ValueError, TypeError, OverflowError) as e:
        assert str(e)
        return
    got = idx.info()[name]
    expected = max(value, 16) if name == "ef_construction" else value   # at least m
    assert got == expected, (name, value, got)
    idx.close()
