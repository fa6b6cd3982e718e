"""How far does each build's calibration table read from the set's own
held-out queries, and does its standard error account for it? For each
index seed (which draws the calibration sample and orders the build), the
set is built with the defaults (2 threads) and every table point at the
coarse shortlist lengths (2, 3, 4, 6, 8 x k) with recall 0.85-0.99 is
searched again with the set's queries (never added) at its ef and
oversample. Prints per seed: the mean, lowest and highest gap (table less
queries), the mean gap in standard errors of the difference (the table's
and the queries' own, combined), both standard errors, and the default's
pick, its expectation and what the queries gave.

    python benchmarks/calibration_gap.py --set minilm-dict --metric l2 --seeds 0,1,2,3,4,5,6

The gaps of one seed share its sample, so they move together: read one
mean gap per seed. The set's queries are the same for every seed, so their
own error (the second standard error) is common to all rows.
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

COARSE = (2.0, 3.0, 4.0, 6.0, 8.0)


def main():
    import knndirect as kd
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--set", default="minilm-dict")
    ap.add_argument("--metric", default="l2")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    k = 10
    ds = bench_data.resolve(args.set, n_queries=1000, metric=args.metric, k=k)
    base = bench_data.load_base(ds.to_json())
    queries = bench_data.load_queries(ds.to_json())
    truth = np.load(ds.gt_path)
    print("| seed | calibration queries | points | mean gap | lowest | highest | mean gap / se "
          "| table se | queries' se | default ef, os | expected | queries gave |")
    print("| ---: " * 12 + "|")
    for seed in (int(s) for s in args.seeds.split(",")):
        t = time.perf_counter()
        index = kd.Index(base.shape[1], args.metric, seed=seed)
        index.add(base, threads=args.threads)
        cal = index.info()["calibration"]
        rows = []
        for p in cal["points"]:
            if p["oversample"] in COARSE and 0.85 <= p["recall"] <= 0.99:
                ids = index.search(queries, k, ef=p["ef"], oversample=p["oversample"],
                                   threads=args.threads)[1]
                r = per_query_recall(ids, truth, k)
                rows.append((p["recall"], p["stderr"], r.mean(), r.std(ddof=1) / np.sqrt(len(r))))
        a = np.asarray(rows)
        gap = a[:, 0] - a[:, 2]
        z = gap / np.hypot(a[:, 1], a[:, 3])
        d = cal["default"]
        got = per_query_recall(index.search(queries, k, threads=args.threads)[1], truth, k).mean()
        print(f"| {seed} | {cal['queries']} | {len(a)} | {gap.mean():+.4f} | {gap.min():+.4f} | "
              f"{gap.max():+.4f} | {z.mean():+.2f} | {a[:, 1].mean():.4f} | {a[:, 3].mean():.4f} "
              f"| {d['ef']}, {d['oversample']:g} | {d['expected_recall']:.4f} | {got:.4f} |",
              flush=True)
        print(f"  (seed {seed}: {time.perf_counter() - t:.0f} s)", file=sys.stderr, flush=True)
        index.close()


if __name__ == "__main__":
    main()
