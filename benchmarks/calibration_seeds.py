"""How far recall= and the default land from their targets across graph
seeds, on the test suite's clustered set (20,000 x 64, one-thread
builds), measured on 4,000 fresh queries of the same distribution.

    python benchmarks/calibration_seeds.py [--seeds 8] [--steps 1,1.5,2,3,...]
        [--quantization 1bit+4bit] [--n 2000]

--n takes the first n vectors of the same distribution instead (small
indexes: their table is measured on n less the held-out queries).

--steps replaces the table's shortlist lengths (multiples of k) for an A/B
of the ladder; the default is the library's own. For each metric it prints
the largest |measured - target| over recall=0.90/0.95/0.98 and every seed,
their mean, how many fell outside +-0.02, and the default's lowest and mean
recall, and on how many graphs the default fell below 0.95.
"""
import argparse
import os
import sys

import numpy as np

import knndirect as kd
from knndirect import _calibration

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "tests"))
from conftest import brute_force, clustered, recall_at_k  # noqa: E402

TARGETS = (0.90, 0.95, 0.98)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=8)
    ap.add_argument("--steps", default=None, help="comma-separated shortlist multiples of k")
    ap.add_argument("--metrics", default="l2,ip,cosine")
    ap.add_argument("--quantization", default="1bit")
    ap.add_argument("--n", type=int, default=20000, help="vectors (the tests' set: 20000)")
    args = ap.parse_args()
    if args.steps:
        _calibration.LENGTH_STEPS = tuple(float(s) for s in args.steps.split(","))
    n, d = args.n, 64
    base = clustered(n + 1000, d, 4200)[:n]  # at 20,000: the base of tests/test_recall_target.py
    fresh = clustered(n + 4000, d, 4200)[n:]
    print(f"{args.quantization}; shortlist steps: {_calibration.LENGTH_STEPS}")
    print("| metric | max abs error | mean error | outside +-0.02 | default min | default mean "
          "| default < 0.95 |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for metric in args.metrics.split(","):
        _, truth = brute_force(base, fresh, 10, metric)
        errs, defaults = [], []
        for seed in range(args.seeds):
            index = kd.Index(d, metric, seed=seed, quantization=args.quantization)
            index.add(base, threads=1)
            for t in TARGETS:
                errs.append(recall_at_k(index.search(fresh, 10, recall=t)[1], truth) - t)
            defaults.append(recall_at_k(index.search(fresh, 10)[1], truth))
            index.close()
        e = np.array(errs)
        print(f"| {metric} | {np.abs(e).max():.4f} | {e.mean():+.4f} | "
              f"{int((np.abs(e) > 0.02).sum())}/{e.size} | {min(defaults):.4f} | "
              f"{np.mean(defaults):.4f} | {sum(r < 0.95 for r in defaults)}/{len(defaults)} |",
              flush=True)


if __name__ == "__main__":
    main()
