"""Graph quality of two builds of knndirect at equal search cost: each
revision builds the same set with several seeds (2 threads, M 16,
ef_construction 200, each build in a fresh process), then one process
searches every graph with the same code at a grid of (ef, oversample) and
times both graphs interleaved at three points.

    python benchmarks/ab_graph.py clustered-100k-384 --old /path/to/base/python --new python
    python benchmarks/ab_graph.py clustered-100k-256 --old python --new python \
        --old-cache 1e18 --new-cache 1          # build codes alone against the 1-bit beam
    python benchmarks/ab_graph.py minilm-wordnet --old BASE/python --new python \
        --quantization 8bit                     # both sides build these codes

--old and --new are the `python/` folders of two built checkouts (say, a git
worktree of the base revision after `python setup.py build_ext --inplace`).
--old-cache / --new-cache make that side's build take the last-level cache
to hold so many bytes (the core's test hook), which decides whether
insertion's beam scores with the 1-bit codes: one revision against itself.
Build seconds are printed per build; recall is the mean over the seeds,
which is what separates a change in graph quality from one build's luck.
"""
import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_data  # noqa: E402

BUILD = """
import sys, time
sys.path.insert(0, sys.argv[1]); sys.path.insert(0, sys.argv[2])
import knndirect as kd, bench_data
ds = bench_data.resolve(sys.argv[3]); x = bench_data.load_base(ds.to_json())
if len(sys.argv) > 7:
    kd._core._set_cache_bytes(int(float(sys.argv[7])))
t = time.perf_counter()
ix = kd.Index(ds.dim, ds.metric, m=16, ef_construction=200, seed=int(sys.argv[5]),
             quantization=sys.argv[6])
ix.add(x, threads=2)
print(time.perf_counter() - t)
ix.save(sys.argv[4])
"""
GRID = [(16, 2), (24, 3), (32, 3), (32, 10), (48, 5), (64, 10), (96, 10)]


def compare(kd, paths, seeds, name, q, truth):
    """Recall of every (tag, seed) graph in paths at the grid, and QPS of seed
    0's "old" and "new" interleaved at three points."""
    recall = {}
    for (tag, seed), p in paths.items():
        with kd.load(p) as ix:
            for ef, os_ in GRID:
                _, ids = ix.search(q, 10, ef=ef, oversample=os_, threads=2)
                recall.setdefault((tag, ef, os_), []).append(
                    kd.datasets.recall_at_k(ids, truth))
    print(f"\n{name}: recall@10 of {seeds} builds each\n")
    print("| ef | oversample | old | new | new - old (means) |\n| --- | --- | --- | --- | --- |")
    for ef, os_ in GRID:
        o, n = recall["old", ef, os_], recall["new", ef, os_]
        print(f"| {ef} | {os_} | {' '.join(f'{v:.4f}' for v in o)} | "
              f"{' '.join(f'{v:.4f}' for v in n)} | {np.mean(n) - np.mean(o):+.4f} |")
    print()
    a, b = kd.load(paths["old", 0]), kd.load(paths["new", 0])
    for ef, os_ in [(32, 3), (48, 5), (64, 10)]:
        qps = {"old": [], "new": []}
        for r in range(7):
            for tag, ix in ((("old", a), ("new", b)) if r % 2 == 0 else
                            (("new", b), ("old", a))):
                ix.search(q[:200], 10, ef=ef, oversample=os_, threads=1)
                t = time.perf_counter()
                ix.search(q, 10, ef=ef, oversample=os_, threads=1)
                qps[tag].append(len(q) / (time.perf_counter() - t))
        mo, mn = statistics.median(qps["old"]), statistics.median(qps["new"])
        print(f"QPS 1 thread, ef {ef} oversample {os_}: old {mo:,.0f}, new {mn:,.0f}, "
              f"new/old {mn / mo:.3f} (medians of 7, interleaved)")
    a.close()
    b.close()


def parse(doc, runs, what, argv, *extra):
    """The arguments of an A/B script (a data set, two python/ folders, runs
    a side, the cache each side assumes), the set, its queries and truth."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("dataset")
    ap.add_argument("--old", required=True, help="python/ folder of the base build")
    ap.add_argument("--new", required=True, help="python/ folder of the changed build")
    ap.add_argument(runs, type=int, default=3)
    ap.add_argument("--old-cache", help=f"last-level cache bytes the old {what} assumes")
    ap.add_argument("--new-cache", help=f"last-level cache bytes the new {what} assumes")
    for flag, kw in extra:
        ap.add_argument(flag, **kw)
    args = ap.parse_args(argv)
    ds = bench_data.resolve(args.dataset)
    j = ds.to_json()
    return args, ds, bench_data.load_queries(j), np.load(j["gt_path"])


def main(argv=None):
    args, ds, q, truth = parse(__doc__, "--seeds", "build", argv,
                               ("--quantization", {"default": "1bit",
                                                   "help": "the codes both sides build"}))
    sys.path.insert(0, str(Path(args.new).resolve()))
    import knndirect as kd
    with tempfile.TemporaryDirectory() as tmp:
        paths = {}
        for seed in range(args.seeds):
            for tag in ("old", "new"):
                p = f"{tmp}/{tag}-{seed}.kdx"
                cache = getattr(args, f"{tag}_cache")
                cmd = [sys.executable, "-c", BUILD, str(Path(getattr(args, tag)).resolve()),
                       str(HERE), args.dataset, p, str(seed), args.quantization]
                cmd += [cache] if cache else []
                out = subprocess.run(cmd, capture_output=True, text=True, check=True)
                print(f"{tag} seed {seed}: build {float(out.stdout):.1f} s", flush=True)
                paths[tag, seed] = p
        compare(kd, paths, args.seeds, ds.name, q, truth)


if __name__ == "__main__":
    main()
