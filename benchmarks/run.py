"""knndirect against its peers: recall@k against QPS, build time, peak RSS,
size on disk and resident bytes per vector, all systems in one run on the
same data.

    python benchmarks/run.py --quick                 # smoke run, about a minute
    python benchmarks/run.py --dataset clustered-100k-384 --threads 1,2
    python benchmarks/run.py --all --readme          # the figures in docs/benchmarks.md
    python benchmarks/run.py --dataset a,b           # several sets, one after the other

Each system is built in a process of its own (clean build time and peak
RSS), saved, then loaded in a fresh process that measures its resident
memory and sweeps its search-time knob for each thread count. Results:
benchmarks/results/<dataset>.json, .md and .png.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

import bench_data  # noqa: E402
import report  # noqa: E402
from systems import DEFAULT_SYSTEMS, SYSTEMS  # noqa: E402

# The suite behind the README's figures (--all): the two sets of the targets,
# plus a d=768 set for the resident-memory target.
SUITE = [
    {"dataset": "clustered-100k-384"},
    {"dataset": "minilm-wordnet"},
    {"dataset": "clustered-100k-768", "systems": "knndirect,knndirect-disk,hnswlib",
     "build_threads": [2]},
]
QUICK_DATASET = "clustered-20k-128"


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="systems: " + ", ".join(SYSTEMS))
    ap.add_argument("--dataset", default=None,
                    help="clustered-<n>-<d> (e.g. clustered-100k-384), minilm-wordnet, or a "
                         "file: .npy, .fvecs/.bvecs, ann-benchmarks .hdf5 "
                         "(default clustered-100k-384; --quick: clustered-20k-128)")
    ap.add_argument("--all", action="store_true",
                    help="run the suite: " + ", ".join(s["dataset"] for s in SUITE) +
                         " (the last with knndirect and hnswlib only, for the d=768 "
                         "resident-memory target)")
    ap.add_argument("--minilm", default="minilm-wordnet",
                    help="the embedding set --all uses: minilm-wordnet (all 117k "
                         "definitions) or minilm-wordnet-<n>k (an evenly spaced subset)")
    ap.add_argument("--metric", default=None, choices=["cosine", "l2", "ip"],
                    help="default: cosine for the named sets, the file's own for HDF5, else l2")
    ap.add_argument("--systems", default=",".join(DEFAULT_SYSTEMS))
    ap.add_argument("--threads", default="1,2", help="search thread counts")
    ap.add_argument("--build-threads", default=None,
                    help="build thread counts, each a separate build (default: 1,2; "
                         "--quick: 2); the index of the largest is searched")
    ap.add_argument("--all-build-threads-for", default="knndirect,hnswlib",
                    help="systems built at every --build-threads count; the others are "
                         "built only at the largest (default: knndirect,hnswlib)")
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--m", type=int, default=16)
    ap.add_argument("--ef-construction", type=int, default=200)
    ap.add_argument("--queries", type=int, default=None, help="default 1000 (--quick: 300)")
    ap.add_argument("--repeats", type=int, default=None,
                    help="timed passes per point, median kept (default 3; --quick: 2)")
    ap.add_argument("--out", default=str(HERE / "results"))
    ap.add_argument("--quick", action="store_true",
                    help="small smoke run: clustered-20k-128, few sweep points")
    ap.add_argument("--min-time", type=float, default=None,
                    help="time each point for at least this many seconds, in whole passes "
                         "(default 0.5; --quick: 0.2)")
    ap.add_argument("--no-latency", dest="latency", action="store_false",
                    help="skip timing the default points one query at a time")
    ap.add_argument("--keep-indexes", action="store_true")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds per worker process")
    ap.add_argument("--readme", action="store_true",
                    help="rewrite the benchmark block of docs/benchmarks.md from the results in --out")
    ap.add_argument("--readme-note", default=None,
                    help="a paragraph put above the tables in the README block (say how "
                         "the run departs from --all, or why its figures are provisional)")
    ap.add_argument("--report-only", action="store_true",
                    help="run nothing: re-render the .md/.png (and with --readme the README "
                         "block) from the .json results already in --out for the datasets "
                         "named by --dataset / --all")
    ap.add_argument("--machine-label", default=os.environ.get(
        "KNNDIRECT_BENCH_MACHINE", "2-core VM"))
    args = ap.parse_args(argv)
    args.threads = [int(t) for t in args.threads.split(",")]
    if args.build_threads is None:
        args.build_threads = "2" if args.quick else "1,2"
    args.build_threads = sorted(int(t) for t in args.build_threads.split(","))
    args.queries = args.queries or (300 if args.quick else 1000)
    args.repeats = args.repeats or (2 if args.quick else 3)
    if args.min_time is None:
        args.min_time = 0.2 if args.quick else 0.5
    return args


def write_result(res, out_dir, stem, markdown):
    """res as <stem>.json (atomically) and markdown(res) as <stem>.md in
    out_dir; returns the .md path."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_dir / f"{stem}.json.tmp"
    tmp.write_text(json.dumps(res, indent=1, default=str))
    os.replace(tmp, out_dir / f"{stem}.json")
    (out_dir / f"{stem}.md").write_text(markdown(res))
    return out_dir / f"{stem}.md"


def loadavg():
    """The 1, 5 and 15 minute load averages, rounded."""
    return [round(v, 2) for v in os.getloadavg()]


def machine_meta(label):
    cpu = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                                capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "csrc",
                                "python"], capture_output=True, text=True).stdout.strip()
        commit += "+dirty" if dirty else ""
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    import numpy
    return {"date": dt.datetime.now().strftime("%Y-%m-%d %H:%M"),
            "machine_label": label, "cpu": cpu, "nproc": os.cpu_count(),
            "kernel": platform.release(), "python": platform.python_version(),
            "numpy": numpy.__version__, "knndirect_commit": commit,
            "loadavg_start": os.getloadavg()[0], "command": " ".join(sys.argv)}


def run_worker(spec, timeout, log_path):
    """Run worker.py on spec in a fresh process; return its result dict."""
    with tempfile.TemporaryDirectory() as tmp:
        spec_path = os.path.join(tmp, "spec.json")
        result_path = os.path.join(tmp, "result.json")
        with open(spec_path, "w") as f:
            json.dump(spec, f)
        env = dict(os.environ)
        nthreads = max(spec["threads"]) if isinstance(spec["threads"], list) else spec["threads"]
        env["OMP_NUM_THREADS"] = str(nthreads)
        env.setdefault("OPENBLAS_NUM_THREADS", "1")
        env.setdefault("MKL_NUM_THREADS", "1")
        with open(log_path, "a") as log:
            log.write(f"\n=== {spec['system']} {spec['phase']} threads={spec['threads']}\n")
            log.flush()
            try:
                proc = subprocess.run([sys.executable, str(HERE / "worker.py"), spec_path,
                                       result_path], stdout=log, stderr=subprocess.STDOUT,
                                      env=env, timeout=timeout)
            except subprocess.TimeoutExpired:
                return {"error": f"timed out after {timeout:.0f} s"}
        if not os.path.exists(result_path):
            return {"error": f"worker exited with status {proc.returncode} and no result "
                             f"(see {log_path})"}
        with open(result_path) as f:
            return json.load(f)


def bench_dataset(args, dataset_spec, systems, meta):
    ds = bench_data.resolve(dataset_spec, n_queries=args.queries, metric=args.metric, k=args.k)
    print(f"[run] {ds.name}: n={ds.n:,} d={ds.dim} {ds.metric}, {ds.n_queries} queries, "
          f"k={ds.k}", flush=True)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    log_path = out_dir / f"{ds.name}.log"
    log_path.write_text("")
    scratch = bench_data.DATA / "indexes" / ds.name
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    cfg = {"metric": ds.metric, "m": args.m, "ef_construction": args.ef_construction,
           "k": args.k, "dim": ds.dim, "n": ds.n, "quick": args.quick,
           "scratch": str(scratch)}
    result = {"meta": meta, "dataset": ds.to_json(),
              "config": {"m": args.m, "ef_construction": args.ef_construction, "k": args.k,
                         "threads": args.threads, "build_threads": args.build_threads,
                         "queries": ds.n_queries, "repeats": args.repeats, "quick": args.quick},
              "systems": {}}
    built = {}
    for name in systems:
        cls = SYSTEMS[name]
        entry = {"status": "ok", "note": cls.note}
        result["systems"][name] = entry
        build_name = cls.builds_as or name
        index_dir = scratch / build_name
        if build_name not in built:
            index_dir.mkdir(exist_ok=True)
            builds = []
            every = build_name in args.all_build_threads_for.split(",")
            for bt in args.build_threads:  # the largest last: its index is kept
                save = bt == max(args.build_threads)
                if not save and not every:
                    continue
                t = time.time()
                r = run_worker({"phase": "build", "system": build_name, "cfg": cfg,
                                "dataset": ds.to_json(), "threads": bt,
                                "save_to": str(index_dir) if save else None},
                               args.timeout, log_path)
                if "skipped" in r or "error" in r:
                    builds = r
                    break
                print(f"[run] {build_name}: build {bt} thread(s) {r['build_s']:.1f} s, "
                      f"peak RSS {r['peak_rss'] / 2**20:.0f} MiB "
                      f"({time.time() - t:.0f} s with load/save)", flush=True)
                builds.append(r)
            built[build_name] = builds
        builds = built[build_name]
        if isinstance(builds, dict):
            entry["status"] = "skipped" if "skipped" in builds else "error"
            entry["reason"] = builds.get("skipped") or builds.get("error")
            print(f"[run] {name}: {entry['status']}: {entry['reason']}", flush=True)
            report.write_all(finish(result), out_dir)
            continue
        entry["builds"] = builds
        if cls.builds_as:
            entry["builds_as"] = cls.builds_as
        entry["version"] = builds[-1].get("version")
        t = time.time()
        r = run_worker({"phase": "search", "system": name, "cfg": cfg, "dataset": ds.to_json(),
                        "threads": args.threads, "index_dir": str(index_dir), "k": args.k,
                        "repeats": args.repeats, "warmup": 200, "latency": args.latency,
                        "min_time": args.min_time,
                        "sweep_budget_s": args.timeout * 0.8},
                       args.timeout, log_path)
        if "skipped" in r or "error" in r:
            entry["status"] = "skipped" if "skipped" in r else "error"
            entry["reason"] = r.get("skipped") or r.get("error")
            print(f"[run] {name}: search {entry['status']}: {entry['reason']}", flush=True)
        else:
            entry["search"] = r
            if r.get("opened_info", {}).get("resident_bytes") is not None:
                entry["opened_resident_bytes"] = r["opened_info"]["resident_bytes"]
            report.summarize_system(entry, args.threads)
            print(f"[run] {name}: {len(r['runs'])} points in {time.time() - t:.0f} s; "
                  f"QPS@{report.TARGET_RECALL}: "
                  + ", ".join(f"{k}T {report._fmt_qps(v)}"
                              for k, v in entry["qps_at_target"].items()), flush=True)
        report.write_all(finish(result), out_dir)
    if not args.keep_indexes:
        shutil.rmtree(scratch, ignore_errors=True)
    result["meta"]["loadavg_end"] = os.getloadavg()[0]
    md = report.write_all(finish(result), out_dir)
    print(f"[run] wrote {md} (+ .json, .png)", flush=True)
    return result


def finish(result):
    result["targets"] = report.evaluate_targets(result)
    result["meta"].setdefault("loadavg_end", os.getloadavg()[0])
    return result


def main(argv=None):
    args = parse_args(argv)
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = [s for s in systems if s not in SYSTEMS]
    if unknown:
        raise SystemExit(f"unknown systems {unknown}; choose from {list(SYSTEMS)}")
    meta = machine_meta(args.machine_label)
    if args.all:
        plan = []
        for s in SUITE:
            name = args.minilm if s["dataset"] == "minilm-wordnet" else s["dataset"]
            syst = [x for x in s.get("systems", ",".join(systems)).split(",")
                    if x in systems or "systems" in s]
            plan.append((name, syst, s.get("build_threads", args.build_threads)))
    else:
        spec = args.dataset or (QUICK_DATASET if args.quick else "clustered-100k-384")
        plan = [(name, systems, args.build_threads) for name in spec.split(",")]
    results = []
    all_build_threads = args.build_threads
    if args.report_only:
        for dataset, _, _ in plan:
            name = Path(dataset).stem if os.path.exists(dataset) else dataset
            p = Path(args.out) / f"{name}.json"
            if not p.exists():
                raise SystemExit(f"--report-only: no results at {p}")
            r = json.loads(p.read_text())
            for e in r["systems"].values():
                if e.get("search"):
                    report.summarize_system(e, r["config"]["threads"])
            results.append(r)
            report.write_all(finish(r), args.out)
        plan = []
    for dataset, syst, build_threads in plan:
        meta_ds = dict(meta, loadavg_start=os.getloadavg()[0],
                       date=dt.datetime.now().strftime("%Y-%m-%d %H:%M"))
        meta_ds.pop("loadavg_end", None)
        args.build_threads = build_threads
        results.append(bench_dataset(args, dataset, syst, meta_ds))
    args.build_threads = all_build_threads
    for r in results:
        print()
        print(report.markdown(r))
    if args.readme:
        # The block lives in docs/benchmarks.md; its image links are relative to docs/.
        page = REPO / "docs" / "benchmarks.md"
        report.update_readme(page, results, results_rel=os.path.relpath(
            Path(args.out).resolve(), page.parent), note=args.readme_note)
        print(f"[run] docs/benchmarks.md benchmark block rewritten from {len(results)} result(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
