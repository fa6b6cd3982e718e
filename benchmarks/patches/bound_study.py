"""The error-bound study of docs/benchmarks.md ("The estimate's error bound
as the shortlist's rule"). Needs error-bound-shortlist.patch applied and the
extension rebuilt (README.md here). Builds clustered-100k-384 (cosine,
defaults, 2 threads), then in child processes, so that each reads its own
KD_BOUND_EPS: recall and rows skipped at seven (ef, oversample) points for
each multiplier, and, from the rows' printed estimates, the error's unit and
what a per-query shortlist of the rows whose lower bound lies under the
10th smallest upper bound would keep.

    python benchmarks/patches/bound_study.py [--eps 0,1.9,3]
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(ROOT, "benchmarks", "data", "clustered-100k-384")
POINTS = [(32, 5), (64, 5), (64, 8), (64, 10), (128, 10), (69, 8), (96, 16)]


def child(path, mode):
    import knndirect as kd

    q = np.ascontiguousarray(np.load(os.path.join(DATA, "queries-1000.npy")))
    ix = kd.load(path)
    if mode == "dump":  # 200 queries at (64, 10), every scored row printed
        ix.search(q[:200], k=10, ef=64, oversample=10, threads=1)
        return
    gt = np.load(os.path.join(DATA, "queries-1000.gt-cosine-n100000-k10.npy"))
    for ef, os_ in POINTS:
        s0 = ix.stats()
        _, ids = ix.search(q, k=10, ef=ef, oversample=os_, threads=1)
        skipped = (ix.stats()["early_unused"] - s0["early_unused"]) / len(q)
        recall = np.mean([len(set(ids[i]) & set(gt[i])) / 10 for i in range(len(q))])
        times = []
        for _ in range(5):
            t = time.perf_counter()
            ix.search(q, k=10, ef=ef, oversample=os_, threads=1)
            times.append(time.perf_counter() - t)
        print(f"eps {os.environ.get('KD_BOUND_EPS')} ef {ef} oversample {os_}: recall "
              f"{recall:.4f}, skipped {skipped:.1f} of {int(os_ * 10)}, "
              f"{len(q) / np.median(times):,.0f} q/s", flush=True)


def analyse(lines):
    a = np.array([ln.split()[1:] for ln in lines if ln.startswith("D ")], float)
    pos, exact, est, unit = a.T
    z = (exact - est) / unit
    print(f"rows {len(z)}: (exact - estimate) / unit mean {z.mean():+.2f}, spread {z.std():.2f}; "
          f"unit median {np.median(unit):.4f}, |error| median {np.median(np.abs(exact - est)):.4f}")
    query = np.cumsum(pos == 0) - 1
    gaps = np.array([np.diff(np.sort(exact[query == i])[[0, 9, 19]])
                     for i in range(query.max() + 1)])
    print(f"median gap 1st -> 10th {np.median(gaps[:, 0]):.4f}, 10th -> 20th "
          f"{np.median(gaps[:, 1]):.4f}")
    for eps in (1.0, 1.9, 3.0):
        kept, lost = [], 0
        for i in range(query.max() + 1):
            e, u, x = est[query == i], unit[query == i], exact[query == i]
            keep = e - eps * u <= np.sort(e + eps * u)[9]
            kept.append(keep.sum())
            lost += np.sum(~keep[np.argsort(x)[:10]])
        print(f"per-query shortlist, eps {eps}: keeps {np.mean(kept):.1f} of {len(x)} on average "
              f"({np.percentile(kept, 10):.0f}-{np.percentile(kept, 90):.0f}), loses "
              f"{lost / (10 * len(kept)):.3f} of the answers the whole list gave")


def main():
    if len(sys.argv) == 3 and sys.argv[1] in ("sweep", "dump"):
        return child(sys.argv[2], sys.argv[1])
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--eps", default="0,1.9,3")
    args = p.parse_args()
    import knndirect as kd

    with tempfile.TemporaryDirectory() as work:
        path = os.path.join(work, "index.kdx")
        x = np.load(os.path.join(DATA, "base-q1000.npy"), mmap_mode="r")
        ix = kd.Index(384, "cosine")
        ix.add(np.ascontiguousarray(x[:100000]), threads=2)
        ix.save(path)
        for eps in args.eps.split(","):
            subprocess.run([sys.executable, __file__, "sweep", path], check=True,
                           env=dict(os.environ, KD_BOUND_EPS=eps))
        r = subprocess.run([sys.executable, __file__, "dump", path], check=True, text=True,
                           capture_output=True, env=dict(os.environ, KD_BOUND_EPS="1",
                                                         KD_BOUND_DUMP="1"))
        analyse(r.stderr.splitlines())


if __name__ == "__main__":
    main()
