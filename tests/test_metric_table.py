"""The metric table the C core exports (knndirect._core.METRICS) describes
what searches actually do, and the Python layer takes its names from it."""
import math

import numpy as np
import pytest

import knndirect as kd
from knndirect import _core, _index, datasets

TABLE = _core.METRICS


def test_table_shape():
    assert isinstance(TABLE, tuple) and len(TABLE) >= 3
    for code, m in enumerate(TABLE):
        assert set(m) == {"name", "code", "larger_is_better", "normalized", "missing"}
        assert m["code"] == code
        assert math.isinf(m["missing"])
        # a missing result sorts after every real one
        assert (m["missing"] < 0) == m["larger_is_better"]
    assert [m["name"] for m in TABLE][:3] == ["l2", "ip", "cosine"]


def test_python_takes_names_from_core():
    assert _index.METRICS == {m["name"]: m["code"] for m in TABLE}


@pytest.mark.parametrize("m", TABLE, ids=lambda m: m["name"])
@pytest.mark.parametrize("exact", [False, True])
def test_search_matches_table(m, exact):
    rng = np.random.default_rng(3)
    base = rng.standard_normal((300, 16)).astype(np.float32)
    idx = kd.Index(16, m["name"], m=8, ef_construction=40)
    idx.add(base)
    assert idx.metric == m["name"] and idx.info()["metric"] == m["name"]
    q = rng.standard_normal((4, 16)).astype(np.float32)
    # more results asked than there are allowed ids: the tail is missing
    D, I = idx.search(q, 8, filter=np.arange(5), exact=exact)
    assert (I[:, 5:] == -1).all()
    assert (D[:, 5:] == m["missing"]).all()
    real = D[:, :5]
    steps = np.diff(real, axis=1)
    assert (steps <= 0).all() if m["larger_is_better"] else (steps >= 0).all()
    # values against a brute force in the table's own terms
    x = base[:5].astype(np.float64)
    qq = q.astype(np.float64)
    if m["normalized"]:
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        qq /= np.linalg.norm(qq, axis=1, keepdims=True)
    want = ((qq[:, None] - x[None]) ** 2).sum(-1) if m["name"] == "l2" else qq @ x.T
    want = -np.sort(-want, axis=1) if m["larger_is_better"] else np.sort(want, axis=1)
    np.testing.assert_allclose(real, want, rtol=1e-4, atol=1e-4)


def test_ground_truth_matches_table():
    rng = np.random.default_rng(4)
    base = rng.standard_normal((50, 8)).astype(np.float32)
    q = rng.standard_normal((3, 8)).astype(np.float32)
    for m in TABLE:
        _, s = datasets.ground_truth(base, q, 5, m["name"])
        steps = np.diff(s, axis=1)
        assert (steps <= 0).all() if m["larger_is_better"] else (steps >= 0).all()


@pytest.mark.parametrize("make", [
    lambda name: kd.Index(8, name),
    lambda name: datasets.ground_truth(np.zeros((2, 8), np.float32),
                                       np.zeros((1, 8), np.float32), 1, name),
])
def test_unknown_metric_names_the_valid_ones(make):
    with pytest.raises(ValueError) as e:
        make("hamming")
    for m in TABLE:
        assert m["name"] in str(e.value)
    assert "hamming" in str(e.value)


def test_unknown_metric_code_rejected_by_core():
    with pytest.raises(ValueError, match="metric"):
        _core.Index(8, len(TABLE), 16, 200, 1, 0)
