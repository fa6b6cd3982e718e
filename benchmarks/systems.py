"""One adapter per benchmarked system: how to build it, save it, load it, set
its search-time knob and run a batch search with a given thread count.

Every HNSW-family system gets the same M (level 0 keeps 2*M links) and
ef_construction. Cosine is native in knndirect, hnswlib and usearch; faiss
and diskannpy get L2-normalized vectors and queries (normalization is inside
the timed build and the timed search) and rank by L2, which on unit vectors
is the cosine order.
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

    def build(self, x, threads):
        c = self.cfg
        index = self.kd.Index(c["dim"], c["metric"], m=c["m"],
                              ef_construction=c["ef_construction"])
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
        out = [{"ef": None, "oversample": None, "default": True}]
        out += [{"ef": ef, "oversample": os_} for os_ in oss for ef in efs if ef >= k]
        return out

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
        k = self.cfg["k"]
        out = [{"ef": None, "oversample": None, "default": True}]
        efs = [32, 128] if self.cfg["quick"] else [32, 64, 128, 256]
        oss = [2, 5] if self.cfg["quick"] else [2, 3, 5, 10]
        out += [{"ef": ef, "oversample": os_} for os_ in oss for ef in efs if ef >= k]
        return out


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
        import shutil
        for p in Path(index).iterdir():
            shutil.move(str(p), os.path.join(folder, p.name))
        os.rmdir(index)

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


SYSTEMS = {cls.name: cls for cls in
           (Knndirect, KnndirectDisk, Hnswlib, FaissHNSW, FaissHNSWSQ8, FaissRaBitQ,
            FaissIVFRaBitQ, Usearch, DiskANN)}
PEERS = ("hnswlib", "faiss-hnsw", "faiss-hnsw-sq8", "faiss-rabitq", "faiss-ivf-rabitq",
         "usearch", "diskann")
DEFAULT_SYSTEMS = ("knndirect", "knndirect-disk") + PEERS


def index_files_size(folder):
    return _files_size(folder)
