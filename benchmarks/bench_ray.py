"""knndirect.ray on a local Ray cluster: build time by shard count, and the
fan-out overhead of a sharded search against one collection.

    python benchmarks/bench_ray.py [--n 200000] [--dim 128] [--shards 1,2,4] [--cpus 2]
                                   [--queries 1000] [--rounds 7] [--json OUT.json]

Build: the same ray.data.Dataset (from NumPy) built into 1, 2 and 4 shards,
wall time of kdr.build each. Search: a batch of --queries queries, k=10,
against the 4-shard index through its actors and against one kd.Collection
over the same vectors in this process; p50 of --rounds batch times, QPS
(queries / p50) and recall@10 of each. The difference is the fan-out: the
batch put into the object store, one actor call per shard, the merge.
"""
import argparse
import json
import os
import shutil
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))

import knndirect as kd  # noqa: E402


def _p50(f, rounds):
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        f()
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=200_000)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--shards", default="1,2,4")
    ap.add_argument("--cpus", type=int, default=2)
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--work", default=None, help="directory for the indexes (default: a temp dir)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)

    import ray
    import knndirect.ray as kdr

    ray.init(num_cpus=args.cpus, include_dashboard=False, configure_logging=False,
             log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": os.path.join(ROOT, "python")}})
    ray.data.DataContext.get_current().enable_progress_bars = False
    work = args.work or tempfile.mkdtemp(prefix="bench_ray-")
    x = kd.datasets.clustered(args.n + args.queries, args.dim, seed=1)
    x, q = np.ascontiguousarray(x[:args.n]), np.ascontiguousarray(x[args.n:])
    truth, _ = kd.datasets.ground_truth(x, q, args.k)
    out = {"n": args.n, "dim": args.dim, "cpus": args.cpus, "queries": args.queries,
           "build": {}, "search": {}}
    try:
        ds = ray.data.from_numpy(x).materialize()
        shard_counts = [int(s) for s in args.shards.split(",")]
        for s in shard_counts:
            path = os.path.join(work, f"s{s}")
            t = time.perf_counter()
            kdr.build(ds, path, column="data", num_shards=s)
            out["build"][s] = time.perf_counter() - t
            print(f"build {s} shard(s): {out['build'][s]:.1f} s", flush=True)

        t = time.perf_counter()
        col = kd.Collection.create(os.path.join(work, "single"), args.dim, merge_policy=None)
        col.add(x)
        col.merge(1)
        out["build"]["collection"] = time.perf_counter() - t
        col.close()
        col = kd.Collection.open(os.path.join(work, "single"))
        p50 = _p50(lambda: col.search(q, args.k), args.rounds)
        rec = kd.datasets.recall_at_k(col.search(q, args.k)[1], truth, args.k)
        out["search"]["collection"] = {"p50_s": p50, "qps": args.queries / p50, "recall": rec}
        col.close()

        widest = max(shard_counts)
        with kdr.open(os.path.join(work, f"s{widest}")) as index:
            index.search(q[:10], args.k)                 # warm the actors
            p50 = _p50(lambda: index.search(q, args.k), args.rounds)
            rec = kd.datasets.recall_at_k(index.search(q, args.k)[1], truth, args.k)
            out["search"][f"ray_{widest}_shards"] = {"p50_s": p50, "qps": args.queries / p50,
                                                     "recall": rec}
        for name, r in out["search"].items():
            print(f"{name:>14}: p50 {r['p50_s'] * 1e3:8.1f} ms per {args.queries}-query batch, "
                  f"{r['qps']:9.0f} QPS, recall@{args.k} {r['recall']:.4f}")
    finally:
        ray.shutdown()
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return out


if __name__ == "__main__":
    main()
