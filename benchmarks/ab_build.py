"""A short interleaved A/B of two builds of knndirect: build time (wall and
process CPU) and a 1-thread batch search, for changes to the build's inner
loop whose gain is a few percent.

    python benchmarks/ab_build.py --base REV [--head REV] [--n 100000] [--dim 256] [--rounds 10]

Each revision is built out of tree as benchmarks/ab.py does (--head
defaults to the working tree, uncommitted changes included). Each round
runs one fresh process per build, in alternating order; a process builds
clustered data (M 16, ef_construction 200, seed 1, --threads build
threads), then times five 1-thread batch searches of 1,000 queries at ef
64 and keeps their median. Nothing is saved, so a round takes one build's
time: ten rounds fit where ab.py's full workload runs three. The table is
ab.py's: each side's median, their ratio, the median and range of the
per-round ratios, and the rounds the head won.
"""
import argparse
import os
import shutil
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))

import ab  # noqa: E402

WORKLOAD = r"""
import json, resource, sys, time
import numpy as np
import knndirect as kd

x = np.load(sys.argv[1])
q = np.load(sys.argv[2])
index = kd.Index(x.shape[1], sys.argv[4], m=16, ef_construction=200, seed=1)
r0 = resource.getrusage(resource.RUSAGE_SELF)
t0 = time.perf_counter()
index.add(x, threads=int(sys.argv[3]))
wall = time.perf_counter() - t0
r1 = resource.getrusage(resource.RUSAGE_SELF)
times = []
for _ in range(5):
    t0 = time.perf_counter()
    index.search(q, k=10, ef=64, threads=1)
    times.append(time.perf_counter() - t0)
cpu = (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime)
print("AB " + json.dumps({"build_s": wall, "build_cpu_s": cpu,
                          "search_qps": len(q) / sorted(times)[2]}))
"""


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base", required=True, help="git revision A")
    p.add_argument("--head", default=None, help="git revision B (default: the working tree)")
    p.add_argument("--n", type=int, default=100_000)
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--metric", default="cosine", choices=["cosine", "l2", "ip"])
    p.add_argument("--threads", type=int, default=2, help="build threads")
    p.add_argument("--rounds", type=int, default=10)
    args = p.parse_args(argv)

    from knndirect.datasets import clustered

    work = tempfile.mkdtemp(prefix="kd-ab-build-")
    try:
        libs = {"base": ab.build(args.base, work, "base"), "head": ab.build(args.head, work, "head")}
        allv = clustered(args.n + 1000, args.dim, seed=7)
        files = [os.path.join(work, "x.npy"), os.path.join(work, "q.npy")]
        np.save(files[0], allv[:args.n])
        np.save(files[1], np.ascontiguousarray(allv[args.n:]))
        runs = {"base": [], "head": []}
        for r in range(args.rounds):
            for name in ("base", "head") if r % 2 == 0 else ("head", "base"):
                runs[name].append(ab.run_once(
                    libs[name], [*files, str(args.threads), args.metric], WORKLOAD))
                print(f"round {r + 1} {name}: {runs[name][-1]}", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    ab.report(runs, dict(vars(args), queries=1000))


if __name__ == "__main__":
    main()
