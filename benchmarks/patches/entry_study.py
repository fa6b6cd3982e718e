"""The level-0 beam entered from k-means centres instead of the descent
through the upper levels (entry-from-centres.patch; docs/benchmarks.md,
"Tried and dropped: entering the beam from k-means centres").

    python benchmarks/patches/entry_study.py clustered-100k-384 --ef 48,64
    python benchmarks/patches/entry_study.py clustered-400k-256 --ef 128 --centres 32,64,128 --kmeans-seeds 0,1

Builds the set's index once (M 16, ef_construction 200, 2 threads, seed 1),
fits spherical k-means on the unit rows (10 iterations, per seed) and takes
each centre's nearest row as its entry. Each search enters at the rows of
the `top` centres nearest the query. "oracle" enters at the query's true
nearest neighbour (its centres are the queries themselves): the bound on any
choice of entry, in code distances and recall; its time counts a scan of
1,000 centres and means nothing. Per point: 5 interleaved rounds of one
1-thread batch of the set's 1,000 queries (k 10, oversample 10); recall@10,
code distances a query, graph microseconds a query (the core's own clock),
and the median of the per-round time ratios against the descent. Cosine
sets only (centres are picked by inner product).
"""
import argparse
import os
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import bench_data  # noqa: E402
import knndirect as kd  # noqa: E402
from knndirect.datasets import recall_at_k  # noqa: E402


def spherical_kmeans(xn, c, seed, iters=10):
    rng = np.random.default_rng(seed)
    cent = xn[rng.choice(len(xn), c, replace=False)].copy()
    for _ in range(iters):
        near = np.argmax(xn @ cent.T, axis=1)
        for j in range(c):
            members = xn[near == j]
            if len(members):
                v = members.mean(0)
                cent[j] = v / np.linalg.norm(v)
    return np.ascontiguousarray(cent, np.float32)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("dataset")
    p.add_argument("--ef", default="48,64")
    p.add_argument("--centres", default="32,64,128")
    p.add_argument("--top", default="1")
    p.add_argument("--kmeans-seeds", default="0")
    p.add_argument("--oversample", type=float, default=10)
    args = p.parse_args()
    ds = bench_data.resolve(args.dataset)
    if ds.metric != "cosine":
        raise SystemExit("cosine sets only")
    x = np.load(ds.base_path)
    q = np.ascontiguousarray(np.load(ds.query_path), np.float32)
    gt = np.load(ds.gt_path)
    xn = x / np.linalg.norm(x, axis=1, keepdims=True)
    index = kd.Index(x.shape[1], ds.metric, m=16, ef_construction=200, seed=1)
    index.add(x, threads=2)
    none = (np.zeros(0, np.float32), np.zeros(0, np.int64), 1)
    qn = np.ascontiguousarray(q / np.linalg.norm(q, axis=1, keepdims=True), np.float32)
    setups = {"descent": none, "oracle": (qn, gt[:, 0].astype(np.int64), 1)}
    for seed in [int(s) for s in args.kmeans_seeds.split(",")]:
        for c in [int(c) for c in args.centres.split(",")]:
            cent = spherical_kmeans(xn, c, seed)
            rows = np.argmax(cent @ xn.T, axis=1).astype(np.int64)
            for t in [int(t) for t in args.top.split(",")]:
                setups[f"{c} centres, top {t}, k-means seed {seed}"] = (cent, rows, t)
    print(f"{ds.name}: {x.shape[0]:,} x {x.shape[1]}, oversample {args.oversample:g}")
    print("| ef | entry | recall@10 | code distances / query | graph us / query | time / descent |")
    print("| ---: | --- | ---: | ---: | ---: | ---: |")
    for ef in [int(e) for e in args.ef.split(",")]:
        times = {name: [] for name in setups}
        seen = {}
        for _ in range(5):
            for name, (cent, rows, top) in setups.items():
                kd._core._study_centres(cent.tobytes(), rows.tobytes(), top)
                index.stats(reset=True)
                t0 = time.perf_counter()
                _, ids = index.search(q, k=10, ef=ef, oversample=args.oversample, threads=1)
                times[name].append(time.perf_counter() - t0)
                st = index.stats(reset=True)
                recall = recall_at_k(ids, gt, 10)
                seen[name] = (recall, st["scored"] / len(q), 1e6 * st["graph_seconds"] / len(q))
        kd._core._study_centres(b"", b"", 1)
        for name in setups:
            ratio = np.median([a / b for a, b in zip(times[name], times["descent"])])
            r, s, g = seen[name]
            shown = "-" if name == "oracle" else f"{ratio:.3f}"
            print(f"| {ef} | {name} | {r:.4f} | {s:.0f} | {g:.1f} | {shown} |")


if __name__ == "__main__":
    main()
