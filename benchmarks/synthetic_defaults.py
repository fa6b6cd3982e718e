"""The default search and the recall= targets on synthetic data that the
harness does not hold: shapes chosen to be hard for a 1-bit graph search
(no clusters, heavy tails, norms that vary, few dimensions).

    python benchmarks/synthetic_defaults.py [--cases NAME,...] [--threads 2]

Each case builds one index with the defaults (M 16, ef_construction 200,
index seed 3) on rows drawn with data seed 5, holds 1,000 other rows out
as queries, and prints recall@10 of the default search and of
recall=0.90 / 0.98 against the exact answer, with the default's ef and
oversample and its queries per second. Nothing is cached; every case
takes seconds to a minute on 2 cores.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "python"))
import knndirect as kd  # noqa: E402
from knndirect.datasets import recall_at_k  # noqa: E402

QUERIES = 1000


def gauss(rng, n, d):
    return rng.standard_normal((n, d), dtype=np.float32)


def heavy(rng, n, d):
    """Student-t(3) coordinates, each row scaled by a log-normal norm."""
    return (rng.standard_t(3, (n, d)) * rng.lognormal(0, 0.5, (n, 1))).astype(np.float32)


def small_ints(rng, n, d):
    """Non-negative integers to 255 around 200 random centres."""
    centres = rng.integers(0, 60, (200, d))
    x = centres[rng.integers(0, 200, n)] + rng.normal(0, 20, (n, d))
    return np.clip(x, 0, 255).round().astype(np.float32)


# name: (rows, dim, metric, generator)
CASES = {
    "gauss-128-l2": (50_000, 128, "l2", gauss),
    "gauss-16-l2": (50_000, 16, "l2", gauss),
    "gauss-200-cosine-3k": (3_000, 200, "cosine", gauss),
    "heavy-100-cosine": (50_000, 100, "cosine", heavy),
    "heavy-32-ip": (50_000, 32, "ip", heavy),
    "heavy-960-ip": (30_000, 960, "ip", heavy),
    "ints-128-l2": (50_000, 128, "l2", small_ints),
    "ints-4-l2": (20_000, 4, "l2", small_ints),
}


def run(name, threads):
    n, d, metric, make = CASES[name]
    x = make(np.random.default_rng(5), n + QUERIES, d)
    q, x = np.ascontiguousarray(x[:QUERIES]), np.ascontiguousarray(x[QUERIES:])
    t = time.perf_counter()
    index = kd.Index(d, metric, seed=3)
    index.add(x, threads=threads)
    build = time.perf_counter() - t
    _, truth = index.search(q, k=10, exact=True, threads=threads)
    t = time.perf_counter()
    _, ids = index.search(q, k=10, threads=threads)
    qps = QUERIES / (time.perf_counter() - t)
    info = index.info()
    row = [name, f"{n:,} x {d}", metric, f"{build:.1f}", str(info["default_ef"]),
           f"{info['default_oversample']:.1f}", f"{recall_at_k(ids, truth):.4f}", f"{qps:,.0f}"]
    for target in (0.90, 0.98):
        _, ids = index.search(q, k=10, recall=target, threads=threads)
        row.append(f"{recall_at_k(ids, truth):.4f}")
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default=",".join(CASES), help="comma-separated, of: " +
                    ", ".join(CASES))
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    names = [c for c in args.cases.split(",") if c]
    unknown = [c for c in names if c not in CASES]
    if unknown:
        ap.error(f"unknown case(s) {', '.join(unknown)}; known: {', '.join(CASES)}")
    print("| case | rows x dim | metric | build s | default ef | default oversample | "
          "default recall | QPS | recall=0.90 | recall=0.98 |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name in names:
        print("| " + " | ".join(run(name, args.threads)) + " |", flush=True)


if __name__ == "__main__":
    main()
