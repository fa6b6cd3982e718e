"""Build throughput as n grows: knndirect against its peers, each build in a
fresh process, with the graph's search quality measured beside it so that a
faster build cannot come from a worse graph.

    python benchmarks/bench_build.py --threads-one-repro     # 100k, 400k, 1m at d=256 + the repro check
    python benchmarks/bench_build.py --sizes 100k,400k,1m --dim 256 --peers hnswlib,scann
    python benchmarks/bench_build.py --sizes '' --threads-one-repro   # the repro check alone
    nice -n 19 python benchmarks/bench_build.py --quick --threads-one-repro \\
        --out /tmp/build-smoke                               # smoke run: 20k, 40k at d=64

Data: bench_data's clustered-<n>-<dim> sets (knndirect.datasets.clustered,
seed 0, cached under benchmarks/data/ with their exact ground truth), cosine,
1000 held-out queries, k = 10.

Per size and system (knndirect, then each of --peers; a peer that cannot be
imported, or has no adapter in systems.py, is skipped with a note):

1. Build, in a fresh process (benchmarks/worker.py, as run.py uses it):
   load the base vectors, reset the peak-RSS counter, build with --threads
   threads (knndirect: kd.Index(dim, metric, m=16, ef_construction=200)
   .add(x, threads=2); hnswlib: M 16, ef_construction 200, native space),
   save. Reported: wall seconds of the build call, vectors per second, peak
   RSS (VmHWM: includes the base vectors the process holds), the RSS the
   build added over the loaded data, the size on disk.
2. Search, in a second fresh process that loads the saved index: the
   system's sweep of systems.py (knndirect: ef x oversample grid; hnswlib:
   ef) at --search-threads threads; recall@10 at the fixed mid point
   (knndirect ef 64, oversample 5; hnswlib ef 64) and the QPS at recall 0.95,
   interpolated on the Pareto front as in run.py (report.py).

Summary per size: knndirect's vectors/s over hnswlib's, its QPS@0.95 over
hnswlib's, and each system's vectors/s against its own at the smallest size.

--threads-one-repro: knndirect builds clustered-20k-64 --repro-builds times
(default 2) at threads=1 with the same seed, twice over: each build in a
fresh process, and the builds one after another in one process (each saved,
its to_bytes() compared with the file, then closed; a long-lived process
reuses freed heap, which a fresh one does not). PASS when the saved files
are byte-identical in both. When they are not, the report names the
sections that differ and compares the graph itself: the level-0 and upper
link lists up to each list's length (the words past a list's length are not
part of the graph), every other section byte by byte, and the ids and
distances of searches with and without re-ranking through the public API.

Writes benchmarks/results/build.json and build.md (--out to change the
folder), naming the machine, its load averages, the commit and the command.
"""
from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import os
import shlex
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

import bench_data  # noqa: E402
import report  # noqa: E402
from run import loadavg, machine_meta, run_worker, write_result  # noqa: E402
from systems import SYSTEMS  # noqa: E402

MID_POINTS = {"knndirect": {"ef": 64, "oversample": 5}, "hnswlib": {"ef": 64}}
QUICK_SIZES, QUICK_DIM = "20k,40k", 64
REPRO_SPEC = "clustered-20k-64"
EXAMPLE_COMMANDS = [
    "python benchmarks/bench_build.py --threads-one-repro",
    "python benchmarks/bench_build.py --sizes 100k,400k,1m --dim 256 --peers hnswlib "
    "--threads-one-repro",
]


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default=None,
                    help="comma-separated n (100k, 1m, 250000); '' for none "
                         f"(default 100k,400k,1m; --quick: {QUICK_SIZES})")
    ap.add_argument("--dim", type=int, default=None,
                    help=f"dimension of the clustered sets (default 256; --quick: {QUICK_DIM})")
    ap.add_argument("--peers", default="hnswlib",
                    help="comma-separated systems.py names built beside knndirect "
                         "(default hnswlib; '' for none; e.g. hnswlib,scann)")
    ap.add_argument("--metric", default="cosine", choices=["cosine", "l2", "ip"])
    ap.add_argument("--threads", type=int, default=2, help="build threads (default 2)")
    ap.add_argument("--search-threads", type=int, default=1,
                    help="threads of the search sweep (default 1)")
    ap.add_argument("--m", type=int, default=16)
    ap.add_argument("--ef-construction", type=int, default=200)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=None,
                    help="timed passes per sweep point, median kept (default 3; --quick: 2)")
    ap.add_argument("--quick", action="store_true",
                    help=f"smoke run: sizes {QUICK_SIZES} at d={QUICK_DIM}, short sweeps")
    ap.add_argument("--threads-one-repro", action="store_true",
                    help=f"also check that threads=1 builds of {REPRO_SPEC} with one seed "
                         "save byte-identical files")
    ap.add_argument("--repro-builds", type=int, default=2,
                    help="builds compared by --threads-one-repro (default 2)")
    ap.add_argument("--repro-seed", type=int, default=0)
    ap.add_argument("--keep-indexes", action="store_true")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds per worker process")
    ap.add_argument("--out", default=str(HERE / "results"),
                    help="folder for build.json and build.md")
    ap.add_argument("--machine-label", default=os.environ.get(
        "KNNDIRECT_BENCH_MACHINE", "2-core VM"))
    ap.add_argument("--repro-child", nargs=2, metavar=("DATASET_JSON", "OUT_DIR"),
                    help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.sizes is None:
        args.sizes = QUICK_SIZES if args.quick else "100k,400k,1m"
    if args.dim is None:
        args.dim = QUICK_DIM if args.quick else 256
    args.sizes = [s.strip().lower() for s in args.sizes.split(",") if s.strip()]
    args.peers = [p.strip() for p in args.peers.split(",") if p.strip()]
    args.repeats = args.repeats or (2 if args.quick else 3)
    if args.repro_builds < 2:
        ap.error("--repro-builds must be at least 2")
    return args


def log(msg):
    print(f"[build] {msg}", flush=True)


def parse_size(s):
    m = re.match(r"^(\d+)(k|m)?$", s)
    if not m:
        raise SystemExit(f"--sizes: cannot read {s!r} (use e.g. 100k, 1m or 250000)")
    return bench_data._parse_count(m.group(1), m.group(2))


def size_name(n):
    if n % 1_000_000 == 0:
        return f"{n // 1_000_000}m"
    if n % 1000 == 0:
        return f"{n // 1000}k"
    return str(n)


# -- builds and sweeps --------------------------------------------------------------
def bench_system(name, ds, args, scratch, log_path):
    """Build (fresh process), then search sweep (fresh process); one entry."""
    cls = SYSTEMS.get(name)
    if cls is None:
        return {"status": "skipped", "reason": f"systems.py has no adapter named {name!r}"}
    entry = {"status": "ok", "note": cls.note}
    cfg = {"metric": ds.metric, "m": args.m, "ef_construction": args.ef_construction,
           "k": args.k, "dim": ds.dim, "n": ds.n, "quick": args.quick,
           "scratch": str(scratch)}
    index_dir = scratch / name
    index_dir.mkdir(parents=True, exist_ok=True)
    load0 = loadavg()
    t = time.time()
    b = run_worker({"phase": "build", "system": name, "cfg": cfg, "dataset": ds.to_json(),
                    "threads": args.threads, "save_to": str(index_dir)},
                   args.timeout, log_path)
    if "skipped" in b or "error" in b:
        entry["status"] = "skipped" if "skipped" in b else "error"
        entry["reason"] = b.get("skipped") or b.get("error")
        log(f"{name} n={ds.n:,}: {entry['status']}: {entry['reason']}")
        return entry
    b["vectors_per_s"] = ds.n / b["build_s"]
    b["loadavg"] = [load0, loadavg()]
    entry["build"] = b
    entry["version"] = b.get("version")
    log(f"{name} n={ds.n:,}: build {b['build_s']:.1f} s ({b['vectors_per_s']:,.0f} vectors/s), "
        f"peak RSS {b['peak_rss'] / 2**20:.0f} MiB ({time.time() - t:.0f} s with load/save)")
    t = time.time()
    s = run_worker({"phase": "search", "system": name, "cfg": cfg, "dataset": ds.to_json(),
                    "threads": [args.search_threads], "index_dir": str(index_dir),
                    "k": args.k, "repeats": args.repeats, "warmup": 200, "latency": False,
                    "min_time": 0.2 if args.quick else 0.5,
                    "sweep_budget_s": args.timeout * 0.8},
                   args.timeout, log_path)
    if "skipped" in s or "error" in s:
        entry["search_error"] = s.get("skipped") or s.get("error")
        log(f"{name} n={ds.n:,}: search failed: {entry['search_error']}")
        return entry
    entry["search"] = {"runs": s["runs"], "load_s": s.get("load_s"),
                       "resident_rss_bytes": s.get("resident_rss_bytes"),
                       **({"notes": s["notes"]} if s.get("notes") else {})}
    report.summarize_system(entry, [args.search_threads])
    key = str(args.search_threads)
    entry["qps_at_target"] = entry["qps_at_target"].get(key)
    entry["max_recall"] = entry["max_recall"].get(key)
    entry.pop("fronts", None)
    mid = MID_POINTS.get(name)
    if mid is not None:
        hit = [r for r in s["runs"] if all(r["params"].get(k) == v for k, v in mid.items())
               and not r["params"].get("default")]
        entry["mid"] = ({"params": mid, "recall": hit[0]["recall"], "qps": hit[0]["qps"]}
                        if hit else {"params": mid, "missing": "not in the system's sweep"})
    log(f"{name} n={ds.n:,}: {len(s['runs'])} sweep points in {time.time() - t:.0f} s; "
        f"QPS@{report.TARGET_RECALL} {report._fmt_qps(entry['qps_at_target'])}"
        + (f", recall@{args.k} at {mid} {entry['mid'].get('recall', float('nan')):.4f}"
           if mid else ""))
    return entry


def bench_size(n, args, out_dir):
    spec = f"clustered-{size_name(n)}-{args.dim}"
    ds = bench_data.resolve(spec, n_queries=args.queries, metric=args.metric, k=args.k)
    log(f"{ds.name}: n={ds.n:,} d={ds.dim} {ds.metric}, {ds.n_queries} queries, k={ds.k}")
    scratch = bench_data.DATA / "indexes" / f"build-{ds.name}"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    log_path = out_dir / "build.log"
    out = {"dataset": ds.to_json(), "loadavg_start": loadavg(),
           "date": dt.datetime.now().strftime("%Y-%m-%d %H:%M"), "systems": {}}
    try:
        for name in ["knndirect"] + [p for p in args.peers if p != "knndirect"]:
            out["systems"][name] = bench_system(name, ds, args, scratch, log_path)
    finally:
        if not args.keep_indexes:
            shutil.rmtree(scratch, ignore_errors=True)
    out["loadavg_end"] = loadavg()
    kd, hn = out["systems"]["knndirect"], out["systems"].get("hnswlib", {})
    cmp_ = {}
    if kd.get("build") and hn.get("build"):
        cmp_["build_speedup_vs_hnswlib"] = (kd["build"]["vectors_per_s"]
                                            / hn["build"]["vectors_per_s"])
        cmp_["peak_rss_vs_hnswlib"] = kd["build"]["peak_rss"] / hn["build"]["peak_rss"]
    if kd.get("qps_at_target") and hn.get("qps_at_target"):
        cmp_["qps_at_target_vs_hnswlib"] = kd["qps_at_target"] / hn["qps_at_target"]
    out["vs_hnswlib"] = cmp_
    return out


def add_growth(sizes):
    """Each system's vectors/s against its own at the smallest size measured."""
    first = {}
    for key in sorted(sizes, key=lambda s: sizes[s]["dataset"]["n"]):
        for name, e in sizes[key]["systems"].items():
            if not e.get("build"):
                continue
            first.setdefault(name, e["build"]["vectors_per_s"])
            e["build"]["throughput_vs_smallest"] = e["build"]["vectors_per_s"] / first[name]


# -- threads=1 reproducibility -----------------------------------------------------------
def repro_child(ds_json, out_dir):
    """threads=1 builds of the repro set in this one process (spec["builds"]
    of them, one after another, into out_dir/b<i>/): each is saved, its
    to_bytes() compared with the saved file, and its searches recorded."""
    import knndirect as kd
    with open(ds_json) as f:
        spec = json.load(f)
    ds, seed = spec["dataset"], spec["seed"]
    x = bench_data.load_base(ds)
    q = bench_data.load_queries(ds)
    for i in range(spec["builds"]):
        d = os.path.join(out_dir, f"b{i}")
        os.makedirs(d, exist_ok=True)
        index = kd.Index(ds["dim"], ds["metric"], m=spec["m"],
                         ef_construction=spec["ef_construction"], seed=seed)
        t = time.perf_counter()
        index.add(x, threads=1)
        build_s = time.perf_counter() - t
        path = os.path.join(d, "index.kdx")
        index.save(path)
        blob = index.to_bytes()
        with open(path, "rb") as f:
            to_bytes_same = f.read() == blob
        del blob
        d0, i0 = index.search(q, ds["k"], rerank=False, threads=1)
        d1, i1 = index.search(q, ds["k"], threads=1)
        np.savez(os.path.join(d, "search.npz"), d_norerank=d0, i_norerank=i0, d=d1, i=i1)
        with open(os.path.join(d, "info.json"), "w") as f:
            json.dump({"build_s": build_s, "info": index.info(), "version": kd.__version__,
                       "to_bytes_equals_file": to_bytes_same}, f, default=str)
        index.close()
    return 0


def _lists(buf, rows, width):
    """Link lists stored as rows of [length, links..., unused...] (uint32):
    (lengths, live mask) so that two graphs compare on their live links only."""
    a = np.frombuffer(buf, dtype="<u4").reshape(rows, width)
    lengths = a[:, 0].astype(np.int64)
    live = np.arange(width)[None, :] <= np.minimum(lengths, width - 1)[:, None]
    return a, live


def compare_graphs(path_a, path_b):
    """Section by section: which differ in bytes, and whether the graph (the
    live part of each link list) and every non-graph section are the same."""
    from knndirect._container import read_layout, read_metadata, read_section
    la, lb = read_layout(path_a), read_layout(path_b)
    names_a, names_b = [s.name for s in la], [s.name for s in lb]
    out = {"sections_differ": [], "graph_identical": True, "other_sections_identical": True,
           "notes": []}
    if names_a != names_b:
        out.update(graph_identical=False, other_sections_identical=False)
        out["notes"].append(f"section lists differ: {names_a} vs {names_b}")
        return out
    ma, mb = read_metadata(path_a), read_metadata(path_b)
    if ma != mb:
        out["notes"].append("metadata fields differ: " + ", ".join(
            k for k in ma if ma[k] != mb.get(k)))
    slots, m0, m = ma["count"], ma["m0"], ma["m"]
    levels = (np.frombuffer(read_section(path_a, "levels"), dtype=np.uint8)
              if "levels" in names_a else None)
    for name in names_a:
        sa, sb = read_section(path_a, name), read_section(path_b, name)
        if sa == sb:
            continue
        out["sections_differ"].append(name)
        diff_bytes = int(np.count_nonzero(np.frombuffer(sa, np.uint8)
                                          != np.frombuffer(sb, np.uint8))) \
            if len(sa) == len(sb) else None
        if name == "level0" and len(sa) == len(sb) == slots * (1 + m0) * 4:
            a, live = _lists(sa, slots, 1 + m0)
            b, _ = _lists(sb, slots, 1 + m0)
            same_live = bool(np.array_equal(np.where(live, a, 0), np.where(live, b, 0)))
            dead_diff = int(np.count_nonzero((a != b) & ~live))
            out["graph_identical"] &= same_live
            out["notes"].append(
                f"level0: {diff_bytes:,} bytes differ; live link lists "
                f"{'identical' if same_live else 'DIFFER'}; {dead_diff:,} differing words lie "
                f"past a list's length (unused slots) in "
                f"{int(np.count_nonzero(((a != b) & ~live).any(axis=1))):,} of {slots:,} lists")
        elif name == "upper" and levels is not None and len(sa) == len(sb):
            # Rows of level * (1 + m) words, node by node, for nodes with level > 0.
            width = 1 + m
            rows = int(levels.astype(np.int64).sum())
            if len(sa) == rows * width * 4:
                a, live = _lists(sa, rows, width)
                b, _ = _lists(sb, rows, width)
                same_live = bool(np.array_equal(np.where(live, a, 0), np.where(live, b, 0)))
                out["graph_identical"] &= same_live
                out["notes"].append(f"upper: {diff_bytes:,} bytes differ; live link lists "
                                    f"{'identical' if same_live else 'DIFFER'}")
            else:
                out["graph_identical"] = False
                out["notes"].append(f"upper: {diff_bytes} bytes differ (layout not decoded)")
        elif name == "upper":
            out["graph_identical"] = False
            out["notes"].append("upper differs (layout not decoded)")
        else:
            if name == "levels":
                out["graph_identical"] = False
            else:
                out["other_sections_identical"] = False
            out["notes"].append(f"{name}: {diff_bytes} bytes differ")
    return out


def _child(spec_path, out_dir, timeout):
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
               MKL_NUM_THREADS="1")
    r = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--repro-child",
                        str(spec_path), str(out_dir)], env=env, capture_output=True,
                       text=True, timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"repro build exited with status {r.returncode}: "
                           f"{r.stderr.strip()[-500:]}")


def _compare_builds(dirs):
    """Builds (folders holding index.kdx, search.npz, info.json) against the first."""
    builds = []
    for d in dirs:
        info = json.loads((d / "info.json").read_text())
        data = (d / "index.kdx").read_bytes()
        builds.append({"dir": d, "sha256": hashlib.sha256(data).hexdigest(),
                       "bytes": len(data), "build_s": info["build_s"],
                       "to_bytes_equals_file": info["to_bytes_equals_file"],
                       "version": info["version"]})
    first = builds[0]
    s0 = np.load(first["dir"] / "search.npz")
    comparisons = []
    for i, b in enumerate(builds[1:], 1):
        c = {"with": i, "bytes_identical": b["sha256"] == first["sha256"]}
        s1 = np.load(b["dir"] / "search.npz")
        c["search_identical"] = all(np.array_equal(s0[k], s1[k]) for k in s0.files)
        if not c["bytes_identical"]:
            c.update(compare_graphs(first["dir"] / "index.kdx", b["dir"] / "index.kdx"))
        comparisons.append(c)
    out = {"builds": [{k: v for k, v in b.items() if k != "dir"} for b in builds],
           "comparisons": comparisons,
           "bytes_identical": all(c["bytes_identical"] for c in comparisons),
           "graph_identical": all(c["bytes_identical"] or (c["graph_identical"] and
                                                          c["other_sections_identical"])
                                  for c in comparisons),
           "search_identical": all(c["search_identical"] for c in comparisons),
           "to_bytes_equals_file": all(b["to_bytes_equals_file"] for b in builds)}
    return out


REPRO_MODES = {
    "fresh processes": "each build in a fresh process",
    "one process": "the builds one after another in one process (each saved, then "
                   "to_bytes() compared with its file, then closed)",
}


def threads_one_repro(args, out_dir):
    ds = bench_data.resolve(REPRO_SPEC, n_queries=args.queries, metric=args.metric, k=args.k)
    log(f"threads=1 reproducibility: {args.repro_builds} builds of {ds.name} "
        f"(n={ds.n:,} d={ds.dim} {ds.metric}), seed {args.repro_seed}, in fresh processes "
        "and in one process")
    work = Path(tempfile.mkdtemp(prefix="kd-repro-", dir=bench_data.DATA))
    out = {"dataset": ds.to_json(), "seed": args.repro_seed, "threads": 1, "modes": {}}
    try:
        spec = {"dataset": ds.to_json(), "seed": args.repro_seed, "m": args.m,
                "ef_construction": args.ef_construction}
        one = work / "one-spec.json"
        one.write_text(json.dumps(dict(spec, builds=1)))
        many = work / "many-spec.json"
        many.write_text(json.dumps(dict(spec, builds=args.repro_builds)))
        for mode in REPRO_MODES:
            try:
                if mode == "fresh processes":
                    dirs = []
                    for i in range(args.repro_builds):
                        _child(one, work / f"p{i}", args.timeout)
                        dirs.append(work / f"p{i}" / "b0")
                else:
                    _child(many, work / "one", args.timeout)
                    dirs = [work / "one" / f"b{i}" for i in range(args.repro_builds)]
                r = _compare_builds(dirs)
            except (RuntimeError, OSError, subprocess.SubprocessError) as e:
                r = {"error": str(e), "bytes_identical": False, "graph_identical": False,
                     "search_identical": False, "to_bytes_equals_file": False}
            r["how"] = REPRO_MODES[mode]
            out["modes"][mode] = r
            if "error" in r:
                log(f"  {mode}: error: {r['error']}")
                continue
            for i, b in enumerate(r["builds"]):
                log(f"  {mode}, build {i}: {b['build_s']:.1f} s, {b['bytes']:,} bytes, sha256 "
                    f"{b['sha256'][:16]}")
            log(f"  {mode}: files byte-identical: "
                + ("PASS" if r["bytes_identical"] else "FAIL")
                + f"; graph identical: {r['graph_identical']}; search results identical: "
                  f"{r['search_identical']}")
            for c in r["comparisons"]:
                for note in c.get("notes", []):
                    log(f"    build 0 vs {c['with']}: {note}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for key in ("bytes_identical", "graph_identical", "search_identical",
                "to_bytes_equals_file"):
        out[key] = all(r[key] for r in out["modes"].values())
    out["pass"] = out["bytes_identical"]
    log("threads=1 repro: " + ("PASS" if out["pass"] else "FAIL")
        + " (saved files byte-identical in every mode)")
    return out


# -- report -----------------------------------------------------------------------------
def _mib(b):
    return f"{b / 2**20:,.0f}" if b is not None else "-"


def args_builds(r):
    return max((len(m_.get("builds", [])) for m_ in r["modes"].values()), default=0)


def markdown(res):
    m, c = res["meta"], res["config"]
    lines = [
        "# Build throughput as n grows",
        "",
        f"{m['date']}, {m['machine_label']}: {m['cpu']}, {m['nproc']} cores, kernel "
        f"{m['kernel']}, Python {m['python']}, numpy {m['numpy']}; knndirect at "
        f"{m['knndirect_commit']}. Load averages (1/5/15 min): {m['loadavg_start']} at the "
        f"start, {m.get('loadavg_end')} at the end.",
    ]
    if c["sizes"]:
        lines += [
            "",
            f"Clustered sets (bench_data, seed 0) at d = {c['dim']}, {c['metric']}, "
            f"{c['queries']} held-out queries, k = {c['k']}. Every build: M {c['m']}, "
            f"ef_construction {c['ef_construction']}, {c['threads']} threads, in a fresh "
            "process (peak RSS = VmHWM, base vectors included; extra = over the loaded "
            "data). Search: the saved index loaded in another fresh process, swept at "
            f"{c['search_threads']} thread(s); recall@{c['k']} at the mid point "
            "(knndirect ef 64 oversample 5, hnswlib ef 64) and QPS at recall "
            f"{report.TARGET_RECALL} interpolated on the Pareto front."
            + (" Quick run: short sweeps, smoke test only." if c["quick"] else ""),
            "",
            "| n | system | build s | vectors/s | vs smallest n | peak RSS MiB | extra MiB "
            f"| disk MiB | recall@{c['k']} mid | QPS@{report.TARGET_RECALL} | max recall |",
            "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for d in res["sizes"].values():
            n = f"{d['dataset']['n']:,}"
            for name, e in d["systems"].items():
                if e["status"] != "ok":
                    lines.append(f"| {n} | {name} | {e['status']}: {e['reason']} "
                                 "| | | | | | | | |")
                    continue
                b = e["build"]
                mid = e.get("mid", {})
                lines.append(
                    f"| {n} | {name} {e.get('version') or ''} | {b['build_s']:.1f} | "
                    f"{b['vectors_per_s']:,.0f} | {b.get('throughput_vs_smallest', 1):.2f}x | "
                    f"{_mib(b['peak_rss'])} | {_mib(b['build_extra_rss'])} | "
                    f"{_mib(b.get('disk_bytes'))} | "
                    + (f"{mid['recall']:.4f}" if "recall" in mid else "-") + " | "
                    + (report._fmt_qps(e.get("qps_at_target")) if "search" in e
                       else f"search failed: {e.get('search_error')}") + " | "
                    + (f"{e['max_recall']:.4f}" if e.get("max_recall") is not None else "-")
                    + " |")
        lines += ["", "| n | knndirect build speed / hnswlib | peak RSS / hnswlib | "
                      f"QPS@{report.TARGET_RECALL} / hnswlib | load |",
                  "| ---: | ---: | ---: | ---: | --- |"]
        for d in res["sizes"].values():
            v = d.get("vs_hnswlib", {})

            def f(key, v=v):
                return f"{v[key]:.2f}x" if key in v else "-"
            lines.append(f"| {d['dataset']['n']:,} | {f('build_speedup_vs_hnswlib')} | "
                         f"{f('peak_rss_vs_hnswlib')} | {f('qps_at_target_vs_hnswlib')} | "
                         f"{d['loadavg_start']} -> {d['loadavg_end']} |")
    r = res.get("repro")
    if r is not None:
        ds = r["dataset"]
        lines += ["", "## threads=1 reproducibility", "",
                  f"{args_builds(r)} builds of {ds['name']} (n = {ds['n']:,}, d = {ds['dim']}, "
                  f"{ds['metric']}) with threads=1 and seed {r['seed']}, saved with "
                  "index.save; PASS when the saved files are byte-identical in every mode. "
                  "Where they are not, the graph is compared on its live link lists "
                  "(the words past a list's length are not part of it), every other "
                  "section byte for byte, and searches (ids and distances, rerank on and "
                  "off) through the public API.", "",
                  f"**{'PASS' if r['pass'] else 'FAIL'}**", "",
                  "| builds | files byte-identical | graph identical | searches identical "
                  "| to_bytes() = file |",
                  "| --- | --- | --- | --- | --- |"]

        def yn(v):
            return "yes" if v else "NO"
        for mode, m_ in r["modes"].items():
            if "error" in m_:
                lines.append(f"| {m_['how']} | error: {m_['error']} | | | |")
                continue
            lines.append(f"| {m_['how']} | {'PASS' if m_['bytes_identical'] else 'FAIL'} | "
                         f"{yn(m_['graph_identical'])} | {yn(m_['search_identical'])} | "
                         f"{yn(m_['to_bytes_equals_file'])} |")
        for mode, m_ in r["modes"].items():
            for c in m_.get("comparisons", []):
                if c.get("sections_differ"):
                    lines.append("")
                    lines.append(f"{mode}, build 0 vs {c['with']}: sections that differ: "
                                 + ", ".join(c["sections_differ"]) + ". "
                                 + " ".join(c.get("notes", [])))
    lines += ["", "## Commands", "", "This result:", "", "```", m["command"], "```", "",
              "The full run:", "", "```"] + EXAMPLE_COMMANDS + ["```", ""]
    return "\n".join(lines)


def write(res, out_dir):
    return write_result(res, out_dir, "build", markdown)


def main(argv=None):
    args = parse_args(argv)
    if args.repro_child:
        return repro_child(*args.repro_child)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "build.log").write_text("")
    meta = machine_meta(args.machine_label)
    meta["loadavg_start"] = loadavg()
    meta["command"] = shlex.join(["python", "benchmarks/bench_build.py"] + list(
        sys.argv[1:] if argv is None else argv))
    sizes = sorted(parse_size(s) for s in args.sizes)
    res = {"meta": meta,
           "config": {"sizes": sizes, "dim": args.dim, "metric": args.metric,
                      "peers": args.peers, "threads": args.threads,
                      "search_threads": args.search_threads, "m": args.m,
                      "ef_construction": args.ef_construction, "k": args.k,
                      "queries": args.queries, "repeats": args.repeats, "quick": args.quick,
                      "mid_points": MID_POINTS},
           "sizes": {}}
    for n in sizes:
        d = bench_size(n, args, out_dir)
        res["sizes"][d["dataset"]["name"]] = d
        add_growth(res["sizes"])
        meta["loadavg_end"] = loadavg()
        write(res, out_dir)
    if args.threads_one_repro:
        res["repro"] = threads_one_repro(args, out_dir)
    meta["loadavg_end"] = loadavg()
    md = write(res, out_dir)
    print()
    print(markdown(res))
    log(f"wrote {md} and build.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
