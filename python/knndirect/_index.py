"""The Python surface of knndirect: argument checking and conversion around
the C core (knndirect._core), which does all the work with the GIL released."""
from __future__ import annotations

import errno
import io
import math
import operator
import os
import time
import warnings

import numpy as np

from . import _calibration, _core

# Names and codes come from the C core's metric table (csrc/metric.h).
METRICS = {m["name"]: m["code"] for m in _core.METRICS}
QUANTIZATIONS = {"1bit": 1, "4bit": 4, "8bit": 8, "1bit+4bit": 0x41}
IO_BACKENDS = {
    "auto": _core.IO_AUTO,
    "io_uring": _core.IO_URING,
    "threads": _core.IO_THREADS,
    "pread": _core.IO_PREAD,
    "mmap": _core.IO_MMAP,
}
PRELOAD_SECTIONS = {
    "graph": (_core.SEC_GRAPH_LEVELS, _core.SEC_GRAPH_LEVEL0, _core.SEC_GRAPH_UPPER),
    "codes": (_core.SEC_CODES, _core.SEC_REFINE),
    "ids": (_core.SEC_IDS, _core.SEC_DELETED),
    "vectors": (_core.SEC_VECTORS,),
}
FALLBACK_WARNINGS = {
    "no_direct_io": "O_DIRECT is not supported for {path}; vector reads are buffered with "
                    "read-ahead disabled",
    "no_io_uring": "io_uring is unavailable (missing or blocked); vector reads use the "
                   "thread pool",
}
# Large adds are fed to the core in chunks, so that progress is reported and
# Ctrl-C lands between chunks. The core lays out each chunk's rows grouped by
# quantizer centre (docs/design.md, "Rows in centre order"), which pays the
# more the larger the chunk: a chunk holds CHUNK_BYTES of float32 input, and
# at least ADD_CHUNK rows; with progress, 1% of the add and at least
# PROGRESS_CHUNK rows.
ADD_CHUNK = 20000
CHUNK_BYTES = 256 << 20
PROGRESS_CHUNK = 1000
# Rows the quantizer is fitted on when an add is fed in chunks.
TRAIN_SAMPLE = 16384


def _chunk_rows(n, dim, progress):
    """Rows per chunk of an add of n vectors of dimension dim."""
    if progress:
        return max(PROGRESS_CHUNK, n // 100)
    return max(ADD_CHUNK, CHUNK_BYTES // (4 * dim))


def features() -> dict:
    """What this build and CPU offer.

    Returns
    -------
    dict
        ``io_uring`` (bool: the io_uring backend was compiled in; the kernel
        or a container may still block it, see ``info()["fallbacks"]``),
        ``avx2`` and ``avx512`` (bool: CPU support), ``simd`` (str: the
        kernel set in use, e.g. "avx2" or "scalar"), ``estimate`` (str: the
        1-bit code estimator in use, "avx512" where the CPU has VPOPCNTQ,
        else "avx2", "popcnt" or "scalar") and ``format_version``
        (int: the newest index file version this build reads and writes,
        4, for files with 1-bit codes; files with scalar codes are written
        as version 2; ``min_format_version`` is the oldest it reads).
    """
    return _core.features()


# The core takes these as 32-bit unsigned integers; a larger value must not wrap.
UINT32_MAX = 2**32 - 1
# The largest dimension the core accepts (csrc/index.c).
MAX_DIM = 1 << 20


def _positive_int(value, name, allow_none=True, maximum=None):
    if value is None and allow_none:
        return 0
    try:
        v = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an integer, got {type(value).__name__}") from None
    if v < 1:
        raise ValueError(f"{name} must be at least 1, got {v}")
    if maximum is not None and v > maximum:
        raise ValueError(f"{name} must be at most {maximum}, got {v}")
    return v


def _float32(a):
    """C-contiguous float32, without a copy when it already is."""
    return np.ascontiguousarray(a, dtype=np.float32)


def _check_finite(x, chunk, what="vector"):
    """Raise ValueError naming the first row of x holding NaN or Inf.

    Read chunk rows at a time. A row sum is non-finite wherever the row holds
    NaN or Inf, so one reduction clears a chunk; only a chunk whose sums are
    not all finite (a bad row, or finite values overflowing the sum) is
    checked element by element: a boolean copy of every chunk cost 1.2% of a
    544k x 384 build."""
    if x.dtype.kind != "f":
        return
    chunk = max(1, chunk)
    for start in range(0, x.shape[0], chunk):
        part = x[start:start + chunk]
        with np.errstate(over="ignore", invalid="ignore"):
            sums = part.sum(axis=1)
        if np.isfinite(sums).all():
            continue
        finite = np.isfinite(part).all(axis=1)
        if not finite.all():
            raise ValueError(f"{what} row {start + int(np.flatnonzero(~finite)[0])} "
                             "contains NaN or Inf")


def _as_matrix(x, dim, what, convert=True):
    """Check an (n, dim) numeric matrix; convert it unless asked not to (a
    memory-mapped input is then converted chunk by chunk by the caller)."""
    a = np.asarray(x)
    if a.dtype.kind not in "fiu" and a.dtype != np.bool_:
        raise TypeError(f"{what} must be a numeric array, got dtype {a.dtype}")
    if a.ndim != 2:
        raise ValueError(f"{what} must be a 2-d array of shape (n, {dim}), got shape {a.shape}")
    if a.shape[1] != dim:
        raise ValueError(f"{what} have dim {a.shape[1]}, but the index has dim {dim}")
    return _float32(a) if convert else a


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


def _default(threads, default):
    """threads as given, else the default (0: none)."""
    return threads if threads is not None else (default or None)


def _recall_target(recall, ef, oversample):
    """The recall a search aims at: recall as given (checked), the default
    when neither ef nor oversample is given, else None (they are used)."""
    if recall is None:
        return _calibration.DEFAULT_TARGET if ef is None and oversample is None else None
    if ef is not None or oversample is not None:
        raise ValueError("recall= chooses ef and oversample: give recall, or ef/oversample, "
                         "not both")
    try:
        r = float(recall)
    except (TypeError, ValueError):
        raise TypeError(f"recall must be a number, got {type(recall).__name__}") from None
    if not 0.0 < r < 1.0:
        raise ValueError(f"recall must be between 0 and 1 (exclusive), got {recall!r}; "
                         "exact=True gives exact answers")
    return r


def _tune_args(queries, dim, k):
    """tune()'s queries (float32, C order) and k, checked."""
    q = np.asarray(queries)
    q = _as_matrix(q if q.ndim == 2 else q.reshape(1, -1), dim, "queries")
    if q.shape[0] < _calibration.MIN_QUERIES:
        raise ValueError(f"tune needs at least {_calibration.MIN_QUERIES} queries, "
                         f"got {q.shape[0]}")
    _check_finite(q, q.shape[0], "query")
    return _float32(q), _positive_int(k, "k", allow_none=False)


def _uncalibrated(recall, live, remedy="call tune(queries) once"):
    """(ef, oversample, exact) where no calibration exists: ef 64 by default;
    for recall= on a small index an exact search (the 1-bit order misses
    neighbours at any beam), else an error that names the remedy."""
    if recall is None:
        return None, None, False  # small, or from before calibrations
    if live < _calibration.MIN_INDEX:
        return None, None, True
    raise ValueError(f"no recall calibration here (written by an older version): {remedy}")


def _search_args(queries, dim, k, ef, oversample, rerank, exact, threads, filter):
    """Check search arguments: (single, queries as (n, dim) float32, the
    core's arguments after the queries)."""
    q = np.asarray(queries)
    single = q.ndim == 1
    if single:
        q = q.reshape(1, -1)
    q = _as_matrix(q, dim, "queries")
    k = _positive_int(k, "k", allow_none=False)
    ef = _positive_int(ef, "ef")
    if oversample is None:
        oversample = 0.0
    else:
        oversample = float(oversample)
        if not math.isfinite(oversample) or oversample < 1.0:
            raise ValueError(f"oversample must be a finite number >= 1, got {oversample}")
    nthreads = _positive_int(threads, "threads", maximum=UINT32_MAX)
    allowed = None if filter is None else _as_ids(filter, "filter")
    return single, q, (k, ef, oversample, bool(rerank), bool(exact), nthreads, allowed)


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
        Beam width while building: higher builds a better graph, slower
        (100 takes about two thirds of the time of 200 and costs 1-3% of
        the queries per second at recall 0.95 on 100k sets, more recall
        on larger, harder ones).
    quantization : {"1bit", "1bit+4bit", "4bit", "8bit"}
        Code used for the in-RAM graph search: 1-bit codes with corrections
        (smallest); 1-bit codes plus a 4-bit refinement that re-orders the
        beam's best before the shortlist is cut (far fewer reads, pdim/2 + 8
        more bytes a vector); or 4/8-bit scalar codes (closer estimates,
        smaller default oversample).
    seed : int
        Seeds the rotation and the level draws.
    """

    def __init__(self, dim, metric="l2", *, m=16, ef_construction=200, quantization="1bit",
                 seed=0):
        dim = _positive_int(dim, "dim", allow_none=False, maximum=MAX_DIM)
        if metric not in METRICS:
            raise ValueError(f"metric must be one of {list(METRICS)}, got {metric!r}")
        if quantization not in QUANTIZATIONS:
            raise ValueError(
                f"quantization must be one of {sorted(QUANTIZATIONS)}, got {quantization!r}")
        m = _positive_int(m, "m", allow_none=False, maximum=UINT32_MAX)
        ef_construction = _positive_int(ef_construction, "ef_construction", allow_none=False,
                                        maximum=UINT32_MAX)
        seed = operator.index(seed)
        if not 0 <= seed < 2**64:
            raise ValueError("seed must be in [0, 2**64)")
        self._attach(_core.Index(dim, METRICS[metric], m, ef_construction,
                                 QUANTIZATIONS[quantization], seed))

    @classmethod
    def _from_core(cls, core, threads=0, source="new", preload=()):
        self = cls.__new__(cls)
        self._attach(core, threads, source, preload)
        return self

    def _attach(self, core, threads=0, source="new", preload=()):
        self._core = core
        self._threads = threads
        self._source = source
        self._preload = list(preload)
        info = core.info()
        self._dim = info["dim"]
        self._metric = info["metric"]
        self._seed = info["seed"]
        self._on_disk = info["storage"] == "disk"
        self._cal = _calibration.decode(core.calibration())
        self._cal_seconds = None
        self._choices = {}
        self._centres = None  # the quantizer's, once fitted (0: not 1-bit codes)

    def _adopt_quantizer(self, other):
        """Take other's quantizer: the rows held are encoded anew (the graph
        stands) and the table, measured on their old codes, is dropped."""
        self._core.adopt_quantizer(other._core)
        self._cal, self._choices, self._centres = None, {}, None

    # -- recall targets -----------------------------------------------------
    def _set_calibration(self, cal):
        self._core.set_calibration(_calibration.encode(cal) if cal else b"")
        self._cal, self._choices = cal, {}

    def _calibrate(self, queries, k, threads, source, *, truth_of=None, hidden=None,
                   started=None, first=None, serves=None, budget=None):
        """Measure the table on queries (their true neighbours found by brute
        force unless truth_of(lo, hi, depth) gives the depth nearest of
        queries[lo:hi]) and keep
        it. first: measure that many, and the rest only if the table's error
        asks for them, or with budget (seconds) as many as fit in it.
        serves: the count the index will have once the queries (held out of
        it) go in."""
        t0 = started or time.perf_counter()
        q = _float32(queries)
        if truth_of is None:
            def truth_of(lo, hi, depth):
                return self._core.search(q[lo:hi], depth, 0, 0.0, True, True, threads or 0,
                                         None)[1]
        cal = _calibration.measure(self._core, q, truth_of, k, hidden=hidden,
                                   threads=threads or 0, source=source, first=first,
                                   budget=budget)
        if serves is not None and serves > cal["count"]:
            cal["serves"] = int(serves)
        self._set_calibration(cal)
        # Not in the file: a threads=1 build saves the same bytes every time.
        self._cal_seconds = round(time.perf_counter() - t0, 4)

    def _calibrate_hidden(self, threads, source):
        """Measure the table where no vector can be held out (an index that
        exists already): stored vectors as queries, each searched with its
        own node hidden (neither scored nor expanded). The graph was pruned
        around that node, so recall comes out a little low (docs/design.md,
        "Recall targets"): a safe table, not a tight one. Nothing for an
        index under MIN_INDEX vectors."""
        live = np.sort(self._core.live_ids())  # the draw must not follow the layout
        if live.shape[0] < _calibration.MIN_INDEX:
            return
        k = _calibration.K
        rng = np.random.default_rng([self._seed & (2**63 - 1), live.shape[0]])
        ids = rng.choice(live, _calibration.MOST_QUERIES, replace=False)
        t0 = time.perf_counter()
        q = np.ascontiguousarray(self._core.get_vectors(ids))

        def truth_of(lo, hi, depth):
            _, found = self._core.search(q[lo:hi], depth + 1, 0, 0.0, True, True, threads or 0,
                                         None)
            # The truth without the query's own id (or, when duplicates crowd
            # it out of the top depth + 1, without the last).
            keep = found != ids[lo:hi, None]
            keep[keep.all(axis=1), -1] = False
            return found[keep].reshape(hi - lo, depth)

        self._calibrate(q, k, threads, source, truth_of=truth_of, hidden=ids, started=t0,
                        first=_calibration.QUERIES)

    def _measure_if_grown(self, threads):
        """After an add too small to hold queries out: once the index has
        outgrown its table GROWTH times (or reached MIN_INDEX without one),
        measure one on hidden nodes, so that the widening for growth
        (_serves) never stretches past what was measured."""
        if _calibration.due(self._cal, len(self._core)):
            self._calibrate_hidden(threads, "hidden")

    def _holdout(self, n):
        """Positions of an add of n rows to hold out as calibration queries,
        or None when no table is due."""
        before = len(self._core)
        if not _calibration.due(self._cal, before + n):
            return None
        held = _calibration.holdout(n, before + n, self._seed)
        if held is None or before + n - held.shape[0] < _calibration.MIN_INDEX // 2:
            return None
        return held

    def _chosen(self, k, recall, among=None, warn=True):
        """(ef, oversample) of the calibration for recall (None: the default
        target, met with confidence), or None without a calibration. A
        target above every point the table measured gets the best one and,
        with warn, a RuntimeWarning, once (a choice made without warn warns
        when next taken with it).

        A build measures its table before its held-out queries go in, so the
        table overstates the whole index's recall: with more vectors
        competing for a shortlist, the same true neighbours sit deeper in it
        (2,000 vectors, 200 held out: by 0.005-0.02 at the default's point,
        which fell to 0.933-0.940 on 5 of 16 graphs). The default's
        shortlist is therefore widened by the count the table serves over
        the count it was measured at, to the nearest row (the rule a
        collection applies across its segments). Adds since the table widen
        the shortlist and the beam further in the core (``_serves``), which
        reads the live count under the search's lock: a search's parameters
        always match the graph it searched, whatever adds run beside it.

        A target given with recall= is an estimate to within +-TOLERANCE,
        not a bound: it is read from the table stretched for the live count
        (_calibration.grown: the shortlist by the growth to the power of
        the depth the table measured, every length measured or read
        between), not widened after
        the choice (widened, the short lists of k=10 round up to overshoot
        by 0.015-0.04; benchmarks/calibration_seeds.py --n 2000). among, a
        collection's live count, is what competes for the shortlist: the
        table is stretched for it, the beam for this graph's own growth."""
        if self._cal is None:
            return None
        growth = None if recall is None else self._growth()
        shared = None if among is None else self._growth(among)
        key = (recall, k, growth, shared)
        got = self._choices.get(key)
        if got is None:
            unmet = None
            if recall is None:
                ef, oversample = _calibration.choose(self._cal, _calibration.DEFAULT_TARGET,
                                                     k, sure=True)[:2]
                grown = self._serves() / self._cal["count"]
                if grown > 1:
                    length = math.ceil(k * oversample - 1e-9)
                    oversample = max(length, round(length * grown)) / k
            else:
                ef, oversample, expect = _calibration.choose_grown(self._cal, recall, k,
                                                                   shared or growth, growth)
                if expect < recall - 5e-5:  # expect is rounded to 4 digits
                    unmet = expect
            got = self._choices[key] = ef, oversample, unmet
        ef, oversample, unmet = got
        if warn and unmet is not None:
            self._choices[key] = ef, oversample, None
            # No ef or oversample in it: a collection may widen them further.
            warnings.warn(
                f"recall={recall} is above the best recall this index's calibration "
                f"measured ({unmet:.4f}): the search runs at that point (info()"
                "['calibration'] lists them); give ef and oversample to search wider, "
                "or exact=True for exact answers", RuntimeWarning, stacklevel=4)
        return ef, oversample

    def _growth(self, count=None):
        """The live count (or count) over the table's, in thousandths
        rounded up (one recall= choice per 0.1% of growth)."""
        count = len(self._core) if count is None else count
        return math.ceil(1000 * count / self._cal["count"] - 1e-6) / 1000

    def _quantizer_fits(self, count):
        """Whether the quantizer has the centres one fitted on half of count
        vectors would (the rule a collection refits its first segment by):
        with fewer, code estimates err by more than the nearest
        neighbours' spacing at that count, and a table measured here says
        less of how deep they sit among count vectors."""
        if self._centres is None:
            info = self._core.info()  # fixed once fitted or adopted
            if not info["centres"]:
                return True           # not fitted: nothing is encoded yet
            self._centres = info["centres"] if info["quantization"].startswith("1bit") else 0
        return not self._centres or self._centres >= _core.quantizer_centres(count // 2)

    def _serves(self):
        """The count the default's beam and shortlist were chosen for: more
        live vectors than this widen the shortlist in proportion and the
        beam by the square root, in the core. Grown from 10,526 to 20,000 x
        64 by adds, the lowest recall of 8 graphs a metric was 0.892-0.921
        unwidened and 0.952-0.970 widened (benchmarks/calibration_seeds.py
        --grow 1.9); the shortlist alone gave 0.922-0.948 at 1.95 times."""
        return self._cal.get("serves", self._cal["count"])

    def _widened(self, k, recall, warn=True):
        """(ef, oversample) that a search for recall uses at this moment:
        the default's widened for adds since its table (the core's rule),
        a recall= target's as chosen (warn: as _chosen); None without a
        table."""
        chosen = self._chosen(k, recall, warn=warn)
        if chosen is None or recall is not None:
            return chosen
        ef, length = self._core.search_widths(k, *chosen, serves=self._serves())
        return ef, length / k

    def _search_params(self, k, ef, oversample, recall):
        """(ef, oversample, exact, serves) for a search: a recall target
        read from the calibration; ef/oversample as given otherwise.
        serves (0: none) widens the default's beam and shortlist for
        growth since its table."""
        if _recall_target(recall, ef, oversample) is None:
            return ef, oversample, False, 0
        chosen = self._chosen(k, recall)
        if not chosen:
            return (*_uncalibrated(recall, len(self._core)), 0)
        return (*chosen, False, self._serves() if recall is None else 0)

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
        """Number of live vectors (added minus removed)."""
        return len(self._core)

    # -- building -----------------------------------------------------------
    def add(self, vectors, ids=None, *, threads=None, progress=None):
        """Add vectors to the graph.

        Parameters
        ----------
        vectors : array_like, shape (n, dim)
            Any real dtype and layout; float32 C-contiguous arrays are used
            without a copy, others are converted once. NaN or Inf raise
            ValueError.
        ids : array_like of int, shape (n,), optional
            int64 ids. Default: 0, 1, 2, ... continuing from the vectors
            already added. An id already present, or repeated, raises
            ValueError and adds nothing.
        threads : int, optional
            Build threads (default: all cores).
        progress : None, True or callable
            True shows a tqdm bar when tqdm is installed; a callable
            ``progress(done, total) -> bool`` is called after each chunk and
            cancels the rest by returning False.

        Large adds run in chunks of about 256 MiB (with progress, 1% of
        the add); Ctrl-C (KeyboardInterrupt) stops between chunks and leaves
        the index usable, holding the chunks already added. Each chunk's rows
        are stored grouped by quantizer centre, which speeds searches;
        progress's smaller chunks group less.
        An index from ``open`` is read-only for add.
        """
        began = time.perf_counter()
        x = _as_matrix(vectors, self._dim, "vectors", convert=False)
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
        nthreads = _positive_int(threads, "threads", maximum=UINT32_MAX)
        report, close = _progress_callback(progress, n)
        held = self._holdout(n)
        chunk = _chunk_rows(n, self._dim, report is not None)
        if report is None and n <= chunk and held is None:
            self._core.add(_float32(x), id_arr, nthreads)
            self._measure_if_grown(nthreads)
            return
        # In chunks: check everything first, so that a bad row or id adds
        # nothing; convert chunk by chunk, so a memory-mapped input is never
        # copied whole.
        if id_arr is None:
            id_arr = np.arange(n, dtype=np.int64)
        _check_finite(x, chunk)
        uniq, counts = np.unique(id_arr, return_counts=True)
        if uniq.shape[0] != n:
            raise ValueError(f"duplicate id {int(uniq[counts > 1][0])} in ids")
        present = self._core.contains(id_arr)
        if present.any():
            raise ValueError(f"duplicate id {int(id_arr[present][0])}: already in the index")
        if len(self._core) == 0 and self._core.info()["slots"] == 0:
            sample = np.unique(np.linspace(0, n - 1, min(n, TRAIN_SAMPLE)).astype(np.int64))
            self._core.train(_float32(x[sample]))
        if n > chunk:
            # The arrays grow once, to their size: doubling chunk by chunk
            # moved them twice in a 544k x 384 add (0.9 s of 44).
            self._core.reserve(n)
        # Calibration queries (held) go in last, after the table is measured
        # on them: vectors of this very data that the graph has not seen.
        keep = None
        if held is not None:
            keep = np.ones(n, bool)
            keep[held] = False
        done = 0
        # The chunks that skip held rows are gathered into one buffer: a
        # fresh copy of each cost its page faults again (2% of a 544k x 384
        # build).
        gathered = None if keep is None else np.empty((min(n, chunk), self._dim), np.float32)
        try:
            for start in range(0, n, chunk):
                end = min(n, start + chunk)
                if keep is None:
                    rows = slice(start, end)
                    part = _float32(x[rows])
                else:
                    rows = np.arange(start, end)[keep[start:end]]
                    part = gathered[:rows.shape[0]]
                    if x.dtype == np.float32:
                        np.take(x, rows, axis=0, out=part, mode="clip")  # unbuffered
                    else:
                        part[...] = x[rows]
                self._core.add(part, id_arr[rows], nthreads)
                done = end
                if report is not None and report(end, n) is False:
                    break
            if held is not None and done == n:
                # One thread: the reproducible build, whose table must not
                # follow the clock (the error rule alone decides).
                one = (nthreads or os.cpu_count() or 1) == 1
                budget = None if one else _calibration.BUDGET * (time.perf_counter() - began)
                self._calibrate(x[held], _calibration.K, nthreads, "build",
                                first=_calibration.QUERIES,
                                serves=len(self._core) + held.shape[0], budget=budget)
            elif held is None and done == n:
                self._measure_if_grown(nthreads)
        finally:
            # Whatever happened, the index holds exactly the chunks done, held
            # rows included. A chunk is done when its rows are in: Ctrl-C can
            # land after a chunk's add returned, before `done` counted it.
            if held is not None:
                starts = held // chunk * chunk
                probe = starts + np.array([np.argmax(keep[s:s + chunk]) for s in starts])
                back = held[self._core.contains(id_arr[probe])]
                if back.size:
                    self._core.add(_float32(x[back]), id_arr[back], nthreads)
            if close is not None:
                close()

    def remove(self, ids):
        """Tombstone ids: they are never returned again.

        Parameters
        ----------
        ids : int or array_like of int, shape (n,)
            Ids to remove. An unknown or already removed id raises KeyError
            and nothing is removed.
        """
        self._core.remove(_as_ids(ids))

    # -- searching ----------------------------------------------------------
    def search(self, queries, k=10, *, ef=None, oversample=None, recall=None, rerank=True,
               filter=None, exact=False, threads=None):
        """Search one query or a batch; the GIL is released throughout.

        Parameters
        ----------
        queries : array_like, shape (dim,) or (n, dim)
            One query or a batch (converted to float32).
        k : int
            Results per query. k larger than the index is fine: the tail is
            padded.
        ef : int, optional
            Beam width of the graph search over codes (at least k). The
            shortlist is drawn from every node the search scores, so ef and
            oversample are independent. Giving ef or oversample turns the
            recall target off; the one not given takes the fixed default
            (ef 64; oversample per quantization and dim).
        oversample : float >= 1, optional
            Shortlist = ceil(k * oversample) candidates re-scored with the
            float32 vectors.
        recall : float in (0, 1), optional
            Aim at this recall@k: ef and oversample are read from the
            index's calibration (``info()["calibration"]``), the cheapest
            measured pair that reaches it. Without ef, oversample or recall
            a search aims at 0.95 with 95% confidence. An index without a
            calibration (fewer than 1,000 vectors; a file written before
            calibrations existed) searches with ef 64 by default; with
            recall given, a small one is searched exactly and a
            large one raises ValueError until ``tune`` is called.
        rerank : bool
            False returns the quantized estimates, with no vector reads.
        filter : array_like of int, optional
            Allowed ids; results honour it exactly.
        exact : bool
            Brute force over all live (or filtered) vectors.
        threads : int, optional
            Native threads for a batch (default: all cores, or the value
            given to ``open``).

        Returns
        -------
        D : numpy.ndarray of float32, shape (k,) or (n, k)
            Squared L2 distances (l2, ascending), or inner products / cosine
            similarities (ip, cosine, descending).
        I : numpy.ndarray of int64, shape (k,) or (n, k)
            Ids, best first. Missing results are I = -1 with D = +inf (l2) or
            -inf (ip, cosine).
        """
        serves = 0
        if not exact:
            ef, oversample, exact, serves = self._search_params(k, ef, oversample, recall)
        single, q, args = _search_args(queries, self._dim, k, ef, oversample, rerank, exact,
                                       _default(threads, self._threads), filter)
        D, I = self._core.search(q, *args, serves=serves)
        if single:
            return D[0], I[0]
        return D, I

    def tune(self, queries, k=10, *, threads=None):
        """Measure the recall calibration again on your own queries.

        Their true neighbours are found by brute force (on disk: one pass
        over the vectors), then each query is searched over a ladder of
        beam widths and shortlist lengths. The table replaces the stored
        one; ``save`` keeps it in the file (an index from ``open`` keeps it
        in memory until closed). Adds that double the index measure it again
        (on held-out vectors of the data, or on hidden nodes for adds too
        small to hold any out); short of that, the default search widens
        its beam and shortlist for the growth.

        Parameters
        ----------
        queries : array_like, shape (n, dim)
            At least 50 queries, like the ones the index will serve; 200 to
            1,000 give a table within about +-0.01 of the truth.
        k : int
            The k the table is measured at (searches with a larger k widen
            the beam in proportion).
        threads : int, optional

        Returns
        -------
        dict
            ``info()["calibration"]``.
        """
        q, k = _tune_args(queries, self._dim, k)
        if len(self._core) <= k:
            raise ValueError(f"tune needs an index of more than k = {k} vectors")
        nthreads = _positive_int(_default(threads, self._threads), "threads",
                                 maximum=UINT32_MAX)
        self._calibrate(q, k, nthreads, "tune")
        return self.info()["calibration"]

    def get_vectors(self, ids):
        """The stored vectors of ids, as added (also for cosine).

        Parameters
        ----------
        ids : int or array_like of int, shape (n,)

        Returns
        -------
        numpy.ndarray of float32, shape (n, dim)
            A row-strided view of the aligned buffer the batch read lands in.
            Unknown or removed ids raise KeyError.
        """
        return self._core.get_vectors(_as_ids(ids))

    # -- storage ------------------------------------------------------------
    def save(self, target):
        """Write the index file.

        Parameters
        ----------
        target : str, os.PathLike or binary file-like
            A path is written atomically: a temporary file ``PATH.tmp-*`` in
            the same directory, fsync, rename. On any failure (ENOSPC, an
            exception) the temporary file is removed and an index already at
            the path is left untouched; a process killed mid-save can leave
            the temporary file behind, never a torn index. A file-like object
            only needs ``.write``: the index is written as one sequential
            stream in chunks of at most 8 MiB (a pipe or socket works), with
            the GIL taken only per chunk. What a failed save already wrote to
            a file-like object stays there.
        """
        if isinstance(target, (str, bytes, os.PathLike)):
            self._core.save_path(target)
        elif hasattr(target, "write"):
            self._core.save_file(target)
        else:
            raise TypeError("save target must be a path or a binary file-like object")

    def to_bytes(self) -> bytes:
        """The index file as bytes (what ``save`` would write); ``load``
        reads it back."""
        return self._core.to_bytes()

    def verify(self) -> bool:
        """Check every checksum of the index file, vector section included
        (``open`` checks the metadata sections, and reads vectors lazily).
        An index from ``load`` had every checksum checked while it was read
        and has no file behind it: verify() returns True.

        Returns
        -------
        bool
            True. Corruption raises CorruptIndexError (a ValueError) naming the
            section.
        """
        return self._core.verify()

    # -- reporting ----------------------------------------------------------
    def info(self) -> dict:
        """A dict describing the index.

        Keys: dim, metric, count (live vectors), slots (added, including
        removed), quantization, m, ef_construction, seed, path (None in
        memory), storage ("memory" or "disk"), io_backend (the backend in use;
        "memory" when loaded), direct_io (bool), record_size (bytes per
        stored vector record), code_size (bytes per code), alignment (bytes;
        reads are rounded to it), resident_bytes (memory the index holds in
        RAM), default_oversample, default_ef, fallbacks (list of str:
        "no_direct_io", "no_io_uring"), source (where the index came from:
        "new" for one built here, "path" for ``open`` or ``load`` of a path,
        "file" for ``load`` of a file-like object, "bytes" for ``load`` of a
        bytes-like object or an unpickled index; whenever storage is
        "memory" the vectors are held in RAM) and preload (the sections
        ``open`` read into the page cache; [] otherwise).
        """
        info = self._core.info()
        info["source"] = self._source
        info["preload"] = list(self._preload)
        info["calibration"] = None
        if self._cal is not None:
            info["calibration"] = _calibration.curve(self._cal, self._growth())
            if self._cal_seconds is not None:
                info["calibration"]["seconds"] = self._cal_seconds
            info["default_ef"], info["default_oversample"] = self._widened(self._cal["k"], None)
        return info

    def stats(self, reset=False) -> dict:
        """Counters since open, load or the last reset, as a dict.

        Parameters
        ----------
        reset : bool
            Zero the counters after reading them.

        Returns
        -------
        dict
            queries, exact_queries, read_ops, read_bytes (int),
            rerank_vectors (int: records fetched to re-score, early_unused
            included), early_reads (int:
            records read while the graph search was still running, with
            io_uring: up to three quarters of the shortlist for a search
            alone, half while other searches are in flight), early_unused
            (int: of those, records that the final shortlist did not keep;
            read, not scored), refined (int: candidates re-estimated from
            their 4-bit refinements, quantization "1bit+4bit"), scored (int:
            code distances the graph searches computed), and
            io_wait_seconds, graph_seconds, rerank_seconds (float). Bytes read
            per query, ``read_bytes / queries``, compares with the ideal
            ``rerank_vectors / queries * info()["record_size"]``.
        """
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

    def _repr_html_(self):
        """A table for notebooks: dim, metric, count, quantization, backend,
        resident memory (and path, O_DIRECT and fallbacks when opened)."""
        import html

        if self._core.closed:
            return "<p><b>knndirect.Index</b> (closed)</p>"
        i = self.info()
        rows = [("dim", i["dim"]), ("metric", i["metric"]), ("count", f"{i['count']:,}"),
                ("quantization", i["quantization"]), ("m", i["m"]),
                ("backend", i["io_backend"]),
                ("resident memory", _human_bytes(i["resident_bytes"])),
                ("vector record", f"{i['record_size']:,} B, alignment {i['alignment']:,} B")]
        if i.get("path"):
            rows += [("path", i["path"]), ("O_DIRECT", "yes" if i["direct_io"] else "no")]
        if i.get("fallbacks"):
            rows.append(("fallbacks", ", ".join(i["fallbacks"])))
        body = "".join(f"<tr><th style='text-align:left'>{html.escape(str(k))}</th>"
                       f"<td style='text-align:left'>{html.escape(str(v))}</td></tr>"
                       for k, v in rows)
        return f"<div><b>knndirect.Index</b><table>{body}</table></div>"


def _human_bytes(n):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def _remaining(f):
    """Bytes left in a seekable file object, or -1 when unknown."""
    try:
        if f.seekable():
            pos = f.tell()
            end = f.seek(0, os.SEEK_END)
            f.seek(pos)
            return max(end - pos, 0)
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        pass
    return -1


def load(source) -> Index:
    """Load an index fully into memory (vectors included).

    Parameters
    ----------
    source : str, os.PathLike, bytes-like or binary file-like
        A path; bytes / bytearray / memoryview / mmap / any object with the
        buffer protocol; or an object with ``readinto()`` (or ``read()``)
        returning bytes, read front to back in chunks of at most 8 MiB with
        the GIL taken only per chunk (a pipe or socket works; the stream is
        left just past the index).

    Returns
    -------
    Index
        A writable index: add, remove, search and save all work. Every
        checksum is verified while reading, vectors included; a truncated,
        corrupted or foreign source raises CorruptIndexError (a ValueError), a
        failing one OSError.
        Memory: the index itself plus a 1 MiB read-ahead buffer; the source
        is never copied whole. ``info()["source"]`` says where it came from.
    """
    if isinstance(source, (str, os.PathLike)):
        return Index._from_core(_core.load_path(os.fspath(source)), source="path")
    if isinstance(source, io.TextIOBase):
        raise TypeError("the file object must be opened in binary mode")
    try:
        view = memoryview(source)
    except TypeError:
        view = None
    if view is not None:
        with view:
            return Index._from_core(_core.load_bytes(view), source="bytes")
    if hasattr(source, "readinto") or hasattr(source, "read"):
        return Index._from_core(_core.load_file(source, _remaining(source)), source="file")
    raise TypeError("source must be a path, a bytes-like object or a binary file-like object, "
                    f"got {type(source).__name__}")


def open(path, *, direct_io=True, io_backend="auto", io_depth=128, preload=("graph", "codes"),
         threads=None) -> Index:
    """Open an index file for search with its vectors left on disk.

    The graph, codes and ids are memory-mapped; vectors are fetched per query
    as one batch of reads into an aligned NumPy buffer.

    Parameters
    ----------
    path : str or os.PathLike
        The index file, or a collection's directory (then the
        :class:`knndirect.Collection`, read-only, with these options applied
        to every segment).
    direct_io : bool
        Read vectors with O_DIRECT (default). Where the filesystem refuses it
        (tmpfs, some overlays), reads are buffered with read-ahead disabled,
        a RuntimeWarning is issued and ``info()["fallbacks"]`` says so.
    io_backend : {"auto", "io_uring", "threads", "pread", "mmap"}
        "auto" takes io_uring and falls back to the thread pool when io_uring
        is missing or blocked; "pread" is one synchronous read per vector
        (the baseline); "mmap" reads through the page cache.
    io_depth : int
        Reads in flight at most (default 128), independent of threads.
    preload : iterable of {"graph", "codes", "ids", "vectors"}, or str
        Sections pulled into the page cache while the index opens (default
        graph and codes); the others are mapped with MADV_RANDOM and read a
        4 KiB page at a time on demand. Preloading pays when the page cache
        can hold what it loads; when memory is tight it only evicts pages
        that are needed, so pass ``()``. "vectors" helps only the buffered
        backends ("mmap", or the no-O_DIRECT fallback): O_DIRECT reads never
        look at the page cache, so it is ignored otherwise.
        ``info()["preload"]`` lists what was preloaded.
    threads : int, optional
        Default native threads for batch searches (default: all cores).

    Returns
    -------
    Index
        Read-only for add; remove works in memory. Close it (or use
        ``with``) to release the file and mappings.
    """
    if os.path.isdir(path):
        from ._collection import Collection, is_collection
        if not is_collection(path):
            raise IsADirectoryError(errno.EISDIR, "a directory, but not a knndirect collection "
                                    "(no manifest)", os.fspath(path))
        return Collection.open(path, direct_io=direct_io, io_backend=io_backend,
                               io_depth=io_depth, preload=preload, threads=threads)
    if io_backend not in IO_BACKENDS:
        raise ValueError(f"io_backend must be one of {sorted(IO_BACKENDS)}, got {io_backend!r}")
    depth = _positive_int(io_depth, "io_depth", allow_none=False, maximum=UINT32_MAX)
    if isinstance(preload, str):
        preload = (preload,)
    mask = 0
    for name in preload or ():
        if name not in PRELOAD_SECTIONS:
            raise ValueError(
                f"preload entries must be among {sorted(PRELOAD_SECTIONS)}, got {name!r}")
        for sec in PRELOAD_SECTIONS[name]:
            mask |= 1 << sec
    nthreads = _positive_int(threads, "threads", maximum=UINT32_MAX)
    core = _core.open(os.fspath(path), bool(direct_io), IO_BACKENDS[io_backend], depth, mask)
    done = [name for name in PRELOAD_SECTIONS if name in (preload or ())]
    if "vectors" in done and core.info()["direct_io"]:
        done.remove("vectors")
    index = Index._from_core(core, nthreads, source="path", preload=done)
    for fallback in index.info()["fallbacks"]:
        warnings.warn(FALLBACK_WARNINGS[fallback].format(path=os.fspath(path)), RuntimeWarning,
                      stacklevel=2)
    return index
