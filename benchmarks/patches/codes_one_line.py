"""The one-line code study of docs/benchmarks.md: 1-bit codes padded to whole
64-byte lines on page-aligned memory (codes-one-line.patch, switched on by
KD_HACK_ALIGN=1) against the packed layout, in alternating fresh processes.
Each process builds clustered-100k-256 (cosine, seed 1, 2 threads) and times
1-thread batches of 1,000 queries, median of 9, at the default point and at
ef 16 with no oversampling.

    python benchmarks/patches/codes_one_line.py [--rounds 3]
"""
import argparse
import os
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(ROOT, "benchmarks", "data", "clustered-100k-256")


def child():
    import knndirect as kd

    x = np.load(os.path.join(DATA, "base-q1000.npy"), mmap_mode="r")
    q = np.ascontiguousarray(np.load(os.path.join(DATA, "queries-1000.npy")))
    ix = kd.Index(256, "cosine", seed=1)
    ix.add(np.ascontiguousarray(x[:100000]), threads=2)
    out = {}
    for name, kw in (("default", {}), ("ef16", {"ef": 16, "oversample": 1})):
        ix.search(q, k=10, threads=1, **kw)
        times = []
        for _ in range(9):
            t = time.perf_counter()
            ix.search(q, k=10, threads=1, **kw)
            times.append(time.perf_counter() - t)
        out[name] = round(len(q) / float(np.median(times)))
    layout = "64-byte lines" if os.environ.get("KD_HACK_ALIGN") else "packed"
    print(f"{layout}: {out}", flush=True)


def main():
    if sys.argv[1:] == ["child"]:
        return child()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    for _ in range(args.rounds):
        for aligned in (False, True):
            env = dict(os.environ)
            env.pop("KD_HACK_ALIGN", None)
            if aligned:
                env["KD_HACK_ALIGN"] = "1"
            subprocess.run([sys.executable, __file__, "child"], check=True, env=env)


if __name__ == "__main__":
    main()
