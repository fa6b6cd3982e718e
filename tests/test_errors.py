"""Bad input raises the documented exception with a message naming the
problem, and leaves the index usable and unchanged."""
import numpy as np
import pytest

import knndirect as kd
from conftest import assert_same_results, build, clustered, open_quiet, same_bytes

D_ = 32


@pytest.fixture
def idx():
    base = clustered(200, D_, seed=7000)
    index = build(base, "l2")
    yield index, base
    index.close()


def _unchanged(index, base):
    assert len(index) == len(base)
    assert same_bytes(index.get_vectors(np.arange(len(base))), base)
    D, I = index.search(base[:3], 1, exact=True)
    np.testing.assert_array_equal(I[:, 0], [0, 1, 2])


# ---------------------------------------------------------------- dimensions

@pytest.mark.parametrize("bad_dim", [D_ - 1, D_ + 1, 1])
def test_add_wrong_dim(idx, bad_dim):
    index, base = idx
    with pytest.raises(ValueError, match="dim"):
        index.add(np.zeros((5, bad_dim), np.float32))
    _unchanged(index, base)


@pytest.mark.parametrize("bad_dim", [D_ - 1, D_ + 1])
def test_search_wrong_dim(idx, bad_dim):
    index, base = idx
    with pytest.raises(ValueError, match="dim"):
        index.search(np.zeros((2, bad_dim), np.float32), 5)
    with pytest.raises(ValueError, match="dim"):
        index.search(np.zeros(bad_dim, np.float32), 5)
    with pytest.raises(ValueError, match="dim"):
        index.search(np.zeros((2, bad_dim), np.float32), 5, exact=True)


def test_three_dimensional_input_rejected(idx):
    index, base = idx
    with pytest.raises(ValueError):
        index.search(np.zeros((2, 2, D_), np.float32), 5)
    with pytest.raises(ValueError):
        index.add(np.zeros((2, 2, D_), np.float32))
    _unchanged(index, base)


@pytest.mark.parametrize("dim", [0, -3])
def test_bad_index_dim(dim):
    with pytest.raises(ValueError):
        kd.Index(dim, "l2")


@pytest.mark.parametrize("metric", ["L3", "euclid", "", "hamming"])
def test_bad_metric(metric):
    with pytest.raises(ValueError):
        kd.Index(8, metric)


# ---------------------------------------------------------------- NaN / Inf

@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_add_nan_inf(idx, bad):
    index, base = idx
    v = clustered(10, D_, seed=1)
    v[7, 3] = bad
    with pytest.raises(ValueError, match="NaN"):
        index.add(v)
    _unchanged(index, base)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("exact", [False, True])
def test_search_nan_inf(idx, bad, exact):
    index, base = idx
    q = clustered(4, D_, seed=2)
    q[2, 0] = bad
    with pytest.raises(ValueError, match="NaN"):
        index.search(q, 5, exact=exact)
    with pytest.raises(ValueError, match="NaN"):
        index.search(q[2], 5, exact=exact)


def test_finite_check_by_row_sums_names_the_row():
    """Adds clear a chunk with one row-sum pass and check element by element
    only where a sum is not finite: finite values whose sum overflows pass,
    and a bad row is named wherever it lies."""
    from knndirect._index import _check_finite
    x = np.zeros((1000, 8), np.float32)
    x[10, :2] = 3e38                  # a finite row whose float32 sum overflows
    x[11, :2] = (3e38, -3e38)
    _check_finite(x, 64)
    _check_finite(np.full((100, 8), 6e4, np.float16), 64)  # float16 sums overflow too
    _check_finite(np.full((5, 8), 2**40, np.int64), 2)              # integers are always finite
    _check_finite(np.zeros((0, 8), np.float32), 0)                   # nothing to check
    for row, values in ((777, (np.nan,)), (999, (np.inf,)), (64, (np.inf, -np.inf)),
                        (0, (-np.inf,))):
        bad = x.copy()
        bad[row, :len(values)] = values
        with pytest.raises(ValueError, match=f"vector row {row} contains NaN or Inf"):
            _check_finite(bad, 64)
    with pytest.raises(ValueError, match="query row 3 contains"):
        _check_finite(np.array([[0.0]] * 3 + [[np.nan]], np.float64), 2, "query")


# ---------------------------------------------------------------- ids

def test_duplicate_ids_within_one_add():
    index = kd.Index(D_, "l2")
    v = clustered(5, D_, seed=3)
    with pytest.raises(ValueError, match="duplicate"):
        index.add(v, ids=[1, 2, 3, 2, 9])
    assert len(index) == 0
    index.close()


def test_duplicate_ids_against_existing(idx):
    index, base = idx
    v = clustered(3, D_, seed=4)
    with pytest.raises(ValueError, match="duplicate"):
        index.add(v, ids=[1000, 1001, 199])
    _unchanged(index, base)
    # the failed add did not register any of its ids
    index.add(v, ids=[1000, 1001, 1002])
    assert len(index) == len(base) + 3


def test_duplicate_default_ids_against_existing(idx):
    """An explicit id equal to an existing default id is a duplicate."""
    index, base = idx
    v = clustered(2, D_, seed=5)
    with pytest.raises(ValueError, match="duplicate"):
        index.add(v, ids=[0, 5000])
    _unchanged(index, base)


@pytest.mark.parametrize("n_ids", [0, 4, 6])
def test_ids_wrong_length(idx, n_ids):
    index, base = idx
    v = clustered(5, D_, seed=6)
    with pytest.raises(ValueError):
        index.add(v, ids=np.arange(1000, 1000 + n_ids))
    _unchanged(index, base)


def test_ids_wrong_shape(idx):
    index, base = idx
    v = clustered(4, D_, seed=6)
    with pytest.raises(ValueError):
        index.add(v, ids=np.arange(1000, 1004).reshape(2, 2))
    _unchanged(index, base)


def test_remove_unknown_id(idx):
    index, base = idx
    with pytest.raises(KeyError):
        index.remove([123456])
    with pytest.raises(KeyError):
        index.remove([5, 123456])
    _unchanged(index, base)


def test_get_vectors_unknown_id(idx):
    index, base = idx
    with pytest.raises(KeyError):
        index.get_vectors([200])
    with pytest.raises(KeyError):
        index.get_vectors([0, 1, -1])


def test_get_vectors_unknown_id_opened(idx, tmp_path):
    index, base = idx
    p = tmp_path / "e.kdx"
    index.save(p)
    o = open_quiet(p)
    try:
        with pytest.raises(KeyError):
            o.get_vectors([3, 999999])
        assert same_bytes(o.get_vectors([3]), base[[3]])
    finally:
        o.close()


# ---------------------------------------------------------------- k

@pytest.mark.parametrize("k", [0, -1, -10])
@pytest.mark.parametrize("exact", [False, True])
def test_bad_k(idx, k, exact):
    index, base = idx
    with pytest.raises(ValueError):
        index.search(base[:2], k, exact=exact)


def test_bad_ef_and_oversample(idx):
    index, base = idx
    with pytest.raises(ValueError):
        index.search(base[:2], 5, ef=-1)
    with pytest.raises(ValueError):
        index.search(base[:2], 5, oversample=0)
    with pytest.raises(ValueError):
        index.search(base[:2], 5, oversample=-2.0)


# ---------------------------------------------------------------- dtypes / layouts

def test_float64_and_layouts_accepted_for_add():
    base = clustered(300, D_, seed=8)
    ref = build(base, "l2", seed=0)
    ref_res = ref.search(base[:20] + 0.01, 5, exact=True)
    variants = {
        "float64": base.astype(np.float64),
        "fortran": np.asfortranarray(base),
        "strided": np.repeat(base, 2, axis=1)[:, ::2],
        "list": base.tolist(),
    }
    for name, arr in variants.items():
        if name == "strided":
            assert not arr.flags.c_contiguous
            assert same_bytes(arr, base)
        idx = kd.Index(D_, "l2", seed=0)
        idx.add(arr)
        assert same_bytes(idx.get_vectors(np.arange(300)), base), name
        assert_same_results(idx.search(base[:20] + 0.01, 5, exact=True), ref_res)
        idx.close()
    ref.close()


@pytest.mark.parametrize("exact", [False, True])
def test_float64_and_layouts_accepted_for_search(exact):
    base = clustered(500, D_, seed=9)
    index = build(base, "ip")
    q = clustered(40, D_, seed=10)
    ref = index.search(q, 7, exact=exact)
    variants = [
        q.astype(np.float64),
        np.asfortranarray(q),
        np.repeat(q, 3, axis=1)[:, ::3],  # non-contiguous rows
        np.ascontiguousarray(q[::-1])[::-1],  # negative stride
    ]
    for v in variants:
        assert_same_results(index.search(v, 7, exact=exact), ref)
    # 1-d non-contiguous single query
    col = np.asfortranarray(q)[5]
    assert_same_results(index.search(col, 7, exact=exact), (ref[0][5], ref[1][5]))
    index.close()


def test_ids_as_python_list_and_int32(idx):
    index, base = idx
    v = clustered(3, D_, seed=11)
    index.add(v, ids=[500, 501, 502])
    index.add(v + 1, ids=np.array([600, 601, 602], dtype=np.int32))
    assert len(index) == len(base) + 6
    assert same_bytes(index.get_vectors([600, 501]), np.vstack([v[0] + 1, v[1]]))


# ---------------------------------------------------------------- read-only / closed

def test_opened_index_is_read_only_for_add(idx, tmp_path):
    index, base = idx
    p = tmp_path / "ro.kdx"
    index.save(p)
    o = open_quiet(p)
    try:
        with pytest.raises(ValueError, match="read-only"):
            o.add(clustered(2, D_, seed=12), ids=[9000, 9001])
        assert len(o) == len(base)
    finally:
        o.close()


def _closed_calls(index, base):
    return {
        "search": lambda: index.search(base[:2], 3),
        "exact": lambda: index.search(base[:2], 3, exact=True),
        "add": lambda: index.add(base[:2], ids=[7000, 7001]),
        "remove": lambda: index.remove([0]),
        "get_vectors": lambda: index.get_vectors([0]),
        "info": lambda: index.info(),
        "stats": lambda: index.stats(),
        "to_bytes": lambda: index.to_bytes(),
    }


def test_closed_index_raises(idx):
    index, base = idx
    index.close()
    for call in _closed_calls(index, base).values():
        with pytest.raises(ValueError, match="closed"):
            call()
    index.close()  # closing twice is harmless


def test_closed_opened_index_raises(idx, tmp_path):
    index, base = idx
    p = tmp_path / "c.kdx"
    index.save(p)
    o = open_quiet(p)
    o.close()
    for name in ("search", "exact", "get_vectors", "remove", "info", "stats"):
        with pytest.raises(ValueError, match="closed"):
            _closed_calls(o, base)[name]()
    o.close()


def test_save_closed_index_raises(idx, tmp_path):
    index, base = idx
    index.close()
    with pytest.raises(ValueError, match="closed"):
        index.save(tmp_path / "x.kdx")
    assert not (tmp_path / "x.kdx").exists()


def test_chunked_add_is_all_or_nothing():
    """A duplicate of an existing id, or a NaN, anywhere in a large (chunked)
    add is found before anything is added."""
    import knndirect._index as ki
    base = np.random.default_rng(7).standard_normal((3 * ki.PROGRESS_CHUNK, 8)).astype(np.float32)
    index = kd.Index(8)
    index.add(base[:10], ids=np.arange(10))
    ids = np.arange(100, 100 + len(base))
    ids[-1] = 5                       # already present, in the last chunk
    with pytest.raises(ValueError, match="duplicate id 5"):
        index.add(base, ids=ids, progress=lambda done, total: True)
    assert len(index) == 10
    bad = base.copy()
    bad[-1, 3] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        index.add(bad, ids=np.arange(100, 100 + len(base)), progress=lambda d, t: True)
    assert len(index) == 10
    index.add(base, ids=np.arange(100, 100 + len(base)), progress=lambda d, t: True)
    assert len(index) == 10 + len(base)


def test_core_finite_check_names_the_row(idx):
    """The core checks what it is given itself (callers other than
    Index.add skip the Python check): a NaN or an infinity anywhere in a
    row, first or last element included, names that row and adds nothing;
    the largest finite floats, subnormals and negative zero pass."""
    index, base = idx
    v = clustered(40, D_, seed=4)
    for row, col, bad in ((0, 0, np.nan), (17, D_ - 1, np.inf), (39, 5, -np.inf),
                          (8, D_ - 1, np.float32("nan") * -1)):
        x = v.copy()
        x[row, col] = bad
        with pytest.raises(ValueError, match=f"vector row {row} contains NaN or Inf"):
            index._core.add(x, np.arange(9000, 9040), 1)
        _unchanged(index, base)
    ok = v.copy()
    ok[0, :3] = (np.finfo(np.float32).max, -np.finfo(np.float32).max, -0.0)
    ok[1, :2] = (np.finfo(np.float32).smallest_subnormal, -1e-44)
    index._core.add(ok, np.arange(9000, 9040), 1)
    assert len(index) == len(base) + 40


def test_add_in_chunks_reserves_once(idx, tmp_path):
    """An add of more than a chunk first makes room for all of it. Stopped
    after its first chunk, it holds that chunk, and the room left over takes
    later adds: every row answers (exact ids against brute force). A
    read-only index refuses the room, and so does a count past the limit."""
    index, base = idx
    more = clustered(3000, D_, seed=21)
    index.add(more, ids=np.arange(5000, 8000), progress=lambda d, t: False)
    assert len(index) == len(base) + 1000
    index.add(more[1000:], ids=np.arange(6000, 8000), progress=lambda d, t: True)
    allv = np.vstack([base, more])
    ids = np.concatenate([np.arange(len(base)), np.arange(5000, 8000)])
    q = clustered(20, D_, seed=22)
    _, got = index.search(q, 5, exact=True)
    truth = ids[np.argsort(((q[:, None, :] - allv[None]) ** 2).sum(-1), axis=1)[:, :5]]
    np.testing.assert_array_equal(got, truth)
    index._core.reserve(0)
    with pytest.raises(OverflowError):
        index._core.reserve(-1)
    for too_many in (2**32, 2**64 - 1):  # the latter would wrap past the count
        with pytest.raises(ValueError, match="at most 4294967294 vectors"):
            index._core.reserve(too_many)
    p = tmp_path / "ro.kdx"
    index.save(p)
    o = open_quiet(p)
    try:
        with pytest.raises(ValueError, match="read-only"):
            o._core.reserve(10)
    finally:
        o.close()


def test_memory_mapped_input_added_in_chunks(tmp_path):
    import knndirect._index as ki
    x = np.random.default_rng(8).standard_normal((ki.ADD_CHUNK + 500, 8)).astype(np.float64)
    path = tmp_path / "x.npy"
    np.save(path, x)
    mm = np.load(path, mmap_mode="r")
    index = kd.Index(8)
    index.add(mm)
    assert len(index) == len(x)
    got = index.get_vectors([0, len(x) - 1])
    np.testing.assert_array_equal(got, x[[0, -1]].astype(np.float32))
