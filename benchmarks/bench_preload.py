"""Preload trade-off: time from open to first result, and reads over the first
1,000 queries, with and without preload, with ample memory and under a memory
cap smaller than the index.

    sudo python benchmarks/bench_preload.py [--n 200000] [--dim 128] [--runs 3]

What it does, per configuration and run:
  1. drops the page cache (`echo 3 > /proc/sys/vm/drop_caches`), so that
     every run starts cold and its page cache is charged to its own cgroup;
  2. starts a child process that imports knndirect, warms its code on a tiny
     in-memory index, then times kd.open(path, preload=...), the first query
     (open -> first result) and 1,000 single queries, and counts:
       - majflt: major page faults (getrusage ru_majflt), i.e. reads of the
         mapped graph, codes and ids that missed the page cache (each is one
         4 KiB read: the mapping is MADV_RANDOM);
       - read MiB: bytes this process made the kernel read from the device
         (/proc/self/io read_bytes), at open and over the queries: page
         faults, read-ahead, the O_DIRECT checks at open, the vector reads;
       - vector reads: index.stats()["read_ops"], the batch reads of vectors.
  3. "capped" runs put the child in a memory cgroup it creates
     (benchmarks/cgroup.py; v1: memory.limit_in_bytes of a group under
     /sys/fs/cgroup/memory, v2: memory.max of /sys/fs/cgroup/<name>;
     detected) whose limit is the child's
     own anonymous memory with the index open (measured by a probe run), plus
     8 MiB for its code, plus a fraction (--cap-fractions, default 1/2 and
     1/8) of the index's RAM-resident sections: the page cache left to the
     index is less than what "graph+codes+ids" asks for, and a small
     fraction of the file.

Needs root (drop_caches, cgroups); without it only the "ample" rows run, with
whatever the page cache holds, and the output says so. Figures are medians
over --runs runs.
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

import numpy as np

import diskio
from cgroup import Cgroup

HERE = os.path.dirname(os.path.abspath(__file__))
CGROUP_NAME = "knndirect_bench_preload_%d" % os.getpid()

CONFIGS = [
    # label, io backend, preload
    ("none", "auto", ()),
    ("graph+codes", "auto", ("graph", "codes")),
    ("graph+codes+ids", "auto", ("graph", "codes", "ids")),
    ("none (mmap backend)", "mmap", ()),
    ("all four (mmap backend)", "mmap", ("graph", "codes", "ids", "vectors")),
]


# ------------------------------------------------------------------ child

def child(args):
    import warnings

    import knndirect as kd

    warnings.simplefilter("ignore")
    q = np.load(args.queries)
    # Warm the code paths (and the libraries' pages) on a tiny index.
    warm = kd.Index(q.shape[1], "l2")
    warm.add(np.ascontiguousarray(np.repeat(q[:50], 4, axis=0) +
                                  np.arange(200, dtype=np.float32)[:, None]))
    warm.search(q[:3], 10)
    warm.search(q[0], 10)
    warm.close()
    if args.report_baseline:
        # Open the index without preload: its own memory (id map, tables,
        # buffers) is then charged, not its sections' page cache.
        idx = kd.open(args.index, preload=())
        idx.search(q[0], 10)
        print(json.dumps({"ready": True}), flush=True)
        sys.stdin.readline()
        idx.close()
        return 0
    preload = tuple(p for p in args.preload.split(",") if p)
    io0, ru0 = diskio.proc_io(), resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    idx = kd.open(args.index, io_backend=args.backend, preload=preload)
    t_open = time.perf_counter()
    io1, ru1 = diskio.proc_io(), resource.getrusage(resource.RUSAGE_SELF)
    idx.search(q[0], 10)
    t_first = time.perf_counter()
    for i in range(1, args.nq):
        idx.search(q[i], 10)
    t_end = time.perf_counter()
    io2, ru2 = diskio.proc_io(), resource.getrusage(resource.RUSAGE_SELF)
    st = idx.stats()
    info = idx.info()
    idx.close()
    print(json.dumps({
        "open_s": t_open - t0,
        "first_result_s": t_first - t0,
        "queries_s": t_end - t_open,
        "majflt_open": ru1.ru_majflt - ru0.ru_majflt,
        "majflt_queries": ru2.ru_majflt - ru1.ru_majflt,
        "read_mib_open": (io1["read_bytes"] - io0["read_bytes"]) / 2**20,
        "read_mib_queries": (io2["read_bytes"] - io1["read_bytes"]) / 2**20,
        "vector_reads": st["read_ops"],
        "io_backend": info["io_backend"],
        "preloaded": info["preload"],
        "maxrss_mib": ru2.ru_maxrss / 1024,
    }), flush=True)
    return 0


# ------------------------------------------------------------------ cache

def drop_caches():
    if not diskio.drop_caches():
        raise PermissionError("dropping the page cache needs root")


# ------------------------------------------------------------------ parent

def build_index(args, path, qpath):
    import knndirect as kd
    from knndirect.datasets import clustered

    # The data of bench_storage.py (seed 1): an index it left behind is used.
    x = clustered(args.n + args.nq, args.dim, seed=1)
    base, q = x[:args.n], x[args.n:]
    np.save(qpath, q)
    if os.path.exists(path) and args.reuse:
        return
    shared = os.path.join(HERE, "data", "storage", "storage_%d_%d.kdx" % (args.n, args.dim))
    if args.reuse and os.path.exists(shared):
        import shutil
        shutil.copyfile(shared, path)
        return
    t0 = time.perf_counter()
    idx = kd.Index(args.dim, "l2")
    idx.add(base)
    print("built %d x %d in %.1f s" % (args.n, args.dim, time.perf_counter() - t0), flush=True)
    idx.save(path)
    idx.close()


def ram_sections(path):
    """Bytes of the sections kept in RAM (all but the vectors)."""
    from knndirect._container import read_layout
    return sum(s.length for s in read_layout(path) if s.name != "vectors")


def run_child(args, path, qpath, backend, preload, cgroup=None):
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "--index", path,
           "--queries", qpath, "--backend", backend, "--preload", ",".join(preload),
           "--nq", str(args.nq)]
    r = subprocess.run(cmd, capture_output=True, text=True,
                       preexec_fn=cgroup.enter if cgroup else None)
    if r.returncode != 0:
        raise RuntimeError("child failed (%d): %s" % (r.returncode, r.stderr[-2000:]))
    return json.loads(r.stdout.strip().splitlines()[-1])


def probe_baseline(args, path, qpath, cgroup):
    """(anonymous, total) memory the child holds with the index open without
    preload; the rest of the total is page cache, mostly of the libraries it
    loaded."""
    cgroup.set_limit(0)
    drop_caches()
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "--index", path,
           "--queries", qpath, "--report-baseline"]
    p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                         preexec_fn=cgroup.enter)
    p.stdout.readline()
    usage = cgroup.usage(), cgroup.anon()
    p.stdin.write("\n")
    p.stdin.flush()
    p.wait()
    return usage[1], usage[0]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=200_000)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--nq", type=int, default=1000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--dir", default=None, help="where the index lives (a real disk; "
                    "default: benchmarks/data/preload)")
    ap.add_argument("--reuse", action="store_true",
                    help="reuse an index built before (by this script or bench_storage.py)")
    ap.add_argument("--cap-mib", type=float, default=None,
                    help="one memory cap for the capped runs, in MiB (default: see "
                    "--cap-fractions)")
    ap.add_argument("--cap-fractions", default="0.5,0.125",
                    help="capped runs at each of these fractions of the RAM-resident "
                    "sections left for their page cache, on top of the child's anonymous "
                    "memory with the index open + 8 MiB for its code (default 0.5,0.125)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--index", help=argparse.SUPPRESS)
    ap.add_argument("--queries", help=argparse.SUPPRESS)
    ap.add_argument("--backend", default="auto", help=argparse.SUPPRESS)
    ap.add_argument("--preload", default="", help=argparse.SUPPRESS)
    ap.add_argument("--report-baseline", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return child(args)

    d = args.dir or os.path.join(HERE, "data", "preload")
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, "preload_%d_%d.kdx" % (args.n, args.dim))
    qpath = os.path.join(d, "preload_queries_%d_%d.npy" % (args.nq, args.dim))
    build_index(args, path, qpath)
    fsize, ram = os.path.getsize(path), ram_sections(path)
    print("index %s: file %.1f MiB, of which %.1f MiB RAM-resident sections (graph, codes, "
          "ids) and %.1f MiB vectors" % (path, fsize / 2**20, ram / 2**20, (fsize - ram) / 2**20))

    root = os.geteuid() == 0
    cgroup, caps = None, {}
    if not root:
        print("NOT root: the page cache is not dropped between runs and no memory cap is "
              "set; only the ample-memory rows run, warm.")
    else:
        print("before each run: page cache dropped (echo 3 > /proc/sys/vm/drop_caches)")
        try:
            cgroup = Cgroup(CGROUP_NAME)
            anon, total = probe_baseline(args, path, qpath, cgroup)
            base = anon + (8 << 20)
            if args.cap_mib:
                caps["capped %.0f MiB" % args.cap_mib] = int(args.cap_mib * 2**20)
            else:
                for frac in (float(f) for f in args.cap_fractions.split(",")):
                    caps["capped, %.1f MiB for sections" % (frac * ram / 2**20)] = \
                        base + int(frac * ram)
            print("capped runs: child in memory cgroup v%d %s; the child's anonymous memory "
                  "with the index open is %.1f MiB (its page cache %.1f MiB, mostly cold "
                  "libraries); limits: %s = %.1f MiB + 8 MiB for its code + what is left for "
                  "the page cache of the index's sections (%.1f MiB of them; file %.1f MiB)"
                  % (cgroup.version, cgroup.path, anon / 2**20, (total - anon) / 2**20,
                     ", ".join("%.1f MiB" % (c / 2**20) for c in caps.values()),
                     anon / 2**20, ram / 2**20, fsize / 2**20))
        except OSError as e:
            print("no memory cgroup (%s): only the ample-memory rows run" % e)
            cgroup = None
    memories = ["ample"] + (list(caps) if cgroup else [])
    results = {}
    try:
        for r in range(args.runs):
            for mem in memories:
                for label, backend, preload in CONFIGS:
                    if root:
                        drop_caches()
                    if mem != "ample":
                        cgroup.set_limit(caps[mem])
                    out = run_child(args, path, qpath, backend, preload,
                                    cgroup if mem != "ample" else None)
                    results.setdefault((mem, label), []).append(out)
            print("run %d of %d done" % (r + 1, args.runs), flush=True)
    finally:
        if cgroup:
            cgroup.remove()

    def med(rows, key):
        return statistics.median(row[key] for row in rows)

    print()
    print("%d x %d l2, %d single queries, k=10, medians of %d runs; file %.0f MiB, RAM "
          "sections %.0f MiB%s" % (args.n, args.dim, args.nq, args.runs, fsize / 2**20,
                                   ram / 2**20, "".join("; %s: limit %.0f MiB" % (k, v / 2**20)
                                                        for k, v in caps.items())))
    print()
    print("| memory | preload | backend | open | open → first result | %d queries | "
          "majflt (queries) | MiB read at open | MiB read by queries | vector reads |" % args.nq)
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for mem in memories:
        for label, backend, preload in CONFIGS:
            rows = results[(mem, label)]
            print("| %s | %s | %s | %.0f ms | %.0f ms | %.2f s | %d | %.1f | %.1f | %d |" % (
                mem, label, rows[0]["io_backend"], 1e3 * med(rows, "open_s"),
                1e3 * med(rows, "first_result_s"), med(rows, "queries_s"),
                med(rows, "majflt_queries"), med(rows, "read_mib_open"),
                med(rows, "read_mib_queries"), med(rows, "vector_reads")))
    print()
    print("majflt: major page faults during the queries (graph, codes, ids; with the mmap "
          "backend also vectors; under the cap also the child's own code pages). MiB read: "
          "/proc/self/io read_bytes.")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"n": args.n, "dim": args.dim, "nq": args.nq, "runs": args.runs,
                       "file_bytes": fsize, "ram_bytes": ram, "caps": caps,
                       "results": {"%s/%s" % k: v for k, v in results.items()}}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
