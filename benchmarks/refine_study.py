"""How many disk reads a second in-RAM estimate would save: a study of the
"refine before reading" lever (issue: recall at every scale).

Today a search walks the graph on 1-bit codes and reads the best
ceil(k x oversample) rows by that estimate. The lever: take a larger pool P
by the 1-bit estimate, re-estimate it with b-bit codes of each row's rotated
residual from its k-means centre (held in RAM), and read only the best S.

This script measures recall@10 against (ef, P, S) with NumPy standing in for
the C kernels (the codes are fitted here, not by the index):
- the pool is the index's own rerank=False search at k = P (the 1-bit order;
  the beam is then at least P wide, so each beam width is paired with pools
  no larger than it, and the 1-bit baseline uses the same beam);
- b-bit codes: residual x - c (c: nearest of C k-means centres fitted on a
  sample), a random rotation, then a per-row symmetric uniform code with
  2^b - 1 levels over [-max|r|, max|r|];
- S rows by the refined estimate are scored exactly, as the disk rerank does.
It prints, per b, the fewest reads S reaching each recall target, against S
for the 1-bit order alone (P = S), at the same beam.

    python benchmarks/refine_study.py clustered-100k-256
    python benchmarks/refine_study.py clustered-1m-256 --ef 320,640 --bits 2,4,8
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import bench_data  # noqa: E402

import knndirect as kd  # noqa: E402

TARGETS = (0.90, 0.95, 0.98)


def kmeans(x, c, iters, seed):
    rng = np.random.default_rng(seed)
    sample = x[rng.choice(x.shape[0], min(x.shape[0], 64 * c), replace=False)]
    centres = sample[rng.choice(sample.shape[0], c, replace=False)].copy()
    for _ in range(iters):
        lab = nearest(sample, centres)
        for j in range(c):
            members = sample[lab == j]
            if len(members):
                centres[j] = members.mean(0)
    return centres


def nearest(x, centres, block=65536):
    out = np.empty(x.shape[0], np.int64)
    csq = (centres * centres).sum(1)
    for s in range(0, x.shape[0], block):
        out[s:s + block] = np.argmin(csq[None, :] - 2 * x[s:s + block] @ centres.T, axis=1)
    return out


class ResidualCodes:
    """b-bit codes of rotated residuals; estimate() is |q - (c + r_hat)|^2."""

    def __init__(self, x, bits, centres, seed=0, block=65536):
        d = x.shape[1]
        rng = np.random.default_rng(seed + 1)
        self.rot = np.linalg.qr(rng.standard_normal((d, d)))[0].astype(np.float32)
        self.centres = centres
        self.label = nearest(x, centres)
        levels = (1 << bits) - 1            # odd count: symmetric around 0
        half = (levels - 1) / 2
        self.codes = np.empty(x.shape, np.int8)
        self.scale = np.empty(x.shape[0], np.float32)
        for s in range(0, x.shape[0], block):
            r = (x[s:s + block] - centres[self.label[s:s + block]]) @ self.rot
            m = np.abs(r).max(1)
            m[m == 0] = 1
            sc = m / half if half else m
            self.codes[s:s + block] = np.clip(np.rint(r / sc[:, None]), -half, half) \
                if half else np.sign(r)
            self.scale[s:s + block] = sc
        self.bytes_per_row = bits * d / 8 + 4 + 4  # codes, scale, centre id

    def estimate(self, q, rows):
        c = self.centres[self.label[rows]]
        r = (self.codes[rows].astype(np.float32) * self.scale[rows, None]) @ self.rot.T
        diff = q[None, :] - c - r
        return (diff * diff).sum(1)


def recall_at(found, gt, k):
    return float(np.mean([len(set(f[:k]) & set(g[:k])) / k for f, g in zip(found, gt)]))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dataset")
    ap.add_argument("--ef", default="160,320", help="beam widths")
    ap.add_argument("--bits", default="4,8")
    ap.add_argument("--pools", default="40,80,160,320")
    ap.add_argument("--reads", default="10,15,20,30,40,60,80,120,160,240,320")
    ap.add_argument("--centres", type=int, default=1024)
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    ds = bench_data.resolve(args.dataset)
    x = np.array(np.load(ds.base_path, mmap_mode="r"), dtype=np.float32)
    q = np.load(ds.query_path)[:args.queries].astype(np.float32)
    gt = np.load(ds.gt_path)[:args.queries]
    if ds.metric == "cosine":
        x = bench_data.normalize_rows(x)
        q = bench_data.normalize_rows(q)
    k = 10
    t = time.time()
    ix = kd.Index(x.shape[1], metric="l2", seed=0)
    ix.add(x)
    print(f"built {ds.name} in {time.time() - t:.0f} s", flush=True)
    efs = [int(v) for v in args.ef.split(",")]
    pools = [int(v) for v in args.pools.split(",")]
    reads = [int(v) for v in args.reads.split(",")]
    centres = kmeans(x, args.centres, 6, 0)
    coders = {int(b): ResidualCodes(x, int(b), centres) for b in args.bits.split(",")}
    rows = []
    for ef in efs:
        # The 1-bit order: the index's estimate, best first, as long as the beam.
        _, pool = ix.search(q, ef, ef=ef, rerank=False)
        for s in (s for s in reads if s <= ef):  # 1-bit alone: read the first s
            rows.append({"ef": ef, "bits": 1, "pool": s, "reads": s,
                         "recall": exact_top(x, q, pool[:, :s], k, gt)})
        for b, coder in coders.items():
            for p in (p for p in pools if p <= ef):
                refined = np.stack([pool[i, :p][np.argsort(coder.estimate(q[i], pool[i, :p]),
                                                             kind="stable")]
                                    for i in range(len(q))])
                for s in reads:
                    if s <= p:
                        rows.append({"ef": ef, "bits": b, "pool": p, "reads": s,
                                     "recall": exact_top(x, q, refined[:, :s], k, gt)})
        print(f"ef {ef} done", flush=True)
    report(rows, coders, x.shape[1])
    if args.out:
        args.out.write_text(json.dumps({"dataset": ds.to_json(), "rows": rows}, indent=1))
    return 0


def exact_top(x, q, cand, k, gt):
    found = []
    for i in range(len(q)):
        c = cand[i][cand[i] >= 0]
        d = ((x[c] - q[i]) ** 2).sum(1)
        found.append(c[np.argsort(d, kind="stable")[:k]])
    return recall_at(found, gt, k)


def report(rows, coders, dim):
    print(f"\nfewest reads per query reaching each recall@10 (float32 row = {4 * dim} B)")
    print("| ef | code in RAM | bytes/row | " + " | ".join(f"reads @ {t}" for t in TARGETS) + " |")
    print("| --- | --- | --- | " + " | ".join("---" for _ in TARGETS) + " |")
    for ef in sorted({r["ef"] for r in rows}):
        for b in [1] + sorted(coders):
            sel = [r for r in rows if r["ef"] == ef and r["bits"] == b]
            best = []
            for t in TARGETS:
                ok = [r for r in sel if r["recall"] >= t]
                best.append(min(ok, key=lambda r: (r["reads"], r["pool"])) if ok else None)
            size = dim / 8 + 16 if b == 1 else coders[b].bytes_per_row
            cells = [f"{r['reads']} (pool {r['pool']})" if r else "-" for r in best]
            print(f"| {ef} | {b}-bit | {size:.0f} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    sys.exit(main())
