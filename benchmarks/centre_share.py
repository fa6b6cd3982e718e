"""How much of each set's spread its 1-bit quantizer's centres explain:
1 - sum |x - c(x)|^2 / sum |x - mean|^2 over a sample, c(x) the nearest of
as many k-means centres as the quantizer fits (knndirect._core.
quantizer_centres). Below one half, a build's insertion beam reads the
1-bit codes from the first row (csrc/index.c, kd_beam_spread, which takes
the share from the quantizer's own centres on the rows it adds).

    python benchmarks/centre_share.py minilm-dict clustered-1m-256

The centres here are faiss's k-means (the bench extra) on a sample of
40,000 rows, 20 iterations: close to the core's fit, not the same one.
"""
import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_data  # noqa: E402


def share(x, centres, unit, seed=0, sample=40_000):
    import faiss

    rng = np.random.default_rng(seed)
    s = np.ascontiguousarray(x[rng.choice(len(x), min(len(x), sample), replace=False)],
                             dtype=np.float32)
    if unit:  # the quantizer fits unit rows for cosine
        s /= np.linalg.norm(s, axis=1, keepdims=True)
    km = faiss.Kmeans(s.shape[1], centres, niter=20, seed=1, verbose=False)
    km.train(s)
    within, _ = km.index.search(s, 1)
    return 1.0 - float(within.sum()) / float(((s - s.mean(0)) ** 2).sum())


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sets", nargs="+")
    args = ap.parse_args(argv)
    import knndirect as kd

    print("| set | n | dim | centres | explained share |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name in args.sets:
        ds = bench_data.resolve(name)
        x = bench_data.load_base(ds.to_json())
        c = kd._core.quantizer_centres(len(x))
        print(f"| {name} | {len(x):,} | {x.shape[1]} | {c} | "
              f"{share(x, c, ds.metric == 'cosine'):.3f} |", flush=True)


if __name__ == "__main__":
    main()
