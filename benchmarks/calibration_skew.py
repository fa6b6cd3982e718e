"""How often a one-sided bound on a calibration sample's recall lies too
high, with and without the Cornish-Fisher term for the skewness of a query's
recall (a study): fresh draws from a clustered set's mixture with exact
truth, searched at each table beam at the default's shortlist, resampled as
calibration samples of 200, 280 and 400.

    python benchmarks/calibration_skew.py clustered-100k-768 "" 5000
    python benchmarks/calibration_skew.py clustered-1m-768 INDEX 3000
"""
import math
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_data  # noqa: E402
from bench_recall import per_query_recall  # noqa: E402
from fresh_queries import fresh_draws  # noqa: E402
from knndirect import _calibration  # noqa: E402

K = 10


def skew(a):
    d = a - a.mean()
    s = d.std()
    return 0.0 if s <= 0 else (d ** 3).mean() / s ** 3


def main(dataset, index_path=None, pool=3000, draws=4000, seed=7):
    import knndirect as kd
    ds = bench_data.resolve(dataset, metric="l2")
    if index_path:
        index = kd.load(index_path)
    else:
        base = np.load(ds.base_path, mmap_mode="r")[:ds.n]
        index = kd.Index(ds.dim, metric="l2")
        index.add(np.ascontiguousarray(base, np.float32), threads=2)
    cal = index.info()["calibration"]
    os_ = cal["default"]["oversample"]
    q = fresh_draws(ds.dim, pool, seed)
    _, truth = index.search(q, K, exact=True, threads=2)
    efs = [p["ef"] for p in cal["points"] if p["oversample"] == os_]
    rng = np.random.default_rng(seed)
    for ef in efs:
        _, ids = index.search(q, K, ef=ef, oversample=os_, threads=2)
        y = per_query_recall(ids, truth, K)
        if not 0.90 <= y.mean() <= 0.985:
            continue
        mu = y.mean()
        print(f"ef {ef}: recall {mu:.4f} sd {y.std():.3f} skew {skew(y):.2f}")
        for n in (200, 280, 400):
            z, at, g = np.empty(draws), np.empty(draws), np.empty(draws)
            for d in range(draws):
                s = y[rng.integers(0, len(y), n)]
                m, se = s.mean(), max(s.std(ddof=1) / math.sqrt(n), 1e-12)
                z[d] = (m - mu) / se
                at[d] = z[d] / float(_calibration._at_target(np.asarray(m), mu))
                g[d] = skew(s)
            for zz in (1.645, 2.33):
                term = np.maximum(-g, 0) * (2 * zz * zz + 1) / (6 * math.sqrt(n))
                print(f"  n {n} z {zz}: plain {(z > zz).mean():.4f}, at target "
                      f"{(at > zz).mean():.4f}, plain + term {(z > zz + term).mean():.4f}, "
                      f"at target + term {(at > zz + term).mean():.4f} (nominal "
                      f"{1 - _calibration.NormalDist().cdf(zz):.4f}; mean term "
                      f"{term.mean():.2f})", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] or None if len(sys.argv) > 2 else None,
         pool=int(sys.argv[3]) if len(sys.argv) > 3 else 3000)
