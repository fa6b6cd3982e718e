"""Where a build's calibration spends its time: the brute force for the
first queries' truth, each pass of the ladder (a pass is measured again when
the shortlists must deepen), then the truth and ladder of the queries the
budget adds. One build of a cached set with the defaults, timed by wrapping
the calibration module's own functions (nothing else changes).

    python benchmarks/calibration_cost.py --dataset clustered-1m-768
    python benchmarks/calibration_cost.py --dataset clustered-100k-256 --metric ip
    python benchmarks/calibration_cost.py --dataset clustered-1m-768 --index INDEX  # the filter alone

Prints one line per step (queries, seconds, ms a query), then the build's
time, the calibration's share of it and the queries the table was measured
on. Last, on the built index, the cost of the random half (medians of 7): a search
of one query with its ids as the filter and without, and a sweep of 100 of
the set's queries at ef 20 with the half read by its salt (as the
calibration reads it), by its ids (a filter built every call, as it did
before), and without it.
"""
import argparse
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_data  # noqa: E402
from bench_exact import median_time  # noqa: E402


def main():
    import knndirect as kd
    from knndirect import _calibration
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", default="clustered-1m-768")
    ap.add_argument("--metric", default="l2")
    ap.add_argument("--threads", type=int, default=2, help="build threads")
    ap.add_argument("--seed", type=int, default=0, help="index seed")
    ap.add_argument("--index", help="a saved index of the set: time its half's filter alone")
    args = ap.parse_args()
    ds = bench_data.resolve(args.dataset, metric=args.metric)
    queries = np.load(ds.query_path)[:100]
    if args.index:
        half_filter(kd.load(args.index), queries, _calibration)
        return
    base = np.ascontiguousarray(np.load(ds.base_path, mmap_mode="r")[:ds.n], np.float32)
    steps = []
    ladder, measure = _calibration._ladder, _calibration.measure

    def timed_ladder(core, part, *a, **kw):
        t = time.perf_counter()
        rows = ladder(core, part, *a, **kw)
        beams = kw.get("beams", a[4] if len(a) > 4 else None)  # given: the queries added
        what = "ladder pass" if beams is None else "ladder, the queries added"
        steps.append((what, part.queries.shape[0], time.perf_counter() - t))
        return rows

    def timed_measure(core, queries, truth_of, k, **kw):
        def timed_truth(lo, hi, depth):
            t = time.perf_counter()
            out = truth_of(lo, hi, depth)
            steps.append((f"truth (depth {depth})", hi - lo, time.perf_counter() - t))
            return out
        return measure(core, queries, timed_truth, k, **kw)

    _calibration._ladder, _calibration.measure = timed_ladder, timed_measure
    try:
        index = kd.Index(ds.dim, metric=args.metric, seed=args.seed)
        t = time.perf_counter()
        index.add(base, threads=args.threads)
        took = time.perf_counter() - t
    finally:
        _calibration._ladder, _calibration.measure = ladder, measure
    print(f"{args.dataset}, {args.metric}, index seed {args.seed}, {args.threads} threads")
    for what, n, s in steps:
        print(f"  {what}: {n} queries, {s:.3f} s, {s / n * 1e3:.2f} ms a query")
    cal = index.info()["calibration"]
    print(f"build {took:.1f} s; calibration {index._cal_seconds:.2f} s "
          f"({index._cal_seconds / took:.2%}), {cal['queries']} queries; "
          f"default {cal['default']}")
    half_filter(index, queries, _calibration)


def median_ms(fn):
    return median_time(fn, 7) * 1e3


def half_filter(index, queries, cal_mod):
    core, k = index._core, cal_mod.K
    q = np.ascontiguousarray(queries, np.float32)
    salt = cal_mod.half_of(core)
    live = core.live_ids()
    half = np.ascontiguousarray(live[cal_mod.in_half(live, salt)])
    _, deep = index.search(q, cal_mod.HALF_DEPTH * k, exact=True)
    truth = np.ascontiguousarray(deep[:, :k], np.int64).ravel()
    half_truth = cal_mod.within(deep, salt, k).ravel()
    lens = np.asarray(index._cal["shortlist"], np.int64)

    def sweep(h=None):
        return median_ms(lambda: core.recall_sweep(q, None, truth, k, 20, lens, 0, h,
                                                   None if h is None else half_truth))

    print(f"the random half: {len(half):,} ids")
    print(f"  search of one query: with it as the filter "
          f"{median_ms(lambda: index.search(q[:1], k, filter=half)):.1f} ms, without "
          f"{median_ms(lambda: index.search(q[:1], k)):.1f} ms")
    print(f"  sweep of {len(q)} queries at ef 20: with the half by its salt {sweep(salt):.1f} ms,"
          f" by its ids {sweep(half):.1f} ms, without {sweep():.1f} ms")


if __name__ == "__main__":
    main()
