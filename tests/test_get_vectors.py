"""get_vectors returns the stored float32 vectors bit-exactly, whatever the
order, repetition or storage (memory, loaded, opened with each backend)."""
import numpy as np
import pytest

import knndirect as kd
from conftest import BACKENDS, build, clustered, open_quiet, same_bytes

N = 1000
SOURCES = ["memory", "loaded"] + ["open-" + b for b in BACKENDS] + ["open-buffered"]


@pytest.fixture(scope="module", params=[100, 128, 768], ids=lambda d: "d%d" % d)
def saved(request, tmp_path_factory):
    d = request.param
    base = clustered(N, d, seed=4000 + d)
    # make a few values special: exact bit patterns must survive
    base[0, 0] = -0.0
    base[1, :3] = [np.float32(1e-40), np.float32(12345.678), np.float32(-1.17549435e-38)]
    index = build(base, "l2")
    path = tmp_path_factory.mktemp("gv") / ("gv_%d.kdx" % d)
    index.save(path)
    yield base, index, path
    index.close()


@pytest.fixture(params=SOURCES)
def source(request, saved):
    base, index, path = saved
    kind = request.param
    if kind == "memory":
        yield base, index
        return
    if kind == "loaded":
        idx = kd.load(path)
    elif kind == "open-buffered":
        idx = open_quiet(path, "auto", direct_io=False)
    else:
        idx = open_quiet(path, kind[len("open-"):])
    yield base, idx
    idx.close()


def _check(idx, base, ids):
    V = idx.get_vectors(ids)
    ids = np.asarray(ids, dtype=np.int64)
    assert isinstance(V, np.ndarray)
    assert V.dtype == np.float32
    assert V.shape == (len(ids), base.shape[1])
    assert same_bytes(V, base[ids]), "vectors differ from the ones added"
    return V


def test_all_ids_shuffled(source):
    base, idx = source
    ids = np.random.default_rng(1).permutation(N)
    _check(idx, base, ids)


def test_repeated_ids(source):
    base, idx = source
    ids = [5, 5, 999, 0, 5, 999, 1, 1, 1]
    _check(idx, base, ids)


def test_empty_request(source):
    base, idx = source
    for empty in ([], np.array([], dtype=np.int64)):
        V = idx.get_vectors(empty)
        assert V.dtype == np.float32
        assert V.shape == (0, base.shape[1])


def test_single_and_list_input(source):
    base, idx = source
    _check(idx, base, [0])
    _check(idx, base, [1])  # special float bit patterns
    _check(idx, base, list(range(10, 20)))
    _check(idx, base, np.arange(30, 40, dtype=np.int32))


def test_result_is_independent_of_later_calls(source):
    """A returned array must not be overwritten by the next call."""
    base, idx = source
    V1 = idx.get_vectors([3, 4, 5])
    snap = np.array(V1, copy=True)
    idx.get_vectors([6, 7, 8])
    idx.search(base[:2], 5)
    assert same_bytes(V1, snap)


def test_small_io_depth(saved):
    base, index, path = saved
    for backend in ("threads", "pread", "auto"):
        idx = open_quiet(path, backend, io_depth=1)
        ids = np.random.default_rng(2).permutation(N)[:300]
        _check(idx, base, ids)
        idx.close()
        idx = open_quiet(path, backend, io_depth=3, threads=1)
        _check(idx, base, ids[::-1])
        idx.close()


def test_cosine_returns_vectors_as_added(tmp_path):
    base = clustered(200, 96, seed=41) * 3.7
    idx = build(base, "cosine")
    p = tmp_path / "cos.kdx"
    idx.save(p)
    ids = np.arange(200)[::-1]
    for other in (idx, kd.load(p), open_quiet(p), open_quiet(p, "threads")):
        V = other.get_vectors(ids)
        assert same_bytes(V, base[ids])
        # definitely not normalized
        assert not np.allclose(np.linalg.norm(V, axis=1), 1.0)
    idx.close()


def test_custom_ids(tmp_path):
    base = clustered(300, 128, seed=42)
    ids = np.random.default_rng(3).choice(2 ** 50, size=300, replace=False).astype(np.int64)
    idx = build(base, "ip", ids=ids)
    p = tmp_path / "c.kdx"
    idx.save(p)
    order = np.random.default_rng(4).permutation(300)
    for other in (idx, open_quiet(p)):
        V = other.get_vectors(ids[order])
        assert same_bytes(V, base[order])
    idx.close()


def test_float64_input_stored_as_float32():
    base64 = clustered(50, 16, seed=43).astype(np.float64) + 1e-9
    idx = kd.Index(16, "l2")
    idx.add(base64)
    V = idx.get_vectors(np.arange(50))
    assert V.dtype == np.float32
    assert same_bytes(V, base64.astype(np.float32))
    idx.close()


def test_default_ids_continue_across_adds():
    base = clustered(150, 24, seed=44)
    idx = kd.Index(24, "l2")
    idx.add(base[:100])
    idx.add(base[100:])
    assert len(idx) == 150
    assert same_bytes(idx.get_vectors(np.arange(150)), base)
    idx.close()
