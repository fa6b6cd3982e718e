"""How sure should a default search be? For each set, metric and index seed
(the seed draws the held-out calibration sample), the set is built with the
defaults (2 threads) and the default search is run with the table read at
several confidence levels (z, the standard errors of the table taken off
before a point counts as reaching 0.95; "auto" is the library's own,
_calibration.sure_z of the columns that could be picked, printed as the z
it took). Prints, per z, the default's recall on the set's own 1,000
queries (never added), how many builds fell below 0.95, and the queries
per second with 1 thread relative to the first z listed, on the same build
(median of --repeats batches of all the queries).

    python benchmarks/default_margin.py --sets clustered-100k-256,minilm-wordnet \\
        --metrics cosine,l2,ip --seeds 0,1,2 --z 1.645,auto,2.326

A fresh build per seed: the table's error is its sample's, so one seed is
one draw. The queries are the same for every seed: their own standard
error (printed) is common to all rows of a set and metric.
"""
import argparse
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_data  # noqa: E402
from bench_recall import per_query_recall  # noqa: E402
from knndirect import _calibration  # noqa: E402

LIBRARY_SURE_Z = _calibration.sure_z


def pinned_sure_z(z, taken=None):
    """A stand-in for _calibration.sure_z: z fixed, or "auto" for the
    library's own rule; each z it gives is appended to taken."""
    def sure_z(columns):
        got = LIBRARY_SURE_Z(columns) if z == "auto" else float(z)
        if taken is not None:
            taken.append(got)
        return got
    return sure_z


def main():
    import knndirect as kd
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sets", default="clustered-100k-256")
    ap.add_argument("--metrics", default="cosine,l2,ip")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--z", default="1.645,auto,2.326")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2, help="build threads")
    args = ap.parse_args()
    k = 10
    zs = args.z.split(",")
    taken = []
    seeds = [int(s) for s in args.seeds.split(",")]
    summary = {z: [] for z in zs}
    print("| set | metric | seed | queries' se | " + " | ".join(
        f"z {z}: ef, os, recall, QPS ratio" for z in zs) + " |")
    print("| --- | --- | ---: | ---: |" + " --- |" * len(zs))
    for name in args.sets.split(","):
        for metric in args.metrics.split(","):
            ds = bench_data.resolve(name, n_queries=1000, metric=metric, k=k)
            base = bench_data.load_base(ds.to_json())
            queries = bench_data.load_queries(ds.to_json())
            truth = np.load(ds.gt_path)
            for seed in seeds:
                t = time.perf_counter()
                index = kd.Index(base.shape[1], metric, seed=seed)
                index.add(base, threads=args.threads)
                cells, qse, first_qps = [], None, None
                for z in zs:
                    _calibration.sure_z = pinned_sure_z(z, taken)
                    index._choices = {}
                    ef, os_ = index._chosen(k, None)
                    took = f" (z {taken[-1]:.2f})" if z == "auto" else ""
                    times = []
                    for _ in range(args.repeats):
                        t0 = time.perf_counter()
                        ids = index.search(queries, k, threads=1)[1]
                        times.append(time.perf_counter() - t0)
                    r = per_query_recall(ids, truth, k)
                    qse = r.std(ddof=1) / np.sqrt(len(r))
                    qps = len(queries) / float(np.median(times))
                    first_qps = first_qps or qps
                    summary[z].append((r.mean(), qps / first_qps))
                    cells.append(f"{ef}, {os_:g}, {r.mean():.4f}, {qps / first_qps:.3f}{took}")
                print(f"| {name} | {metric} | {seed} | {qse:.4f} | " + " | ".join(cells) + " |",
                      flush=True)
                print(f"  ({name} {metric} seed {seed}: {time.perf_counter() - t:.0f} s)",
                      file=sys.stderr, flush=True)
                index.close()
    print()
    print("| z | builds | below 0.95 | lowest recall | mean recall | median QPS ratio |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    for z in zs:
        a = np.asarray(summary[z])
        print(f"| {z} | {len(a)} | {int((a[:, 0] < 0.95).sum())} | {a[:, 0].min():.4f} | "
              f"{a[:, 0].mean():.4f} | {np.median(a[:, 1]):.3f} |")


if __name__ == "__main__":
    main()
