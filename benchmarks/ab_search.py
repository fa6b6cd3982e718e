"""A short interleaved A/B of two builds of knndirect searching one saved
index, for changes to the search's kernels that leave the file format and
the graph alone.

    python benchmarks/ab_search.py --base REV [--head REV] [--n 100000] [--dim 384] [--rounds 7]
                                   [--quantization 1bit|1bit+4bit]

Each revision is built out of tree as benchmarks/ab.py does (--head
defaults to the working tree, uncommitted changes included). The head
builds one index of clustered data (M 16, ef_construction 200, seed 1,
2 threads, the codes --quantization names) and saves it with the exact
answers of 1,000 queries. Each round then runs one fresh process per
build, in alternating order; a process loads the index (kd.load:
everything in RAM) and times batches of the 1,000 queries, each figure the
median of seven passes: the default search (the calibrated target 0.95)
with 1 and 2 threads, and ef 16 with no oversampling (the beam almost
alone) with 1 thread. The 1-thread
figures come twice, by the wall clock and by the process's CPU time (the
"cpu" rows: time this process did not run is not counted). Recall is given
for the default search; equal recall on both sides says the two returned
the same answers' worth. The table is ab.py's.
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))

import ab  # noqa: E402

BUILD = r"""
import sys
import numpy as np
import knndirect as kd

x = np.load(sys.argv[1])
q = np.load(sys.argv[2])
index = kd.Index(x.shape[1], sys.argv[4], m=16, ef_construction=200, seed=1,
                 quantization=sys.argv[5])
index.add(x, threads=2)
index.save(sys.argv[3])
_, truth = index.search(q, k=10, exact=True, threads=2)
np.save(sys.argv[3] + ".truth.npy", truth)
print("AB {}")
"""

SEARCH = r"""
import json, sys, time
import numpy as np
import knndirect as kd
from knndirect.datasets import recall_at_k

index = kd.load(sys.argv[1])
q = np.load(sys.argv[2])
truth = np.load(sys.argv[1] + ".truth.npy")

def qps(clock, **kw):
    index.search(q, k=10, **kw)
    times = []
    for _ in range(7):
        t0 = clock()
        index.search(q, k=10, **kw)
        times.append(clock() - t0)
    return len(q) / float(np.median(times))

_, ids = index.search(q, k=10, threads=1)
print("AB " + json.dumps({
    "recall_default": recall_at_k(ids, truth, 10),
    "default_1t_qps": qps(time.perf_counter, threads=1),
    "default_1t_cpu_qps": qps(time.process_time, threads=1),
    "default_2t_qps": qps(time.perf_counter, threads=2),
    "ef16_1t_qps": qps(time.perf_counter, ef=16, oversample=1, threads=1),
    "ef16_1t_cpu_qps": qps(time.process_time, ef=16, oversample=1, threads=1),
}))
"""


def main(argv=None):
    p = ab.short_args(__doc__.split("\n\n")[0], dim=384, rounds=7)
    p.add_argument("--quantization", default="1bit", choices=["1bit", "1bit+4bit"])
    args = p.parse_args(argv)
    with ab.short_work(args, "kd-ab-search-") as (work, libs, (x, q)):
        index = os.path.join(work, "index.kdx")
        ab.run_once(libs["head"], [x, q, index, args.metric, args.quantization], BUILD)
        runs = ab.interleave(libs, args.rounds, lambda name: [index, q], SEARCH)
    ab.report(runs, dict(vars(args), queries=1000))


if __name__ == "__main__":
    main()
