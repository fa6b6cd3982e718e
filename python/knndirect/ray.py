"""Scale-out on Ray: shards built by Ray tasks and served by Ray actors.

    import knndirect.ray as kdr
    kdr.build(dataset, path, column="embedding")      # a ray.data.Dataset in
    index = kdr.open(path)
    D, I = index.search(queries, k=10)

A built path is a directory:

    PATH/manifest.json       written last, atomically, once every shard committed
    PATH/quantizer.kdx       the one quantizer (an empty index), fitted once
    PATH/shard-0000/ ...     one kd.Collection per shard (kd.open opens it alone)

Ray is an optional dependency (``pip install 'knndirect[ray]'``); importing
this module imports it, ``import knndirect`` never does.
"""
import itertools
import os
import re
import shutil
import threading
import time

import numpy as np
import ray
from ray.exceptions import RayActorError

try:
    from ray.exceptions import ActorUnavailableError
except ImportError:                                # Ray before 2.31
    ActorUnavailableError = ()

from ._collection import (Collection, _encode_manifest, _fsync_dir, _read_json_manifest,
                          _write_durable, parse_bytes)
from ._index import (TRAIN_SAMPLE, Index, _progress_callback, _recall_target, _search_args,
                     _tune_args, load)
from .datasets import _arrow_matrix

__all__ = ["build", "open", "ShardedIndex", "ShardError", "ShardTimeoutError",
           "ShardUnavailableError"]

FORMAT = "knndirect-ray"
VERSION = 1
MANIFEST = "manifest.json"
QUANTIZER = "quantizer.kdx"
# How long a search waits for a shard's actor that Ray is restarting, when
# the search has no timeout of its own; asked again with a growing pause.
RESTART_WAIT = 60.0
_OWNED = re.compile(r"^(shard-\d{4,}|quantizer\.kdx|manifest\.json)(\.tmp.*)?$")
_INDEX_PARAMS = ("m", "ef_construction", "quantization", "seed")


class ShardError(RuntimeError):
    """A query could not be answered by every shard; ``shards`` names them."""

    def __init__(self, message, shards):
        super().__init__(message)
        self.shards = list(shards)


class ShardTimeoutError(ShardError, TimeoutError):
    """A shard did not answer within the search's timeout."""


class ShardUnavailableError(ShardError):
    """A shard's actors are dead and Ray can no longer restart them."""


def _shard_name(i):
    return f"shard-{i:04d}"


def _ray_required():
    if not ray.is_initialized():
        ray.init()


# -- building -----------------------------------------------------------------
def _batch_rows(table, column, id_column, dim):
    x = _arrow_matrix(table.column(column), f"column {column!r}")
    if dim is not None and x.shape[1] != dim:
        raise ValueError(f"column {column!r} holds vectors of length {x.shape[1]}, not {dim}")
    ids = None
    if id_column is not None:
        ids = table.column(id_column).to_numpy()
    return x, ids


def _cpus_per_shard(num_shards):
    """CPUs for each of num_shards tasks running at once (at least 1)."""
    return max(1, int(ray.cluster_resources().get("CPU", 1)) // num_shards)


def _build_shard(part, shard_path, quantizer_path, dim, metric, params, column, id_column,
                 first_id, memory_budget, threads, batch_rows):
    """One Ray task: the shard's rows into a new collection, merged to one
    segment. Returns the shard's manifest entry."""
    quantizer = load(quantizer_path)
    col = Collection.create(shard_path, dim, metric, memory_budget=memory_budget,
                            merge_policy=None, threads=threads, _quantizer=quantizer, **params)
    try:
        next_id = first_id
        for table in part.iter_batches(batch_size=batch_rows, batch_format="pyarrow"):
            x, ids = _batch_rows(table, column, id_column, dim)
            if ids is None:
                ids = np.arange(next_id, next_id + x.shape[0], dtype=np.int64)
                next_id += x.shape[0]
            col.add(x, ids)
        col.commit()
        col.merge(max_segments=1)
        segs = col.segments()
        return {"count": len(col), "bytes": sum(s["bytes"] for s in segs),
                "segments": len(segs)}
    finally:
        col.close()


def _tune_shard(shard_path, queries, k, threads, options):
    """One Ray task: the shard's collection opened for writing, tuned on
    the queries and committed. Returns its segments()."""
    with Collection.open(shard_path, writable=True, **options) as col:
        segs = col.tune(queries, k, threads=threads)
        col.commit()
        return segs


def _clean_partial(path):
    """Remove what a failed build left at path (never a finished build, and
    nothing this module did not write)."""
    if not os.path.isdir(path):
        return
    names = os.listdir(path)
    if MANIFEST in names:
        raise FileExistsError(f"{path} holds a built index (manifest.json); remove it first")
    foreign = [n for n in names if not _OWNED.match(n)]
    if foreign:
        raise FileExistsError(f"{path} is not empty and not a failed knndirect.ray build "
                              f"(found {foreign[:3]})")
    for n in names:
        p = os.path.join(path, n)
        if os.path.isdir(p) and not os.path.islink(p):
            shutil.rmtree(p)
        else:
            os.unlink(p)


def _sample(dataset, n, column, dim, seed):
    """Up to TRAIN_SAMPLE rows, drawn at random from the whole dataset."""
    want = min(n, TRAIN_SAMPLE)
    ds = dataset
    if n > want:
        ds = dataset.random_sample(min(1.0, 1.25 * want / n), seed=seed)
    parts, got = [], 0
    for table in ds.iter_batches(batch_size=4096, batch_format="pyarrow"):
        x, _ = _batch_rows(table, column, None, dim)
        parts.append(np.array(x, dtype=np.float32))
        got += x.shape[0]
        if got >= want:
            break
    if not parts:
        raise ValueError("the dataset holds no vectors")
    x = np.concatenate(parts)[:want]
    bad = ~np.isfinite(x).all(axis=1)
    if bad.any():
        raise ValueError("the dataset holds a vector with NaN or Inf (seen in the training sample)")
    return np.ascontiguousarray(x)


def build(dataset, path, *, column="embedding", id_column=None, num_shards=None, metric="l2",
          memory_budget="1GiB", progress=None, **index_params):
    """Build a sharded index at path (a new or empty directory) from a
    ``ray.data.Dataset``.

    The vectors are the ``column`` (fixed-size lists, equal-length lists or
    a tensor column of numbers); ids come from ``id_column`` (int64, unique
    across the dataset) or are the row numbers 0..n-1 in the dataset's order.
    One quantizer is fitted on a random sample of up to 16384 rows and
    shared by every shard. The rows are split into ``num_shards`` shards of
    equal size (within one row; default: the cluster's CPUs), and one Ray
    task per shard builds it as a :class:`knndirect.Collection` (add,
    commit, merge to one segment) within ``memory_budget``. ``progress``:
    True (tqdm) or a callable(done_shards, num_shards) called as shards
    finish. ``index_params``: m, ef_construction, quantization, seed.

    The top manifest is written, atomically, only after every shard has
    committed. If a task fails, the other tasks are cancelled, the partial
    shards are removed, no manifest exists, and the error is raised; a new
    build into the same path starts clean. Returns the manifest (a dict).
    """
    unknown = set(index_params) - set(_INDEX_PARAMS)
    if unknown:
        raise TypeError(f"build() got unexpected keyword arguments {sorted(unknown)}")
    params = {"m": 16, "ef_construction": 200, "quantization": "1bit", "seed": 0}
    params.update(index_params)
    budget = parse_bytes(memory_budget)
    path = os.path.abspath(os.fspath(path))
    _ray_required()
    names = dataset.schema().names
    for c in (column, id_column):
        if c is not None and c not in names:
            raise ValueError(f"the dataset has no column {c!r} (found: {names})")
    n = dataset.count()
    if n == 0:
        raise ValueError("the dataset holds no rows")
    if num_shards is None:
        num_shards = max(1, int(ray.cluster_resources().get("CPU", 1)))
    if not isinstance(num_shards, int) or isinstance(num_shards, bool) or num_shards < 1:
        raise ValueError(f"num_shards must be a positive int, got {num_shards!r}")
    num_shards = min(num_shards, n)

    _clean_partial(path)
    os.makedirs(path, exist_ok=True)
    try:
        first = dataset.take_batch(1, batch_format="pyarrow")
        dim = _batch_rows(first, column, None, None)[0].shape[1]
        quantizer = Index(dim, metric, **params)
        quantizer._core.train(_sample(dataset, n, column, dim, params["seed"]))
        quantizer.save(os.path.join(path, QUANTIZER))
        return _build_shards(dataset, path, n, dim, metric, params, column, id_column,
                             num_shards, budget, progress)
    except BaseException:
        try:
            _clean_partial(path)
        except OSError:
            pass
        raise


def _build_shards(dataset, path, n, dim, metric, params, column, id_column, num_shards, budget,
                  progress):
    bounds = [n * i // num_shards for i in range(num_shards + 1)]
    parts = dataset.split_at_indices(bounds[1:-1]) if num_shards > 1 else [dataset]
    cpus = _cpus_per_shard(num_shards)
    batch_rows = int(max(1, min(65536, budget // (8 * dim))))
    task = ray.remote(_build_shard).options(num_cpus=cpus, max_retries=0)
    refs = {}
    for i, part in enumerate(parts):
        ref = task.remote(part, os.path.join(path, _shard_name(i)), os.path.join(path, QUANTIZER),
                          dim, metric, params, column, id_column, bounds[i], budget, cpus,
                          batch_rows)
        refs[ref] = i
    report, close = _progress_callback(progress, num_shards)
    results = {}
    pending = list(refs)
    try:
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            for ref in ready:
                results[refs[ref]] = ray.get(ref)    # raises the task's error
            if report is not None:
                report(len(results), num_shards)
    except BaseException:
        for ref in pending:
            ray.cancel(ref, force=True)
        for ref in pending:                  # wait until no task writes any more
            try:
                ray.get(ref)
            except Exception:
                pass
        raise
    finally:
        if close is not None:
            close()
    shards = []
    for i in range(num_shards):
        shards.append({"name": _shard_name(i), "count": int(results[i]["count"]),
                       "bytes": int(results[i]["bytes"]), "first_row": bounds[i]})
    doc = {"format": FORMAT, "version": VERSION, "dim": int(dim), "metric": metric,
           "params": params, "memory_budget": budget, "quantizer": QUANTIZER,
           "count": sum(s["count"] for s in shards), "shards": shards,
           "built": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    _fsync_dir(path)                     # the shards' directories, before the manifest
    _write_manifest(path, doc)
    return doc


def _write_manifest(path, doc):
    _write_durable(os.path.join(path, MANIFEST), _encode_manifest(doc))
    _fsync_dir(path)


def read_manifest(path):
    """The manifest of a built path, checked (format, version, checksum)."""
    file = os.path.join(os.fspath(path), MANIFEST)
    if not os.path.exists(file):
        raise FileNotFoundError(f"no knndirect.ray index at {path}: no manifest.json (a build "
                                "that failed or never finished leaves none)")
    return _read_json_manifest(file, FORMAT, VERSION, "knndirect.ray manifest")


# -- serving ------------------------------------------------------------------
class _ShardServer:
    """The actor of one shard replica: the shard opened read-only."""

    def __init__(self, path, options):
        self._col = Collection.open(path, writable=False, **options)
        self._stall_until = 0.0

    def ready(self):
        return os.getpid()

    def search(self, queries, k, options):
        pause = self._stall_until - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        return self._col.search(queries, k, **options)

    def info(self):
        return self._col.info()

    def refresh(self):
        return self._col.refresh()

    def _stall(self, seconds):
        """Tests: answer no search for the next `seconds`."""
        self._stall_until = time.monotonic() + float(seconds)


def _merge_top_k(results, k, metric, n):
    """Global top k of the shards' (D, I), by exact distance (ties: smaller id)."""
    if not results:
        worst = np.inf if metric == "l2" else -np.inf
        return np.full((n, k), worst, np.float32), np.full((n, k), -1, np.int64)
    D = np.concatenate([r[0] for r in results], axis=1)
    ids = np.concatenate([r[1] for r in results], axis=1)
    key = D if metric == "l2" else -D
    rows = np.arange(n)[:, None]
    order = np.lexsort((ids, key), axis=1)[:, :k] if n else np.zeros((0, k), np.int64)
    if order.shape[1] < k:                 # fewer than k candidates in all
        pad = k - order.shape[1]
        worst = np.inf if metric == "l2" else -np.inf
        return (np.concatenate([D[rows, order], np.full((n, pad), worst, np.float32)], 1),
                np.concatenate([ids[rows, order], np.full((n, pad), -1, np.int64)], 1))
    return np.ascontiguousarray(D[rows, order]), np.ascontiguousarray(ids[rows, order])


class ShardedIndex:
    """A built path served by one Ray actor per shard replica; see :func:`open`."""

    def __init__(self, path, doc, replicas, max_restarts, retries, actor_options, open_options):
        self._path = path
        self._doc = doc
        self._replicas = replicas
        self._retries = retries
        self._dim = int(doc["dim"])
        self._metric = doc["metric"]
        self._lock = threading.Lock()
        self._missing = []
        self._queries = 0
        self._retried = 0
        self._owner = True
        self._closed = False
        self._inflight = {}
        self._turn = itertools.count()
        self._open_options = dict(open_options)
        options = {"num_cpus": 0, "max_concurrency": 4}
        options.update(actor_options or {})
        options["max_restarts"] = max_restarts
        options["max_task_retries"] = 0          # search() retries, with its own deadline
        cls = ray.remote(_ShardServer).options(**options)
        self._actors = [[cls.remote(os.path.join(path, s["name"]), open_options)
                         for _ in range(replicas)] for s in doc["shards"]]
        try:
            ray.get([a.ready.remote() for group in self._actors for a in group])
        except BaseException:
            self._kill()
            raise

    def __getstate__(self):
        state = self.__dict__.copy()
        del state["_lock"], state["_turn"]
        state["_inflight"] = {}
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._lock = threading.Lock()
        self._turn = itertools.count()
        self._owner = False          # a copy in a task or actor never kills the actors

    # -- properties
    @property
    def dim(self):
        return self._dim

    @property
    def metric(self):
        return self._metric

    @property
    def path(self):
        return self._path

    def __len__(self):
        return int(self._doc["count"])

    def _check_open(self):
        if self._closed:
            raise ValueError("the sharded index is closed")

    def _pick(self, shard, avoid=()):
        """The replica of shard with the fewest searches in flight from here
        (round-robin among equals), preferring one not in avoid."""
        group = self._actors[shard]
        start = next(self._turn)
        order = [(start + j) % len(group) for j in range(len(group))]
        with self._lock:
            order.sort(key=lambda r: (r in avoid, self._inflight.get((shard, r), 0)))
            r = order[0]
            self._inflight[(shard, r)] = self._inflight.get((shard, r), 0) + 1
        return r

    def _done(self, shard, r):
        with self._lock:
            self._inflight[(shard, r)] -= 1

    def search(self, queries, k=10, *, timeout=None, allow_partial=False, ef=None,
               oversample=None, recall=None, rerank=True, filter=None, exact=False,
               threads=None, output="numpy"):
        """Search every shard once with the whole batch and merge the global
        top k by distance. Options and results are those of
        :meth:`knndirect.Collection.search`, plus:

        timeout : float, optional
            Seconds for the whole query. A shard that has not answered by
            then raises :class:`ShardTimeoutError` naming it, unless
            allow_partial.
        allow_partial : bool
            Return what the shards that answered found; ``info()["missing_shards"]``
            lists the others (for the last query).
        output : {"numpy", "arrow"}
            "arrow": a pyarrow Table with list columns ``ids`` and
            ``distances``, one row per query (for ``ray.data`` pipelines).

        A recall target goes to every shard, which picks its own beam and
        shortlist for it: each of the global top k is in its shard's top k,
        which that shard finds with the target's recall.

        A shard replica that dies mid-query is retried (Ray restarts it, or
        another replica answers); a shard that cannot answer raises
        :class:`ShardUnavailableError`, unless allow_partial.
        """
        self._check_open()
        if output not in ("numpy", "arrow"):
            raise ValueError(f"output must be 'numpy' or 'arrow', got {output!r}")
        if timeout is not None:
            timeout = float(timeout)
            if not timeout > 0:
                raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
        single, q, _ = _search_args(queries, self._dim, k, ef, oversample, rerank, exact,
                                    threads, filter)
        _recall_target(recall, ef, oversample)     # bad values raise here, not in a shard
        k = int(k)
        options = {"ef": ef, "oversample": oversample, "recall": recall, "rerank": bool(rerank),
                   "filter": None if filter is None else np.asarray(filter, np.int64),
                   "exact": bool(exact), "threads": threads}
        deadline = None if timeout is None else time.monotonic() + timeout
        qref = ray.put(q)                          # travels once, to every shard
        nshards = len(self._actors)
        tried = {s: set() for s in range(nshards)}
        attempts = {s: 0 for s in range(nshards)}
        running = {}
        later = {}                                 # shard -> when to ask it again
        patience = {}                              # shard -> waiting for a restart until
        pauses = {s: 0 for s in range(nshards)}

        def submit(s):
            r = self._pick(s, tried[s])
            tried[s].add(r)
            attempts[s] += 1
            running[self._actors[s][r].search.remote(qref, k, options)] = (s, r)

        for s in range(nshards):
            submit(s)
        results, dead, errors = {}, [], {}
        try:
            while running or later:
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    break
                for s in [s for s, at in later.items() if at <= now]:
                    del later[s]
                    submit(s)
                wake = [deadline] if deadline is not None else []
                wake += list(later.values())
                left = max(0.0, min(wake) - now) if wake else None
                if not running:
                    time.sleep(left)
                    continue
                ready, _ = ray.wait(list(running), num_returns=1, timeout=left)
                if not ready:
                    continue                       # a resubmission is due, or the deadline
                ref = ready[0]
                s, r = running.pop(ref)
                self._done(s, r)
                try:
                    results[s] = ray.get(ref)
                except RayActorError as e:
                    errors[s] = e
                    now = time.monotonic()
                    if isinstance(e, ActorUnavailableError) and \
                            now < patience.setdefault(s, now + RESTART_WAIT):
                        # Restarting: ask again after a pause that grows,
                        # without spending one of the retries.
                        attempts[s] -= 1
                        pauses[s] += 1
                        later[s] = now + min(2.0, 0.05 * 2 ** pauses[s])
                    elif attempts[s] <= self._retries:
                        submit(s)
                    else:
                        dead.append(s)
                        continue
                    with self._lock:
                        self._retried += 1
        except BaseException:
            for ref in running:
                ray.cancel(ref)
            raise
        late = sorted({s for s, _ in running.values()} | set(later))
        for ref, (s, r) in running.items():
            ray.cancel(ref)
            self._done(s, r)
        names = [self._doc["shards"][s]["name"] for s in range(nshards)]
        missing = sorted(set(late) | set(dead))
        with self._lock:
            self._missing = [names[s] for s in missing]
            self._queries += q.shape[0]
        if missing and not allow_partial:
            if late:
                raise ShardTimeoutError(
                    f"shard(s) {', '.join(names[s] for s in late)} of {self._path} did not "
                    f"answer within {timeout} s (pass allow_partial=True for partial results)",
                    [names[s] for s in late])
            first = errors[dead[0]]
            raise ShardUnavailableError(
                f"shard(s) {', '.join(names[s] for s in dead)} of {self._path} cannot answer: "
                f"its actors died and Ray cannot restart them after {attempts[dead[0]]} tries "
                f"({type(first).__name__}); pass allow_partial=True for partial results",
                [names[s] for s in dead]) from first
        D, ids = _merge_top_k([results[s] for s in sorted(results)], k, self._metric,
                              q.shape[0])
        if output == "arrow":
            return _arrow_table(D, ids)
        if single:
            return D[0], ids[0]
        return D, ids

    def tune(self, queries, k=10, *, threads=None):
        """Calibrate every shard's recall targets on your own queries: one
        Ray task per shard opens its collection for writing and runs
        :meth:`knndirect.Collection.tune` (each shard's truth by brute force
        over that shard, so each finds its own top k at the target, and so
        the merged top k does too), then commits; every replica then moves
        to that commit. Segments the shards write later are calibrated on
        the same queries. Needs the shards' paths where the tasks run, and
        no other writer open on them.

        Each shard commits on its own. If one fails, the others keep their
        tune (a shard's table is right either way) and
        :class:`ShardError` names the failed shards; run tune again to
        finish. Returns one dict per shard: name and segments.
        """
        self._check_open()
        q, k = _tune_args(queries, self._dim, k)
        nshards = len(self._actors)
        cpus = _cpus_per_shard(nshards)
        options = {key: self._open_options[key] for key in ("io_backend", "direct_io")
                   if key in self._open_options}
        task = ray.remote(_tune_shard).options(num_cpus=cpus, max_retries=0)
        qref = ray.put(q)
        names = [s["name"] for s in self._doc["shards"]]
        refs = [task.remote(os.path.join(self._path, name), qref, k,
                            cpus if threads is None else threads, options) for name in names]
        done, failed = [], {}
        for name, ref in zip(names, refs):
            try:
                done.append({"name": name, "segments": ray.get(ref)})
            except Exception as e:             # the task's error, re-raised by ray.get
                failed[name] = e
        for ref in [a.refresh.remote() for group in self._actors for a in group]:
            try:
                ray.get(ref)
            except RayActorError:
                pass                           # a restarted actor opens the newest commit
        if done:
            self._record_tune(done, {"queries": int(q.shape[0]), "k": k})
        if failed:
            first = next(iter(failed.values()))
            cause = getattr(first, "cause", None) or first
            raise ShardError(f"tune failed on shard(s) {', '.join(failed)} of {self._path} "
                             f"({type(cause).__name__}: {cause}); the other shards are tuned "
                             "and committed", list(failed)) from first
        return done

    def _record_tune(self, done, tune):
        """The tuned shards' tune and segment bytes into the manifest, so
        info() and shards() here and in later opens report them."""
        doc = {**self._doc, "shards": [dict(s) for s in self._doc["shards"]]}
        by_name = {s["name"]: s for s in doc["shards"]}
        for d in done:
            entry = by_name[d["name"]]
            entry["tune"] = dict(tune)
            entry["bytes"] = int(sum(seg["bytes"] for seg in d["segments"]))
        _write_manifest(self._path, doc)
        with self._lock:
            self._doc = doc

    def info(self):
        """The manifest's facts (dim, metric, count, params), shards,
        replicas, tune ({"queries", "k"} when every shard carries that
        tune, else None; shards() has each shard's), queries, retried
        (searches retried after an actor died), and missing_shards: the
        shards that did not answer the last query."""
        with self._lock:
            tunes = [s.get("tune") for s in self._doc["shards"]]
            return {"path": self._path, "dim": self._dim, "metric": self._metric,
                    "count": len(self), "shards": len(self._actors),
                    "replicas": self._replicas, "params": dict(self._doc["params"]),
                    "quantizer": self._doc["quantizer"],
                    "tune": tunes[0] if all(t == tunes[0] for t in tunes) else None,
                    "queries": self._queries, "retried": self._retried,
                    "missing_shards": list(self._missing), "closed": self._closed}

    def shards(self):
        """One dict per shard: name, path, count, bytes (its segment
        files), replicas, tune ({"queries", "k"} of its last tune, or
        None)."""
        with self._lock:
            return [{"name": s["name"], "path": os.path.join(self._path, s["name"]),
                     "count": s["count"], "bytes": s["bytes"], "replicas": self._replicas,
                     "tune": s.get("tune")} for s in self._doc["shards"]]

    def actors(self):
        """The Ray actor handles: one list per shard, one handle per replica."""
        return [list(group) for group in self._actors]

    def _kill(self):
        for group in getattr(self, "_actors", []):
            for a in group:
                try:
                    ray.kill(a)
                except Exception:
                    pass

    def close(self):
        """Stop the actors (only the process that opened the index does)."""
        if self._closed:
            return
        self._closed = True
        if self._owner:
            self._kill()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        state = "closed" if self._closed else "open"
        return (f"<knndirect.ray.ShardedIndex {self._path!r} dim={self._dim} "
                f"metric={self._metric!r} count={len(self)} shards={len(self._actors)} "
                f"replicas={self._replicas} {state}>")


def _arrow_table(D, ids):
    import pyarrow as pa
    n, k = ids.shape
    return pa.table({
        "ids": pa.FixedSizeListArray.from_arrays(pa.array(ids.reshape(-1)), k),
        "distances": pa.FixedSizeListArray.from_arrays(pa.array(D.reshape(-1)), k)})


def open(path, *, replicas=1, io_backend="auto", max_restarts=3, retries=3, actor_options=None,
         **open_options):
    """Serve a built path: one Ray actor per shard replica, each with its
    shard open read-only (:meth:`knndirect.Collection.open` with io_backend
    and open_options: direct_io, io_depth, preload, threads).

    max_restarts: how often Ray restarts a dead actor; retries: how often a
    search resends a shard's batch after its actor died. actor_options:
    extra ``.options()`` for the actors (default num_cpus=0,
    max_concurrency=4; e.g. resources or a scheduling strategy). Every node
    that may run an actor must see path (a shared or replicated filesystem).
    """
    path = os.path.abspath(os.fspath(path))
    doc = read_manifest(path)
    if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 1:
        raise ValueError(f"replicas must be a positive int, got {replicas!r}")
    _ray_required()
    options = dict(open_options)
    options["io_backend"] = io_backend
    return ShardedIndex(path, doc, replicas, int(max_restarts), int(retries), actor_options,
                        options)
