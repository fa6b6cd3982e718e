"""How far recall= and the default land from their targets across graph
seeds, on the test suite's clustered set (20,000 x 64, one-thread
builds), measured on 4,000 fresh queries of the same distribution.

    python benchmarks/calibration_seeds.py [--seeds 8] [--steps 1,1.5,2,3,...]
        [--quantization 1bit+4bit] [--n 2000] [--dim 64] [--grow 1.9 [--grid]]
        [--segments 4 [--refit] [--bound]] [--unstretched] [--depth-bound]

--n takes the first n vectors of the same distribution instead (small
indexes: their table is measured on n less the held-out queries); --dim
another dimension.

--grow G builds each graph on the first n / G vectors and adds the rest
in adds of 1,000 (G below 2, so the table is not measured again), then
prints the default's recall as searched (widened for the growth in the
core) and with the table's own pick at build (unwidened), and how far
recall= lands from its targets.

--grid (with --grow) also prints, for the first seed, each table beam's
recall on the grown graph at that beam times sqrt(growth) less the
stretched table's, at a few lengths: where the stretch or the beam is off.

--segments S builds a Collection (merge_policy=None) of S equal segments
of n / S vectors, one commit each, and prints how far its recall= lands
from its targets and the default's recall, as --grow does. Its quantizer
is fitted on the first segment (as a collection fits it), or with --refit
on the first 16,384 vectors before the adds (Collection.refit). --bound
makes recall= take the default's bound (the widest beam, the largest
segment's shortlist times the live count over its own), as where the
quantizer is too coarse for the stretch, for an A/B.

recall= targets are read from the table stretched for the vectors added
since it was measured (the held-out queries, then adds);
--unstretched reads them from the table as measured, for an A/B. The
stretch reads a shortlist of L at L / growth ** depth, with the depth each
table measures on a random half of its rows; --depth-bound takes the bound
0.5 instead (as tables measured before the depth was), for an A/B.

--steps replaces the table's shortlist lengths (multiples of k) for an A/B
of the ladder; the default is the library's own. For each metric it prints
the largest |measured - target| over recall=0.90/0.95/0.98 and every seed,
their mean, how many fell outside +-0.02, and the default's lowest and mean
recall, and on how many graphs the default fell below 0.95.
"""
import argparse
import os
import sys
import tempfile

import numpy as np

import knndirect as kd
from knndirect import _calibration

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "tests"))
from conftest import brute_force, clustered, recall_at_k  # noqa: E402

TARGETS = (0.90, 0.95, 0.98)
DIM = 64


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=8)
    ap.add_argument("--steps", default=None, help="comma-separated shortlist multiples of k")
    ap.add_argument("--metrics", default="l2,ip,cosine")
    ap.add_argument("--quantization", default="1bit")
    ap.add_argument("--n", type=int, default=20000, help="vectors (the tests' set: 20000)")
    ap.add_argument("--dim", type=int, default=DIM, help="dimension (the tests' set: 64)")
    ap.add_argument("--grow", type=float, default=None,
                    help="build on n/G, add the rest by 1,000 (1 < G < 2)")
    ap.add_argument("--segments", type=int, default=None,
                    help="a collection of this many equal segments")
    ap.add_argument("--refit", action="store_true",
                    help="--segments: fit the quantizer on the first 16,384 vectors first")
    ap.add_argument("--bound", action="store_true",
                    help="--segments: recall= takes the default's bound, not the stretch")
    ap.add_argument("--unstretched", action="store_true",
                    help="recall= picks from the table as measured (no growth since)")
    ap.add_argument("--depth-bound", action="store_true",
                    help="stretch by the bound sqrt(growth), not the measured depth")
    ap.add_argument("--workdir", default=None, help="where --segments writes (a temp dir)")
    ap.add_argument("--grid", action="store_true",
                    help="with --grow: each table beam's recall on the grown graph less the "
                         "stretched table's, on the first seed")
    args = ap.parse_args()
    if args.unstretched:
        _calibration.choose_grown = lambda cal, target, k, growth: _calibration.choose(
            cal, target, k)
    if args.depth_bound:
        _calibration.depth_exponent = lambda rows, lens: None
    if args.bound:
        kd.Index._quantizer_fits = lambda self, count: False
    if args.grow is not None and not 1 < args.grow < 2:
        ap.error("--grow must lie between 1 and 2 (at 2 the table is measured again)")
    if args.grow:
        return grown(args)
    if args.segments:
        return segmented(args)
    if args.steps:
        _calibration.LENGTH_STEPS = tuple(float(s) for s in args.steps.split(","))
    base, fresh = _data(args.n, args.dim)
    print(f"{args.quantization}; shortlist steps: {_calibration.LENGTH_STEPS}")
    _header("metric", "max abs error", "mean error", "outside +-0.02", "default min",
            "default mean", "default < 0.95")
    for metric, truth, graphs in _per_metric(args, base, fresh):
        errs, defaults = [], []
        for index in graphs:
            index.add(base, threads=1)
            errs += _target_errors(index, fresh, truth)
            defaults.append(recall_at_k(index.search(fresh, 10)[1], truth))
        print(f"| {metric} | {_errors(errs)} | {_spread(defaults)} |", flush=True)


def _target_errors(index, fresh, truth):
    return [recall_at_k(index.search(fresh, 10, recall=t)[1], truth) - t for t in TARGETS]


def _errors(errs):
    """The largest |error|, the mean (and each target's), how many fell
    outside +-0.02: three cells."""
    e = np.array(errs)
    each = "/".join(f"{m:+.3f}" for m in e.reshape(-1, len(TARGETS)).mean(axis=0))
    return (f"{np.abs(e).max():.4f} | {e.mean():+.4f} ({each}) | "
            f"{int((np.abs(e) > 0.02).sum())}/{e.size}")


def grown(args):
    base, fresh = _data(args.n, args.dim)
    first = int(args.n / args.grow)
    print(f"{args.quantization}; built on {first}, grown by adds of 1,000 to {args.n}")
    _header("metric", "default min", "default mean", "default < 0.95", "unwidened min",
            "unwidened mean", "unwidened < 0.95", "ef, oversample (mean)",
            "recall= max abs error", "mean error", "outside +-0.02")
    grids = []
    for metric, truth, graphs in _per_metric(args, base, fresh):
        widened, unwidened, picks, errs = [], [], [], []
        for index in graphs:
            index.add(base[:first], threads=1)
            at_build = index.info()
            for start in range(first, args.n, 1000):
                index.add(base[start:start + 1000], threads=1)
            now = index.info()
            assert now["calibration"]["count"] == at_build["calibration"]["count"], \
                "the table was measured again: use a smaller --grow"
            widened.append(recall_at_k(index.search(fresh, 10)[1], truth))
            unwidened.append(recall_at_k(index.search(
                fresh, 10, ef=at_build["default_ef"],
                oversample=at_build["default_oversample"])[1], truth))
            picks.append((at_build["default_ef"], at_build["default_oversample"],
                          now["default_ef"], now["default_oversample"]))
            errs += _target_errors(index, fresh, truth)
            if args.grid and len(errs) == len(TARGETS):
                grids.append((metric, _grid(index, fresh, truth)))
        p = np.mean(picks, axis=0)
        print(f"| {metric} | {_spread(widened)} | {_spread(unwidened)} | "
              f"{p[0]:.1f}, {p[1]:.2f} -> {p[2]:.1f}, {p[3]:.2f} | {_errors(errs)} |",
              flush=True)
    for metric, lines in grids:
        print(f"\n{metric}, first seed: recall on the grown graph at each table beam "
              "times sqrt(growth), less the stretched table's")
        for line in lines:
            print(line)


def _grid(index, fresh, truth):
    """Per table beam: the measured recall on the grown graph (its beam
    widened by the root of the growth, as recall= widens it) less the
    stretched table's, at a few of the stretched table's lengths."""
    cal = index._cal
    growth = len(index) / cal["count"]
    table = _calibration.grown(cal, growth)
    lens = np.asarray(table["shortlist"], np.int64)
    at = sorted({0, 2, 4, len(lens) // 3, 2 * len(lens) // 3, len(lens) - 1})
    q = np.ascontiguousarray(fresh, np.float32)
    t = np.ascontiguousarray(truth, np.int64).ravel()
    lines = ["| ef | " + " | ".join(f"L {lens[j]}" for j in at) + " |",
             "| ---: |" + " ---: |" * len(at)]
    for ef, row in zip(cal["ef"], table["recall"]):
        wide = max(truth.shape[1], round(ef * growth ** 0.5))
        got = np.asarray(index._core.recall_sweep(q, None, t, truth.shape[1], wide, lens, 0)[0])
        lines.append(f"| {ef} → {wide} | "
                     + " | ".join(f"{got[j] - row[j]:+.3f}" for j in at) + " |")
    return lines


def segmented(args):
    base, fresh = _data(args.n, args.dim)
    size = -(-args.n // args.segments)
    print(f"{args.quantization}; a collection of {args.segments} segments of {size}; quantizer "
          f"fitted on {min(args.n, 16384) if args.refit else size}")
    _header("metric", "default min", "default mean", "default < 0.95",
            "ef, oversample (mean)", "recall= max abs error", "mean error", "outside +-0.02")
    for metric, truth, graphs in _per_metric(args, base, fresh):
        defaults, picks, errs = [], [], []
        for seed, _ in enumerate(graphs):
            with tempfile.TemporaryDirectory(dir=args.workdir) as d:
                col = kd.Collection.create(os.path.join(d, "c"), args.dim, metric, seed=seed,
                                           quantization=args.quantization, merge_policy=None)
                if args.refit:
                    col.refit(base[:16384])
                for start in range(0, args.n, size):
                    col.add(base[start:start + size])
                    col.commit()
                defaults.append(recall_at_k(col.search(fresh, 10)[1], truth))
                picks.append([col._search_picks(10, t)[:2] for t in (None,) + TARGETS])
                errs += _target_errors(col, fresh, truth)
                col.close()
        p = np.mean(picks, axis=0)
        print(f"| {metric} | {_spread(defaults)} | "
              + ", ".join(f"{e:.0f}/{o:.2f}" for e, o in p)
              + f" | {_errors(errs)} |", flush=True)


def _data(n, d=DIM):
    base = clustered(n + 1000, d, 4200)[:n]  # at 20,000: the base of tests/test_recall_target.py
    fresh = clustered(n + 4000, d, 4200)[n:]
    return base, fresh


def _per_metric(args, base, fresh):
    """(metric, true neighbours of fresh, the seeds' empty indexes) per metric."""
    def graphs(metric):
        for seed in range(args.seeds):
            index = kd.Index(base.shape[1], metric, seed=seed, quantization=args.quantization)
            yield index
            index.close()
    for metric in args.metrics.split(","):
        yield metric, brute_force(base, fresh, 10, metric)[1], graphs(metric)


def _header(*columns):
    print("| " + " | ".join(columns) + " |")
    print("| --- |" + " ---: |" * (len(columns) - 1))


def _spread(recalls):
    """The lowest, the mean, and how many fell below 0.95: three cells."""
    return (f"{min(recalls):.4f} | {np.mean(recalls):.4f} | "
            f"{sum(r < 0.95 for r in recalls)}/{len(recalls)}")


if __name__ == "__main__":
    main()
