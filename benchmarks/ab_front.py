"""An interleaved A/B of two builds of knndirect by what the peers' tables
compare: queries per second at recall@10 = 0.95, read off each build's own
Pareto front, for changes that move the front itself (the codes, the file
format) and so cannot share one saved index as ab_search.py does.

    python benchmarks/ab_front.py --base REV [--head REV] --dataset clustered-100k-256 \
        [--metric l2] [--rounds 3]

Each revision is built out of tree as benchmarks/ab.py does (--head
defaults to the working tree, uncommitted changes included). Each round
runs one fresh process per build, in alternating order; a process builds
the index (M 16, ef_construction 200, seed 1, 2 threads), times 1-thread
batches of the 1,000 queries (median of three) at the default and at every
(ef, oversample) of a grid, keeps the points no faster point beats in
recall, and interpolates its queries per second at 0.95 between the two
points around it. The table is ab.py's: each side's median, their ratio,
the median and range of the per-round ratios, and the rounds the head won.
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))

import ab  # noqa: E402
import numpy as np  # noqa: E402
from knndirect.datasets import ground_truth  # noqa: E402

EFS = (16, 24, 32, 40, 48, 56, 64, 80, 96, 128)
OVERSAMPLES = (1, 2, 3, 4, 6, 8, 10, 12, 16)

WORKLOAD = r"""
import json, sys, time
import numpy as np
import knndirect as kd

x, q, gt = np.load(sys.argv[1]), np.load(sys.argv[2]), np.load(sys.argv[4])
index = kd.Index(x.shape[1], sys.argv[3], m=16, ef_construction=200, seed=1)
t0 = time.perf_counter()
index.add(x, threads=2)
build = time.perf_counter() - t0

def point(**kw):
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        _, ids = index.search(q, k=10, threads=1, **kw)
        times.append(time.perf_counter() - t0)
    recall = float(np.mean([len(set(a) & set(b)) / 10 for a, b in zip(ids, gt)]))
    return recall, len(q) / sorted(times)[1]

default = point()
points = [point(ef=ef, oversample=o) for ef in %s for o in %s]
front, best = [], -1.0
for r, s in sorted(points, key=lambda p: -p[1]):
    if r > best:
        front.append((r, s))
        best = r
front.sort()
at = next((a[1] + (b[1] - a[1]) * (0.95 - a[0]) / (b[0] - a[0])
           for a, b in zip(front, front[1:]) if a[0] < 0.95 <= b[0]), float("nan"))
print("AB " + json.dumps({"at_0.95_qps": at, "default_qps": default[1],
                          "recall_default": default[0], "build_s": build}))
""" % (EFS, OVERSAMPLES)


def main(argv=None):
    p = ab.short_args(__doc__.split("\n\n")[0], dim=256, rounds=3)
    args = p.parse_args(argv)
    with ab.short_work(args, "kd-ab-front-") as (work, libs, files):
        gt = os.path.join(work, "gt.npy")
        np.save(gt, ground_truth(np.load(files[0]), np.load(files[1]), 10, args.metric)[0])
        runs = ab.interleave(libs, args.rounds, lambda name: [*files, args.metric, gt], WORKLOAD)
    ab.report(runs, dict(vars(args), queries=1000))


if __name__ == "__main__":
    main()
