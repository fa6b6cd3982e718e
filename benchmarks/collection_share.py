"""What a collection's recall is made of, against what its largest
segment's table says: a collection of S equal segments (merge_policy=None)
on the test suite's clustered set, searched at explicit (ef, shortlist)
points, beside two readings of one segment's own sweep.

    python benchmarks/collection_share.py [--n 80000] [--segments 4]
        [--metric l2] [--quantization 1bit+4bit] [--efs 14,20,28,40,57]

Per beam and global shortlist length L it prints three recalls@10:
the collection as searched; one segment's recall of its own nearest k / S
(the share of the collection's true top k it holds: its own nearest few)
within a shortlist of L / S, averaged over the two whole shares around
k / S; and the segment's table as measured (its whole top k within L).
A collection's true neighbours in one segment are that segment's nearest
few, and a segment's beam finds those more surely than its whole top k,
so the segment's table understates the collection where the beam is
narrow (refined codes choose such beams).
"""
import argparse
import os
import sys
import tempfile

import numpy as np

import knndirect as kd

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "tests"))
from conftest import brute_force, clustered, recall_at_k  # noqa: E402

K = 10
DIM = 64
LENGTHS = (10, 12, 14, 16, 20, 30, 40, 60, 80)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=80000)
    ap.add_argument("--segments", type=int, default=4)
    ap.add_argument("--metric", default="l2")
    ap.add_argument("--quantization", default="1bit+4bit")
    ap.add_argument("--efs", default="14,20,28,40,57")
    ap.add_argument("--queries", type=int, default=2000)
    args = ap.parse_args()
    base = clustered(args.n + 1000, DIM, 4200)[:args.n]
    fresh = clustered(args.n + 4000, DIM, 4200)[args.n:args.n + args.queries]
    truth = brute_force(base, fresh, K, args.metric)[1]
    size = args.n // args.segments
    share = K / args.segments
    print(f"{args.quantization}, {args.metric}: {args.segments} segments of {size}; "
          "collection / segment's own nearest k/S within L/S / segment's table at L")
    with tempfile.TemporaryDirectory() as d:
        col = kd.Collection.create(os.path.join(d, "c"), DIM, args.metric, seed=0,
                                   quantization=args.quantization, merge_policy=None)
        col.refit(base[:16384])
        for start in range(0, size * args.segments, size):
            col.add(base[start:start + size])
            col.commit()
        segment = col._segments[0].index
        own = brute_force(base[:size], fresh, K, args.metric)[1]
        q = np.ascontiguousarray(fresh, np.float32)
        lens = np.arange(1, max(LENGTHS) + 1, dtype=np.int64)

        def nearest(ef, m):
            """The segment's recall of its own nearest m at each length."""
            at = lens[lens >= m]
            t = np.ascontiguousarray(own[:, :m], np.int64).ravel()
            return at, np.asarray(segment._core.recall_sweep(q, None, t, m, ef, at, 0)[0])

        print("| ef | " + " | ".join(f"L {L}" for L in LENGTHS) + " |")
        print("| ---: |" + " ---: |" * len(LENGTHS))
        for ef in (int(x) for x in args.efs.split(",")):
            lo, hi = int(np.floor(share)), int(np.ceil(share))
            parts = [nearest(ef, m) for m in sorted({max(lo, 1), hi})]
            table = nearest(ef, K)
            cells = []
            for L in LENGTHS:
                got = recall_at_k(col.search(fresh, K, ef=ef, oversample=L / K)[1], truth)
                x = L / args.segments
                model = np.mean([np.interp(x, at, r) for at, r in parts])
                cells.append(f"{got:.3f} / {model:.3f} / {np.interp(L, *table):.3f}")
            print(f"| {ef} | " + " | ".join(cells) + " |", flush=True)
        col.close()


if __name__ == "__main__":
    main()
