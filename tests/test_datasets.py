"""kd.datasets: vector file loaders (.npy, .fvecs, .ivecs, .bvecs, HDF5) and
writers; loaders memory-map where the layout allows."""
import os

import numpy as np
import pytest

import knndirect as kd
from knndirect import datasets


def _is_mapped(a):
    """True when a is a np.memmap or a view whose base chain reaches one."""
    while a is not None:
        if isinstance(a, np.memmap):
            return True
        a = getattr(a, "base", None)
    return False


@pytest.fixture
def rng():
    return np.random.default_rng(7)


def test_kd_datasets_is_the_module():
    assert kd.datasets is datasets
    for name in ("read_vectors", "read_ann_hdf5", "write_fvecs", "write_ivecs", "write_bvecs",
                 "clustered", "ground_truth", "recall_at_k"):
        assert callable(getattr(datasets, name)), name


@pytest.mark.parametrize("ext,writer,dtype", [
    (".fvecs", datasets.write_fvecs, np.float32),
    (".ivecs", datasets.write_ivecs, np.int32),
    (".bvecs", datasets.write_bvecs, np.uint8),
])
@pytest.mark.parametrize("mmap", [True, False])
def test_vecs_round_trip(tmp_path, rng, ext, writer, dtype, mmap):
    if dtype is np.float32:
        x = rng.standard_normal((301, 13)).astype(np.float32)
    elif dtype is np.int32:
        x = rng.integers(-2**31, 2**31 - 1, (301, 13)).astype(np.int32)
    else:
        x = rng.integers(0, 256, (301, 13)).astype(np.uint8)
    path = tmp_path / ("x" + ext)
    writer(path, x)
    itemsize = np.dtype(dtype).itemsize
    assert os.path.getsize(path) == 301 * (4 + 13 * itemsize)
    y = datasets.read_vectors(path, mmap=mmap)
    assert y.shape == (301, 13)
    assert y.dtype == dtype
    np.testing.assert_array_equal(y, x)
    if mmap:
        assert _is_mapped(y)
        assert not y.flags.writeable
    else:
        assert not _is_mapped(y)
        assert y.flags.c_contiguous


def test_vecs_str_path_and_uppercase_extension(tmp_path, rng):
    x = rng.standard_normal((5, 4)).astype(np.float32)
    path = str(tmp_path / "X.FVECS")
    datasets.write_fvecs(path, x)
    np.testing.assert_array_equal(datasets.read_vectors(path), x)


def test_fvecs_record_layout(tmp_path):
    """Each record is an int32 dim followed by dim little-endian values."""
    x = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], dtype=np.float32)
    path = tmp_path / "a.fvecs"
    datasets.write_fvecs(path, x)
    raw = np.fromfile(path, dtype="<i4").reshape(2, 4)
    assert (raw[:, 0] == 3).all()
    np.testing.assert_array_equal(raw[:, 1:].view("<f4"), x)


def test_write_converts_to_float32(tmp_path):
    x = np.arange(12, dtype=np.float64).reshape(3, 4)
    datasets.write_fvecs(tmp_path / "a.fvecs", x)
    y = datasets.read_vectors(tmp_path / "a.fvecs")
    assert y.dtype == np.float32
    np.testing.assert_array_equal(y, x.astype(np.float32))


def test_write_rejects_out_of_range(tmp_path):
    with pytest.raises(ValueError, match="255"):
        datasets.write_bvecs(tmp_path / "a.bvecs", np.array([[0, 256]]))
    with pytest.raises(TypeError):
        datasets.write_bvecs(tmp_path / "a.bvecs", np.array([[0.5, 1.0]]))
    with pytest.raises(ValueError, match="2-d"):
        datasets.write_fvecs(tmp_path / "a.fvecs", np.zeros(3))


def test_npy_is_memory_mapped(tmp_path, rng):
    x = rng.standard_normal((50, 8)).astype(np.float32)
    np.save(tmp_path / "a.npy", x)
    y = datasets.read_vectors(tmp_path / "a.npy")
    assert isinstance(y, np.memmap)
    np.testing.assert_array_equal(y, x)
    z = datasets.read_vectors(tmp_path / "a.npy", mmap=False)
    assert not isinstance(z, np.memmap)
    np.testing.assert_array_equal(z, x)


def test_mismatched_dims_raise_naming_the_file(tmp_path):
    path = tmp_path / "bad.fvecs"
    # Two records of dim 4 then one of dim 3 padded so that the size still
    # divides evenly: 3 * 20 bytes, the last record claiming dim 3.
    datasets.write_fvecs(path, np.zeros((3, 4), dtype=np.float32))
    raw = bytearray(path.read_bytes())
    raw[40:44] = np.int32(3).tobytes()
    path.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match="bad.fvecs") as e:
        datasets.read_vectors(path)
    assert "dim" in str(e.value)


def test_truncated_file_raises(tmp_path):
    path = tmp_path / "short.bvecs"
    datasets.write_bvecs(path, np.zeros((4, 10), dtype=np.uint8))
    path.write_bytes(path.read_bytes()[:-3])
    with pytest.raises(ValueError, match="short.bvecs"):
        datasets.read_vectors(path)


def test_nonpositive_dim_raises(tmp_path):
    path = tmp_path / "zero.ivecs"
    path.write_bytes(np.zeros(8, dtype="<i4").tobytes())
    with pytest.raises(ValueError, match="zero.ivecs"):
        datasets.read_vectors(path)


def test_empty_vecs_file(tmp_path):
    path = tmp_path / "empty.fvecs"
    path.write_bytes(b"")
    y = datasets.read_vectors(path)
    assert y.shape[0] == 0 and y.dtype == np.float32


def test_unknown_extension(tmp_path):
    path = tmp_path / "x.csv"
    path.write_text("1,2\n")
    with pytest.raises(ValueError, match="x.csv"):
        datasets.read_vectors(path)


def test_mapped_fvecs_feeds_an_index(tmp_path):
    """A strided memory-mapped view goes straight into Index.add."""
    base = datasets.clustered(2000, 16, seed=3)
    datasets.write_fvecs(tmp_path / "b.fvecs", base)
    mapped = datasets.read_vectors(tmp_path / "b.fvecs")
    assert not mapped.flags.c_contiguous
    index = kd.Index(16)
    index.add(mapped)
    _, I = index.search(base[:20], 1, exact=True)
    np.testing.assert_array_equal(I[:, 0], np.arange(20))


def test_ground_truth_and_recall_unchanged():
    base = datasets.clustered(500, 8, seed=1)
    q = datasets.clustered(5, 8, seed=2)
    ids, scores = datasets.ground_truth(base, q, 3)
    assert ids.shape == (5, 3) and scores.shape == (5, 3)
    d = ((base[None].astype(np.float64) - q[:, None]) ** 2).sum(-1)
    np.testing.assert_array_equal(ids, np.argsort(d, axis=1)[:, :3])
    assert datasets.recall_at_k(ids, ids, 3) == 1.0



# -- recall_at_k, against hand-computed values ---------------------------------

def test_recall_at_k_partial_overlap():
    found = [[1, 2, 3], [4, 5, 6]]
    truth = [[1, 9, 3], [7, 8, 9]]
    # Row 0 finds 1 and 3, row 1 nothing: 2 hits of 6.
    assert datasets.recall_at_k(found, truth, 3) == pytest.approx(2 / 6)
    assert datasets.recall_at_k(np.array(found, np.int64), np.array(truth, np.int32), 3) \
        == pytest.approx(2 / 6)
    assert datasets.recall_at_k([[7, 8, 9]], [[1, 2, 3]], 3) == 0.0


def test_recall_at_k_order_within_top_k_is_irrelevant():
    assert datasets.recall_at_k([[3, 2, 1]], [[1, 2, 3]], 3) == 1.0
    assert datasets.recall_at_k([[3, 9, 1]], [[1, 2, 3]], 3) == pytest.approx(2 / 3)
    assert datasets.recall_at_k([[9, 3, 1]], [[1, 3, 2]], 3) == pytest.approx(2 / 3)


def test_recall_at_k_uses_the_first_k_columns_of_both():
    found = [[1, 2, 3, 4]]
    truth = [[4, 3, 2, 1]]
    assert datasets.recall_at_k(found, truth, 4) == 1.0
    assert datasets.recall_at_k(found, truth, 3) == pytest.approx(2 / 3)   # {1,2,3} vs {4,3,2}
    assert datasets.recall_at_k(found, truth, 2) == 0.0                    # {1,2} vs {4,3}
    assert datasets.recall_at_k(found, truth, 1) == 0.0
    # A true neighbour found past the k-th place is no hit.
    assert datasets.recall_at_k([[5, 6, 1]], [[1, 7, 8]], 2) == 0.0
    # The default k is 10: 10 of 12 columns count.
    f = np.arange(12)[None, :]
    t = np.concatenate([np.arange(5), np.arange(100, 105), [10, 11]])[None, :]
    assert datasets.recall_at_k(f, t) == pytest.approx(5 / 10)
    assert datasets.recall_at_k(f, t, 12) == pytest.approx(7 / 12)


def test_recall_at_k_means_over_queries():
    found = [[1, 2], [3, 4], [5, 6], [7, 8]]
    truth = [[1, 2], [3, 0], [0, 0], [8, 7]]
    assert datasets.recall_at_k(found, truth, 2) == pytest.approx((2 + 1 + 0 + 2) / 8)


def test_recall_at_k_minus_one_is_never_a_hit():
    # Missing results (-1) find nothing.
    assert datasets.recall_at_k([[-1, -1, 3]], [[1, 2, 3]], 3) == pytest.approx(1 / 3)
    assert datasets.recall_at_k([[-1, -1]], [[1, 2]], 2) == 0.0


def test_recall_at_k_minus_one_matches_no_missing_truth():
    # Truth padded with -1 (fewer true neighbours than k): a missing result
    # does not "find" the padding, and the padding is not a neighbour to find.
    assert datasets.recall_at_k([[-1, 7]], [[1, -1]], 2) == 0.0
    assert datasets.recall_at_k([[1, -1]], [[1, -1]], 2) == 1.0
    assert datasets.recall_at_k([[1, 5], [2, 3]], [[1, -1], [2, 4]], 2) == pytest.approx(2 / 3)


def test_recall_at_k_truth_narrower_than_k():
    # Data with fewer than k vectors: ground_truth clips its columns to n.
    assert datasets.recall_at_k([[4, 9, -1]], [[9, 4]], 3) == 1.0
    assert datasets.recall_at_k([[4, 7, -1]], [[9, 4]], 3) == 0.5


def test_recall_at_k_rejects_one_dimensional_input():
    with pytest.raises(ValueError, match="2-D"):
        datasets.recall_at_k([1, 2, 3], [[1, 2, 3]], 3)
    with pytest.raises(ValueError, match="2-D"):
        datasets.recall_at_k([[1, 2, 3]], [1, 2, 3], 3)


@pytest.mark.parametrize("found, truth, k, words", [
    ([[1, 2]], [[1, 2], [3, 4]], 2, "1 rows but truth has 2"),   # fewer result rows
    ([[1, 2], [3, 4]], [[1, 2]], 2, "2 rows but truth has 1"),   # more result rows
    ([[1]], [[1, 2]], 2, "fewer than k = 2"),                    # results narrower than k
    ([[1, 2]], [[1, 2]], 0, "k must be at least 1"),
])
def test_recall_at_k_rejects_mismatched_shapes(found, truth, k, words):
    with pytest.raises(ValueError, match=words):
        datasets.recall_at_k(found, truth, k)


# -- HDF5 ---------------------------------------------------------------------

def _write_ann_hdf5(path, train, test, neighbors, distance="euclidean", **kw):
    h5py = pytest.importorskip("h5py")
    with h5py.File(path, "w") as f:
        f.create_dataset("train", data=train, **kw)
        f.create_dataset("test", data=test)
        f.create_dataset("neighbors", data=neighbors)
        if distance is not None:
            f.attrs["distance"] = distance


@pytest.fixture
def h5py_mod():
    try:
        import h5py
    except ImportError:
        pytest.skip("h5py is not installed (pip install 'knndirect[hdf5]')")
    return h5py


@pytest.mark.parametrize("chunked", [False, True])
def test_ann_hdf5_round_trip(tmp_path, rng, h5py_mod, chunked):
    train = rng.standard_normal((400, 12)).astype(np.float32)
    test = rng.standard_normal((10, 12)).astype(np.float32)
    nbrs, _ = datasets.ground_truth(train, test, 5)
    nbrs = nbrs.astype(np.int32)
    kw = {"chunks": (100, 12), "compression": "gzip"} if chunked else {}
    path = tmp_path / "ann.hdf5"
    _write_ann_hdf5(path, train, test, nbrs, **kw)
    tr, te, nb = datasets.read_ann_hdf5(path)
    np.testing.assert_array_equal(tr, train)
    np.testing.assert_array_equal(te, test)
    np.testing.assert_array_equal(nb, nbrs)
    assert _is_mapped(tr) == (not chunked)
    assert datasets.ann_hdf5_metric(path) == "l2"
    np.testing.assert_array_equal(datasets.read_vectors(path), train)
    np.testing.assert_array_equal(datasets.read_vectors(path, mmap=False), train)
    assert not _is_mapped(datasets.read_vectors(path, mmap=False))


def test_ann_hdf5_metric_names(tmp_path, rng, h5py_mod):
    x = rng.standard_normal((4, 3)).astype(np.float32)
    nb = np.zeros((4, 1), dtype=np.int32)
    for distance, metric in (("angular", "cosine"), (b"euclidean", "l2"), ("dot", "ip"),
                             ("hamming", None), (None, None)):
        path = tmp_path / "m.h5"
        _write_ann_hdf5(path, x, x, nb, distance=distance)
        assert datasets.ann_hdf5_metric(path) == metric, distance


def test_ann_hdf5_missing_dataset(tmp_path, h5py_mod):
    path = tmp_path / "partial.hdf5"
    with h5py_mod.File(path, "w") as f:
        f.create_dataset("train", data=np.zeros((3, 2), dtype=np.float32))
    with pytest.raises(ValueError, match="neighbors"):
        datasets.read_ann_hdf5(path)


def test_hdf5_without_h5py_says_how_to_install(tmp_path, monkeypatch):
    import builtins
    real_import = builtins.__import__

    def no_h5py(name, *args, **kwargs):
        if name == "h5py":
            raise ImportError("No module named 'h5py'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_h5py)
    with pytest.raises(ImportError, match="h5py"):
        datasets.read_ann_hdf5(tmp_path / "x.hdf5")
    with pytest.raises(ImportError, match="pip install"):
        datasets.read_vectors(tmp_path / "x.h5")
