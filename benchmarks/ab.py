"""Interleaved A/B of two builds of knndirect: build time, in-RAM search and
on-disk search, on the same data in one run.

    python benchmarks/ab.py --base REV [--head REV] [--n 100000] [--dim 128] [--rounds 5]
    python benchmarks/ab.py --report RUN.json     # the table of a saved run

Each revision is exported from git (`--head` defaults to the working tree as
it is, uncommitted changes included) and its extension built out of tree
under --work. The data and the ground truth are made once. Each round runs
one fresh process per build, in alternating order (A B, then B A, ...), so
drift of a shared, noisy machine falls on both sides alike. Every process
builds an index (threads=2), saves it, searches a batch in RAM, runs single
queries in RAM, scores the batch exactly (exact=True), then opens the file
with io_uring (or threads where io_uring is absent) and runs single queries
and a batch from disk. The table gives
the median of each figure per build, the ratio head / base of those
medians, and the median of the per-round ratios (each round's two runs ran
back to back, under the same load).
"""
import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The workload, run in a fresh interpreter with one build on its path.
WORKLOAD = r"""
import json, os, sys, time
import numpy as np
import knndirect as kd
from knndirect.datasets import recall_at_k

data = np.load(sys.argv[1], mmap_mode="r")
queries = np.load(sys.argv[2])
truth = np.load(sys.argv[3])
path = sys.argv[4]
out = {}
index = kd.Index(data.shape[1], "l2", seed=1)
t0 = time.perf_counter()
index.add(np.ascontiguousarray(data), threads=2)
out["build_s"] = time.perf_counter() - t0
index.save(path)

def passes(fn, reps):
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))

def singles(ix, qs):
    lat = []
    for q in qs:
        t0 = time.perf_counter()
        ix.search(q, k=10)
        lat.append(time.perf_counter() - t0)
    return float(np.median(lat)) * 1e3

_, ids = index.search(queries, k=10, threads=2)
out["recall_ram"] = recall_at_k(ids, truth, 10)
out["batch_ram_qps"] = len(queries) / passes(lambda: index.search(queries, k=10, threads=2), 5)
out["single_ram_p50_ms"] = singles(index, queries)
out["exact_batch_ram_s"] = passes(lambda: index.search(queries, k=10, exact=True, threads=2), 3)
index.close()

backend = "io_uring" if kd.features()["io_uring"] else "threads"
disk = kd.open(path, io_backend=backend)
_, ids = disk.search(queries, k=10, threads=2)
out["recall_disk"] = recall_at_k(ids, truth, 10)
out["single_disk_p50_ms"] = singles(disk, queries)
out["batch_disk_qps"] = len(queries) / passes(lambda: disk.search(queries, k=10, threads=2), 3)
disk.close()
os.unlink(path)
print("AB " + json.dumps(out))
"""


def larger_better(key):
    """Rates and recalls; every other figure is a time."""
    return key.endswith("qps") or key.startswith("recall")


def export(rev, dest):
    """The tree of REV (None: the working tree as it is) under dest."""
    if rev is None:
        files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT,
                               check=True, capture_output=True).stdout.split(b"\0")
        for f in filter(None, files):
            src = os.path.join(ROOT, os.fsdecode(f))
            if os.path.isfile(src):
                os.makedirs(os.path.dirname(os.path.join(dest, os.fsdecode(f))), exist_ok=True)
                shutil.copy2(src, os.path.join(dest, os.fsdecode(f)))
        return
    os.makedirs(dest)
    archive = subprocess.run(["git", "archive", rev], cwd=ROOT, check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", dest], input=archive, check=True)


def build(rev, work, name):
    """Build REV's extension out of tree; returns the folder to put on PYTHONPATH."""
    src = os.path.join(work, name + "-src")
    lib = os.path.join(work, name + "-lib")
    shutil.rmtree(src, ignore_errors=True)
    shutil.rmtree(lib, ignore_errors=True)
    export(rev, src)
    subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--build-lib", lib,
                    "--build-temp", os.path.join(work, name + "-tmp")], cwd=src, check=True,
                   stdout=subprocess.DEVNULL)
    shutil.copytree(os.path.join(src, "python", "knndirect"), os.path.join(lib, "knndirect"),
                    dirs_exist_ok=True, ignore=shutil.ignore_patterns("*.so"))
    return lib


def run_once(lib, argv, workload=WORKLOAD):
    """Run a workload with one build on its path; returns its "AB " line's figures."""
    env = dict(os.environ, PYTHONPATH=lib)
    res = subprocess.run([sys.executable, "-c", workload, *argv], env=env,
                         check=True, capture_output=True, text=True)
    line = [ln for ln in res.stdout.splitlines() if ln.startswith("AB ")][-1]
    return json.loads(line[3:])


def interleave(libs, rounds, argv_of, workload=WORKLOAD):
    """Each round runs the workload once per build, base first in odd rounds
    and head first in even ones; argv_of(name) gives that side's arguments.
    Returns each side's figures, round by round."""
    runs = {"base": [], "head": []}
    for r in range(rounds):
        for name in ("base", "head") if r % 2 == 0 else ("head", "base"):
            runs[name].append(run_once(libs[name], argv_of(name), workload))
            print(f"round {r + 1} {name}: " + ", ".join(f"{k} {v:.4g}"
                                                       for k, v in runs[name][-1].items()),
                  flush=True)
    return runs


def short_args(description, dim, rounds):
    """The options of the short A/Bs (ab_build.py, ab_search.py)."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--base", required=True, help="git revision A")
    p.add_argument("--head", default=None, help="git revision B (default: the working tree)")
    p.add_argument("--n", type=int, default=100_000)
    p.add_argument("--dim", type=int, default=dim)
    p.add_argument("--metric", default="cosine", choices=["cosine", "l2", "ip"])
    p.add_argument("--rounds", type=int, default=rounds)
    p.add_argument("--dataset", default="",
                   help="a benchmark set (bench_data.py) instead of clustered rows: its first "
                        "--n rows and its queries, at its own metric")
    return p


@contextlib.contextmanager
def short_work(args, prefix):
    """A scratch folder holding both builds, and n clustered rows with 1,000
    queries of the same draw (or --dataset's first n rows and its queries,
    which set args.dim and args.metric); yields (folder, libs, the two
    files' paths) and removes the folder afterwards."""
    from knndirect.datasets import clustered

    work = tempfile.mkdtemp(prefix=prefix)
    try:
        libs = {"base": build(args.base, work, "base"), "head": build(args.head, work, "head")}
        files = [os.path.join(work, "x.npy"), os.path.join(work, "q.npy")]
        if args.dataset:
            import bench_data

            ds = bench_data.resolve(args.dataset)
            base = np.load(ds.base_path, mmap_mode="r")[:min(args.n, ds.n)]
            args.n, args.dim, args.metric = len(base), ds.dim, ds.metric
            np.save(files[0], np.ascontiguousarray(base, dtype=np.float32))
            np.save(files[1], bench_data.load_queries(ds.to_json()))
        else:
            allv = clustered(args.n + 1000, args.dim, seed=7)
            np.save(files[0], allv[:args.n])
            np.save(files[1], np.ascontiguousarray(allv[args.n:]))
        yield work, libs, files
    finally:
        shutil.rmtree(work, ignore_errors=True)


def report(runs, args):
    """The table: medians per build, their ratio, and the paired ratios."""
    keys = list(runs["base"][0])
    print(f"\n{args['n']:,} x {args['dim']}, {args['queries']} queries, {args['rounds']} "
          f"interleaved rounds, base {args['base']} vs head {args['head'] or 'working tree'}\n")
    # A round's two runs ran back to back: their ratio sees the same load,
    # so the median of those ratios is steadier than a ratio of medians.
    print("| figure | base (median) | head (median) | head / base | paired ratios: median "
          "(min-max) | rounds head won |\n| --- | --- | --- | --- | --- | --- |")
    for k in keys:
        a = float(np.median([x[k] for x in runs["base"]]))
        b = float(np.median([x[k] for x in runs["head"]]))
        pairs = [h[k] / r[k] for h, r in zip(runs["head"], runs["base"]) if r[k]]
        larger = larger_better(k)
        won = sum((p > 1) if larger else (p < 1) for p in pairs)
        note = " (higher is better)" if larger else ""
        print(f"| {k}{note} | {a:.4g} | {b:.4g} | {b / a:.3f} | {np.median(pairs):.3f} "
              f"({min(pairs):.3f}-{max(pairs):.3f}) | {won} of {len(pairs)} |")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base", help="git revision A (required unless --report)")
    p.add_argument("--head", default=None, help="git revision B (default: the working tree)")
    p.add_argument("--n", type=int, default=100_000)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--queries", type=int, default=1000)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--work", default=None, help="scratch folder (default: a temp dir)")
    p.add_argument("--json", default=None, help="write every measurement here")
    p.add_argument("--report", default=None, metavar="JSON",
                   help="run nothing: print the table of a run saved with --json")
    args = p.parse_args(argv)
    if not args.report and not args.base:
        p.error("--base is required")
    if args.report:
        with open(args.report) as f:
            saved = json.load(f)
        report(saved["runs"], saved["args"])
        return

    sys.path.insert(0, os.path.join(ROOT, "python"))
    from knndirect.datasets import clustered, ground_truth

    work = args.work or tempfile.mkdtemp(prefix="kd-ab-")
    os.makedirs(work, exist_ok=True)
    libs = {"base": build(args.base, work, "base"), "head": build(args.head, work, "head")}
    allv = clustered(args.n + args.queries, args.dim, seed=7)
    data, queries = allv[:args.n], np.ascontiguousarray(allv[args.n:])
    files = [os.path.join(work, f) for f in ("data.npy", "queries.npy", "truth.npy")]
    np.save(files[0], data)
    np.save(files[1], queries)
    np.save(files[2], ground_truth(data, queries, 10, "l2")[0])

    runs = interleave(libs, args.rounds, lambda name: [*files, os.path.join(work, name + ".kdx")])
    report(runs, vars(args))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "runs": runs}, f, indent=1)
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
