"""A short interleaved A/B of two builds of knndirect: build time (wall and
process CPU) and a 1-thread batch search, for changes to the build's inner
loop whose gain is a few percent.

    python benchmarks/ab_build.py --base REV [--head REV] [--n 100000] [--dim 256] [--rounds 10]
    python benchmarks/ab_build.py --base HEAD --head HEAD --dim 384 \
        --base-cache 1e18 --head-cache 1      # build codes alone against the 1-bit beam

Each revision is built out of tree as benchmarks/ab.py does (--head
defaults to the working tree, uncommitted changes included). Each round
runs one fresh process per build, in alternating order; a process builds
clustered data (M 16, ef_construction 200, seed 1, --threads build
threads), then times five 1-thread batch searches of 1,000 queries at ef
64 and keeps their median, with their recall@10 against the exact answer
(the graph's quality at that cost). Nothing is saved, so a round takes one build's
time: ten rounds fit where ab.py's full workload runs three. The table is
ab.py's: each side's median, their ratio, the median and range of the
per-round ratios, and the rounds the head won. --base-cache / --head-cache
make that side's build take the last-level cache to hold so many bytes
(the core's test hook), which decides whether insertion's beam scores with
the 1-bit codes: one revision against itself.
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))

import ab  # noqa: E402
import numpy as np  # noqa: E402
from knndirect.datasets import ground_truth  # noqa: E402

WORKLOAD = r"""
import json, resource, sys, time
import numpy as np
import knndirect as kd

x = np.load(sys.argv[1])
q = np.load(sys.argv[2])
if sys.argv[5]:
    kd._core._set_cache_bytes(int(float(sys.argv[5])))
index = kd.Index(x.shape[1], sys.argv[4], m=16, ef_construction=200, seed=1)
r0 = resource.getrusage(resource.RUSAGE_SELF)
t0 = time.perf_counter()
index.add(x, threads=int(sys.argv[3]))
wall = time.perf_counter() - t0
r1 = resource.getrusage(resource.RUSAGE_SELF)
times = []
for _ in range(5):
    t0 = time.perf_counter()
    _, ids = index.search(q, k=10, ef=64, threads=1)
    times.append(time.perf_counter() - t0)
gt = np.load(sys.argv[6])
recall = float(np.mean([len(set(a) & set(b)) / 10 for a, b in zip(ids, gt)]))
cpu = (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime)
print("AB " + json.dumps({"build_s": wall, "build_cpu_s": cpu,
                          "search_qps": len(q) / sorted(times)[2],
                          "recall_at_ef64": recall}))
"""


def main(argv=None):
    p = ab.short_args(__doc__.split("\n\n")[0], dim=256, rounds=10)
    p.add_argument("--threads", type=int, default=2, help="build threads")
    p.add_argument("--base-cache", default="", help="last-level cache bytes the base build assumes")
    p.add_argument("--head-cache", default="", help="last-level cache bytes the head build assumes")
    args = p.parse_args(argv)
    cache = {"base": args.base_cache, "head": args.head_cache}
    with ab.short_work(args, "kd-ab-build-") as (work, libs, files):
        gt = os.path.join(work, "gt.npy")
        np.save(gt, ground_truth(np.load(files[0]), np.load(files[1]), 10, args.metric)[0])
        runs = ab.interleave(libs, args.rounds,
                             lambda name: [*files, str(args.threads), args.metric, cache[name], gt],
                             WORKLOAD)
    ab.report(runs, dict(vars(args), queries=1000))


if __name__ == "__main__":
    main()
