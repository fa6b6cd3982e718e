"""Write the golden index files of tests/test_storage_golden.py.

Run it ONLY together with a bump of the index format version
(KD_FORMAT_VERSION in csrc/format.h), and then ADD the new files beside the
old ones: the files already here were written by older versions, and every
later build must keep opening them with the same answers. Regenerating an
existing golden file in place defeats the test, so a case whose file exists
is skipped. A file is named by the version written into it: a build writes
the lowest version that holds the file's content (4 for 1-bit codes, refined
or not, since format 4 shortened their trailer; 5 for plain 1-bit codes of
256 dims or fewer, since format 5 pads them to 512 bits; 2 for scalar
codes), so a case can stay at an older version.

    python tests/data/make_golden.py            # writes golden_v<N>_*.{kdx,npz}

Everything is deterministic: fixed seeds and one build thread. Each .kdx has
a .npz beside it holding the base vectors, their ids, the removed ids, the
queries and the expected results:
  exact_D / exact_I: exact=True, k=10;
  full_D / full_I:   graph search with a beam and a shortlist as large as the
                     index (ef = oversample * k = all vectors), so that the
                     answer is exact and independent of the search heuristics,
                     yet it runs through codes, graph and rerank;
  calibration:       the recall calibration's stored bytes (format 2 on; empty
                     when the index has none: fewer than 1,000 vectors).
Queries are kept only where the top-k+1 distances are well separated, so
that a change of summation order in a SIMD kernel cannot reorder them.
"""
import os

import numpy as np

import knndirect as kd

HERE = os.path.dirname(os.path.abspath(__file__))
K = 10

CASES = [
    # name, n, dim, metric, quantization, m, seed
    ("l2_1bit", 500, 24, "l2", "1bit", 8, 20240601),
    ("cosine_4bit", 300, 24, "cosine", "4bit", 6, 20240602),
    # From format 2: large enough to carry a recall calibration.
    ("ip_1bit_calibrated", 1500, 24, "ip", "1bit", 8, 20261201),
    # From format 3: refined codes (section 10).
    ("l2_1bit_4bit_calibrated", 1500, 24, "l2", "1bit+4bit", 8, 20261202),
]


def file_version(path):
    with open(path, "rb") as f:
        head = f.read(12)
    return int(np.frombuffer(head[8:12], "<u4")[0])


def data(n, dim, seed):
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((8, dim)) * 3.0
    pts = centres[rng.integers(0, 8, n + 200)] + rng.standard_normal((n + 200, dim))
    pts = pts.astype(np.float32)
    return pts[:n].copy(), pts[n:].copy()


def separated(D, metric, rel=1e-3):
    """Rows whose k+1 best values differ pairwise by more than rel."""
    d = np.sort(D, axis=1)
    if metric != "l2":
        d = d[:, ::-1]
    gaps = np.abs(np.diff(d, axis=1))
    scale = np.maximum(np.abs(d[:, 1:]), 1e-6)
    return (gaps > rel * scale).all(axis=1)


def make(name, n, dim, metric, quantization, m, seed):
    base, pool = data(n, dim, seed)
    ids = (10_000 + 7 * np.arange(n)).astype(np.int64)
    removed = ids[[3, 50, 51, 200, n - 1]]
    index = kd.Index(dim, metric, m=m, ef_construction=64, quantization=quantization,
                     seed=seed)
    index.add(base, ids, threads=1)
    index.remove(removed)
    live = len(index)
    # Keep queries whose top k+1 are well separated.
    D, _ = index.search(pool, K + 1, exact=True)
    queries = pool[separated(D, metric)][:20]
    assert len(queries) >= 10, "too few well-separated queries"
    exact_D, exact_I = index.search(queries, K, exact=True)
    full_D, full_I = index.search(queries, K, ef=live, oversample=live / K)
    assert (full_I == exact_I).all(), "a full beam should give the exact answer"
    tmp = os.path.join(HERE, "golden.tmp.kdx")
    index.save(tmp)
    version = file_version(tmp)
    stem = os.path.join(HERE, "golden_v%d_%s" % (version, name))
    if os.path.exists(stem + ".kdx"):
        os.unlink(tmp)
        print("kept %s.kdx: written by an earlier build, it must stay as it is" % stem)
        return
    os.replace(tmp, stem + ".kdx")
    np.savez(stem + ".npz", base=base, ids=ids, removed=removed, queries=queries,
             exact_D=exact_D, exact_I=exact_I, full_D=full_D, full_I=full_I,
             params=np.array([n, dim, m, seed, K]), metric=np.array(metric),
             quantization=np.array(quantization), version=np.array(version),
             calibration=np.frombuffer(index._core.calibration(), np.uint8))
    print("wrote %s.kdx (%d bytes) and .npz" % (stem, os.path.getsize(stem + ".kdx")))


if __name__ == "__main__":
    for case in CASES:
        make(*case)
