"""Could a calibration learn more per second of its budget? A study, not a
feature: the library does not do this.

A table's error is its held-out sample's: n queries whose exact truth costs a
brute force each (at 1M x 768, about 11 ms on 2 cores). A proxy costs far
less: a query's agreement with a deep reference search (a wide beam,
reranked) instead of with its truth. On queries with both, the proxy and the
true recall move together, so proxies on many more queries can correct the
truth sample's luck (a control variate):

    estimate = mean(y) + b * (mean(x over the proxies) - mean(x over the sample))

with b = cov(x, y) / var(x) from the sample, shrunk by 1 / (1 + n / m) for
m proxies. Its error is var(y - b x) / n + b^2 var(x) / m.

This script draws a pool of fresh queries from a clustered set's mixture,
takes their truth, and at each of the index's table beams near the default's
recall (at the default's shortlist) measures y (recall) and x (agreement with
the reference) per query. It then resamples the pool (with replacement, as
if from the mixture itself) to compare the plain estimate with the control
variate: root-mean-square error, and how often the estimate lies more than
2.33 of its own standard errors high (a one-sided 1% bound, if the errors
were normal). Last, from the measured costs per query (truth and ladder for
a sample query; reference and the bracketing beams for a proxy), the split
of one budget between the two that minimises the error, against spending it
all on truth.

    python benchmarks/calibration_control.py --dataset clustered-1m-768 \\
        --index benchmarks/data/disk-peers/clustered-1m-768-l2/knndirect/index.kdx

Without --index, the set is built with the defaults on 2 threads first.
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
from fresh_queries import fresh_draws  # noqa: E402
from knndirect import _calibration  # noqa: E402

K = 10
Z = 2.33  # one-sided 1%


def timed(fn):
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


def control_variate(y, x, xp):
    """(estimate, standard error) of mean recall from a sample's (y, x) and
    proxies' x alone."""
    n, m = len(y), len(xp)
    vx = x.var(ddof=1)
    b = 0.0 if vx <= 0 else np.cov(x, y)[0, 1] / vx / (1.0 + n / m)
    est = y.mean() + b * (xp.mean() - x.mean())
    return est, math.sqrt((y - b * x).var(ddof=1) / n + b * b * xp.var(ddof=1) / m)


def resample(y, x, n, m, draws, rng):
    """Plain and control-variate errors (estimate - pool mean) and z scores
    over draws of n sample queries and m proxies, both from the pool."""
    mu = y.mean()
    plain, cv = np.empty((draws, 3)), np.empty((draws, 2))
    for d in range(draws):
        s = rng.integers(0, len(y), n)
        mean, se = y[s].mean(), max(y[s].std(ddof=1) / math.sqrt(n), 1e-12)
        # The score form, as the library's default bound reads it (a sample
        # below mu, whose z is negative, keeps its own error).
        score = se * float(_calibration._at_target(np.asarray(mean), mu))
        plain[d] = mean - mu, (mean - mu) / se, (mean - mu) / score
        if m:
            est, se = control_variate(y[s], x[s], x[rng.integers(0, len(y), m)])
            cv[d] = est - mu, (est - mu) / max(se, 1e-12)
    return plain, cv


def summary(errors):
    out = (f"rmse {math.sqrt((errors[:, 0] ** 2).mean()):.4f}, "
           f"P(z > {Z}) {(errors[:, 1] > Z).mean():.4f}")
    if errors.shape[1] > 2:
        out += f" (score form {(errors[:, 2] > Z).mean():.4f})"
    return out


def main():
    import knndirect as kd
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", default="clustered-1m-768")
    ap.add_argument("--metric", default="l2")
    ap.add_argument("--index", help="a saved index of the set (default: build one)")
    ap.add_argument("--pool", type=int, default=3000, help="fresh queries with truth")
    ap.add_argument("--samples", default="200,280,400", help="sample sizes (truth)")
    ap.add_argument("--proxies", default="1000,2000", help="proxy counts")
    ap.add_argument("--reference", type=float, default=2.0,
                    help="reference beam as a multiple of the table's widest")
    ap.add_argument("--draws", type=int, default=4000)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    if not bench_data.CLUSTERED_RE.match(args.dataset):
        raise SystemExit("--dataset: a clustered-<n>-<d> set (its mixture is known)")
    ds = bench_data.resolve(args.dataset, metric=args.metric)
    if args.index:
        index = kd.load(args.index)
    else:
        base = np.load(ds.base_path, mmap_mode="r")[:ds.n]
        index = kd.Index(ds.dim, metric=args.metric)
        _, took = timed(lambda: index.add(np.ascontiguousarray(base, np.float32), threads=2))
        print(f"built {ds.n} x {ds.dim} ({args.metric}) in {took:.0f} s")
    info = index.info()
    cal = info["calibration"]
    os_ = cal["default"]["oversample"]
    print(f"{args.dataset}, {info['quantization']}, default {cal['default']} from "
          f"{cal['queries']} calibration queries")
    q = fresh_draws(ds.dim, args.pool, args.seed)
    (_, truth), t_truth = timed(lambda: index.search(q, K, exact=True, threads=2))
    efs = [p["ef"] for p in cal["points"] if p["oversample"] == os_]
    ref_ef = int(max(efs) * args.reference)
    ref_os = max(p["oversample"] for p in cal["points"])
    (_, ref), t_ref = timed(lambda: index.search(q, K, ef=ref_ef, oversample=ref_os,
                                                 threads=2))
    lens = np.asarray(index._cal["shortlist"], np.int64)
    flat = np.ascontiguousarray(truth, np.int64).ravel()
    _, t_ladder = timed(lambda: [index._core.recall_sweep(q, None, flat, K, ef, lens, 2)
                                 for ef in index._cal["ef"]])
    print(f"pool {args.pool} fresh draws; reference ef {ref_ef}, oversample {ref_os:g}, "
          f"its recall {per_query_recall(ref, truth, K).mean():.4f}")
    per_q = 1e3 / args.pool
    print(f"ms a query (2 threads): truth {t_truth * per_q:.2f}, the table's ladder "
          f"{t_ladder * per_q:.2f}, reference {t_ref * per_q:.2f}")
    cells, t_beams = [], 0.0
    for ef in efs:
        (_, ids), t = timed(lambda ef=ef: index.search(q, K, ef=ef, oversample=os_, threads=2))
        y, x = per_query_recall(ids, truth, K), per_query_recall(ids, ref, K)
        if 0.85 <= y.mean() <= 0.99:
            cells.append((ef, y, x))
            t_beams += t
            print(f"  ef {ef}: recall {y.mean():.4f} (per-query sd {y.std():.3f}), "
                  f"agreement {x.mean():.4f}, correlation {np.corrcoef(x, y)[0, 1]:.3f}")
    if not cells:
        raise SystemExit("no table beam between recall 0.85 and 0.99 at the default")
    ef, y, x = min(cells, key=lambda c: abs(c[1].mean() - 0.95))
    rho2 = np.corrcoef(x, y)[0, 1] ** 2
    rng = np.random.default_rng(args.seed)
    print(f"resampled at ef {ef} ({args.draws} draws each):")
    for n in (int(s) for s in args.samples.split(",")):
        plain, _ = resample(y, x, n, 0, args.draws, rng)
        print(f"  {n} with truth: plain {summary(plain)}")
        for m in (int(s) for s in args.proxies.split(",")):
            _, cv = resample(y, x, n, m, args.draws, rng)
            print(f"    + {m} proxies: control variate {summary(cv)}")
    # One budget: n sample queries cost c_t each, m proxies c_p each. The
    # error is sd^2 ((1 - rho^2) / n + rho^2 / m); the best split puts n in
    # proportion to sqrt((1 - rho^2) / c_t), m to sqrt(rho^2 / c_p).
    c_t = (t_truth + t_ladder) * per_q
    c_p = (t_ref + t_beams) * per_q
    ratio = (math.sqrt((1 - rho2) * c_t) + math.sqrt(rho2 * c_p)) ** 2 / c_t
    print(f"one budget: a sample query {c_t:.2f} ms, a proxy {c_p:.2f} ms "
          f"(the reference and {len(cells)} beams), correlation^2 {rho2:.3f}")
    print(f"  best split: {math.sqrt(rho2 / c_p) / math.sqrt((1 - rho2) / c_t):.1f} "
          f"proxies a sample query; variance {ratio:.2f} x all truth "
          f"(standard error {math.sqrt(ratio):.2f} x)")
    for n_all in (int(s) for s in args.samples.split(",")):
        budget = n_all * c_t
        share = math.sqrt((1 - rho2) * c_t) / (math.sqrt((1 - rho2) * c_t)
                                               + math.sqrt(rho2 * c_p))
        n = max(2, round(budget * share / c_t))
        m = max(1, round(budget * (1 - share) / c_p))
        _, cv = resample(y, x, n, m, args.draws, rng)
        plain, _ = resample(y, x, n_all, 0, args.draws, rng)
        print(f"  the budget of {n_all} with truth: plain {summary(plain)}; "
              f"{n} with truth + {m} proxies: {summary(cv)}")


if __name__ == "__main__":
    main()
