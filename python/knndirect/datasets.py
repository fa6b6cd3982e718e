"""Vector files, synthetic data and exact ground truth.

Loaders (memory-mapped where the layout allows, so a file larger than RAM
costs only the pages you touch):

- ``read_vectors(path)``: ``.npy``, ``.fvecs`` (float32), ``.ivecs`` (int32),
  ``.bvecs`` (uint8), ``.hdf5`` / ``.h5`` (the "train" dataset).
- ``read_ann_hdf5(path)``: the ann-benchmarks HDF5 layout, as
  ``(train, test, neighbors)``. Needs ``h5py`` (``pip install knndirect[hdf5]``).
- ``write_fvecs``, ``write_ivecs``, ``write_bvecs``: the matching writers.

Synthetic data and evaluation: ``clustered``, ``ground_truth``, ``recall_at_k``.
"""
from __future__ import annotations

import os

import numpy as np

from . import _core

# The C core's metric table by name (csrc/metric.h).
_METRICS = {m["name"]: m for m in _core.METRICS}

__all__ = ["read_vectors", "read_ann_hdf5", "ann_hdf5_metric", "write_fvecs", "write_ivecs",
           "write_bvecs", "clustered", "ground_truth", "recall_at_k"]

# The *vecs formats: each record is a little-endian int32 dim, then dim values.
_VECS_DTYPES = {".fvecs": np.dtype("<f4"), ".ivecs": np.dtype("<i4"), ".bvecs": np.dtype("u1")}
_HDF5_EXTS = (".hdf5", ".h5")
# How many records read_vectors samples to check that every record's dim agrees.
_DIM_SAMPLES = 1024
# Records per write in the *vecs writers (bounds the temporary buffer).
_WRITE_ROWS = 65536


def read_vectors(path, *, mmap=True, column=None):
    """Read a vector file, dispatching on its extension.

    Parameters
    ----------
    path : str or os.PathLike
        ``.npy`` (any dtype and shape, as saved), ``.fvecs`` (float32),
        ``.ivecs`` (int32), ``.bvecs`` (uint8), or ``.hdf5`` / ``.h5``
        (the "train" dataset, as in the ann-benchmarks layout), or
        ``.parquet`` (one column of fixed-size or equal-length lists of
        numbers; needs pyarrow).
    mmap : bool
        True (default): return a read-only memory-mapped view where the
        layout allows (``.npy``; ``*vecs``, as a row-strided view that skips
        each record's dim field; HDF5 datasets stored contiguous and
        uncompressed). False: read everything into a new C-contiguous array.
        For Parquet, True memory-maps the file while it is decoded; a column
        of one chunk without nulls comes back as a view of Arrow's buffer
        (no copy), several chunks are concatenated.
    column : str, optional
        Parquet only: the column to read (default: the file's only column,
        else "embedding").

    Returns
    -------
    numpy.ndarray
        For ``*vecs`` and HDF5, shape (n, dim) with dtype float32 (fvecs),
        int32 (ivecs), uint8 (bvecs) or as stored (HDF5). For ``.npy``, the
        saved array. A memory-mapped result is not C-contiguous for ``*vecs``;
        ``Index.add`` converts it in chunks.

    Raises
    ------
    ValueError
        Unknown extension, or a ``*vecs`` file that is truncated or whose
        records disagree on dim (the message names the file).
    ImportError
        HDF5 without h5py, or Parquet without pyarrow installed.
    """
    path = os.fspath(path)
    ext = os.path.splitext(path)[1].lower()
    if ext == ".npy":
        return np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)
    if ext in _VECS_DTYPES:
        return _read_vecs(path, _VECS_DTYPES[ext], mmap)
    if ext in _HDF5_EXTS:
        h5py = _import_h5py()
        with h5py.File(path, "r") as f:
            if "train" not in f:
                raise ValueError(f"{path} has no 'train' dataset (found: {sorted(f.keys())})")
            return _hdf5_array(path, f["train"], mmap)
    if ext == ".parquet":
        return _read_parquet(path, column, mmap)
    raise ValueError(f"{path}: unknown vector file extension {ext!r}; expected .npy, .fvecs, "
                     f".ivecs, .bvecs, .hdf5, .h5 or .parquet")


def _import_pyarrow():
    try:
        import pyarrow
    except ImportError:
        raise ImportError("reading Parquet needs pyarrow: pip install 'knndirect[parquet]'"
                          ) from None
    return pyarrow


def _read_parquet(path, column, mmap):
    _import_pyarrow()
    import pyarrow.parquet as pq
    names = pq.read_schema(path).names
    if column is None:
        column = names[0] if len(names) == 1 else "embedding"
    if column not in names:
        raise ValueError(f"{path} has no column {column!r} (found: {names})")
    table = pq.read_table(path, columns=[column], memory_map=bool(mmap))
    return _arrow_matrix(table.column(column), f"{path} column {column!r}")


def _arrow_matrix(array, what="column"):
    """An Arrow column of vectors (fixed-size lists, equal-length lists, or a
    tensor extension type such as Ray's) as an (n, dim) NumPy array: a view
    of Arrow's buffer when it is one chunk without nulls, else a copy."""
    pa = _import_pyarrow()
    chunks = array.chunks if isinstance(array, pa.ChunkedArray) else [array]
    parts = [_arrow_chunk_matrix(pa, c, what) for c in chunks]
    parts = [p for p in parts if p.shape[0]] or parts[:1]
    if not parts:
        return np.zeros((0, 0), np.float32)
    dims = {p.shape[1] for p in parts}
    if len(dims) > 1:
        raise ValueError(f"{what}: chunks disagree on the vector length ({sorted(dims)})")
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def _arrow_chunk_matrix(pa, chunk, what):
    if chunk.null_count:
        raise ValueError(f"{what} holds {chunk.null_count} null vectors")
    if isinstance(chunk.type, pa.ExtensionType):
        if hasattr(chunk, "to_numpy"):          # tensor types (Ray's) know their shape
            try:
                a = np.asarray(chunk.to_numpy(zero_copy_only=False))
            except TypeError:
                a = np.asarray(chunk.to_numpy())
            if a.dtype != object:
                return a.reshape(len(chunk), -1)
        chunk = chunk.storage
    n = len(chunk)
    if pa.types.is_fixed_size_list(chunk.type):
        dim = chunk.type.list_size
        values = chunk.flatten()      # honours the chunk's offset
    elif pa.types.is_list(chunk.type) or pa.types.is_large_list(chunk.type):
        lengths = np.asarray(chunk.value_lengths())
        dim = int(lengths[0]) if n else 0
        if n and (lengths != dim).any():
            raise ValueError(f"{what}: lists of different lengths "
                             f"({int(lengths.min())} to {int(lengths.max())})")
        values = chunk.flatten()
    else:
        raise TypeError(f"{what} has type {chunk.type}; expected a list or fixed-size list "
                        "of numbers")
    if values.null_count:
        raise ValueError(f"{what} holds null elements")
    if not (pa.types.is_floating(values.type) or pa.types.is_integer(values.type)):
        raise TypeError(f"{what} holds {values.type}, not numbers")
    flat = values.to_numpy(zero_copy_only=False)
    return flat.reshape(n, dim) if n else flat.reshape(0, dim)


def _read_vecs(path, dtype, mmap):
    size = os.path.getsize(path)
    if size == 0:
        return np.zeros((0, 0), dtype=dtype)
    if size < 4:
        raise ValueError(f"{path} is truncated: {size} bytes, shorter than one dim field")
    with open(path, "rb") as f:
        dim = int(np.frombuffer(f.read(4), dtype="<i4")[0])
    if dim <= 0:
        raise ValueError(f"{path}: first record has dim {dim}; not a {_vecs_name(dtype)} file")
    record = 4 + dim * dtype.itemsize
    if size % record:
        raise ValueError(
            f"{path}: size {size} bytes is not a whole number of {record}-byte records for "
            f"dim {dim}; the file is truncated or its records disagree on dim")
    n = size // record
    # The file as (n, record) bytes; dims and values are views into it.
    raw = np.memmap(path, dtype=np.uint8, mode="r", shape=(n, record))
    sample = np.unique(np.linspace(0, n - 1, min(n, _DIM_SAMPLES)).astype(np.int64))
    dims = np.ascontiguousarray(raw[sample, :4]).view("<i4").ravel()
    bad = np.flatnonzero(dims != dim)
    if bad.size:
        row = int(sample[bad[0]])
        raise ValueError(f"{path}: record {row} has dim {int(dims[bad[0]])}, but record 0 has "
                         f"dim {dim}; all records of a {_vecs_name(dtype)} file must agree")
    if dtype.itemsize == 1:
        values = raw[:, 4:]
    else:
        # Same bytes seen as 4-byte values: (n, dim + 1), column 0 is the dim.
        values = raw.view(dtype)[:, 1:]
    if not mmap:
        out = np.array(values, dtype=dtype.newbyteorder("="), order="C")
        del values, raw
        return out
    return values


def _vecs_name(dtype):
    return {"f": ".fvecs", "i": ".ivecs", "u": ".bvecs"}[dtype.kind]


def _import_h5py():
    try:
        import h5py
    except ImportError:
        raise ImportError("reading HDF5 needs h5py: pip install h5py "
                          "(or pip install 'knndirect[hdf5]')") from None
    return h5py


def _hdf5_array(path, ds, mmap):
    """A dataset as an array: memory-mapped when stored contiguous and
    uncompressed with a plain numeric dtype, else read into memory."""
    if mmap and ds.chunks is None and ds.compression is None and ds.dtype.kind in "fiu" \
            and ds.size > 0:
        offset = ds.id.get_offset()
        if offset is not None:
            return np.memmap(path, dtype=ds.dtype, mode="r", offset=offset, shape=ds.shape)
    return ds[()]


def read_ann_hdf5(path, *, mmap=True):
    """Read an ann-benchmarks HDF5 file.

    Parameters
    ----------
    path : str or os.PathLike
        A file with datasets "train" (n, dim), "test" (nq, dim) and
        "neighbors" (nq, k), and an optional "distance" attribute (see
        ``ann_hdf5_metric``).
    mmap : bool
        Memory-map "train" when it is stored contiguous and uncompressed
        (default True); "test" and "neighbors" are always read into memory.

    Returns
    -------
    (train, test, neighbors) : tuple of numpy.ndarray
        train (n, dim) and test (nq, dim) as stored (float32 in the
        published files); neighbors (nq, k) as stored (int32 in the published
        files): the true nearest ids into train, best first.

    Raises
    ------
    ImportError
        h5py is not installed (``pip install 'knndirect[hdf5]'``).
    ValueError
        A dataset is missing.
    """
    h5py = _import_h5py()
    path = os.fspath(path)
    with h5py.File(path, "r") as f:
        missing = [name for name in ("train", "test", "neighbors") if name not in f]
        if missing:
            raise ValueError(f"{path} is not in the ann-benchmarks layout: missing dataset(s) "
                             f"{missing} (found: {sorted(f.keys())})")
        return _hdf5_array(path, f["train"], mmap), f["test"][()], f["neighbors"][()]


def ann_hdf5_metric(path):
    """The knndirect metric for the "distance" attribute of the
    ann-benchmarks HDF5 file at path: "euclidean" -> "l2", "angular" /
    "cosine" -> "cosine", "dot" / "ip" / "inner_product" -> "ip". Returns
    None when the attribute is absent or unknown. Needs h5py."""
    h5py = _import_h5py()
    with h5py.File(os.fspath(path), "r") as f:
        distance = f.attrs.get("distance")
    if distance is None:
        return None
    if isinstance(distance, bytes):
        distance = distance.decode("utf-8", "replace")
    return {"euclidean": "l2", "l2": "l2", "angular": "cosine", "cosine": "cosine",
            "dot": "ip", "ip": "ip", "inner_product": "ip"}.get(str(distance).lower())


def _write_vecs(path, x, dtype, what):
    x = np.asarray(x)
    if x.ndim != 2:
        raise ValueError(f"{what} needs a 2-d array (n, dim), got shape {x.shape}")
    n, dim = x.shape
    if n and dim == 0:
        raise ValueError(f"{what} needs dim >= 1")
    if dtype.kind in "iu" and x.dtype != dtype:
        if x.dtype.kind not in "iub":
            raise TypeError(f"{what} needs integers, got dtype {x.dtype}")
        info = np.iinfo(dtype)
        if x.size and (x.min() < info.min or x.max() > info.max):
            raise ValueError(f"{what}: values must lie in [{info.min}, {info.max}]")
    record = 4 + dim * dtype.itemsize
    with open(os.fspath(path), "wb") as f:
        for start in range(0, n, _WRITE_ROWS):
            rows = x[start:start + _WRITE_ROWS]
            buf = np.empty((len(rows), record), dtype=np.uint8)
            buf[:, :4] = np.frombuffer(np.int32(dim).astype("<i4").tobytes(), dtype=np.uint8)
            buf[:, 4:] = np.ascontiguousarray(rows, dtype=dtype).view(np.uint8).reshape(
                len(rows), dim * dtype.itemsize)
            f.write(buf.tobytes())


def write_fvecs(path, x):
    """Write x, an array (n, dim), converted to float32, to path as a
    .fvecs file: per row, an int32 dim then dim float32 values."""
    _write_vecs(path, x, _VECS_DTYPES[".fvecs"], "write_fvecs")


def write_ivecs(path, x):
    """Write x, an integer array (n, dim) in int32 range, to path as an
    .ivecs file (for example ground-truth neighbour ids). Values out of
    range raise ValueError, non-integers TypeError."""
    _write_vecs(path, x, _VECS_DTYPES[".ivecs"], "write_ivecs")


def write_bvecs(path, x):
    """Write x, an integer array (n, dim) in [0, 255], to path as a .bvecs
    file (uint8 values). Values out of range raise ValueError, non-integers
    TypeError."""
    _write_vecs(path, x, _VECS_DTYPES[".bvecs"], "write_bvecs")


def clustered(n, dim, *, n_clusters=64, spread=0.5, seed=0):
    """Clustered float32 data with a decaying spectrum: cluster centres and
    within-cluster noise both scale dimension i by 1/sqrt(1 + i/8), as real
    embeddings concentrate their variance in few directions.

    Parameters
    ----------
    n, dim : int
        Number of vectors and their dimension.
    n_clusters : int
        Gaussian clusters the points are drawn around.
    spread : float
        Within-cluster noise relative to the spread of the centres.
    seed : int
        Seed of numpy's default generator; the same arguments give the same
        data.

    Returns
    -------
    numpy.ndarray of float32, shape (n, dim), C-contiguous
    """
    rng = np.random.default_rng(seed)
    scale = (1.0 / np.sqrt(1.0 + np.arange(dim) / 8.0)).astype(np.float32)
    centres = rng.standard_normal((n_clusters, dim), dtype=np.float32) * scale
    out = np.empty((n, dim), dtype=np.float32)
    step = 65536
    for start in range(0, n, step):
        end = min(n, start + step)
        labels = rng.integers(0, n_clusters, end - start)
        noise = rng.standard_normal((end - start, dim), dtype=np.float32)
        out[start:end] = centres[labels] + spread * noise * scale
    return out


def ground_truth(data, queries, k, metric="l2", *, block=4096):
    """Exact top-k by brute force in float64, best first.

    Parameters
    ----------
    data : array_like, shape (n, dim)
    queries : array_like, shape (nq, dim)
    k : int
        Clipped to n.
    metric : {"l2", "ip", "cosine"}
    block : int
        Rows of data scored at a time (bounds the temporary memory).

    Returns
    -------
    ids : numpy.ndarray of int64, shape (nq, min(k, n))
        Row numbers into data (the default ids of an index built from it).
    scores : numpy.ndarray of float64, shape (nq, min(k, n))
        Squared distances (l2, ascending) or similarities (ip, cosine,
        descending).
    """
    info = _METRICS.get(metric)
    if info is None:
        raise ValueError(f"metric must be one of {list(_METRICS)}, got {metric!r}")
    data = np.asarray(data, dtype=np.float32)
    queries = np.asarray(queries, dtype=np.float32)
    if info["normalized"]:
        data = data / np.maximum(np.linalg.norm(data, axis=1, keepdims=True), 1e-30)
        queries = queries / np.maximum(np.linalg.norm(queries, axis=1, keepdims=True), 1e-30)
    k = min(k, len(data))
    best_s = np.full((len(queries), k), np.inf)
    best_i = np.zeros((len(queries), k), dtype=np.int64)
    q64 = queries.astype(np.float64)
    qn = (q64 ** 2).sum(1)[:, None]
    for start in range(0, len(data), block):
        x = data[start:start + block].astype(np.float64)
        ip = q64 @ x.T
        s = qn - 2 * ip + (x ** 2).sum(1)[None] if metric == "l2" else -ip
        s = np.concatenate([best_s, s], axis=1)
        ids = np.concatenate([best_i, np.arange(start, start + len(x))[None].repeat(len(q64), 0)], 1)
        part = np.argpartition(s, k - 1, axis=1)[:, :k]
        best_s = np.take_along_axis(s, part, 1)
        best_i = np.take_along_axis(ids, part, 1)
    order = np.argsort(best_s, axis=1, kind="stable")
    best_s = np.take_along_axis(best_s, order, 1)
    best_i = np.take_along_axis(best_i, order, 1)
    return best_i, (-best_s if info["larger_is_better"] else best_s)


def recall_at_k(found, truth, k=10):
    """Fraction of the true top-k ids found in the first k results, over all
    queries together.

    Parameters
    ----------
    found : array_like of int, shape (nq, >= k)
        Result ids, e.g. the I of ``Index.search``. A missing result (-1)
        finds nothing.
    truth : array_like of int, shape (nq, w)
        True neighbour ids, best first; the first min(k, w) columns count.
        Fewer than k columns (data with fewer than k vectors) and -1 padding
        are allowed: only real ids are counted.
    k : int

    Returns
    -------
    float in [0, 1]: hits / real true ids (1.0 when there are none).

    Raises
    ------
    ValueError
        found or truth is not 2-D, their row counts differ, found has fewer
        than k columns, or k < 1.
    """
    found = np.asarray(found)
    truth = np.asarray(truth)
    if found.ndim != 2 or truth.ndim != 2:
        raise ValueError(f"found and truth must be 2-D (queries x ids), got shapes "
                         f"{found.shape} and {truth.shape}")
    if len(found) != len(truth):
        raise ValueError(f"found has {len(found)} rows but truth has {len(truth)}")
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    if found.shape[1] < k:
        raise ValueError(f"found has {found.shape[1]} columns, fewer than k = {k}")
    hits = total = 0
    for f, t in zip(found[:, :k].tolist(), truth[:, :k].tolist()):
        got = set(f)
        real = [i for i in t if i >= 0]
        total += len(real)
        hits += sum(i in got for i in real)
    return hits / total if total else 1.0
