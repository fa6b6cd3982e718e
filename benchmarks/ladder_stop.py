"""An A/B of where the calibration's beam ladder stops (SATURATED in
knndirect/_calibration.py): for each metric and each stop, the set is
built with the defaults (2 threads) and the given index seed, and the
script prints the build and calibration seconds (and share), the
calibration queries, the widest beam measured, and the recall@10 of the
default and of recall=0.90/0.95/0.98/0.99 on the set's 1,000 held-out
queries.

    python benchmarks/ladder_stop.py --set minilm-wordnet --seed 1 --stops 0.99,0.985
"""
import argparse
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_data  # noqa: E402
from bench_recall import recall_at  # noqa: E402


def main():
    import knndirect as kd
    from knndirect import _calibration
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--set", default="minilm-wordnet")
    ap.add_argument("--metrics", default="cosine,l2,ip")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--stops", default="0.99,0.985")
    args = ap.parse_args()
    k = 10
    for metric in args.metrics.split(","):
        ds = bench_data.resolve(args.set, n_queries=1000, metric=metric, k=k)
        base = bench_data.load_base(ds.to_json())
        queries = bench_data.load_queries(ds.to_json())
        truth = np.load(ds.gt_path)
        for stop in (float(s) for s in args.stops.split(",")):
            _calibration.SATURATED = stop
            index = kd.Index(base.shape[1], metric, seed=args.seed)
            t = time.perf_counter()
            index.add(base, threads=2)
            cal = index.info()["calibration"]
            build = time.perf_counter() - t - cal["seconds"]
            got = {r: recall_at(index.search(queries, k, recall=r, threads=2)[1], truth, k)
                   for r in (0.90, 0.95, 0.98, 0.99)}
            default = recall_at(index.search(queries, k, threads=2)[1], truth, k)
            print(f"{metric} stop {stop}: build {build:.1f} s, calibration {cal['seconds']:.2f} s "
                  f"({100 * cal['seconds'] / build:.1f}%), {cal['queries']} queries, widest ef "
                  f"{cal['ef'][-1]} | default {default:.4f} | "
                  + " ".join(f"{r}: {v:.4f}" for r, v in got.items()), flush=True)
            index.close()


if __name__ == "__main__":
    main()
