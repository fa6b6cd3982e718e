"""How far is a calibration table from the truth, and what do more queries
buy? One index is built on a set less some of its vectors; those are split
into a test set (recall measured on it is the truth) and many independent
samples of MOST_QUERIES calibration queries. Each sample is measured three
ways:

- one: the first QUERIES only (the table before staged sampling);
- staged: the first QUERIES, and more where the table's error at a
  promised target exceeds STDERR_BOUND (what an add does);
- all: all MOST_QUERIES at once.

For each way and target it prints the mean and spread, over the samples, of
(test recall at the chosen point - the table's expected recall), the mean
queries measured and the mean calibration seconds.

--sure-z Z1,Z2,... then prints, for each way, what the default (0.95 with
the recall less Z standard errors) gives on the test queries with each Z:
the lowest and mean recall, how many samples fell below 0.95, and the mean
beam and shortlist it chose (its cost); the library's own rule ("auto",
_calibration.sure_z of the columns that could be picked) first.
--ways picks some of the three ways (staged is what an add does).

    python benchmarks/calibration_samples.py --set mpnet-dict --metric cosine
    python benchmarks/calibration_samples.py --set clustered-100k-384 --samples 30
    python benchmarks/calibration_samples.py --set minilm-dict --metric l2 \
        --samples 40 --ways staged --sure-z 1.645,2.326
"""
import argparse
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_data  # noqa: E402
from default_margin import LIBRARY_SURE_Z, pinned_sure_z  # noqa: E402


def main():
    import knndirect as kd
    from knndirect import _calibration as cal_mod
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--set", default="clustered-100k-384")
    ap.add_argument("--metric", default="cosine")
    ap.add_argument("--quantization", default="1bit")
    ap.add_argument("--samples", type=int, default=20)
    ap.add_argument("--test", type=int, default=2000, help="test queries")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--ways", default="one,staged,all")
    ap.add_argument("--sure-z", default=None,
                    help="comma-separated z for the default's one-sided bound, for an A/B")
    args = ap.parse_args()
    unknown = set(args.ways.split(",")) - {"one", "staged", "all"}
    if unknown:
        ap.error(f"--ways: unknown {sorted(unknown)}; choose from all, one, staged")
    zs = ["auto"] + [z for z in (args.sure_z or "").split(",") if z and z != "auto"]
    k, most, first = cal_mod.K, cal_mod.MOST_QUERIES, cal_mod.QUERIES
    ds = bench_data.resolve(args.set, metric=args.metric, k=k)
    base = np.asarray(bench_data.load_base(ds.to_json()), np.float32)
    rng = np.random.default_rng(args.seed)
    order = rng.permutation(base.shape[0])
    spare = args.test + args.samples * most
    if spare * 4 > base.shape[0]:
        sys.exit(f"{args.set}: {base.shape[0]:,} vectors are too few for "
                 f"{args.samples} samples of {most}")
    test = np.ascontiguousarray(base[np.sort(order[:args.test])])
    pool = np.ascontiguousarray(base[order[args.test:spare]])
    rest = np.sort(order[spare:])
    index = kd.Index(base.shape[1], args.metric, quantization=args.quantization,
                     seed=args.seed)
    t = time.perf_counter()
    index.add(base[rest], ids=rest, threads=args.threads)
    print(f"{args.set} {args.metric} {args.quantization}: index of {len(rest):,} built in "
          f"{time.perf_counter() - t:.1f} s; {args.test} test queries, {args.samples} "
          f"samples of {most}", flush=True)
    _, truth = index.search(test, k, exact=True, threads=args.threads)
    core, measured = index._core, {}

    def test_recall(ef, oversample):
        if (ef, oversample) not in measured:
            _, ids = index.search(test, k, ef=ef, oversample=oversample, threads=args.threads)
            measured[ef, oversample] = float(np.mean(
                [len(set(a) & set(b)) / k for a, b in zip(ids, truth)]))
        return measured[ef, oversample]

    picks = [(0.90, False), (0.95, False), (0.98, False), (0.95, True)]
    plans = {"one": (first, None), "staged": (most, first), "all": (most, None)}
    plans = {w: plans[w] for w in args.ways.split(",")}
    ways = {w: [] for w in plans}
    defaults = {(w, z): [] for w in plans for z in zs}
    for s in range(args.samples):
        q = pool[s * most:(s + 1) * most]
        for way, (n, stage) in plans.items():
            def truth_of(lo, hi, depth, q=q):
                return index.search(q[lo:hi], depth, exact=True, threads=args.threads)[1]

            t = time.perf_counter()
            cal = cal_mod.measure(core, q[:n], truth_of, k, threads=args.threads, first=stage)
            sec = time.perf_counter() - t
            errs = []
            for target, sure in picks:
                ef, oversample, expect = cal_mod.choose(cal, target, k, sure=sure)
                errs.append(test_recall(ef, oversample) - expect)
            ways[way].append(errs + [cal["queries"], sec])
            for z in zs:
                cal_mod.sure_z = pinned_sure_z(z)
                ef, oversample, _ = cal_mod.choose(cal, cal_mod.DEFAULT_TARGET, k, sure=True)
                defaults[way, z].append((test_recall(ef, oversample), ef, oversample))
            cal_mod.sure_z = LIBRARY_SURE_Z
    print("| way | " + " | ".join(f"{t}{' (default)' if s else ''}: bias, spread"
                                  for t, s in picks) + " | queries | seconds |")
    print("| --- " * (len(picks) + 3) + "|")
    for way, rows in ways.items():
        a = np.asarray(rows)
        cells = [f"{a[:, i].mean():+.4f}, {a[:, i].std(ddof=1):.4f}" for i in range(len(picks))]
        print(f"| {way} | " + " | ".join(cells) + f" | {a[:, -2].mean():.0f} | "
              f"{a[:, -1].mean():.2f} |")
    print("\n| way | z | default lowest | mean | below 0.95 | mean ef | mean oversample |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for (way, z), rows in defaults.items():
        a = np.asarray(rows)
        print(f"| {way} | {z} | {a[:, 0].min():.4f} | {a[:, 0].mean():.4f} | "
              f"{int((a[:, 0] < 0.95).sum())}/{len(a)} | {a[:, 1].mean():.1f} | "
              f"{a[:, 2].mean():.2f} |")


if __name__ == "__main__":
    main()
