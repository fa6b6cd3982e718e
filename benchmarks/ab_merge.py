"""Two merges of the same two segments compared: each half of the set (2
threads, M 16, ef_construction 200, the second adopting the first's
quantizer) is built once, then each side merges them in turn, in fresh
processes, and their graphs are compared at equal search cost as
ab_graph.py compares builds.

    python benchmarks/ab_merge.py clustered-400k-256 --old /path/to/base/python --new python
    python benchmarks/ab_merge.py clustered-400k-256 --old python --new python \
        --old-cache 1e18                     # build codes alone against the 1-bit beam

--old and --new are the `python/` folders of two built checkouts (a git
worktree of the base revision after `python setup.py build_ext --inplace`);
the segments are built with --new. --old-cache / --new-cache set the
last-level cache bytes that side's merge assumes (the core's test hook; 0,
the default, detects it), which decides whether insertion's beam reads the
1-bit codes. Each round merges with its own seed (levels of inserted
rows), old and new alike; insert and whole-merge seconds are printed per
merge and as medians.
"""
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from ab_graph import compare, parse  # noqa: E402

SEGMENTS = """
import sys
sys.path.insert(0, sys.argv[4]); sys.path.insert(0, sys.argv[5])
import numpy as np
import knndirect as kd, bench_data
ds = bench_data.resolve(sys.argv[1]); x = bench_data.load_base(ds.to_json())
half = len(x) // 2
a = kd.Index(ds.dim, ds.metric, m=16, ef_construction=200, seed=1)
a.add(x[:half], threads=2)
b = kd.Index(ds.dim, ds.metric, m=16, ef_construction=200, seed=2)
b._core.adopt_quantizer(a._core)
b.add(x[half:], ids=np.arange(half, len(x)), threads=2)
a.save(sys.argv[2]); b.save(sys.argv[3])
"""
MERGE = """
import json, sys, time
sys.path.insert(0, sys.argv[6])
import knndirect as kd
kd._core._set_cache_bytes(int(float(sys.argv[4])))
a, b = kd.open(sys.argv[1]), kd.open(sys.argv[2])
t = time.perf_counter()
r = kd._core.merge(sys.argv[3], [a._core, b._core], seed=int(sys.argv[5]))
r["wall_seconds"] = time.perf_counter() - t
print(json.dumps(r))
"""


def main(argv=None):
    args, ds, q, truth = parse(__doc__, "--rounds", "merge", argv)
    new = str(Path(args.new).resolve())
    sys.path.insert(0, new)
    import knndirect as kd
    run = dict(capture_output=True, text=True, check=True)
    with tempfile.TemporaryDirectory() as tmp:
        a, b = f"{tmp}/a.kdx", f"{tmp}/b.kdx"
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", SEGMENTS, args.dataset, a, b, new, str(HERE)],
                       **run)
        print(f"{ds.name}: two segments of {ds.n // 2:,} built in "
              f"{time.perf_counter() - t:.0f} s", flush=True)
        paths, secs = {}, {"old": [], "new": []}
        for seed in range(args.rounds):
            for tag in ("old", "new") if seed % 2 == 0 else ("new", "old"):
                p = f"{tmp}/{tag}-{seed}.kdx"
                cache = getattr(args, f"{tag}_cache") or "0"
                side = str(Path(getattr(args, tag)).resolve())
                out = subprocess.run([sys.executable, "-c", MERGE, a, b, p, cache, str(seed), side],
                                     **run)
                r = json.loads(out.stdout)
                secs[tag].append((r["insert_seconds"], r["wall_seconds"]))
                print(f"{tag} seed {seed}: insert {r['insert_seconds']:.1f} s, "
                      f"merge {r['wall_seconds']:.1f} s", flush=True)
                paths[tag, seed] = p
        med = {tag: [statistics.median(s[i] for s in v) for i in (0, 1)]
               for tag, v in secs.items()}
        print(f"\nmedians of {args.rounds}: insert old {med['old'][0]:.1f} s, new "
              f"{med['new'][0]:.1f} s, new/old {med['new'][0] / med['old'][0]:.3f}; merge old "
              f"{med['old'][1]:.1f} s, new {med['new'][1]:.1f} s, "
              f"new/old {med['new'][1] / med['old'][1]:.3f}")
        compare(kd, paths, args.rounds, ds.name, q, truth)


if __name__ == "__main__":
    main()
