"""A short interleaved A/B of two builds of knndirect's exact search
(search(..., exact=True)) over one set, batch size by batch size.

    python benchmarks/ab_exact.py --base REV [--head REV] [--n 100000] [--dim 256]
                                  [--metric l2] [--rounds 5] [--batches 1,4,8,12,16,64,200]

Each revision is built out of tree as benchmarks/ab.py does (--head
defaults to the working tree, uncommitted changes included). Each round
runs one fresh process per build, in alternating order; a process adds the
n clustered rows to the cheapest graph (M 4, ef_construction 8: exact
search reads only the vectors) and times exact searches of the first B of
1,000 queries for each batch size B, k 10, 2 threads, each figure the
median of five timings of as many repeats as make about 0.1 s. Both builds
must return the same ids (checked on the largest batch). The table is
ab.py's.
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))

import ab  # noqa: E402

EXACT = r"""
import hashlib, json, sys, time
import numpy as np
import knndirect as kd

x = np.load(sys.argv[1])
q = np.load(sys.argv[2])
index = kd.Index(x.shape[1], sys.argv[3], m=4, ef_construction=8, seed=1)
index.add(x, threads=2)
out = {}
for b in [int(v) for v in sys.argv[4].split(",")]:
    batch = q[:b]
    t0 = time.perf_counter()
    index.search(batch, k=10, exact=True, threads=2)
    reps = max(1, int(0.1 / max(time.perf_counter() - t0, 1e-6)))
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(reps):
            _, ids = index.search(batch, k=10, exact=True, threads=2)
        times.append((time.perf_counter() - t0) / reps)
    out[f"batch{b}_ms"] = 1e3 * float(np.median(times))
out["ids_digest"] = int(hashlib.sha256(ids.tobytes()).hexdigest()[:12], 16)
print("AB " + json.dumps(out))
"""


def main(argv=None):
    p = ab.short_args(__doc__.split("\n\n")[0], dim=256, rounds=5)
    p.set_defaults(metric="l2")
    p.add_argument("--batches", default="1,4,8,12,16,64,200")
    args = p.parse_args(argv)
    with ab.short_work(args, "kd-ab-exact-") as (work, libs, (x, q)):
        runs = ab.interleave(libs, args.rounds, lambda name: [x, q, args.metric, args.batches],
                             EXACT)
    digests = {r.pop("ids_digest") for side in runs.values() for r in side}
    ab.report(runs, dict(vars(args), queries=args.batches))
    print("\nids of the largest batch: " + ("the same in every run" if len(digests) == 1
                                            else f"DIFFER ({len(digests)} distinct)"))


if __name__ == "__main__":
    main()
