"""How much of the spread in per-query recall a region explains: one index
of a set built with the defaults (2 threads, index seed 0), its held-out
queries searched at the point its own default search takes, and the
queries grouped by their nearest of K k-means centres (K = 8 to 64, fitted
on 16,384 rows). The between-group share of the variance is what a
calibration sample stratified by region could remove from the table's
error; the within-group share stays.

    python benchmarks/calibration_strata.py minilm-wordnet
"""
import argparse
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_data  # noqa: E402


def kmeans_labels(sample, points, k, rng, iters=10):
    """Labels of points (rows on the unit sphere) by nearest of k centres
    fitted on sample by spherical k-means."""
    centres = sample[rng.choice(len(sample), k, replace=False)].copy()
    for _ in range(iters):
        lab = np.argmax(sample @ centres.T, 1)
        for c in range(k):
            if (lab == c).any():
                centres[c] = sample[lab == c].mean(0)
    return np.argmax(points @ centres.T, 1)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dataset")
    ap.add_argument("--groups", default="8,16,32,64")
    args = ap.parse_args(argv)
    import knndirect as kd

    ds = bench_data.resolve(args.dataset)
    j = ds.to_json()
    x, q, truth = bench_data.load_base(j), bench_data.load_queries(j), np.load(j["gt_path"])
    with kd.Index(ds.dim, ds.metric, seed=0) as ix:
        ix.add(x, threads=2)
        _, ids = ix.search(q, 10)
    per_query = np.array([len(set(a) & set(t[:10])) / 10 for a, t in zip(ids, truth)])
    print(f"{ds.name}: default search, recall {per_query.mean():.4f}, per-query standard "
          f"deviation {per_query.std():.4f} over {len(q)} queries\n")
    print("| groups | between-group share of the variance |\n| --- | --- |")
    rng = np.random.default_rng(0)
    sample = bench_data.normalize_rows(x[rng.choice(len(x), 16384, replace=False)])
    qn = bench_data.normalize_rows(q)
    for k in (int(v) for v in args.groups.split(",")):
        lab = kmeans_labels(sample, qn, k, rng)
        within = sum((lab == c).mean() * per_query[lab == c].var()
                     for c in range(k) if (lab == c).any())
        print(f"| {k} | {1 - within / per_query.var():.3f} |", flush=True)


if __name__ == "__main__":
    main()
