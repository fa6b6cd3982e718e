"""Which queries make an honest recall calibration? Recall@10 at a ladder of
beam widths, four ways, against the set's held-out test queries:

- test: the set's own queries, never added (the truth to match);
- held out: vectors kept out of the graph (an index built on the rest);
- node hidden: stored vectors, searched with their node neither scored nor
  expanded (the core's recall sweep with hidden ids);
- self excluded: stored vectors, searched plainly, their own id dropped.

    python benchmarks/calibration_queries.py                       # minilm-wordnet, cosine
    python benchmarks/calibration_queries.py --set clustered-100k-384 --metric ip

Both indexes are built with the defaults (2 threads); the shortlist is the
default oversample's. Prints a Markdown table (docs/design.md, "Recall
targets", quotes it).
"""
import argparse
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_data  # noqa: E402


def recall(found, truth, k):
    return float(np.mean([len(set(a[:k]) & set(b[:k])) / k for a, b in zip(found, truth)]))


def main():
    import knndirect as kd
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--set", default="minilm-wordnet")
    ap.add_argument("--metric", default="cosine")
    ap.add_argument("--held", type=int, default=300, help="vectors held out / hidden")
    ap.add_argument("--efs", default="10,16,24,32,48,64,96")
    args = ap.parse_args()
    k = 10
    ds = bench_data.resolve(args.set, metric=args.metric, k=k)
    base = np.ascontiguousarray(bench_data.load_base(ds.to_json()))
    test = bench_data.load_queries(ds.to_json())
    truth_test = np.load(ds.gt_path)
    rows = np.random.default_rng(1).choice(len(base), args.held, replace=False)
    keep = np.ones(len(base), bool)
    keep[rows] = False
    q = np.ascontiguousarray(base[rows])

    full = kd.Index(base.shape[1], args.metric)
    full.add(base, threads=2)
    rest = kd.Index(base.shape[1], args.metric)
    rest.add(base[keep], np.flatnonzero(keep), threads=2)
    _, with_self = full.search(q, k + 1, exact=True)
    truth_self = np.array([[i for i in r if i != own][:k] for r, own in zip(with_self, rows)])
    _, truth_held = rest.search(q, k, exact=True)
    length = int(np.ceil(k * full.info()["default_oversample"]))
    lens = np.array([length], np.int64)
    print(f"{args.set} ({len(base):,} x {base.shape[1]}, {args.metric}), recall@{k} at "
          f"oversample {length / k:g}; {len(test)} test queries, {args.held} held out / "
          "hidden / self\n")
    print("| ef | test queries | held out of the graph | node hidden | own vector, self "
          "excluded |")
    print("| --- | --- | --- | --- | --- |")
    for ef in (int(e) for e in args.efs.split(",")):
        os_ = length / k
        _, found_test = full.search(test, k, ef=ef, oversample=os_)
        _, found_held = rest.search(q, k, ef=ef, oversample=os_)
        hidden, *_ = full._core.recall_sweep(q, rows.astype(np.int64),
                                             truth_self.astype(np.int64).ravel(), k, ef, lens)
        _, found_self = full.search(q, k + 1, ef=ef, oversample=os_)
        found_self = [[i for i in r if i != own][:k] for r, own in zip(found_self, rows)]
        print(f"| {ef} | {recall(found_test, truth_test, k):.3f} | "
              f"{recall(found_held, truth_held, k):.3f} | {hidden[0]:.3f} | "
              f"{recall(found_self, truth_self, k):.3f} |")


if __name__ == "__main__":
    main()
