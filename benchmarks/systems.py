"""One adapter per benchmarked system: how to build it, save it, load it, set
its search-time knob and run a batch search with a given thread count.

Every HNSW-family system gets the same M (level 0 keeps 2*M links) and
ef_construction. Cosine is native in knndirect, hnswlib, usearch, voyager and
lancedb; faiss and diskannpy get L2-normalized vectors and queries
(normalization is inside the timed build and the timed search) and rank by L2,
which on unit vectors is the cosine order; scann likewise gets normalized
vectors and ranks by dot product.
"""
from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np

from bench_data import normalize_rows

EF_SWEEP = [10, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512]
EF_SWEEP_QUICK = [10, 16, 32, 64, 128, 256]
KD_EF = [16, 24, 32, 48, 64, 96, 128, 192, 256]
KD_EF_QUICK = [16, 32, 64, 128]
KD_OVERSAMPLE = [1, 2, 3, 5, 10]
KD_OVERSAMPLE_QUICK = [2, 5, 10]
# Refined codes put the answer at the front: shortlists of 1-3 x k, wider beams.
KD_REFINED_EF = [32, 48, 64, 96, 128, 192, 256, 384]
KD_REFINED_OVERSAMPLE = [1, 1.5, 2, 3]


def kd_points(k, efs, oss):
    """The default search, then every (ef, oversample) of the grid with ef >= k."""
    out = [{"ef": None, "oversample": None, "default": True}]
    out += [{"ef": ef, "oversample": os_} for os_ in oss for ef in efs if ef >= k]
    return out


def _move_into(built, folder):
    """Move what a build wrote into its own folder into the index folder."""
    import shutil
    for p in Path(built).iterdir():
        shutil.move(str(p), os.path.join(folder, p.name))
    os.rmdir(built)


def _files_size(folder):
    return sum(p.stat().st_size for p in Path(folder).rglob("*") if p.is_file())


class System:
    name = ""
    builds_as = None        # another system's build is reused (knndirect-disk)
    normalize_cosine = False
    note = ""

    def __init__(self, cfg):
        self.cfg = cfg      # dict: metric, m, ef_construction, k, dim, n, quick

    # availability
    def import_lib(self):
        """Import the library; return its version string. Raises ImportError."""
        raise NotImplementedError

    @property
    def prepare_cosine(self):
        return self.normalize_cosine and self.cfg["metric"] == "cosine"

    def prep(self, x):
        """The vectors as this system receives them (copy when normalizing)."""
        if self.prepare_cosine:
            return normalize_rows(np.array(x, dtype=np.float32, order="C"))
        return x

    def build(self, x, threads):
        raise NotImplementedError

    def save(self, index, folder):
        raise NotImplementedError

    def load(self, folder):
        raise NotImplementedError

    def points(self):
        k = self.cfg["k"]
        efs = EF_SWEEP_QUICK if self.cfg["quick"] else EF_SWEEP
        return [{"ef": ef} for ef in efs if ef >= k]

    def search(self, index, q, point, threads):
        """Return int64 ids (nq, k)."""
        raise NotImplementedError

    def info(self, index):
        return {}

    def close(self, index):
        pass


class Knndirect(System):
    name = "knndirect"
    note = "in RAM (kd.load): 1-bit codes + HNSW, float32 rerank from RAM"
    metric_map = {"cosine": "cosine", "l2": "l2", "ip": "ip"}

    def import_lib(self):
        import knndirect
        self.kd = knndirect
        return knndirect.__version__

    quantization = "1bit"

    def build(self, x, threads):
        c = self.cfg
        index = self.kd.Index(c["dim"], c["metric"], m=c["m"],
                              ef_construction=c["ef_construction"],
                              quantization=self.quantization)
        index.add(x, threads=threads)
        return index

    def save(self, index, folder):
        index.save(os.path.join(folder, "index.kdx"))

    def load(self, folder):
        return self.kd.load(os.path.join(folder, "index.kdx"))

    def opened_info(self, folder):
        """info() of the same file opened with kd.open (vectors left on disk)."""
        with self.kd.open(os.path.join(folder, "index.kdx")) as index:
            return self.info(index)

    def points(self):
        k = self.cfg["k"]
        efs = KD_EF_QUICK if self.cfg["quick"] else KD_EF
        oss = KD_OVERSAMPLE_QUICK if self.cfg["quick"] else KD_OVERSAMPLE
        # ef (beam width) and oversample (shortlist = ceil(k * oversample), drawn
        # from every node the search scores) are independent knobs: sweep the grid.
        return kd_points(k, efs, oss)

    def search(self, index, q, point, threads):
        _, ids = index.search(q, self.cfg["k"], ef=point["ef"], oversample=point["oversample"],
                              threads=threads)
        return ids

    def info(self, index):
        i = index.info()
        keep = ("resident_bytes", "record_size", "io_backend", "direct_io",
                "default_ef", "default_oversample", "quantization", "storage", "fallbacks")
        return {key: i[key] for key in keep if key in i}

    def close(self, index):
        index.close()


class KnndirectDisk(Knndirect):
    name = "knndirect-disk"
    builds_as = "knndirect"
    note = "opened (kd.open): graph + codes in RAM, float32 rerank by O_DIRECT batch reads"
    opened_info = None

    def load(self, folder):
        return self.kd.open(os.path.join(folder, "index.kdx"))

    def points(self):
        efs = [32, 128] if self.cfg["quick"] else [32, 64, 128, 256]
        oss = [2, 5] if self.cfg["quick"] else [2, 3, 5, 10]
        return kd_points(self.cfg["k"], efs, oss)


class KnndirectRefined(Knndirect):
    name = "knndirect-refined"
    quantization = "1bit+4bit"
    note = ("in RAM (kd.load), quantization=\"1bit+4bit\": the beam's best re-ordered by "
            "4-bit codes before the float32 rerank")

    def points(self):
        efs, oss = KD_REFINED_EF, KD_REFINED_OVERSAMPLE
        if self.cfg["quick"]:
            efs, oss = efs[::2], oss[1:3]
        return kd_points(self.cfg["k"], efs, oss)


class KnndirectRefinedDisk(KnndirectRefined):
    name = "knndirect-refined-disk"
    builds_as = "knndirect-refined"
    note = ("opened (kd.open), quantization=\"1bit+4bit\": graph + both codes in RAM, "
            "float32 rerank by O_DIRECT batch reads")
    opened_info = None
    load = KnndirectDisk.load


class Hnswlib(System):
    name = "hnswlib"
    note = "hnswlib.Index, float32, native cosine space"

    def import_lib(self):
        import hnswlib
        self.lib = hnswlib
        import importlib.metadata as md
        return md.version("hnswlib")

    def _space(self):
        return {"cosine": "cosine", "l2": "l2", "ip": "ip"}[self.cfg["metric"]]

    def build(self, x, threads):
        c = self.cfg
        index = self.lib.Index(space=self._space(), dim=c["dim"])
        index.init_index(max_elements=x.shape[0], ef_construction=c["ef_construction"],
                         M=c["m"], random_seed=100)
        index.set_num_threads(threads)
        index.add_items(x, np.arange(x.shape[0]), num_threads=threads)
        return index

    def save(self, index, folder):
        index.save_index(os.path.join(folder, "index.bin"))

    def load(self, folder):
        index = self.lib.Index(space=self._space(), dim=self.cfg["dim"])
        index.load_index(os.path.join(folder, "index.bin"), max_elements=self.cfg["n"])
        return index

    def search(self, index, q, point, threads):
        index.set_ef(point["ef"])
        index.set_num_threads(threads)
        ids, _ = index.knn_query(q, k=self.cfg["k"], num_threads=threads)
        return ids


class FaissHNSW(System):
    name = "faiss-hnsw"
    normalize_cosine = True
    note = "faiss IndexHNSWFlat (float32); cosine as L2 on normalized vectors"

    def import_lib(self):
        import faiss
        self.faiss = faiss
        return faiss.__version__

    def _metric(self):
        f = self.faiss
        return f.METRIC_INNER_PRODUCT if self.cfg["metric"] == "ip" else f.METRIC_L2

    def _make(self):
        c = self.cfg
        index = self.faiss.IndexHNSWFlat(c["dim"], c["m"], self._metric())
        index.hnsw.efConstruction = c["ef_construction"]
        return index, index

    def build(self, x, threads):
        self.faiss.omp_set_num_threads(threads)
        x = self.prep(x)
        index, _ = self._make()
        index.train(x)
        index.add(x)
        return index

    def save(self, index, folder):
        self.faiss.write_index(index, os.path.join(folder, "index.faiss"))

    def load(self, folder):
        return self.faiss.read_index(os.path.join(folder, "index.faiss"))

    def _hnsw(self, index):
        return self.faiss.downcast_index(index)

    def search(self, index, q, point, threads):
        self.faiss.omp_set_num_threads(threads)
        q = self.prep(q)
        self._hnsw(index).hnsw.efSearch = point["ef"]
        _, ids = index.search(q, self.cfg["k"])
        return ids


class FaissRefined(FaissHNSW):
    """An HNSW over compressed codes, wrapped in IndexRefineFlat: the shortlist
    of k * k_factor is re-scored with float32 vectors held in RAM."""
    k_factors = (1, 2, 4)
    k_factors_quick = (2,)

    def _base(self):
        raise NotImplementedError

    def _make(self):
        base = self._base()
        base.hnsw.efConstruction = self.cfg["ef_construction"]
        return self.faiss.IndexRefineFlat(base), base

    def build(self, x, threads):
        self.faiss.omp_set_num_threads(threads)
        x = self.prep(x)
        index, base = self._make()
        index.train(x)
        index.add(x)
        return index

    def load(self, folder):
        raw = self.faiss.read_index(os.path.join(folder, "index.faiss"))
        index = self.faiss.downcast_index(raw)
        self._keep = raw  # the wrapper that owns the C++ object must outlive the view
        self._post_load(index)
        return index

    def _post_load(self, index):
        pass

    def points(self):
        k = self.cfg["k"]
        efs = EF_SWEEP_QUICK if self.cfg["quick"] else EF_SWEEP
        kfs = self.k_factors_quick if self.cfg["quick"] else self.k_factors
        return [{"ef": ef, "k_factor": kf} for kf in kfs for ef in efs if ef >= k * kf]

    def search(self, index, q, point, threads):
        self.faiss.omp_set_num_threads(threads)
        q = self.prep(q)
        base = self.faiss.downcast_index(index.base_index)
        base.hnsw.efSearch = point["ef"]
        index.k_factor = point["k_factor"]
        _, ids = index.search(q, self.cfg["k"])
        return ids


class FaissHNSWSQ8(FaissRefined):
    name = "faiss-hnsw-sq8"
    note = "faiss IndexHNSWSQ (8-bit scalar codes) + IndexRefineFlat (float32 in RAM)"

    def _base(self):
        c = self.cfg
        return self.faiss.IndexHNSWSQ(c["dim"], self.faiss.ScalarQuantizer.QT_8bit, c["m"],
                                      self._metric())


class FaissRaBitQ(FaissRefined):
    name = "faiss-rabitq"
    note = ("faiss IndexHNSWRaBitQ (1-bit RaBitQ codes, 4-bit queries) + IndexRefineFlat "
            "(float32 in RAM)")
    k_factors = (4, 8, 16, 32)
    k_factors_quick = (8, 16)
    query_bits = 4

    def import_lib(self):
        version = super().import_lib()
        if not hasattr(self.faiss, "IndexHNSWRaBitQ"):
            raise ImportError(f"faiss {version} has no IndexHNSWRaBitQ")
        return version

    def _base(self):
        c = self.cfg
        base = self.faiss.IndexHNSWRaBitQ(c["dim"], c["m"], self._metric())
        self._set_qb(base)
        return base

    def _set_qb(self, base):
        storage = self.faiss.downcast_index(base.storage)
        if hasattr(storage, "qb"):
            storage.qb = self.query_bits

    def _post_load(self, index):
        self._set_qb(self.faiss.downcast_index(index.base_index))


class FaissIVFRaBitQ(FaissRefined):
    """Not a graph: an inverted file of RaBitQ codes (residuals to the list
    centroid), the way faiss mostly pairs with RaBitQ; the knob is nprobe."""
    name = "faiss-ivf-rabitq"
    note = ("faiss IndexIVFRaBitQ (nlist = 4*sqrt(n), 4-bit queries) + IndexRefineFlat "
            "(float32 in RAM); not a graph, M/ef_construction do not apply")
    k_factors = (2, 4, 8, 16)
    k_factors_quick = (4, 8)
    nprobes = (4, 8, 16, 32, 64, 128, 256)
    nprobes_quick = (8, 32, 128)
    query_bits = 4

    def import_lib(self):
        version = super().import_lib()
        if not hasattr(self.faiss, "IndexIVFRaBitQ"):
            raise ImportError(f"faiss {version} has no IndexIVFRaBitQ")
        return version

    def _make(self):
        c = self.cfg
        nlist = max(16, int(4 * math.sqrt(c["n"])))
        self._quantizer = self.faiss.IndexFlat(c["dim"], self._metric())
        base = self.faiss.IndexIVFRaBitQ(self._quantizer, c["dim"], nlist, self._metric())
        base.qb = self.query_bits
        return self.faiss.IndexRefineFlat(base), base

    def _post_load(self, index):
        self.faiss.downcast_index(index.base_index).qb = self.query_bits

    def points(self):
        kfs = self.k_factors_quick if self.cfg["quick"] else self.k_factors
        nps = self.nprobes_quick if self.cfg["quick"] else self.nprobes
        return [{"nprobe": p, "k_factor": kf} for kf in kfs for p in nps]

    def search(self, index, q, point, threads):
        self.faiss.omp_set_num_threads(threads)
        q = self.prep(q)
        self.faiss.downcast_index(index.base_index).nprobe = point["nprobe"]
        index.k_factor = point["k_factor"]
        _, ids = index.search(q, self.cfg["k"])
        return ids


class Usearch(System):
    name = "usearch"
    note = "usearch Index, f32, native cos metric"

    def import_lib(self):
        import usearch
        import usearch.index
        self.lib = usearch.index
        return usearch.__version__

    def _metric(self):
        return {"cosine": "cos", "l2": "l2sq", "ip": "ip"}[self.cfg["metric"]]

    def _new(self):
        c = self.cfg
        return self.lib.Index(ndim=c["dim"], metric=self._metric(), dtype="f32",
                              connectivity=c["m"], expansion_add=c["ef_construction"],
                              expansion_search=64)

    def build(self, x, threads):
        index = self._new()
        index.add(np.arange(x.shape[0], dtype=np.uint64), x, threads=threads)
        return index

    def save(self, index, folder):
        index.save(os.path.join(folder, "index.usearch"))

    def load(self, folder):
        index = self._new()
        index.load(os.path.join(folder, "index.usearch"))
        return index

    def search(self, index, q, point, threads):
        index.expansion_search = point["ef"]
        m = index.search(q, self.cfg["k"], threads=threads)
        return np.asarray(m.keys, dtype=np.int64)


class DiskANN(System):
    name = "diskann"
    normalize_cosine = True
    note = ("diskannpy in-memory Vamana (StaticMemoryIndex), graph_degree = 2*M, "
            "build complexity = ef_construction, alpha 1.2; cosine as L2 on normalized vectors")

    def import_lib(self):
        import diskannpy
        self.lib = diskannpy
        import importlib.metadata as md
        return md.version("diskannpy")

    def _metric(self):
        return {"cosine": "l2", "l2": "l2", "ip": "mips"}[self.cfg["metric"]]

    def build(self, x, threads):
        import tempfile
        x = self.prep(x)
        c = self.cfg
        folder = tempfile.mkdtemp(dir=self.cfg.get("scratch"))
        self.lib.build_memory_index(
            data=x, distance_metric=self._metric(), index_directory=folder,
            complexity=c["ef_construction"], graph_degree=2 * c["m"], num_threads=threads,
            alpha=1.2, use_pq_build=False, num_pq_bytes=0, use_opq=False)
        return folder

    def save(self, index, folder):
        _move_into(index, folder)

    def load(self, folder):
        return self.lib.StaticMemoryIndex(index_directory=folder, num_threads=os.cpu_count(),
                                          initial_search_complexity=max(EF_SWEEP))

    def points(self):
        k = self.cfg["k"]
        efs = EF_SWEEP_QUICK if self.cfg["quick"] else EF_SWEEP
        return [{"L": ef} for ef in efs if ef >= k]

    def search(self, index, q, point, threads):
        q = self.prep(q)
        r = index.batch_search(q, self.cfg["k"], point["L"], threads)
        return np.asarray(r.identifiers, dtype=np.int64)


def _pkg_version(name):
    import importlib.metadata as md
    return md.version(name)


def _writable_f32(x):
    """x as a C-contiguous, writeable float32 array (voyager's bindings refuse
    read-only arrays, e.g. a read-only mmap): a copy only when x is not one
    already (the worker's base and query arrays are, so it copies nothing)."""
    if x.dtype == np.float32 and x.flags.c_contiguous and x.flags.writeable:
        return x
    return np.array(x, dtype=np.float32, order="C")


class ScaNN(System):
    """ScaNN tuned as its docs advise (docs/algorithms.md and the example
    notebook of google-research/scann): a k-means tree of about sqrt(n)
    leaves, asymmetric hashing with 2 dimensions per block, then exact float32
    re-scoring of the shortlist."""
    name = "scann"
    normalize_cosine = True
    note = ("scann_ops_pybind: tree(num_leaves = sqrt(n), training_sample_size = min(n, 250k)) + "
            "score_ah(2 dims/block; anisotropic_quantization_threshold 0.2 for dot product, none "
            "for squared_l2) + reorder (float32 re-score); cosine as dot product on normalized "
            "vectors; build threads via set_n_training_threads; 1 thread: search_batched, "
            "T > 1: set_num_threads(T - 1) + search_batched_parallel (the calling thread works "
            "beside the T - 1 pool threads); not a graph, M/ef_construction do not apply")
    leaves_fracs = (0.01, 0.02, 0.04, 0.08, 0.16)
    leaves_fracs_quick = (0.015, 0.03, 0.06, 0.12)
    reorder_mults = (2, 4, 8, 16, 32)
    reorder_mults_quick = (2, 5, 10, 20)

    def import_lib(self):
        from scann.scann_ops.py import scann_ops_pybind
        self.lib = scann_ops_pybind
        return _pkg_version("scann")

    def _distance(self):
        return "squared_l2" if self.cfg["metric"] == "l2" else "dot_product"

    def num_leaves(self):
        return max(1, int(round(math.sqrt(self.cfg["n"]))))

    def training_sample_size(self):
        return min(self.cfg["n"], 250_000)

    def build(self, x, threads):
        c = self.cfg
        x = np.ascontiguousarray(self.prep(x), dtype=np.float32)
        nl = self.num_leaves()
        b = self.lib.builder(x, c["k"], self._distance())
        b = b.tree(num_leaves=nl, num_leaves_to_search=max(1, nl // 20),
                   training_sample_size=self.training_sample_size())
        if self._distance() == "dot_product":
            b = b.score_ah(2, anisotropic_quantization_threshold=0.2)
        else:
            # Anisotropic (score-aware) quantization is defined for inner products.
            b = b.score_ah(2)
        b = b.reorder(10 * c["k"])
        b.set_n_training_threads(threads)
        return b.build()

    def save(self, index, folder):
        index.serialize(folder, relative_path=True)

    def load(self, folder):
        return self.lib.load_searcher(folder)

    def points(self):
        k, nl = self.cfg["k"], self.num_leaves()
        fracs = self.leaves_fracs_quick if self.cfg["quick"] else self.leaves_fracs
        mults = self.reorder_mults_quick if self.cfg["quick"] else self.reorder_mults
        leaves = sorted({min(nl, max(1, int(round(f * nl)))) for f in fracs})
        return [{"leaves": lv, "reorder": m * k} for m in mults for lv in leaves]

    def search(self, index, q, point, threads):
        q = np.ascontiguousarray(self.prep(q), dtype=np.float32)
        k = self.cfg["k"]
        if threads <= 1:
            ids, _ = index.search_batched(q, k, point["reorder"], point["leaves"])
        else:
            if getattr(self, "_pool_threads", None) != threads:
                index.set_num_threads(threads - 1)
                self._pool_threads = threads
            # Batches of at most ScaNN's default 256 queries, at least 4 per thread.
            bs = min(256, max(16, -(-len(q) // (4 * threads))))
            ids, _ = index.search_batched_parallel(q, k, point["reorder"], point["leaves"],
                                                   batch_size=bs)
        return np.asarray(ids, dtype=np.int64)

    def info(self, index):
        return {"num_leaves": self.num_leaves(), "training_sample_size":
                self.training_sample_size(), "distance_measure": self._distance(),
                "dimensions_per_block": 2, "build_reorder": 10 * self.cfg["k"]}


class Voyager(System):
    name = "voyager"
    note = ("Spotify voyager Index (hnswlib-based HNSW), StorageDataType.Float32, M and "
            "ef_construction as the others; Space.Cosine / Euclidean / InnerProduct (cosine "
            "native: voyager normalizes on insert); add_items and query with num_threads")

    def import_lib(self):
        import voyager
        self.lib = voyager
        return _pkg_version("voyager")

    def _space(self):
        S = self.lib.Space
        return {"cosine": S.Cosine, "l2": S.Euclidean, "ip": S.InnerProduct}[self.cfg["metric"]]

    def build(self, x, threads):
        c = self.cfg
        index = self.lib.Index(self._space(), num_dimensions=c["dim"], M=c["m"],
                               ef_construction=c["ef_construction"], random_seed=1,
                               max_elements=x.shape[0],
                               storage_data_type=self.lib.StorageDataType.Float32)
        index.add_items(_writable_f32(x), list(range(x.shape[0])), num_threads=threads)
        return index

    def save(self, index, folder):
        index.save(os.path.join(folder, "index.voy"))

    def load(self, folder):
        return self.lib.Index.load(os.path.join(folder, "index.voy"))

    def search(self, index, q, point, threads):
        ids, _ = index.query(_writable_f32(q), k=self.cfg["k"],
                             num_threads=threads, query_ef=point["ef"])
        return np.asarray(ids, dtype=np.int64).reshape(len(q), self.cfg["k"])


class LanceDB(System):
    """An on-disk LanceDB table (id, vector) with an IVF_PQ index; the float32
    vectors stay in the table's files and are read back for the refine step."""
    name = "lancedb"
    note = ("LanceDB table on disk + IVF_PQ index (num_partitions = sqrt(n), num_sub_vectors = "
            "dim/8, 8-bit codes), native metric; knobs nprobes x refine_factor (float32 re-rank "
            "read from the table); LANCE_CPU_THREADS = the process's thread count. 1 thread: one "
            "query at a time from Python (Lance may still use helper threads inside a query); "
            "T > 1: multi-vector queries of at most 100 (LanceDB runs a call's queries "
            "concurrently on that pool)")
    table_name = "vectors"
    nprobes = (10, 20, 50)
    nprobes_quick = (4, 16)
    refine = (5, 10, 20, 50)
    refine_quick = (5, 10, 20)
    # 1,000 queries at nprobes 10 (20k x 128, 2 threads, AMD EPYC Zen 3) in
    # calls of 1,000 / 100 / 32 / 10 queries: 671 / 828 / 769 / 509 q/s at
    # refine 1, 302 / 456 / 405 / 332 at refine 10; a call of 1,000 also
    # took 277 MiB more than one of 1, a call of 100 73 MiB.
    CALL_ROWS = 100

    def import_lib(self):
        # Lance sizes its compute pool once per process, from LANCE_CPU_THREADS
        # (read on first use); run.py sets OMP_NUM_THREADS to the worker's count.
        os.environ.setdefault("LANCE_CPU_THREADS", os.environ.get("OMP_NUM_THREADS", "1"))
        import lancedb
        import pyarrow
        from lancedb.index import IvfPq
        self.lib, self.pa, self.IvfPq = lancedb, pyarrow, IvfPq
        return lancedb.__version__

    def _metric(self):
        return {"cosine": "cosine", "l2": "l2", "ip": "dot"}[self.cfg["metric"]]

    def num_partitions(self):
        return max(1, int(round(math.sqrt(self.cfg["n"]))))

    def num_sub_vectors(self):
        """dim/8 (8 values per sub-vector, one of the two widths LanceDB's docs
        prefer for SIMD); None (LanceDB's own choice) when 8 does not divide dim."""
        d = self.cfg["dim"]
        return d // 8 if d % 8 == 0 else None

    def _batches(self, x, rows=65536):
        pa = self.pa
        for lo in range(0, x.shape[0], rows):
            chunk = np.ascontiguousarray(x[lo:lo + rows], dtype=np.float32)
            yield pa.record_batch(
                [pa.array(np.arange(lo, lo + len(chunk), dtype=np.int64)),
                 pa.FixedSizeListArray.from_arrays(pa.array(chunk.reshape(-1)), x.shape[1])],
                names=["id", "vector"])

    def build(self, x, threads):
        import tempfile
        pa = self.pa
        folder = tempfile.mkdtemp(dir=self.cfg.get("scratch"))
        schema = pa.schema([("id", pa.int64()),
                            ("vector", pa.list_(pa.float32(), x.shape[1]))])
        db = self.lib.connect(folder)
        table = db.create_table(self.table_name,
                                data=pa.RecordBatchReader.from_batches(schema, self._batches(x)))
        table.create_index("vector", config=self.IvfPq(
            distance_type=self._metric(), num_partitions=self.num_partitions(),
            num_sub_vectors=self.num_sub_vectors()))
        return folder

    def save(self, index, folder):
        _move_into(index, folder)

    def load(self, folder):
        return self.lib.connect(folder).open_table(self.table_name)

    def points(self):
        nps = self.nprobes_quick if self.cfg["quick"] else self.nprobes
        rfs = self.refine_quick if self.cfg["quick"] else self.refine
        return [{"nprobes": p, "refine_factor": r} for r in rfs for p in nps]

    def _query(self, index, qv, point):
        return (index.search(qv).distance_type(self._metric()).nprobes(point["nprobes"])
                .refine_factor(point["refine_factor"]).limit(self.cfg["k"])
                .select(["id", "_distance"]))

    def batch_rows(self, point):
        """Queries per multi-vector call: at most CALL_ROWS, the fastest of
        10-1,000 measured. A call holds every query's refine pool of full
        vectors at once (about three copies of refine_factor x k rows), so
        under a memory budget (cfg "memory_budget") calls are cut to keep
        those within a quarter of it."""
        budget = self.cfg.get("memory_budget")
        if not budget:
            return self.CALL_ROWS
        pool = point["refine_factor"] * self.cfg["k"] * self.cfg["dim"] * 4 * 3
        return max(1, min(self.CALL_ROWS, budget // 4 // pool))

    def search(self, index, q, point, threads):
        rows = self.batch_rows(point)
        if rows and rows < len(q):
            return np.concatenate([self.search(index, q[i:i + rows], point, threads)
                                   for i in range(0, len(q), rows)])
        k = self.cfg["k"]
        out = np.full((len(q), k), -1, dtype=np.int64)
        if threads <= 1 or len(q) == 1:
            for i, qv in enumerate(q):
                ids = self._query(index, qv, point).to_arrow()["id"].to_numpy()
                out[i, :len(ids)] = ids[:k]
            return out
        r = self._query(index, q, point).to_arrow()
        qi = r["query_index"].to_numpy()
        ids = r["id"].to_numpy()
        order = np.lexsort((r["_distance"].to_numpy(), qi))
        qi, ids = qi[order], ids[order]
        starts = np.searchsorted(qi, np.arange(len(q)))
        ends = np.searchsorted(qi, np.arange(len(q)), side="right")
        for i in range(len(q)):
            row = ids[starts[i]:min(ends[i], starts[i] + k)]
            out[i, :len(row)] = row
        return out

    def info(self, index):
        return {"num_partitions": self.num_partitions(), "num_sub_vectors":
                self.num_sub_vectors(), "num_bits": 8, "distance_type": self._metric(),
                "lance_cpu_threads": os.environ.get("LANCE_CPU_THREADS"),
                "memory_budget": self.cfg.get("memory_budget")}


SYSTEMS = {cls.name: cls for cls in
           (Knndirect, KnndirectDisk, KnndirectRefined, KnndirectRefinedDisk, Hnswlib, FaissHNSW, FaissHNSWSQ8, FaissRaBitQ,
            FaissIVFRaBitQ, Usearch, DiskANN, ScaNN, Voyager, LanceDB)}
PEERS = ("hnswlib", "faiss-hnsw", "faiss-hnsw-sq8", "faiss-rabitq", "faiss-ivf-rabitq",
         "usearch", "diskann", "scann", "voyager")
# Run only when named in --systems: lancedb keeps its vectors in on-disk files and
# answers one query per Python call at 1 thread (a few hundred QPS), so its sweep
# takes minutes where the in-RAM peers take seconds.
OPT_IN = ("lancedb",)
DEFAULT_SYSTEMS = ("knndirect", "knndirect-disk") + PEERS


def index_files_size(folder):
    return _files_size(folder)
