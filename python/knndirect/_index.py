"""The Python surface of knndirect: argument checking and conversion around
the C core (knndirect._core), which does all the work with the GIL released."""
from __future__ import annotations

import builtins
import math
import mmap
import operator
import os
import warnings

import numpy as np

from . import _core

METRICS = {"l2": 0, "ip": 1, "cosine": 2}
QUANTIZATIONS = {"1bit": 1, "4bit": 4, "8bit": 8}
IO_BACKENDS = {
    "auto": _core.IO_AUTO,
    "io_uring": _core.IO_URING,
    "threads": _core.IO_THREADS,
    "pread": _core.IO_PREAD,
    "mmap": _core.IO_MMAP,
}
PRELOAD_SECTIONS = {
    "graph": (_core.SEC_GRAPH_LEVELS, _core.SEC_GRAPH_LEVEL0, _core.SEC_GRAPH_UPPER),
    "codes": (_core.SEC_CODES,),
    "ids": (_core.SEC_IDS, _core.SEC_DELETED),
    "vectors": (_core.SEC_VECTORS,),
}
FALLBACK_WARNINGS = {
    "no_direct_io": "O_DIRECT is not supported for {path}; vector reads are buffered with "
                    "read-ahead disabled",
    "no_io_uring": "io_uring is unavailable (missing or blocked); vector reads use the "
                   "thread pool",
}
# Adds larger than this are fed to the core in chunks, so that progress is
# reported and Ctrl-C lands between chunks.
ADD_CHUNK = 20000
PROGRESS_CHUNK = 1000


def features() -> dict:
    """What this build and CPU offer: io_uring, avx2, avx512 and the SIMD
    kernel set in use ("simd")."""
    return _core.features()


def _positive_int(value, name, allow_none=True):
    if value is None and allow_none:
        return 0
    try:
        v = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an integer, got {type(value).__name__}") from None
    if v < 1:
        raise ValueError(f"{name} must be at least 1, got {v}")
    return v


def _as_matrix(x, dim, what):
    a = np.asarray(x)
    if a.dtype.kind not in "fiu" and a.dtype != np.bool_:
        raise TypeError(f"{what} must be a numeric array, got dtype {a.dtype}")
    if a.ndim != 2:
        raise ValueError(f"{what} must be a 2-d array of shape (n, {dim}), got shape {a.shape}")
    if a.shape[1] != dim:
        raise ValueError(f"{what} have dim {a.shape[1]}, but the index has dim {dim}")
    return np.ascontiguousarray(a, dtype=np.float32)


def _as_ids(ids, what="ids"):
    a = np.asarray(ids)
    if a.ndim == 0:
        a = a.reshape(1)
    if a.ndim != 1:
        raise ValueError(f"{what} must be a 1-d array, got shape {a.shape}")
    if a.size == 0:
        return np.zeros(0, dtype=np.int64)
    if a.dtype.kind not in "iu":
        raise TypeError(f"{what} must be integers, got dtype {a.dtype}")
    if a.dtype.kind == "u" and a.size and a.max() > np.iinfo(np.int64).max:
        raise ValueError(f"{what} must fit in int64")
    return np.ascontiguousarray(a, dtype=np.int64)


def _progress_callback(progress, total):
    """Turn the progress argument into a callable(done, total) -> bool, and a closer."""
    if progress is None or progress is False:
        return None, None
    if progress is True:
        try:
            from tqdm.auto import tqdm
        except ImportError:
            return None, None
        bar = tqdm(total=total, unit="vec", desc="add")

        def report(done, _total):
            bar.update(done - bar.n)
            return True

        return report, bar.close
    if callable(progress):
        return progress, None
    raise TypeError("progress must be None, True or a callable(done, total) -> bool")


class Index:
    """An HNSW index over 1-bit codes, with float32 re-ranking.

    Parameters
    ----------
    dim : int
        Vector dimension.
    metric : {"l2", "ip", "cosine"}
        "l2" returns squared Euclidean distances (smallest first); "ip" inner
        products and "cosine" cosine similarities (largest first).
    m : int
        Graph degree (level 0 keeps 2*m neighbours).
    ef_construction : int
        Beam width while building.
    quantization : {"1bit", "4bit", "8bit"}
        Code used for the in-RAM graph search: 1-bit codes with corrections
        (smallest), or 4/8-bit scalar codes (closer estimates, smaller
        default oversample).
    seed : int
        Seeds the rotation and the level draws.
    """

    def __init__(self, dim, metric="l2", *, m=16, ef_construction=200, quantization="1bit",
                 seed=0):
        dim = _positive_int(dim, "dim", allow_none=False)
        if metric not in METRICS:
            raise ValueError(f"metric must be one of {sorted(METRICS)}, got {metric!r}")
        if quantization not in QUANTIZATIONS:
            raise ValueError(
                f"quantization must be one of {sorted(QUANTIZATIONS)}, got {quantization!r}")
        m = _positive_int(m, "m", allow_none=False)
        ef_construction = _positive_int(ef_construction, "ef_construction", allow_none=False)
        seed = operator.index(seed)
        if not 0 <= seed < 2**64:
            raise ValueError("seed must be in [0, 2**64)")
        self._attach(_core.Index(dim, METRICS[metric], m, ef_construction,
                                 QUANTIZATIONS[quantization], seed))

    @classmethod
    def _from_core(cls, core, threads=0):
        self = cls.__new__(cls)
        self._attach(core, threads)
        return self

    def _attach(self, core, threads=0):
        self._core = core
        self._threads = threads
        info = core.info()
        self._dim = info["dim"]
        self._metric = info["metric"]

    # -- properties ---------------------------------------------------------
    @property
    def dim(self) -> int:
        """Vector dimension."""
        return self._dim

    @property
    def metric(self) -> str:
        """"l2", "ip" or "cosine"."""
        return self._metric

    def __len__(self) -> int:
        return len(self._core)

    # -- building -----------------------------------------------------------
    def add(self, vectors, ids=None, *, threads=None, progress=None):
        """Add vectors (n, dim), with optional int64 ids (default: 0, 1, 2, ...
        in order of addition). Duplicate ids raise ValueError and add nothing.

        progress: None, True (tqdm when installed) or a callable
        progress(done, total) -> bool that cancels the rest by returning False.
        Ctrl-C interrupts between chunks and leaves the index usable with the
        chunks already added.
        """
        x = _as_matrix(vectors, self._dim, "vectors")
        n = x.shape[0]
        id_arr = None
        if ids is not None:
            id_arr = _as_ids(ids)
            if id_arr.shape[0] != n:
                raise ValueError(f"got {id_arr.shape[0]} ids for {n} vectors")
        elif len(self._core) == 0 and self._core.info()["slots"] == 0:
            id_arr = None
        else:
            start = self._core.info()["slots"]
            id_arr = np.arange(start, start + n, dtype=np.int64)
        nthreads = _positive_int(threads, "threads")
        report, close = _progress_callback(progress, n)
        if report is None and n <= ADD_CHUNK:
            self._core.add(x, id_arr, nthreads)
            return
        if id_arr is None:
            id_arr = np.arange(n, dtype=np.int64)
        if not np.isfinite(x).all():
            bad = int(np.flatnonzero(~np.isfinite(x).all(axis=1))[0])
            raise ValueError(f"vector row {bad} contains NaN or Inf")
        if np.unique(id_arr).shape[0] != n:
            raise ValueError("ids contain a duplicate id")
        if len(self._core) == 0:
            self._core.train(x)
        chunk = max(PROGRESS_CHUNK if report else ADD_CHUNK, n // 100)
        try:
            for start in range(0, n, chunk):
                end = min(n, start + chunk)
                self._core.add(x[start:end], id_arr[start:end], nthreads)
                if report is not None and report(end, n) is False:
                    break
        finally:
            if close is not None:
                close()

    def remove(self, ids):
        """Tombstone ids: they are never returned again. Unknown ids raise
        KeyError and nothing is removed."""
        self._core.remove(_as_ids(ids))

    # -- searching ----------------------------------------------------------
    def search(self, queries, k=10, *, ef=None, oversample=None, rerank=True, filter=None,
               exact=False, threads=None):
        """Search one query (dim,) or a batch (n, dim).

        Returns (D, I): float32 scores and int64 ids, (k,) or (n, k), best
        first. Missing results are I = -1 with D = +inf (l2) or -inf.

        ef: beam width of the graph search (default 64, raised to the
        shortlist). oversample: shortlist = ceil(k * oversample) candidates
        re-scored with float32 (default per quantization and dim, see
        info()["default_oversample"]). rerank=False returns the 1-bit
        estimates. filter: array of allowed ids. exact: brute force.
        threads: native threads for a batch (default: all cores).
        """
        q = np.asarray(queries)
        single = q.ndim == 1
        if single:
            q = q.reshape(1, -1)
        q = _as_matrix(q, self._dim, "queries")
        k = _positive_int(k, "k", allow_none=False)
        ef = _positive_int(ef, "ef")
        if oversample is None:
            oversample = 0.0
        else:
            oversample = float(oversample)
            if not math.isfinite(oversample) or oversample < 1.0:
                raise ValueError(f"oversample must be a finite number >= 1, got {oversample}")
        nthreads = _positive_int(threads, "threads") or self._threads
        allowed = None if filter is None else _as_ids(filter, "filter")
        D, I = self._core.search(q, k, ef, oversample, bool(rerank), bool(exact), nthreads,
                                 allowed)
        if single:
            return D[0], I[0]
        return D, I

    def get_vectors(self, ids):
        """The float32 vectors of ids, as added: an (n, dim) array (a
        row-strided view of an aligned NumPy buffer the reads land in).
        Unknown or removed ids raise KeyError."""
        return self._core.get_vectors(_as_ids(ids))

    # -- storage ------------------------------------------------------------
    def save(self, target):
        """Write the index to a path (atomically: temp file, fsync, rename) or
        to a binary file-like object with .write (sequential writes only)."""
        if isinstance(target, (str, bytes, os.PathLike)):
            self._core.save_path(target)
        elif hasattr(target, "write"):
            self._core.save_file(target)
        else:
            raise TypeError("save target must be a path or a binary file-like object")

    def to_bytes(self) -> bytes:
        """The index file's bytes."""
        return self._core.to_bytes()

    def verify(self) -> bool:
        """Check every checksum of an opened index's file, vectors included.
        Raises ValueError on corruption."""
        return self._core.verify()

    # -- reporting ----------------------------------------------------------
    def info(self) -> dict:
        """dim, metric, count, quantization, m, path, storage, io_backend,
        direct_io, record_size, alignment, resident_bytes, fallbacks, ..."""
        return self._core.info()

    def stats(self, reset=False) -> dict:
        """Counters since open (or the last reset): queries, read_ops,
        read_bytes, rerank_vectors, io_wait_seconds, graph_seconds,
        rerank_seconds, exact_queries."""
        return self._core.stats(bool(reset))

    def close(self):
        """Release memory, mappings and files; later calls raise ValueError."""
        self._core.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __reduce__(self):
        return (load, (self.to_bytes(),))

    def __repr__(self):
        if self._core.closed:
            return "<knndirect.Index (closed)>"
        i = self.info()
        return (f"<knndirect.Index dim={i['dim']} metric={i['metric']!r} count={i['count']} "
                f"quantization={i['quantization']!r} backend={i['io_backend']!r} "
                f"resident={_human_bytes(i['resident_bytes'])}>")


def _human_bytes(n):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def load(source) -> Index:
    """Load an index fully into memory from a path, a binary file-like object
    or a bytes-like object (bytes, memoryview, mmap)."""
    if isinstance(source, (str, bytes, os.PathLike)) and not isinstance(source, bytes):
        with builtins.open(source, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size == 0:
                raise ValueError(f"{os.fspath(source)} is empty, not a knndirect index")
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
                return Index._from_core(_core.load_bytes(mm))
    if hasattr(source, "read") and not isinstance(source, (bytes, bytearray, memoryview)):
        data = source.read()
        if not isinstance(data, (bytes, bytearray)):
            raise TypeError("the file object must be opened in binary mode")
        return Index._from_core(_core.load_bytes(data))
    try:
        view = memoryview(source)
    except TypeError:
        raise TypeError("source must be a path, a binary file-like object or bytes") from None
    return Index._from_core(_core.load_bytes(view))


def open(path, *, direct_io=True, io_backend="auto", io_depth=128, preload=("graph", "codes"),
         threads=None) -> Index:
    """Open an index file for search with its vectors left on disk.

    The graph, codes and ids are memory-mapped (the sections in `preload` are
    pulled into the page cache now, the others are read on demand). Vectors
    are fetched per query as one batch of reads with `io_backend`: "auto"
    (io_uring, else threads), "io_uring", "threads", "pread" (serial baseline)
    or "mmap" (page cache). `io_depth` bounds reads in flight. An opened index
    is read-only for add; remove works in memory.
    """
    if io_backend not in IO_BACKENDS:
        raise ValueError(f"io_backend must be one of {sorted(IO_BACKENDS)}, got {io_backend!r}")
    depth = _positive_int(io_depth, "io_depth", allow_none=False)
    if isinstance(preload, str):
        preload = (preload,)
    mask = 0
    for name in preload or ():
        if name not in PRELOAD_SECTIONS:
            raise ValueError(
                f"preload entries must be among {sorted(PRELOAD_SECTIONS)}, got {name!r}")
        for sec in PRELOAD_SECTIONS[name]:
            mask |= 1 << sec
    nthreads = _positive_int(threads, "threads")
    core = _core.open(os.fspath(path), bool(direct_io), IO_BACKENDS[io_backend], depth, mask)
    index = Index._from_core(core, nthreads)
    for fallback in index.info()["fallbacks"]:
        warnings.warn(FALLBACK_WARNINGS[fallback].format(path=os.fspath(path)), RuntimeWarning,
                      stacklevel=2)
    return index
