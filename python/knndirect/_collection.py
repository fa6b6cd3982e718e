"""Collections: a directory of immutable index files (segments), per-segment
tombstone files and one manifest per commit.

    DIR/LOCK                         held (flock) by the one writer
    DIR/manifest-<gen>.json          the commit: segments, tombstones, quantizer
    DIR/seg-<n>.kdx                  a segment: an ordinary index file
    DIR/seg-<n>.kdx.del-<gen>        ids removed from seg-<n>, as of commit <gen>
    DIR/quantizer-<n>.kdx            an empty index holding the shared quantizer
    DIR/tune-<n>.f32                 the queries of the last tune(), if any

A commit writes every new file first (each fsynced), then the manifest by
rename, then fsyncs the directory: the newest manifest is always whole, and
whatever it does not name is an orphan of a crash, removed at the next
writable open. Adds go to an in-memory write buffer (an Index, searchable at
once) that becomes a segment at commit or when it fills memory_budget.
"""
from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import threading
import warnings
import weakref
import zlib

import numpy as np

from . import _calibration, _core
from ._container import append_calibration
from ._core import CorruptIndexError
from ._index import (
    Index, _as_ids, _as_matrix, _check_finite, _default, _float32, _positive_int,
    _progress_callback, _recall_target, _search_args, _tune_args, _uncalibrated, UINT32_MAX,
)
from ._index import TRAIN_SAMPLE
from ._index import open as _open_index

MANIFEST_FORMAT = "knndirect-collection"
MANIFEST_VERSION = 1
TOMBSTONE_MAGIC = b"KDTOMB01"
TUNE_MAGIC = b"KDTUNE01"
MERGE_POLICIES = (None, "tiered")
# Tiered policy: merge this many segments of one size tier (tiers grow by
# the same factor), and rewrite a segment alone once this share is removed.
TIER_FACTOR = 4
EXPUNGE_SHARE = 0.3
# A reader retries when the commit it read is replaced while it opens it.
OPEN_ATTEMPTS = 50

_MANIFEST_RE = re.compile(r"^manifest-(\d{12})\.json$")
_OURS_RE = re.compile(r"^(manifest-\d{12}\.json|seg-\d{6}\.kdx|seg-\d{6}\.kdx\.del-\d{12}|"
                      r"quantizer-\d{6}\.kdx|tune-\d{6}\.f32)(\.tmp.*)?$")
_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1000, "kib": 1 << 10, "m": 1 << 20, "mb": 10**6,
          "mib": 1 << 20, "g": 1 << 30, "gb": 10**9, "gib": 1 << 30, "t": 1 << 40,
          "tb": 10**12, "tib": 1 << 40}


class CollectionLockedError(RuntimeError):
    """A second writable open of a collection that already has a writer."""


def parse_bytes(value, what="memory_budget") -> int:
    """Bytes from an int or a string such as "512MiB", "1GiB", "2 GB"."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        n = int(value)
    elif isinstance(value, str):
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", value)
        if not m or m.group(2).lower() not in _UNITS:
            raise ValueError(f"{what} must be bytes or a size such as '1GiB', got {value!r}")
        n = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    else:
        raise TypeError(f"{what} must be an int or a string such as '1GiB', got "
                        f"{type(value).__name__}")
    if n < 1 << 16:
        raise ValueError(f"{what} must be at least 64 KiB, got {n} bytes")
    return n


# -- files: names, durable writes ---------------------------------------------

def _seg_name(n):
    return f"seg-{n:06d}.kdx"


def _manifest_name(gen):
    return f"manifest-{gen:012d}.json"


def _fsync_dir(path):
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_durable(path, data: bytes):
    """Temporary file, fsync, rename (the directory is fsynced by the commit)."""
    tmp = f"{path}.tmp-{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        os.unlink(tmp)
        raise
    os.close(fd)
    os.rename(tmp, path)


def _checksum(doc) -> int:
    body = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    return zlib.crc32(body)


def _encode_manifest(doc) -> bytes:
    doc = dict(doc)
    doc["checksum"] = _checksum(doc)
    return (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode()


def _read_json_manifest(path, fmt, version, what):
    """A manifest written by _encode_manifest, checked: its format, its
    checksum (CorruptIndexError) and its version (ValueError)."""
    try:
        with open(path, "rb") as f:
            doc = json.loads(f.read())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CorruptIndexError(f"{what} {path} is damaged: {e}") from None
    if not isinstance(doc, dict) or doc.get("format") != fmt:
        raise CorruptIndexError(f"{path} is not a {what}")
    want = doc.pop("checksum", None)
    if want != _checksum(doc):
        raise CorruptIndexError(f"{what} {path} is damaged (checksum mismatch)")
    if doc.get("version") != version:
        raise ValueError(f"{what} {path} has version {doc.get('version')}; "
                         f"this build reads version {version}")
    return doc


def _read_manifest(path):
    return _read_json_manifest(path, MANIFEST_FORMAT, MANIFEST_VERSION,
                               "knndirect collection manifest")


def _write_tombstones(path, ids: np.ndarray):
    ids = np.ascontiguousarray(np.sort(ids), dtype="<i8")
    head = TOMBSTONE_MAGIC + np.uint64(ids.size).astype("<u8").tobytes()
    body = head + ids.tobytes()
    _write_durable(path, body + np.uint32(zlib.crc32(body)).astype("<u4").tobytes())


def _read_tombstones(path) -> np.ndarray:
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 20 or data[:8] != TOMBSTONE_MAGIC:
        raise CorruptIndexError(f"tombstone file {path} is damaged or foreign")
    n = int(np.frombuffer(data, "<u8", 1, 8)[0])
    if len(data) != 16 + 8 * n + 4:
        raise CorruptIndexError(f"tombstone file {path} is truncated")
    if int(np.frombuffer(data, "<u4", 1, 16 + 8 * n)[0]) != zlib.crc32(data[:16 + 8 * n]):
        raise CorruptIndexError(f"tombstone file {path} is damaged (checksum mismatch)")
    return np.frombuffer(data, "<i8", n, 16).astype(np.int64)


def _write_tune(path, queries: np.ndarray, k: int):
    q = np.ascontiguousarray(queries, dtype="<f4")
    head = TUNE_MAGIC + np.array([q.shape[0], q.shape[1], k], "<u4").tobytes()
    body = head + q.tobytes()
    _write_durable(path, body + np.uint32(zlib.crc32(body)).astype("<u4").tobytes())


def _read_tune(path, dim):
    """(queries, k) of a tune file."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 24 or data[:8] != TUNE_MAGIC:
        raise CorruptIndexError(f"tune file {path} is damaged or foreign")
    n, d, k = (int(x) for x in np.frombuffer(data, "<u4", 3, 8))
    end = 20 + 4 * n * d
    if d != dim or len(data) != end + 4:
        raise CorruptIndexError(f"tune file {path} is truncated or of another dim")
    if int(np.frombuffer(data, "<u4", 1, end)[0]) != zlib.crc32(data[:end]):
        raise CorruptIndexError(f"tune file {path} is damaged (checksum mismatch)")
    return np.frombuffer(data, "<f4", n * d, 20).reshape(n, d).astype(np.float32), k


def _calibrate_new_segment(index, tune, threads):
    """A segment about to be written gets its table: on the queries of
    tune() where one was made; else it keeps the one its adds measured if
    that serves all its vectors, or (adds since, adds too small to hold
    queries out, a merge's output) one measured on hidden nodes. A
    collection's search does not widen a segment's pick for growth since
    its table, as Index.search does, so a segment's table must fit it."""
    if tune is not None and len(index) > tune[1]:
        index._calibrate(*tune, threads, "tune")
    elif index._cal is None or len(index) > index._serves():
        index._calibrate_hidden(threads, "hidden")


def _doc_files(doc):
    """Every file a commit names, its manifest included."""
    out = {_manifest_name(doc["generation"])}
    if doc["quantizer"]:
        out.add(doc["quantizer"])
    if doc.get("tune"):
        out.add(doc["tune"]["file"])
    for e in doc["segments"]:
        out.add(e["name"])
        if e["tombstones"]:
            out.add(e["tombstones"])
    return out


def is_collection(path) -> bool:
    """True when path is a directory holding a collection manifest."""
    return os.path.isdir(path) and _newest_generation(path) is not None


def _newest_generation(path):
    gens = [int(m.group(1)) for m in map(_MANIFEST_RE.match, os.listdir(path)) if m]
    return max(gens) if gens else None


# -- segment files in use by this process --------------------------------------
# A replaced segment's files are deleted only when no handle of this process
# (a reader's snapshot, a search in flight) still has them open.

_files_lock = threading.Lock()
_open_files: dict = {}   # real path -> live handles
_retired: set = set()    # real paths no commit needs any more


def _track(handle, path):
    path = os.path.realpath(path)
    with _files_lock:
        _open_files[path] = _open_files.get(path, 0) + 1
    weakref.finalize(handle, _untrack, path)


def _untrack(path):
    with _files_lock:
        left = _open_files[path] = _open_files[path] - 1
        if left == 0:
            del _open_files[path]
            if path in _retired:
                _retired.discard(path)
                _unlink_quietly(path)


def _retire(paths):
    """Delete these files now, or when their last handle here goes."""
    for p in paths:
        p = os.path.realpath(p)
        with _files_lock:
            if p in _open_files:
                _retired.add(p)
                continue
        _unlink_quietly(p)


def _unlink_quietly(path):
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


class _Segment:
    """One segment of a snapshot: its handle and tombstones."""

    __slots__ = ("name", "index", "count", "bytes", "removed", "tomb_file", "dirty", "number",
                 "tuned")

    def __init__(self, name, index, count, nbytes, removed, tomb_file, tuned=None):
        self.name = name
        self.number = int(name[4:10])
        self.index = index
        self.count = count           # records in the file, removed ones included
        self.bytes = nbytes
        self.removed = removed       # sorted ids removed since the file was written
        self.tomb_file = tomb_file   # the committed tombstone file, or None
        self.dirty = False           # removes since the last commit
        self.tuned = tuned           # a table tune() measured after the file was written

    def live(self):
        return len(self.index)


class Collection:
    """A directory of segments that takes adds and removes after it is on
    disk, and builds indexes whose vectors do not fit in RAM.

    Create one with :meth:`Collection.create`, open one with
    :meth:`Collection.open` (or ``knndirect.open(directory)``, read-only).
    """

    # -- opening -------------------------------------------------------------
    def __init__(self):
        raise TypeError("use Collection.create(path, dim, ...) or Collection.open(path)")

    @classmethod
    def create(cls, path, dim, metric="l2", *, m=16, ef_construction=200, quantization="1bit",
               seed=0, memory_budget="1GiB", merge_policy="tiered", threads=None,
               _quantizer=None):
        """Create an empty collection at path (a new or empty directory) and
        return it open for writing.

        Parameters are those of :class:`knndirect.Index`, plus
        ``memory_budget`` (bytes or a size string: the RAM the write buffer,
        a flush and a merge may use beyond the graph and codes; a full
        buffer becomes a segment) and ``merge_policy`` ("tiered": merge
        segments of similar size in the background; None: only on
        :meth:`merge`).

        ``_quantizer`` (private; knndirect.ray): an Index whose fitted
        quantizer the collection takes from the start instead of fitting
        its own, so that several collections share one.
        """
        # Index() checks dim, metric, m, ef_construction, quantization, seed.
        probe = Index(dim, metric, m=m, ef_construction=ef_construction,
                      quantization=quantization, seed=seed)
        if _quantizer is not None:
            # Raises ValueError for another dim, metric or code width, or
            # an Index with no fitted quantizer.
            probe._core.adopt_quantizer(_quantizer._core)
        budget = parse_bytes(memory_budget)
        if merge_policy not in MERGE_POLICIES:
            raise ValueError(f"merge_policy must be 'tiered' or None, got {merge_policy!r}")
        path = os.fspath(path)
        if os.path.exists(path):
            if not os.path.isdir(path):
                raise FileExistsError(f"{path} exists and is not a directory")
            if os.listdir(path):
                raise FileExistsError(f"{path} is not empty; open an existing collection with "
                                      "Collection.open(path, writable=True)")
        else:
            os.makedirs(path)
        params = {"dim": probe.dim, "metric": metric, "m": int(m),
                  "ef_construction": int(ef_construction), "quantization": quantization,
                  "seed": int(seed)}
        doc = {"format": MANIFEST_FORMAT, "version": MANIFEST_VERSION, "generation": 0,
               "params": params, "memory_budget": budget, "merge_policy": merge_policy,
               "quantizer": None, "segments": [], "next_file": 1, "next_id": 0}
        self = cls.__new__(cls)
        self._init(path, writable=True, threads=threads)
        self._lock_dir()
        if _quantizer is not None:
            # Part of the first commit: the collection is born with it.
            name = f"quantizer-{1:06d}.kdx"
            probe.save(os.path.join(path, name))
            doc["quantizer"] = name
            doc["next_file"] = 2
        _write_durable(os.path.join(path, _manifest_name(0)), _encode_manifest(doc))
        _fsync_dir(path)
        self._load(doc)
        return self

    @classmethod
    def open(cls, path, *, writable=False, direct_io=True, io_backend="auto", io_depth=128,
             preload=("graph", "codes"), threads=None):
        """Open a collection at its newest commit.

        writable=True takes the collection's one writer lock (a second
        writable open, here or in another process, raises
        CollectionLockedError) and removes the orphan files of a crash.
        Readers take no lock: each sees the commit it opened until
        :meth:`refresh`. The other options are those of
        :func:`knndirect.open`, applied to every segment.
        """
        path = os.fspath(path)
        if not os.path.isdir(path):
            raise FileNotFoundError(f"no collection at {path}: not a directory")
        if _newest_generation(path) is None:
            raise FileNotFoundError(f"no collection at {path}: no manifest")
        self = cls.__new__(cls)
        self._init(path, writable=bool(writable), threads=threads,
                   open_options={"direct_io": direct_io, "io_backend": io_backend,
                                 "io_depth": io_depth, "preload": preload})
        if self._writable:
            self._lock_dir()
        try:
            self._load_newest()
            if self._writable:
                self._clean_orphans()
        except BaseException:
            self._release_lock()
            raise
        return self

    def _init(self, path, writable, threads, open_options=None):
        self._path = path
        self._writable = writable
        self._threads = _positive_int(threads, "threads", maximum=UINT32_MAX)
        self._open_options = dict(open_options or {})
        self._open_options.setdefault("preload", ("graph", "codes"))
        # Check the open options once, before any segment is opened.
        if self._open_options.get("io_backend", "auto") not in ("auto", "io_uring", "threads",
                                                                "pread", "mmap"):
            raise ValueError("io_backend must be one of ['auto', 'io_uring', 'mmap', 'pread', "
                             f"'threads'], got {self._open_options['io_backend']!r}")
        self._state = threading.RLock()
        self._lock_fd = None
        self._closed = False
        self._segments = []
        self._buffer = None
        self._view = ()
        self._buffer_rows = 0
        self._quantizer = None
        self._trained_rows = 0
        self._pending_quantizer = False
        self._tune = None            # (queries, k) of the last tune(), for new segments
        self._pending_tune = False
        self._changed = False
        self._queries = 0
        self._retired_stats = {}
        self._merge_thread = None
        self._merge_error = None
        self._last_merge = None
        self._merge_cancel = threading.Event()

    def _lock_dir(self):
        lock_path = os.path.join(self._path, "LOCK")
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
            finally:
                os.close(fd)
            who = f" (process {holder})" if holder else ""
            raise CollectionLockedError(
                f"collection {self._path} is already open for writing{who}; a collection "
                "has one writer: close it first, or open with writable=False") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self._lock_fd = fd

    def _release_lock(self):
        if self._lock_fd is not None:
            os.close(self._lock_fd)   # drops the flock
            self._lock_fd = None

    # -- loading a commit ----------------------------------------------------
    def _load_newest(self):
        """Open the newest commit; retry when a writer replaces it (and
        deletes its files) while this process opens it."""
        last = None
        for _ in range(OPEN_ATTEMPTS):
            gen = _newest_generation(self._path)
            try:
                doc = _read_manifest(os.path.join(self._path, _manifest_name(gen)))
                self._load(doc)
                return
            except FileNotFoundError as e:
                last = e
                if _newest_generation(self._path) == gen:
                    raise CorruptIndexError(
                        f"collection {self._path}: commit {gen} names a missing file: "
                        f"{e.filename}") from None
        raise last

    def _load(self, doc):
        # Open and read every file of the commit first: a file can vanish
        # (a writer commits again) and the caller retries with a newer
        # commit, so nothing here may change a handle or this object before
        # all of them are in hand.
        quantizer = None
        if doc["quantizer"] and self._writable:     # only new segments need it
            quantizer = self._open_file(doc["quantizer"], load=True)
        tune = None
        if doc.get("tune") and self._writable:      # only new segments need them
            tune = _read_tune(os.path.join(self._path, doc["tune"]["file"]),
                              int(doc["params"]["dim"]))
        old = {s.name: s for s in self._segments}
        staged = []
        for entry in doc["segments"]:
            removed = np.zeros(0, np.int64)
            if entry["tombstones"]:
                removed = _read_tombstones(os.path.join(self._path, entry["tombstones"]))
            prev = old.get(entry["name"])
            if (prev is not None and not prev.dirty and np.isin(prev.removed, removed).all()
                    and prev.tuned == entry.get("calibration")):
                # Still valid: tombstones only grow while a segment lives.
                staged.append((entry, prev.index, np.setdiff1d(removed, prev.removed), removed))
            else:
                staged.append((entry, self._open_file(entry["name"]), removed, removed))
        segments = []
        for entry, index, new, removed in staged:
            if new.size:
                index.remove(new)
            tuned = entry.get("calibration")
            if tuned is not None:
                index._set_calibration(_calibration.decode(_calibration.encode(tuned)))
            segments.append(_Segment(entry["name"], index, int(entry["count"]),
                                     int(entry["bytes"]), removed, entry["tombstones"], tuned))
        p = doc["params"]
        self._doc = doc
        self._params = p
        self._dim = int(p["dim"])
        self._metric = p["metric"]
        self._generation = int(doc["generation"])
        self._memory_budget = int(doc["memory_budget"])
        self._merge_policy = doc["merge_policy"]
        self._next_file = int(doc["next_file"])
        self._next_id = int(doc["next_id"])
        self._quantizer = quantizer
        self._pending_quantizer = False
        self._tune = tune
        self._pending_tune = False
        kept = {id(index) for _, index, _, _ in staged}
        for s in self._segments:
            if id(s.index) not in kept:
                self._retire_stats(s.index)
        self._segments = segments
        self._buffer = None
        self._publish()
        self._changed = False

    def _new_file_number(self):
        """A file number no file in the directory has: a retired file whose
        delete waits for a handle (a search in flight) keeps its name."""
        n = self._next_file
        while any(os.path.exists(os.path.join(self._path, f))
                  for f in (_seg_name(n), f"quantizer-{n:06d}.kdx")):
            n += 1
        self._next_file = n + 1
        return n

    def _open_file(self, name, load=False):
        path = os.path.join(self._path, name)
        if load:
            index = Index._from_core(_core.load_path(path))
        else:
            with warnings.catch_warnings():
                # The fallback is reported once by info(), not per segment.
                warnings.simplefilter("ignore", RuntimeWarning)
                try:
                    index = _open_index(path, threads=self._threads or None,
                                        **self._open_options)
                except FileNotFoundError as e:
                    raise FileNotFoundError(errno.ENOENT, str(e), path) from None
        _track(index._core, path)
        return index

    def _clean_orphans(self):
        """Remove files of our naming that the newest commit does not name."""
        keep = _doc_files(self._doc)
        stale = [os.path.join(self._path, f) for f in os.listdir(self._path)
                 if _OURS_RE.match(f) and f not in keep]
        _retire(stale)
        if stale:
            _fsync_dir(self._path)

    # -- properties ----------------------------------------------------------
    @property
    def path(self) -> str:
        return self._path

    @property
    def dim(self) -> int:
        return self._dim

    @property
    def metric(self) -> str:
        return self._metric

    @property
    def generation(self) -> int:
        """The commit this collection is at (uncommitted changes aside)."""
        return self._generation

    @property
    def writable(self) -> bool:
        return self._writable

    def __len__(self) -> int:
        """Live vectors, uncommitted adds and removes included."""
        with self._state:
            n = sum(s.live() for s in self._segments)
            return n + (len(self._buffer) if self._buffer is not None else 0)

    def _check_open(self):
        if self._closed:
            raise ValueError("collection is closed")

    def _check_writable(self):
        self._check_open()
        if not self._writable:
            raise PermissionError(f"collection {self._path} is open read-only; open it with "
                                  "writable=True to change it")

    # -- writing -------------------------------------------------------------
    def _where(self, ids):
        """For each id: the segment (or the buffer) that holds it live, else None."""
        where = np.full(ids.shape[0], -1, np.int64)
        holders = list(self._segments) + ([self._buffer] if self._buffer is not None else [])
        for j, h in enumerate(holders):
            index = h.index if isinstance(h, _Segment) else h
            hit = index._core.contains(ids)
            where[hit & (where < 0)] = j
        return where, holders

    def add(self, vectors, ids=None, *, upsert=False, threads=None, progress=None):
        """Add vectors; searchable at once, durable at the next commit.

        ids default to one past the largest id ever seen by this collection's
        segments and buffer, in order. An id that is live anywhere in the
        collection raises ValueError and adds nothing, unless upsert=True:
        then its old vector is replaced (remove plus add, all or nothing).
        A full write buffer (memory_budget) becomes a new segment.
        """
        with self._state:
            self._check_writable()
            x = _as_matrix(vectors, self._dim, "vectors", convert=False)
            n = x.shape[0]
            if ids is None:
                id_arr = np.arange(self._next_id, self._next_id + n, dtype=np.int64)
            else:
                id_arr = _as_ids(ids)
                if id_arr.shape[0] != n:
                    raise ValueError(f"got {id_arr.shape[0]} ids for {n} vectors")
            if n == 0:
                return
            uniq, counts = np.unique(id_arr, return_counts=True)
            if uniq.shape[0] != n:
                raise ValueError(f"duplicate id {int(uniq[counts > 1][0])} in ids")
            # The buffer holds each row's vector and its build code.
            row_bytes = 4 * self._dim + _core.build_code_row_bytes(self._dim)
            rows = max(1, self._memory_budget // row_bytes)
            _check_finite(x, rows)
            where, holders = self._where(id_arr)
            present = where >= 0
            if present.any() and not upsert:
                raise ValueError(f"duplicate id {int(id_arr[present][0])}: already in the "
                                 "collection (pass upsert=True to replace it)")
            if present.any():
                self._remove_at(id_arr[present], where[present], holders)
            report, close = _progress_callback(progress, n)
            nthreads = _default(threads, self._threads)
            try:
                done = 0
                while done < n:
                    buf = self._writable_buffer()
                    room = max(1, rows - self._buffer_rows)
                    end = min(n, done + room)
                    buf.add(_float32(x[done:end]), id_arr[done:end], threads=nthreads)
                    self._buffer_rows += end - done
                    self._changed = True
                    self._next_id = max(self._next_id, int(id_arr[done:end].max()) + 1)
                    if self._quantizer is None:
                        self._trained_rows = end - done
                        self._adopt_buffer_quantizer(buf)
                    done = end
                    if self._buffer_rows >= rows:
                        self._flush()
                    if report is not None and report(done, n) is False:
                        break
            finally:
                if close is not None:
                    close()

    def _writable_buffer(self):
        if self._buffer is None:
            buf = self._empty_index()
            if self._quantizer is not None:
                buf._core.adopt_quantizer(self._quantizer._core)
            self._buffer = buf
            self._buffer_rows = 0
            self._publish()
        return self._buffer

    def _empty_index(self):
        """A new in-memory Index with the collection's parameters."""
        p = self._params
        return Index(self._dim, p["metric"], m=p["m"], ef_construction=p["ef_construction"],
                     quantization=p["quantization"], seed=p["seed"])

    def _adopt_buffer_quantizer(self, buf):
        """The first vectors fit the collection's one quantizer."""
        q = self._empty_index()
        q._core.adopt_quantizer(buf._core)
        self._quantizer = q
        self._pending_quantizer = True

    def _refit_buffer(self, buf):
        """The first adds were too few to fit the quantizer well: fit it on
        the whole first segment (a sample of it) and rebuild that segment,
        once, before anything is encoded with it on disk."""
        ids = _live_ids(buf)
        x = buf.get_vectors(ids)
        fresh = self._empty_index()
        fresh.add(x, ids, threads=self._threads or None)
        self._buffer = fresh
        self._buffer_rows = len(fresh)
        self._trained_rows = len(fresh)
        self._adopt_buffer_quantizer(fresh)
        self._publish()
        return fresh

    def _flush(self):
        """The write buffer becomes a segment file (not yet committed)."""
        buf = self._buffer
        if buf is None:
            return
        if len(buf) == 0:
            self._buffer = None
            self._publish()
            return
        if self._pending_quantizer and self._trained_rows < min(len(buf), TRAIN_SAMPLE) // 2:
            buf = self._refit_buffer(buf)
        elif self._refit_if_outgrown():
            self._encode_buffer_anew()   # this segment takes the new one too
        _calibrate_new_segment(buf, self._tune, self._threads or 0)
        name = _seg_name(self._new_file_number())
        path = os.path.join(self._path, name)
        buf.save(path)
        try:
            index = self._open_file(name)
        except BaseException:
            _unlink_quietly(path)
            raise
        seg = _Segment(name, index, self._buffer_rows, os.path.getsize(path),
                       np.zeros(0, np.int64), None)
        seg.dirty = True
        self._retire_stats(buf)
        self._segments.append(seg)
        self._buffer = None
        self._publish()

    def _refit_if_outgrown(self):
        """A quantizer with fewer centres than one fitted on half the live
        vectors would have (a small first commit) estimates coarsely for
        every later row: a new one is fitted on a sample of them, once per
        doubling at most, which later segments take and merges re-encode
        to. A refit that fails (reading the sample) fails no write: the
        quantizer stays, with a warning, and the next flush tries again.
        Returns whether it refitted."""
        if self._quantizer is None or self._quantizer._quantizer_fits(len(self)):
            return False
        try:
            sample = self._live_sample()
        except (OSError, ValueError, KeyError) as e:
            warnings.warn(f"could not refit the outgrown quantizer of {self._path}, kept it: "
                          f"{e!r}", RuntimeWarning, stacklevel=4)
            return False
        self._fit_quantizer(sample)
        return True

    def _encode_buffer_anew(self):
        """The write buffer's rows take the collection's quantizer. Its
        graph stands (it links rows, whichever codes guided insertion); its
        table is measured again on hidden nodes when it is flushed."""
        if self._buffer is not None:
            self._buffer._adopt_quantizer(self._quantizer)

    def remove(self, ids):
        """Remove ids: gone from searches at once, durable at the next commit.
        An id that is not live raises KeyError and nothing is removed."""
        with self._state:
            self._check_writable()
            id_arr = _as_ids(ids)
            if id_arr.size == 0:
                return
            uniq = np.unique(id_arr)
            where, holders = self._where(uniq)
            if (where < 0).any():
                raise KeyError(f"id {int(uniq[where < 0][0])} is not in the collection")
            self._remove_at(uniq, where, holders)

    def _remove_at(self, ids, where, holders):
        for j in np.unique(where):
            h = holders[j]
            mine = ids[where == j]
            if isinstance(h, _Segment):
                h.index.remove(mine)
                h.removed = np.union1d(h.removed, mine)
                h.dirty = True
            else:
                h.remove(mine)
        self._changed = True

    def commit(self) -> int:
        """Make every change since the last commit durable; returns the new
        generation. The buffer is flushed to a segment, tombstones are
        written, then the manifest is published by rename and the directory
        fsynced. On an error (disk full, ...) the last commit stays intact
        and the changes stay pending."""
        with self._state:
            self._check_writable()
            self._raise_merge_error()
            self._flush()
            gen = self._generation + 1
            written = []
            try:
                doc = self._manifest_doc(gen, written)
                _write_durable(os.path.join(self._path, _manifest_name(gen)),
                               _encode_manifest(doc))
            except BaseException:
                _retire([os.path.join(self._path, f) for f in written])
                raise
            _fsync_dir(self._path)
            old = self._doc
            self._doc = doc
            self._generation = gen
            for s in self._segments:
                if s.dirty:
                    s.tomb_file = next((e["tombstones"] for e in doc["segments"]
                                        if e["name"] == s.name), None)
                    s.dirty = False
            self._pending_quantizer = False
            self._pending_tune = False
            self._changed = False
            self._drop_unreferenced(old, doc)
            self._maybe_merge()
            return gen

    def _manifest_doc(self, gen, written):
        doc = dict(self._doc)
        doc["generation"] = gen
        if self._pending_quantizer or (self._quantizer is not None and not doc["quantizer"]):
            name = f"quantizer-{self._new_file_number():06d}.kdx"
            self._quantizer.save(os.path.join(self._path, name))
            written.append(name)
            doc["quantizer"] = name
        if self._pending_tune:
            name = f"tune-{self._new_file_number():06d}.f32"
            _write_tune(os.path.join(self._path, name), *self._tune)
            written.append(name)
            doc["tune"] = {"file": name, "queries": int(self._tune[0].shape[0]),
                           "k": int(self._tune[1])}
        entries = []
        for s in self._segments:
            tomb = s.tomb_file
            if s.dirty and s.removed.size:
                tomb = f"{s.name}.del-{gen:012d}"
                _write_tombstones(os.path.join(self._path, tomb), s.removed)
                written.append(tomb)
            elif not s.removed.size:
                tomb = None
            entry = {"name": s.name, "count": s.count, "bytes": s.bytes, "live": s.live(),
                     "tombstones": tomb}
            if s.tuned is not None:
                entry["calibration"] = s.tuned
            entries.append(entry)
        doc["segments"] = entries
        doc["next_file"] = self._next_file
        doc["next_id"] = self._next_id
        return doc

    def _drop_unreferenced(self, old, new):
        gone = _doc_files(old) - _doc_files(new)
        _retire([os.path.join(self._path, f) for f in gone])

    def rollback(self):
        """Drop every add and remove since the last commit."""
        with self._state:
            self._check_writable()
            self._wait_merge()
            committed = {e["name"] for e in self._doc["segments"]}
            flushed = [s.name for s in self._segments if s.name not in committed]
            # Segments with removes since the commit are reopened (a remove
            # cannot be undone in place); the others are kept.
            self._load(self._doc)
            _retire([os.path.join(self._path, name) for name in flushed])

    def refit(self, sample=None, *, threads=None):
        """Fit a new quantizer (rotation and centres) for data that has
        drifted: on sample (an (n, dim) array), else on up to 16384 live
        vectors drawn at random. The write buffer's rows are encoded with it
        at once, segments written from now on use it, and merges re-encode
        the codes of older segments with it. Durable at the next commit. (A
        flush refits the same way by itself when the live count has outgrown
        the quantizer.)"""
        with self._state:
            self._check_writable()
            if sample is None:
                if len(self) == 0:
                    raise ValueError("the collection is empty: pass a sample to refit on")
                x = self._live_sample()
            else:
                x = _as_matrix(sample, self._dim, "sample")
                if x.shape[0] == 0:
                    raise ValueError("sample holds no vectors")
            self._fit_quantizer(x)
            self._encode_buffer_anew()

    def _live_sample(self):
        """Up to TRAIN_SAMPLE live vectors drawn at random."""
        ids = self.ids()
        rng = np.random.default_rng(self._generation)
        return self.get_vectors(np.sort(rng.choice(ids, min(ids.size, TRAIN_SAMPLE),
                                                   replace=False)))

    def _fit_quantizer(self, x):
        q = self._empty_index()
        q._core.train(_float32(x))
        self._quantizer = q
        self._trained_rows = x.shape[0]
        self._pending_quantizer = True
        self._changed = True

    # -- merging -------------------------------------------------------------
    def merge(self, max_segments=1, *, threads=None, progress=None) -> int:
        """Commit, merge segments until at most max_segments remain (removed
        vectors dropped), and commit again; returns the generation.

        A merge builds its graph over scalar codes of its rows, which must
        fit memory_budget (4 bits a dimension at least): when the budget
        cannot hold the rows of the merges needed, merging stops at the
        fewest segments it allows and a RuntimeWarning says so."""
        max_segments = _positive_int(max_segments, "max_segments", allow_none=False)
        with self._state:
            self._check_writable()
            self._wait_merge()
            self.commit()
            limit = self._merge_row_limit()
            while len(self._segments) > max_segments:
                # The smallest segments: as many as needed, at least two, as
                # far as the budget allows.
                order = sorted(self._segments, key=lambda s: s.live())
                take = order[:len(self._segments) - max_segments + 1]
                while len(take) > 2 and sum(s.live() for s in take) > limit:
                    take.pop()
                if sum(s.live() for s in take) > limit:
                    warnings.warn(
                        f"memory_budget ({self._memory_budget} bytes) lets a merge take at "
                        f"most {limit} rows of dim {self._dim}; {len(self._segments)} "
                        f"segments remain (asked for {max_segments})", RuntimeWarning,
                        stacklevel=2)
                    break
                self._merge_now(take, threads, progress)
            for seg in list(self._segments):
                if seg.removed.size and seg.live() <= limit:
                    self._merge_now([seg], threads, progress)   # drop removed records
            return self.commit()

    def _merge_row_limit(self):
        """Rows one merge may take: their build codes, 4 bits a dimension at
        the least, must fit memory_budget."""
        return max(2, self._memory_budget // _core.merge_row_bytes(4, self._dim))

    def _merge_now(self, inputs, threads, progress, cancel=None):
        """Merge inputs (segments of this collection) into one new segment
        and swap it in; the swap is committed by the next commit. The state
        lock is held only to take the inputs and to swap."""
        with self._state:
            if any(s not in self._segments for s in inputs):
                return   # a stale plan: an input was merged or rolled back meanwhile
            snapshot = [(s, s.removed.copy()) for s in inputs]
            tune = self._tune
            # The output takes the collection's quantizer, re-encoding rows
            # an older (or coarser) one encoded.
            quantizer = None if self._quantizer is None else self._quantizer._core
            name = _seg_name(self._new_file_number())
            handles = []
            for s, removed in snapshot:
                h = _open_index(os.path.join(self._path, s.name), preload=(),
                                **{k: v for k, v in self._open_options.items()
                                   if k != "preload"})
                if removed.size:
                    h.remove(removed)
                handles.append(h)
        path = os.path.join(self._path, name)
        # The core counts four passes over the rows (fit, encode, graph, write).
        report, close = _progress_callback(progress, 4 * sum(len(h) for h in handles))

        def step(done, total):
            if cancel is not None and cancel.is_set():
                return False
            return True if report is None else report(done, total) is not False

        try:
            done = _core.merge(path, [h._core for h in handles],
                               threads=_default(threads, self._threads) or 0,
                               memory_budget=self._memory_budget, seed=self._params["seed"],
                               progress=step, quantizer=quantizer)
        finally:
            if close is not None:
                close()
            for h in handles:
                h.close()
        try:
            self._calibrate_merged(path, threads, tune)
        except BaseException:
            _unlink_quietly(path)
            raise
        with self._state:
            try:
                index = self._open_file(name)
            except BaseException:
                _unlink_quietly(path)
                raise
            # Removes that arrived while merging land on the new segment.
            late = [np.setdiff1d(s.removed, removed) for s, removed in snapshot]
            late = np.concatenate(late) if late else np.zeros(0, np.int64)
            seg = _Segment(name, index, len(index), os.path.getsize(path),
                           np.zeros(0, np.int64), None)
            seg.dirty = True
            if late.size:
                index.remove(late)
                seg.removed = np.sort(late)
            gone = {s.name for s in inputs}
            pos = min(i for i, s in enumerate(self._segments) if s.name in gone)
            for s in inputs:
                self._retire_stats(s.index)
            rest = [s for s in self._segments if s.name not in gone]
            self._segments = rest[:pos] + [seg] + rest[pos:]
            done["inputs"] = [s.name for s in inputs]
            done["output"] = name
            self._last_merge = done
            self._publish()
            # Flushed-but-uncommitted inputs exist in no commit: gone now.
            committed = {e["name"] for e in self._doc["segments"]}
            _retire([os.path.join(self._path, s.name) for s in inputs
                     if s.name not in committed])

    def _calibrate_merged(self, path, threads, tune):
        """A merge's output gets its recall calibration before anyone opens
        it: measured on the queries of tune() where one was made, else on
        hidden nodes (no vector of it can be held out of its graph),
        appended to the file in place."""
        opts = {k: v for k, v in self._open_options.items() if k != "preload"}
        nthreads = _default(threads, self._threads) or 0
        with _open_index(path, preload=(), **opts) as out:
            _calibrate_new_segment(out, tune, nthreads)
            blob = out._core.calibration()
        if blob:
            append_calibration(path, blob)

    def _plan_merge(self):
        """The tiered policy's next merge, or None."""
        limit = self._merge_row_limit()
        segs = [s for s in self._segments if s.live() <= limit]
        for s in segs:
            if s.count and 1 - s.live() / s.count > EXPUNGE_SHARE:
                return [s]
        tiers = {}
        for s in segs:
            tier = 0
            size = max(s.live(), 1)
            while size >= TIER_FACTOR:
                size //= TIER_FACTOR
                tier += 1
            tiers.setdefault(tier, []).append(s)
        for tier in sorted(tiers):
            if len(tiers[tier]) >= TIER_FACTOR:
                plan = sorted(tiers[tier], key=lambda s: s.live())[:TIER_FACTOR]
                if sum(s.live() for s in plan) <= limit:
                    return plan
        return None

    def _maybe_merge(self):
        if self._merge_policy != "tiered" or self._merge_thread is not None:
            return
        plan = self._plan_merge()
        if not plan:
            return
        committed = {e["name"] for e in self._doc["segments"]}
        if any(s.name not in committed for s in plan):
            return
        self._merge_cancel.clear()
        t = threading.Thread(target=self._background_merge, args=(plan,),
                             name="knndirect-merge", daemon=True)
        self._merge_thread = t
        t.start()

    def _background_merge(self, plan):
        try:
            self._merge_now(plan, None, None, cancel=self._merge_cancel)
        except BaseException as e:  # reported at the next commit, never lost
            if not self._merge_cancel.is_set():
                self._merge_error = e
        finally:
            self._merge_thread = None

    def _wait_merge(self, cancel=False):
        t = self._merge_thread
        if t is not None:
            if cancel:
                self._merge_cancel.set()
            # The merge takes the state lock to swap: let it.
            depth = 0
            while True:
                try:
                    self._state.release()
                    depth += 1
                except RuntimeError:
                    break
            try:
                t.join()
            finally:
                for _ in range(depth):
                    self._state.acquire()

    def _raise_merge_error(self):
        e, self._merge_error = self._merge_error, None
        if e is not None:
            warnings.warn(f"a background merge failed and was dropped: {e!r}", RuntimeWarning,
                          stacklevel=3)

    # -- reading -------------------------------------------------------------
    def _publish(self):
        """Searches read this tuple without the state lock, so an add or a
        merge never holds them up; the handles in it stay valid (and their
        files on disk) while a search uses them."""
        view = [s.index._core for s in self._segments]
        if self._buffer is not None:
            view.append(self._buffer._core)
        self._view = tuple(view)

    def search(self, queries, k=10, *, ef=None, oversample=None, recall=None, rerank=True,
               filter=None, exact=False, threads=None):
        """Search every segment and the write buffer as one pipeline: graph
        searches over codes, one global shortlist, one batch of reads across
        the segment files, an exact rerank, the global top k. Options and
        results are those of :meth:`knndirect.Index.search`. One shortlist
        is chosen across all segments, and the more vectors compete for it,
        the deeper the same true neighbours sit in it.

        The default (0.95, met with confidence) takes, of the segments that
        carry a calibration, the widest beam any of them needs, and the
        shortlist of the largest one widened by the collection's size over
        its own (a bound that errs towards recall: 4 equal segments read 4
        times one's shortlist; merging makes it cheaper). Its picks are
        first widened for adds since each table, as Index.search widens
        them (the write buffer's).

        A target given with recall= is an estimate, read from the largest
        segment's table stretched for the collection's live count as an
        index grown to that count would read it (Index.search), its beam
        widened for that segment's own growth. Where the quantizer has fewer
        centres than one fitted on half the collection would (a first
        segment of a few thousand vectors), the stretch says too little and
        the default's bound is taken instead.

        Where no segment carries a calibration, a collection under 1,000
        vectors is searched exactly and a larger one raises ValueError."""
        if not exact and _recall_target(recall, ef, oversample) is not None:
            ef, oversample, exact = self._search_picks(k, recall)
        single, q, args = _search_args(queries, self._dim, k, ef, oversample, rerank, exact,
                                       _default(threads, self._threads), filter)
        self._check_open()
        D, I = _core.search_many(self._view, q, *args)
        self._queries += q.shape[0]
        if single:
            return D[0], I[0]
        return D, I

    def _search_picks(self, k, recall):
        """(ef, oversample, exact) of a search for recall (None: the
        default) over the collection as it stands (see search)."""
        with self._state:
            self._check_open()
            indexes = self._indexes()
            picks = [(len(ix), ix, c) for ix in indexes
                     if (c := ix._widened(k, recall, warn=False))]
            live = len(self)
            if picks:
                size, big, (_, big_oversample) = max(picks, key=lambda p: p[0])
                if recall is not None and all(ix._quantizer_fits(live) for ix in indexes):
                    return (*big._chosen(k, recall, among=live), False)
                big._chosen(k, recall)  # warns for a target past the largest one's table
        if not picks:
            return _uncalibrated(recall, live, "merge(max_segments=1) measures one for its output")
        ef = max(c[0] for _, _, c in picks)
        return ef, big_oversample * max(1.0, live / max(size, 1)), False

    def tune(self, queries, k=10, *, threads=None) -> list:
        """Measure every segment's recall calibration again on your own
        queries (as :meth:`knndirect.Index.tune` does for one index: each
        segment's true neighbours by brute force over it), and keep the
        queries: segments written later (flushes, merges) are calibrated on
        them too, not on vectors of the data. Durable at the next commit;
        a writer only (readers see it after ``refresh``). Returns
        ``segments()``."""
        q, k = _tune_args(queries, self._dim, k)
        with self._state:
            self._check_writable()
            self._wait_merge()
            nthreads = _positive_int(_default(threads, self._threads), "threads",
                                     maximum=UINT32_MAX) or 0
            for s in self._segments:
                if s.live() > k:
                    s.index._calibrate(q, k, nthreads, "tune")
                    s.tuned = s.index._cal
            if self._buffer is not None and len(self._buffer) > k:
                self._buffer._calibrate(q, k, nthreads, "tune")
            self._tune = (q.copy(), k)
            self._pending_tune = True
            self._changed = True
            return self.segments()

    def get_vectors(self, ids):
        """The stored vectors of live ids, as added, shape (n, dim). An id
        that is not live raises KeyError."""
        id_arr = _as_ids(ids)
        with self._state:
            self._check_open()
            where, holders = self._where(id_arr)
        if (where < 0).any():
            raise KeyError(f"id {int(id_arr[where < 0][0])} is not in the collection")
        out = np.empty((id_arr.shape[0], self._dim), np.float32)
        for j in np.unique(where):
            h = holders[j]
            index = h.index if isinstance(h, _Segment) else h
            sel = where == j
            out[sel] = index.get_vectors(id_arr[sel])
        return out

    def ids(self) -> np.ndarray:
        """Every live id, sorted (uncommitted adds and removes included)."""
        with self._state:
            self._check_open()
            parts = [index._core.live_ids() for index in self._indexes()]
        return np.sort(np.concatenate(parts)) if parts else np.zeros(0, np.int64)

    def refresh(self) -> int:
        """Move a reader to the newest commit; returns its generation."""
        with self._state:
            self._check_open()
            if self._writable:
                return self._generation
            if _newest_generation(self._path) != self._generation:
                self._load_newest()
            return self._generation

    def segments(self) -> list:
        """One dict per segment: name, count (records in the file), live,
        bytes (file size), removed (ids removed since it was written),
        committed, calibration (the source of its recall table: "build",
        "hidden", "tune", or None), centres (its quantizer's, as
        Index.info() gives them)."""
        with self._state:
            return [{"name": s.name, "count": s.count, "live": s.live(), "bytes": s.bytes,
                     "removed": int(s.removed.size), "committed": not s.dirty,
                     "calibration": s.index._cal and s.index._cal["source"],
                     "centres": s.index.info()["centres"]}
                    for s in self._segments]

    def info(self) -> dict:
        """Parameters and state: dim, metric, count, generation, segments,
        buffered (vectors in the write buffer), pending (uncommitted
        changes), merging, last_merge (the core's report of this object's
        last merge: rows reused from the base graph, inserted, repaired,
        timings), memory_budget, merge_policy, tune (queries and k of the
        last tune(), or None), and the I/O facts of the
        segments (io_backend, direct_io, record_size, alignment) and
        resident_bytes."""
        with self._state:
            self._check_open()
            p = self._params
            out = {"path": self._path, "dim": self._dim, "metric": self._metric,
                   "count": len(self), "generation": self._generation,
                   "segments": len(self._segments), "quantization": p["quantization"],
                   "m": p["m"], "ef_construction": p["ef_construction"], "seed": p["seed"],
                   "memory_budget": self._memory_budget, "merge_policy": self._merge_policy,
                   "writable": self._writable,
                   "buffered": len(self._buffer) if self._buffer is not None else 0,
                   "pending": bool(self._changed or any(s.dirty for s in self._segments)),
                   "merging": self._merge_thread is not None,
                   "tune": self._tune_info(),
                   "last_merge": self._last_merge}
            resident = 0
            for s in self._segments:
                resident += s.index.info()["resident_bytes"]
            if self._buffer is not None:
                resident += self._buffer.info()["resident_bytes"]
            out["resident_bytes"] = resident
            if self._segments:
                first = self._segments[0].index.info()
                for key in ("io_backend", "direct_io", "record_size", "alignment",
                            "fallbacks"):
                    out[key] = first.get(key)
            return out

    def _tune_info(self):
        """{"queries", "k"} of the last tune() (a reader's: the commit's), or None."""
        if self._tune is not None:
            return {"queries": int(self._tune[0].shape[0]), "k": int(self._tune[1])}
        t = self._doc.get("tune")
        return t and {"queries": t["queries"], "k": t["k"]}

    def stats(self, reset=False) -> dict:
        """Counters summed over the segments (those merged away included):
        queries, read_ops, read_bytes, rerank_vectors, io_wait_seconds, ..."""
        with self._state:
            self._check_open()
            total = dict(self._retired_stats)
            for index in self._indexes():
                for key, value in index.stats(reset=reset).items():
                    total[key] = total.get(key, 0) + value
            total["queries"] = self._queries
            if reset:
                self._retired_stats = {}
                self._queries = 0
            return total

    def _indexes(self):
        out = [s.index for s in self._segments]
        if self._buffer is not None:
            out.append(self._buffer)
        return out

    def _retire_stats(self, index):
        try:
            for key, value in index.stats().items():
                self._retired_stats[key] = self._retired_stats.get(key, 0) + value
        except ValueError:
            pass   # closed

    def verify(self) -> bool:
        """Check the commit: the manifest and tombstone checksums, every
        segment file's checksums (vectors included), the tune file's, and
        that every tombstoned id belongs to its segment. Raises
        CorruptIndexError."""
        with self._state:
            self._check_open()
            _read_manifest(os.path.join(self._path, _manifest_name(self._generation)))
            if self._doc.get("tune"):
                _read_tune(os.path.join(self._path, self._doc["tune"]["file"]), self._dim)
            for s in self._segments:
                s.index.verify()
                if s.tomb_file:
                    removed = _read_tombstones(os.path.join(self._path, s.tomb_file))
                    if s.dirty:
                        continue
                    if not np.array_equal(removed, s.removed):
                        raise CorruptIndexError(f"tombstones of {s.name} do not match the "
                                                "commit")
            return True

    # -- closing -------------------------------------------------------------
    def close(self):
        """Release the segments and the writer lock. Uncommitted changes are
        dropped (with a warning); a background merge is stopped."""
        if self._closed:
            return
        with self._state:
            if self._writable:
                self._wait_merge(cancel=True)
                # A merge finished since the last commit is dropped quietly:
                # it changed no answer and the next writer redoes it.
                if self._changed:
                    warnings.warn(f"collection {self._path} closed with uncommitted changes; "
                                  "they are dropped (call commit())", RuntimeWarning,
                                  stacklevel=2)
                if self._changed or any(s.dirty for s in self._segments):
                    self.rollback()
            self._closed = True
            self._segments = []
            self._buffer = None
            self._view = ()
            self._quantizer = None
            self._release_lock()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        """Commit on success, roll back on an error."""
        if self._closed:
            return
        if self._writable:
            if exc_type is None:
                self.commit()
            else:
                self.rollback()
        self.close()

    def __del__(self):
        try:
            self._release_lock()
        except Exception:
            pass

    def __repr__(self):
        if self._closed:
            return f"<knndirect.Collection {self._path!r} closed>"
        mode = "writable" if self._writable else "read-only"
        return (f"<knndirect.Collection {self._path!r} dim={self._dim} metric={self._metric} "
                f"count={len(self)} segments={len(self._segments)} "
                f"generation={self._generation} {mode}>")


def _live_ids(index):
    """The live ids of an in-memory index, in row order."""
    return index._core.live_ids()


def open_collection(path, **options):
    """knndirect.open on a directory: the collection, read-only."""
    if options.pop("writable", False):
        raise ValueError("knndirect.open opens collections read-only; use "
                         "Collection.open(path, writable=True)")
    return Collection.open(path, **options)


__all__ = ["Collection", "CollectionLockedError", "is_collection", "parse_bytes"]
