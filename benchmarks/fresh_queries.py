"""Is a default that misses on a clustered set's 1,000 queries a hard query
set or a calibration that read easy? Draws fresh queries from the set's own
mixture (the same 64 centres, new noise), takes their exact truth, and
searches a saved index with its default on both.

    python benchmarks/fresh_queries.py --dataset clustered-1m-768 \\
        --index benchmarks/data/disk-peers/clustered-1m-768-l2/knndirect/index.kdx

Prints the index's default and what its calibration expected, then the
recall and its standard error on the set's queries and on the fresh ones
(and per block of 1,000 fresh), and the table's beams at the default's
shortlist against the fresh draws. The fresh draws' truth is brute force over
the whole set (about 1 minute per 1,000 queries at 1M x 768 on 2 cores).
"""
import argparse
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_data  # noqa: E402
from bench_recall import per_query_recall  # noqa: E402

K = 10


def mixture_centres(dim, n_clusters=64, seed=0):
    """The centres knndirect.datasets.clustered draws first from its seed."""
    rng = np.random.default_rng(seed)
    scale = (1.0 / np.sqrt(1.0 + np.arange(dim) / 8.0)).astype(np.float32)
    return rng.standard_normal((n_clusters, dim), dtype=np.float32) * scale, scale


def fresh_draws(dim, count, seed, spread=0.5):
    centres, scale = mixture_centres(dim)
    rng = np.random.default_rng([seed, 0xF2E5])
    labels = rng.integers(0, centres.shape[0], count)
    noise = rng.standard_normal((count, dim), dtype=np.float32)
    return np.ascontiguousarray(centres[labels] + spread * noise * scale, np.float32)


def main():
    import knndirect as kd
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", default="clustered-1m-768")
    ap.add_argument("--metric", default="l2")
    ap.add_argument("--index", required=True, help="a saved index of the set")
    ap.add_argument("--fresh", type=int, default=4000)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    if not bench_data.CLUSTERED_RE.match(args.dataset):
        raise SystemExit("--dataset: a clustered-<n>-<d> set (its mixture is known)")
    ds = bench_data.resolve(args.dataset, metric=args.metric)
    base = np.load(ds.base_path, mmap_mode="r")[:ds.n]
    queries = np.load(ds.query_path)
    truth = np.load(ds.gt_path)
    fresh = fresh_draws(ds.dim, args.fresh, args.seed)
    # The mixture is the set's: its rows lie as far from the nearest centre.
    centres, _ = mixture_centres(ds.dim)
    for name, x in (("set", np.asarray(base[:1000])), ("fresh", fresh[:1000])):
        d2 = ((x[:, None, :] - centres[None]) ** 2).sum(-1).min(1)
        print(f"{name} rows: mean squared distance to the nearest centre {d2.mean():.3f}")
    t = time.perf_counter()
    fresh_truth = bench_data.exact_knn(base, fresh, K, args.metric)
    print(f"truth of {args.fresh} fresh draws: {time.perf_counter() - t:.0f} s", flush=True)
    index = kd.load(args.index)
    if index.info()["metric"] != args.metric:
        raise SystemExit(f"--index is {index.info()['metric']}, not {args.metric}")
    cal = index.info()["calibration"]
    print(f"default {cal['default']} from {cal['queries']} calibration queries")
    for name, q, g in (("the set's queries", queries, truth), ("fresh draws", fresh,
                                                                 fresh_truth)):
        _, ids = index.search(q, K, threads=2)
        per = per_query_recall(ids, g, K)
        print(f"{name}: {len(q)}, recall {per.mean():.4f} (standard error "
              f"{per.std() / np.sqrt(len(q)):.4f})")
        if q is fresh:
            print("  per 1,000: " + ", ".join(f"{per[i:i + 1000].mean():.4f}"
                                               for i in range(0, len(q), 1000)))
    # The table's own beams at the default's shortlist, on the fresh draws.
    os_ = cal["default"]["oversample"]
    print(f"the table against the fresh draws at oversample {os_:g}:")
    for p in cal["points"]:
        if p["oversample"] == os_ and p["recall"] >= 0.85:
            _, ids = index.search(fresh, K, ef=p["ef"], oversample=os_, threads=2)
            per = per_query_recall(ids, fresh_truth, K)
            print(f"  ef {p['ef']}: table {p['recall']:.4f} (standard error "
                  f"{p['stderr']:.4f}), fresh {per.mean():.4f} ({per.std() / np.sqrt(len(per)):.4f})")


if __name__ == "__main__":
    main()
