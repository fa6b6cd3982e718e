"""What one scored node costs the beam as the index grows: the first n rows
of a set built with the defaults (2 threads), searched by one thread with
oversample 1 (so the float32 re-score is 10 rows), and the graph phase's
time from `stats()` divided by the nodes it scored. If the cost stayed flat
while the codes and lists outgrow the caches, the beam is bound by its
instructions rather than by memory misses.

    python benchmarks/beam_cost.py clustered-100k-384 --sizes 10000,30000,100000
"""
import argparse
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_data  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dataset")
    ap.add_argument("--sizes", default="10000,30000,100000")
    ap.add_argument("--efs", default="32,64")
    ap.add_argument("--passes", type=int, default=3)
    args = ap.parse_args(argv)
    import knndirect as kd

    ds = bench_data.resolve(args.dataset)
    j = ds.to_json()
    x, q = bench_data.load_base(j), bench_data.load_queries(j)
    print(f"{ds.name}: 1 search thread, oversample 1, {len(q)} queries, "
          f"{args.passes} passes a point\n")
    print("| rows | ef | scored a query | graph µs a query | ns a scored node |")
    print("| --- | --- | --- | --- | --- |")
    for n in (int(v) for v in args.sizes.split(",")):
        with kd.Index(ds.dim, ds.metric, seed=0) as ix:
            ix.add(np.ascontiguousarray(x[:n]), threads=2)
            for ef in (int(v) for v in args.efs.split(",")):
                ix.search(q, 10, ef=ef, oversample=1, threads=1)
                s0 = ix.stats()
                for _ in range(args.passes):
                    ix.search(q, 10, ef=ef, oversample=1, threads=1)
                s1 = ix.stats()
                queries = args.passes * len(q)
                scored = (s1["scored"] - s0["scored"]) / queries
                graph = (s1["graph_seconds"] - s0["graph_seconds"]) / queries
                print(f"| {n:,} | {ef} | {scored:.0f} | {graph * 1e6:.1f} | "
                      f"{graph / scored * 1e9:.1f} |", flush=True)


if __name__ == "__main__":
    main()
