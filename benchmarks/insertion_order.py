"""Does the graph depend on the order the input arrives in? One build of a
set as it is stored and one of the same rows shuffled (ids kept, so the
ground truth holds), recall@10 of each at three (ef, oversample) points.

    python benchmarks/insertion_order.py minilm-wordnet
    python benchmarks/insertion_order.py minilm-wordnet --python /path/to/base/python

--python puts another build's python/ folder first on the path (a git
worktree of a base revision after `python setup.py build_ext --inplace`),
to see the same on the code before a change.
"""
import argparse
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
POINTS = [(16, 2), (32, 3), (64, 10)]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dataset")
    ap.add_argument("--python", default=str(HERE.parent / "python"),
                    help="python/ folder of the build to measure")
    ap.add_argument("--seed", type=int, default=0, help="index seed")
    ap.add_argument("--shuffle-seed", type=int, default=5)
    args = ap.parse_args(argv)
    sys.path.insert(0, str(Path(args.python).resolve()))
    sys.path.insert(0, str(HERE))
    import bench_data
    import knndirect as kd

    ds = bench_data.resolve(args.dataset)
    j = ds.to_json()
    x, q, truth = bench_data.load_base(j), bench_data.load_queries(j), np.load(j["gt_path"])
    shuffled = np.random.default_rng(args.shuffle_seed).permutation(len(x))
    print(f"{ds.name}, knndirect from {kd.__file__}, index seed {args.seed}\n")
    print("| arrival | " + " | ".join(f"ef {e}, oversample {o}" for e, o in POINTS) + " |")
    print("| --- |" + " --- |" * len(POINTS))
    for name, order in (("as stored", np.arange(len(x))), ("shuffled", shuffled)):
        with kd.Index(ds.dim, ds.metric, seed=args.seed) as ix:
            ix.add(x[order], ids=order.astype(np.int64), threads=2)
            got = [kd.datasets.recall_at_k(ix.search(q, 10, ef=e, oversample=o)[1], truth)
                   for e, o in POINTS]
        print(f"| {name} | " + " | ".join(f"{r:.4f}" for r in got) + " |", flush=True)


if __name__ == "__main__":
    main()
