"""What a small first commit costs a collection for the rest of its life:
its quantizer is fitted on that commit. Builds a collection (tiered
merging, as by default) from the tests' clustered set in commits of
--commit rows, merges it to one segment, and prints, per metric, the
collection's and the merged segment's quantizer centres, recall@10 of
4,000 fresh queries at fixed beams and shortlists (recall per read), and
the default's recall and shortlist; then the same for one index built at
once on all the rows (its quantizer fitted on 16,384 of them).

    python benchmarks/quantizer_growth.py [--n 40000] [--commit 2500]
        [--first N] [--unmerged] [--dim 64] [--seeds 2]
        [--metrics l2,ip,cosine] [--workdir DIR] [--set clustered-100k-384]

--first sets the first commit's rows (the rest follow in commits of
--commit). --unmerged builds without merges and measures the segments as
committed (centres then lists each segment's).

--set takes the first n vectors of a named set of benchmarks/bench_data.py
(or a user file) and its queries instead (--dim is then the set's).

For an A/B against another build, run it with PYTHONPATH pointing at that
build's python/ directory.
"""
import argparse
import os
import sys
import tempfile
import time

import numpy as np

import knndirect as kd

import bench_data  # this script's directory

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "tests"))
from conftest import brute_force, clustered, recall_at_k  # noqa: E402

POINTS = ((32, 2), (32, 4), (64, 4), (64, 8))   # (ef, oversample)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=40000)
    ap.add_argument("--commit", type=int, default=2500, help="rows per commit")
    ap.add_argument("--first", type=int, default=None, help="rows of the first commit")
    ap.add_argument("--unmerged", action="store_true", help="no merges")
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--metrics", default="l2,ip,cosine")
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--set", default=None, help="a named set of bench_data.py, or a file")
    args = ap.parse_args()
    if args.set:
        ds = bench_data.resolve(args.set).to_json()
        base = bench_data.load_base(ds)[:args.n]
        fresh = bench_data.load_queries(ds)
        args.dim = base.shape[1]
    else:
        base = clustered(args.n + 1000, args.dim, 4200)[:args.n]
        fresh = clustered(args.n + 4000, args.dim, 4200)[args.n:]
    first = args.first or args.commit
    starts = [0] + list(range(first, args.n, args.commit))
    print(f"knndirect from {os.path.dirname(kd.__file__)}; {args.set or 'clustered'}: "
          f"{base.shape[0]} x {args.dim}, first commit {first}, then commits of {args.commit}, "
          f"{'unmerged' if args.unmerged else 'merged to one segment'}; "
          f"{fresh.shape[0]} queries; {args.seeds} seeds")
    cols = ["metric", "built as", "centres (quantizer, segment)", "build s"]
    cols += [f"ef {e}, os {o}" for e, o in POINTS] + ["default recall", "default ef/os"]
    print("| " + " | ".join(cols) + " |")
    print("| --- |" + " ---: |" * (len(cols) - 1))
    for metric in args.metrics.split(","):
        truth = brute_force(base, fresh, 10, metric)[1]
        rows = {"collection": [], "one index": []}
        for seed in range(args.seeds):
            with tempfile.TemporaryDirectory(dir=args.workdir) as d:
                t = time.perf_counter()
                col = kd.Collection.create(os.path.join(d, "c"), args.dim, metric, seed=seed,
                                           **({"merge_policy": None} if args.unmerged else {}))
                for start, end in zip(starts, starts[1:] + [args.n]):
                    col.add(base[start:end])
                    col.commit()
                if not args.unmerged:
                    col.merge()
                took = time.perf_counter() - t
                centres = (col._quantizer.info()["centres"],
                           tuple(s.index.info()["centres"] for s in col._segments))
                rows["collection"].append(
                    (centres, took) + _reads(col, col._search_picks(10, None), fresh, truth))
                col.close()
            t = time.perf_counter()
            whole = kd.Index(args.dim, metric, seed=seed)
            whole.add(base)
            took = time.perf_counter() - t
            info = whole.info()
            rows["one index"].append(
                ((info["centres"], (info["centres"],)), took)
                + _reads(whole, (info["default_ef"], info["default_oversample"]), fresh, truth))
            whole.close()
        for built, got in rows.items():
            centres = sorted({r[0] for r in got})
            at = np.mean([r[2] for r in got], axis=0)
            print(f"| {metric} | {built} | {centres} | {np.median([r[1] for r in got]):.1f} | "
                  + " | ".join(f"{a:.4f}" for a in at)
                  + f" | {np.mean([r[3] for r in got]):.4f} | "
                  f"{np.mean([r[4] for r in got]):.0f}/{np.mean([r[5] for r in got]):.2f} |",
                  flush=True)


def _reads(searcher, picks, fresh, truth):
    """Recall@10 at each fixed point, the default's recall, its ef and
    oversample."""
    at = [recall_at_k(searcher.search(fresh, 10, ef=e, oversample=o)[1], truth)
          for e, o in POINTS]
    return at, recall_at_k(searcher.search(fresh, 10)[1], truth), picks[0], picks[1]


if __name__ == "__main__":
    main()
