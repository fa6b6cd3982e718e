"""Command line: python -m knndirect demo [options]."""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

import numpy as np


def _demo(args):
    import knndirect as kd
    from knndirect.datasets import clustered, ground_truth, recall_at_k

    print(f"knndirect demo: {args.n:,} x {args.dim} clustered float32, metric={args.metric}, "
          f"k={args.k}")
    print(f"features: {kd.features()}")
    data = clustered(args.n + args.queries, args.dim, seed=args.seed)
    base, queries = data[:args.n], data[args.n:]

    t0 = time.perf_counter()
    index = kd.Index(args.dim, args.metric, m=args.m, ef_construction=args.ef_construction)
    index.add(base, progress=True if sys.stderr.isatty() else None)
    build_s = time.perf_counter() - t0
    print(f"build: {build_s:.1f} s ({args.n / build_s:,.0f} vectors/s, all cores)")

    workdir = tempfile.mkdtemp(prefix="knndirect-demo-", dir=args.dir)
    path = os.path.join(workdir, "demo.kdx")
    try:
        t0 = time.perf_counter()
        index.save(path)
        print(f"save: {time.perf_counter() - t0:.2f} s, {os.path.getsize(path) / 2**20:.1f} MiB "
              f"-> {path}")
        truth, _ = ground_truth(base, queries, args.k, args.metric)

        with kd.open(path, direct_io=True, io_backend=args.io_backend) as opened:
            info = opened.info()
            latencies = []
            found = np.empty((len(queries), args.k), dtype=np.int64)
            opened.search(queries[0], args.k)   # warm the mapped graph and codes
            opened.stats(reset=True)
            for i, q in enumerate(queries):
                t = time.perf_counter()
                _, found[i] = opened.search(q, args.k)
                latencies.append(time.perf_counter() - t)
            st = opened.stats(reset=True)
            t = time.perf_counter()
            _, batch_found = opened.search(queries, args.k)
            batch_s = time.perf_counter() - t
            lat = np.array(latencies) * 1e3
            per_q = st["read_bytes"] / max(1, st["queries"])
            ideal = st["rerank_vectors"] / max(1, st["queries"]) * info["record_size"]
            print(f"opened: io_backend={info['io_backend']} direct_io={info['direct_io']} "
                  f"alignment={info['alignment']} record_size={info['record_size']} B "
                  f"resident={info['resident_bytes'] / 2**20:.1f} MiB "
                  f"(float32 data {args.n * args.dim * 4 / 2**20:.1f} MiB)"
                  + (f" fallbacks={info['fallbacks']}" if info["fallbacks"] else ""))
            print(f"recall@{args.k}: {recall_at_k(found, truth, args.k):.4f} "
                  f"(batch: {recall_at_k(batch_found, truth, args.k):.4f}) vs numpy brute force")
            print(f"latency, one query at a time: p50 {np.median(lat):.3f} ms, "
                  f"p99 {np.percentile(lat, 99):.3f} ms")
            print(f"batch of {len(queries)}: {len(queries) / batch_s:,.0f} queries/s")
            print(f"reads per query: {st['read_ops'] / max(1, st['queries']):.1f} ops, "
                  f"{per_q / 1024:.1f} KiB (ideal shortlist x record_size: {ideal / 1024:.1f} KiB), "
                  f"io wait {st['io_wait_seconds'] / max(1, st['queries']) * 1e3:.3f} ms/query")
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m knndirect",
                                     description="knndirect command line")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="build, save, open with O_DIRECT and search on "
                                       "generated clustered data")
    demo.add_argument("--n", type=int, default=100_000, help="vectors (default 100000)")
    demo.add_argument("--dim", type=int, default=128)
    demo.add_argument("--metric", choices=("l2", "ip", "cosine"), default="l2")
    demo.add_argument("--queries", type=int, default=1000)
    demo.add_argument("--k", type=int, default=10)
    demo.add_argument("--m", type=int, default=16)
    demo.add_argument("--ef-construction", type=int, default=200)
    demo.add_argument("--io-backend", default="auto",
                      choices=("auto", "io_uring", "threads", "pread", "mmap"))
    demo.add_argument("--dir", default=None,
                      help="where to write the index (default: the temp dir; O_DIRECT needs a "
                           "filesystem that supports it)")
    demo.add_argument("--keep", action="store_true", help="keep the index file")
    demo.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.command == "demo":
        return _demo(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
