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

With --queries, each z is read from tables measured on that many of the
build's held-out queries (all on the same graph: the build's calibration is
measured once per count before the held-out rows go in; "lib" is the
library's own rule, "staged" its error rule alone, as a one-thread build
takes it), and "auto@A" is the family's rule at confidence 1 - A:

    python benchmarks/default_margin.py --queries lib,400 --z auto,auto@0.01

A z ending in "/plain" reads the standard error at the estimate, not at
the target (_calibration.SPREAD_AT_TARGET off), the rule before it:

    python benchmarks/default_margin.py --z auto/plain,auto

"whole" is the library's rule with every beam measured on all the queries
(none on half of them past HALF_PAST), the rule before the halving:

    python benchmarks/default_margin.py --queries lib,whole --z auto \
        --targets 0.9,0.95,0.98

--targets also searches with recall= each target from each table, and
counts the targets whose recall lands outside +-0.02.

A fresh build per seed: the table's error is its sample's, so one seed is
one draw. The queries are the same for every seed: their own standard
error (printed) is common to all rows of a set and metric.
"""
import argparse
import math
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


LIBRARY_MEASURE = _calibration.measure
LIBRARY_ALPHA = _calibration.SURE_ALPHA
LIBRARY_HALF_PAST = _calibration.HALF_PAST
LIBRARY_AT_TARGET = _calibration.SPREAD_AT_TARGET


def pinned_sure_z(z, taken=None):
    """A stand-in for _calibration.sure_z: z fixed, "auto" for the library's
    own rule or "auto@A" for it at alpha A; each z it gives is appended to
    taken."""
    def sure_z(columns):
        if z.startswith("auto"):
            at = z.split("/")[0][5:]
            _calibration.SURE_ALPHA = float(at) if at else LIBRARY_ALPHA
            got = LIBRARY_SURE_Z(columns)
            _calibration.SURE_ALPHA = LIBRARY_ALPHA
        else:
            got = float(z)
        if taken is not None:
            taken.append(got)
        return got
    return sure_z


def measuring_each(counts, tables, seconds):
    """A stand-in for _calibration.measure that, for a build (first given),
    measures one table per count in counts ("lib": the library's own rule;
    "staged": its error rule alone, as a one-thread build takes it; a
    number: that many of the held-out queries, all of them at once) and
    keeps each in tables, its time in seconds. The index keeps the first.
    "whole": the library's rule, no beam on half the queries."""
    def measure(core, queries, truth_of, k, **kw):
        if kw.get("first") is None:
            return LIBRARY_MEASURE(core, queries, truth_of, k, **kw)
        for c in counts:
            t0 = time.perf_counter()
            rule = {} if c in ("lib", "whole") else {"budget": None} if c == "staged" else {
                "first": min(int(c), queries.shape[0]), "budget": None}
            _calibration.HALF_PAST = math.inf if c == "whole" else LIBRARY_HALF_PAST
            tables[c] = LIBRARY_MEASURE(core, queries, truth_of, k, **(kw | rule))
            _calibration.HALF_PAST = LIBRARY_HALF_PAST
            seconds[c] = time.perf_counter() - t0
        return tables[counts[0]]
    return measure


def main():
    import knndirect as kd
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sets", default="clustered-100k-256")
    ap.add_argument("--metrics", default="cosine,l2,ip")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--z", default="1.645,auto,2.326")
    ap.add_argument("--queries", default="lib",
                    help="held-out query counts the tables are measured on")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2, help="build threads")
    ap.add_argument("--targets", default="",
                    help="recall= targets to search with from each table, e.g. 0.9,0.95,0.98")
    args = ap.parse_args()
    targets = [float(t) for t in args.targets.split(",") if t]
    k = 10
    counts = args.queries.split(",")
    missed = {c: [] for c in counts}  # per table: each target's recall less the target
    rules = [(c, z) for c in counts for z in args.z.split(",")]
    taken = []
    seeds = [int(s) for s in args.seeds.split(",")]
    summary = {r: [] for r in rules}
    shares = {c: [] for c in counts}

    def label(rule):
        return rule[1] if counts == ["lib"] else f"{rule[0]} q, {rule[1]}"
    heads = [f"{label(r)}: ef, os, recall, QPS ratio" for r in rules] + [
        f"recall={'/'.join(map(str, targets))}" for _ in counts if targets]
    print("| set | metric | seed | queries' se | calibration share | " + " | ".join(heads)
          + " |")
    print("| --- | --- | ---: | ---: | --- |" + " --- |" * len(heads))
    for name in args.sets.split(","):
        for metric in args.metrics.split(","):
            ds = bench_data.resolve(name, n_queries=1000, metric=metric, k=k)
            base = bench_data.load_base(ds.to_json())
            queries = bench_data.load_queries(ds.to_json())
            truth = np.load(ds.gt_path)
            for seed in seeds:
                t = time.perf_counter()
                index = kd.Index(base.shape[1], metric, seed=seed)
                tables, seconds = {}, {}
                _calibration.measure = measuring_each(counts, tables, seconds)
                index.add(base, threads=args.threads)
                _calibration.measure = LIBRARY_MEASURE
                build = time.perf_counter() - t - sum(seconds.values())
                share = ", ".join(f"{c} {tables[c]['queries']} q {seconds[c] / build:.1%}"
                                  for c in counts)
                for c in counts:
                    shares[c].append(seconds[c] / build)
                cells, qse, first_qps = [], None, None
                for rule in rules:
                    count, z = rule
                    index._set_calibration(tables[count])
                    _calibration.sure_z = pinned_sure_z(z, taken)
                    _calibration.SPREAD_AT_TARGET = not z.endswith("/plain")
                    ef, os_ = index._chosen(k, None)
                    _calibration.SPREAD_AT_TARGET = LIBRARY_AT_TARGET
                    took = f" (z {taken[-1]:.2f})" if z.startswith("auto") else ""
                    times = []
                    for _ in range(args.repeats):
                        t0 = time.perf_counter()
                        ids = index.search(queries, k, threads=1)[1]
                        times.append(time.perf_counter() - t0)
                    r = per_query_recall(ids, truth, k)
                    qse = r.std(ddof=1) / np.sqrt(len(r))
                    qps = len(queries) / float(np.median(times))
                    first_qps = first_qps or qps
                    summary[rule].append((r.mean(), qps / first_qps))
                    cells.append(f"{ef}, {os_:g}, {r.mean():.4f}, {qps / first_qps:.3f}{took}")
                _calibration.sure_z = LIBRARY_SURE_Z
                for c in counts:
                    index._set_calibration(tables[c])
                    got = [per_query_recall(index.search(queries, k, recall=t, threads=1)[1],
                                            truth, k).mean() for t in targets]
                    missed[c] += [g - t for g, t in zip(got, targets)]
                    if targets:
                        cells.append(f"{c}: " + "/".join(f"{g:.4f}" for g in got))
                print(f"| {name} | {metric} | {seed} | {qse:.4f} | {share} | "
                      + " | ".join(cells) + " |", flush=True)
                print(f"  ({name} {metric} seed {seed}: {time.perf_counter() - t:.0f} s)",
                      file=sys.stderr, flush=True)
                index.close()
    print()
    print("| rule | builds | below 0.95 | lowest recall | mean recall | median QPS ratio |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for rule in rules:
        a = np.asarray(summary[rule])
        print(f"| {label(rule)} | {len(a)} | {int((a[:, 0] < 0.95).sum())} | "
              f"{a[:, 0].min():.4f} | {a[:, 0].mean():.4f} | {np.median(a[:, 1]):.3f} |")
    print()
    for c in counts:
        print(f"calibration share of the build, {c} queries: median "
              f"{np.median(shares[c]):.2%}, largest {max(shares[c]):.2%}")
        if targets:
            m = np.asarray(missed[c])
            print(f"  recall= from its tables: {int((np.abs(m) > 0.02).sum())} of {len(m)} "
                  f"outside +-0.02, mean {m.mean():+.4f}, from {m.min():+.4f} to "
                  f"{m.max():+.4f}")


if __name__ == "__main__":
    main()
