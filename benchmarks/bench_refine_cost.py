"""What re-estimating a candidate from its 4-bit refinement costs, against a
1-bit code distance of the beam: the price the calibration gives it
(REFINED_COST in python/knndirect/_calibration.py).

    python benchmarks/bench_refine_cost.py clustered-100k-256 clustered-100k-768

Per set: a "1bit" and a "1bit+4bit" index built on one thread with one seed,
so both walk the same graph (it is built over separate build codes), then
searched with rerank=False at ef 64 and 256, the two interleaved, 7 passes
each on one thread. A code distance costs graph_seconds / scored of the
1-bit index; a refinement costs the extra time per query of the refined
index divided by the candidates it re-estimated (stats()["refined"]).
Medians; the machine is shared, so run it quiet.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_data  # noqa: E402


def timed(index, queries, ef):
    index.stats(reset=True)
    t = time.perf_counter()
    index.search(queries, 10, ef=ef, rerank=False, threads=1)
    return time.perf_counter() - t, index.stats()


def main(argv=None):
    import knndirect as kd
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sets", nargs="+")
    ap.add_argument("--metric", default="l2")
    ap.add_argument("--efs", default="64,256")
    ap.add_argument("--passes", type=int, default=7)
    args = ap.parse_args(argv)
    for spec in args.sets:
        ds = bench_data.resolve(spec, metric=args.metric)
        base = bench_data.load_base(ds.to_json())
        queries = bench_data.load_queries(ds.to_json())
        built = {}
        for quant in ("1bit", "1bit+4bit"):
            index = kd.Index(base.shape[1], args.metric, quantization=quant, seed=1)
            index.add(base, threads=1)
            built[quant] = index
        for ef in (int(e) for e in args.efs.split(",")):
            runs = {q: [] for q in built}
            for _ in range(args.passes):
                for quant, index in built.items():
                    runs[quant].append(timed(index, queries, ef))
            plain = statistics.median(t for t, _ in runs["1bit"])
            refined = statistics.median(t for t, _ in runs["1bit+4bit"])
            st_plain, st_refined = runs["1bit"][0][1], runs["1bit+4bit"][0][1]
            per_code = statistics.median(s["graph_seconds"] / s["scored"]
                                         for _, s in runs["1bit"]) * 1e9
            per_refined = (refined - plain) / st_refined["refined"] * 1e9
            print(f"{spec} ef {ef}: {1e6 * plain / len(queries):.1f} us/query 1bit, "
                  f"{1e6 * refined / len(queries):.1f} refined; "
                  f"{st_plain['scored'] / len(queries):.0f} code distances a query at "
                  f"{per_code:.0f} ns; {st_refined['refined'] / len(queries):.0f} refined at "
                  f"{per_refined:.0f} ns = {per_refined / per_code:.1f} code distances",
                  flush=True)
        for index in built.values():
            index.close()


if __name__ == "__main__":
    main()
