"""Opened from disk under one memory cap: knndirect against LanceDB and
diskannpy, on any set of the harness.

    sudo python benchmarks/bench_disk_peers.py --dataset mpnet-dict --metric l2
    sudo python benchmarks/bench_disk_peers.py --dataset clustered-1m-768 \\
        --systems knndirect-disk,knndirect-refined-disk,lancedb

Every system is built once (2 threads, cached under --dir) and then searched
in a child process inside a memory cgroup whose limit counts the page cache.
The limit is one index budget for every system (cap-fraction, default 1/4,
of the float32 vectors, or the largest knndirect RAM part + 64 MiB where
that is more) plus the system's own process baseline (Python, numpy and its
library imported, no index; measured in the same run), all printed with the
results. Before each child the system's files are read once with O_DIRECT
(diskio.read_through: the disk's host-side cache would otherwise decide the
first pass at each point) and the page cache is dropped (sync; echo 3 >
/proc/sys/vm/drop_caches). In the child: a sweep of the system's knobs, one
batch of all queries per point with 2 threads, recall@10 against the exact
ground truth (saved after each point, so a child stopped by --timeout keeps
them); then the point with the highest QPS at recall >= 0.95 is measured
again over 5 batches (the median). A point whose batch runs past
--point-timeout, or whose child the cap's OOM killer ends, is recorded as
stopped there; a new child goes on with the points that turn no knob further
than it, so one thrashing point does not end a system's sweep. --uncapped
sweeps the named systems again with no limit: the most they give with all of
RAM. Needs root for the cgroup and the cache
drops; without it the figures are uncapped and warm, and the results say so.

- knndirect-disk, knndirect-refined-disk: kd.open (graph and codes in RAM,
  float32 rows by O_DIRECT reads); the default search, then ef x oversample.
- lancedb: a LanceDB table on disk with an IVF_PQ index (systems.LanceDB);
  nprobes x refine_factor, LANCE_CPU_THREADS = 2, multi-vector queries of at
  most 100 (under a cap, fewer where their refine pools need it: LanceDB
  holds a call's pools at once).
- diskann: diskannpy's disk index (bench_disk's build and search: PQ codes
  and a node cache in RAM, graph and vectors on disk); L x beam width.

Writes benchmarks/results/disk-peers-<dataset>.{json,md}.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from types import SimpleNamespace

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import bench_data  # noqa: E402
import bench_disk  # noqa: E402
from bench_disk import batch_qps, log, loadavg  # noqa: E402
from cgroup import Cgroup  # noqa: E402
from disk_report import K, TARGET_RECALL, fmt  # noqa: E402
from diskio import read_through  # noqa: E402
from systems import kd_points  # noqa: E402

BUFFERS_MIB = 64
THREADS = 2
CONFIRM_PASSES = 5
# knndirect's grids start with its default search (kd_points). LanceDB's
# grid: IVF_PQ's own order alone (refine 1) and then the float32 re-rank its
# docs advise for PQ codes, each refine factor along nprobes.
GRIDS = {
    "knndirect-disk": kd_points(K, (32, 48, 64, 96, 128, 192, 256, 384, 512),
                                (2, 3, 4, 6, 8, 12)),
    "knndirect-refined-disk": kd_points(K, (32, 48, 64, 96, 128, 192, 256, 384),
                                        (1, 1.5, 2, 3)),
    "lancedb": [{"nprobes": p, "refine_factor": r} for r in (1, 5, 10, 20, 50, 100)
                for p in (5, 10, 20, 40, 80, 160)],
}
# The knob that stays fixed along one row of a grid: a row stops once its
# recall passes ENOUGH (wider points only cost more).
ROW_KEY = {"knndirect-disk": "oversample", "knndirect-refined-disk": "oversample",
           "lancedb": "refine_factor"}
ENOUGH = 0.995
# LanceDB's rows also stop once a step along nprobes gains less than this:
# past the partitions that hold the neighbours, the re-rank's pool is the
# limit and more probes only cost.
SATURATED = {"lancedb": 0.002}


def _cfg(spec):
    return {"metric": spec["metric"], "m": 16, "ef_construction": 200, "k": K,
            "dim": spec["dim"], "n": spec["n"], "quick": False, "scratch": spec["scratch"],
            "memory_budget": spec.get("budget")}


def _adapter(spec):
    os.environ["LANCE_CPU_THREADS"] = str(THREADS)
    from systems import SYSTEMS
    system = SYSTEMS[spec["system"]](_cfg(spec))
    system.import_lib()
    return system


def task_build(spec):
    system = _adapter(spec)
    x = np.load(spec["base"], mmap_mode="r")[:spec["n"]]
    t = time.perf_counter()
    index = system.build(x, THREADS)
    build_s = time.perf_counter() - t
    system.save(index, spec["dir"])
    return {"build_s": build_s}


def _rss_bytes():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def task_baseline(spec):
    """What the process holds before any index: Python, numpy, the library
    imported, the queries loaded."""
    if spec["system"] != "diskann":
        _adapter(spec)
    else:
        import diskannpy  # noqa: F401
    np.load(spec["queries"])
    return {"rss_bytes": _rss_bytes()}


def best_at_target(points):
    """The point with the highest QPS at recall >= 0.95, or None."""
    return max((p for p in points if p["recall"] >= TARGET_RECALL), key=lambda p: p["qps"],
               default=None)


def dominated(point, stopped):
    """Whether point turns every knob at least as far as a point that was
    stopped for taking too long (so it would take at least as long)."""
    stopped = _knobs_of(stopped)
    knobs = [k for k in stopped if k != "default" and stopped[k] is not None]
    return bool(knobs) and not point.get("default") and all(
        point.get(k) is not None and point[k] >= stopped[k] for k in knobs)


def walk(name, measured, stopped):
    """The points of a system's grid still to measure, in order, given those
    measured and stopped so far (by this child or earlier ones)."""
    row_key, gain = ROW_KEY[name], SATURATED.get(name)
    done = {json.dumps(_knobs_of(p), sort_keys=True) for p in measured + stopped}
    for point in GRIDS[name]:
        if json.dumps(point, sort_keys=True) in done or any(dominated(point, s)
                                                            for s in stopped):
            continue
        row = [p for p in measured if not p.get("default") and
               p.get(row_key) == point.get(row_key)]
        if not point.get("default") and row:
            if max(p["recall"] for p in row) >= ENOUGH:
                continue
            if gain is not None and len(row) >= 2 and row[-1]["recall"] - row[-2]["recall"] < gain:
                continue
        yield point


def _knobs_of(b):
    return {k: v for k, v in b.items()
            if k not in ("qps", "recall", "passes", "after_s", "killed")}


def _watchdog(state, partial):
    """Ends the child when one point has run past limit seconds: a system that
    thrashes under its cap is stopped at that point, which is recorded, and
    the parent goes on with the points that do not cost more."""
    import threading

    def run():
        while True:
            time.sleep(1)
            cur = state.get("point")
            limit = state.get("limit", 0)
            if cur is not None and time.perf_counter() - state["t"] > limit:
                out = dict(state["out"], stopped=dict(cur, after_s=limit))
                with open(partial, "w") as f:
                    json.dump(out, f)
                print(f"  stopped at {cur}: over {limit:.0f} s", flush=True)
                os._exit(3)
    threading.Thread(target=run, daemon=True).start()


def task_sweep(spec):
    """The knob sweep (one batch per point), then the best point at recall >=
    0.95 again over CONFIRM_PASSES batches."""
    system = _adapter(spec)
    q = np.ascontiguousarray(np.load(spec["queries"]), np.float32)
    gt = np.load(spec["gt"])[:, :K]
    t = time.perf_counter()
    index = system.load(spec["dir"])
    out = {"open_s": time.perf_counter() - t, "points": []}
    out["info"] = system.info(index)
    state = {"out": out, "point": None}
    _watchdog(state, spec["partial"])
    measured, stopped = spec.get("measured", []), spec.get("stopped", [])
    for point in walk(spec["system"], measured, stopped):
        state.update(point=point, t=time.perf_counter(), limit=spec["point_timeout"])
        b = batch_qps(lambda x, p=point: system.search(index, x, p, THREADS), q, gt,
                      min_s=0, passes=1)
        state["point"] = None
        b.update(point)
        out["points"].append(b)
        measured.append(b)
        print(f"  {spec['system']} {point}: recall {b['recall']:.4f}, {b['qps']:,.0f} q/s",
              flush=True)
        with open(spec["partial"], "w") as f:  # kept if the child is stopped
            json.dump(out, f)
    best = best_at_target(measured)
    if best:
        point = _knobs_of(best)
        state.update(point=point, t=time.perf_counter(),
                     limit=spec["point_timeout"] * CONFIRM_PASSES)
        b = batch_qps(lambda x: system.search(index, x, point, THREADS), q, gt, min_s=0,
                      passes=CONFIRM_PASSES)
        state["point"] = None
        out["at_target"] = dict(point, **b)
    system.close(index)
    return out


TASKS = dict(bench_disk.TASKS, build=task_build, sweep=task_sweep, baseline=task_baseline)


def _builds_as(name):
    """The folder a system's build lives in: knndirect's opened variants
    search the index that its in-RAM name builds."""
    return name.replace("-disk", "") if name.startswith("knndirect") else name


def diskann_params(n, info):
    """bench_disk's diskann sizing: 192 PQ bytes a vector, and a node cache
    of what knndirect keeps in RAM beyond that."""
    args = SimpleNamespace(diskann_pq_bytes=192, n=n, diskann_R=64, diskann_L=100)
    return bench_disk.diskann_params(args, info)


def build(name, folder, ds, base_path, metric, kd_info):
    """Build one system into folder once; its build.json marks it done."""
    flag = os.path.join(folder, "build.json")
    if os.path.exists(flag):
        return json.load(open(flag))
    os.makedirs(folder, exist_ok=True)
    log(f"[build] {name} (load {loadavg()})")
    if name == "diskann":
        p = diskann_params(ds.n, kd_info)
        binp = os.path.join(folder, "base.bin")
        bench_disk.write_diskann_bin(np.load(base_path, mmap_mode="r")[:ds.n], binp)
        out = bench_disk.run_child(
            {"task": "diskann_build", "bin": binp, "dir": folder, "R": p["R"], "L": p["L_build"],
             "search_gb": p["search_memory_maximum_gb"],
             "build_gb": max(4.0, 2.5 * ds.n * ds.dim * 4 / 2**30), "threads": THREADS,
             "metric": metric}, script=__file__)
        os.remove(binp)
    else:
        out = bench_disk.run_child(
            {"task": "build", "system": name, "base": base_path, "n": ds.n, "dim": ds.dim,
             "metric": metric, "dir": folder, "scratch": os.path.dirname(folder)},
            script=__file__)
    if "error" in out:
        raise SystemExit(f"{name} build failed: {out['error']}")
    log(f"  {name} built in {out['build_s']:.0f} s")
    with open(flag, "w") as f:
        json.dump(out, f)
    return out


def sweep(name, folder, ds, metric, cg, root, kd_info, timeout, point_timeout, budget=None):
    if name == "diskann":
        p = diskann_params(ds.n, kd_info)
        spec = {"task": "diskann_search", "dir": folder, "queries": ds.query_path,
                "gt": ds.gt_path, "warm": ds.query_path, "metric": metric,
                "Ls": [10, 20, 30, 50, 70, 100, 150, 200, 300, 400],
                "beam_widths": [2, 4, 8], "single_beam_width": 4,
                "cache_nodes": p["cache_nodes"]}
        out = bench_disk.run_child(spec, cgroup=cg, drop=root, script=__file__,
                                   timeout=timeout)
        out["params"] = p
        best = best_at_target(out.get("points", []))
        if best:
            out["at_target"] = best
        return out
    # One child per run of points: a point that runs past point_timeout ends
    # its child, and the next child starts after it, skipping the points that
    # cost at least as much, until the grid is done or timeout is spent.
    partial = os.path.join(os.path.dirname(folder), f"{name}.partial.json")
    out = {"points": [], "stopped": []}
    start = time.perf_counter()
    while True:
        spec = {"task": "sweep", "system": name, "dir": folder, "queries": ds.query_path,
                "gt": ds.gt_path, "n": ds.n, "dim": ds.dim, "metric": metric,
                "scratch": os.path.dirname(folder), "partial": partial,
                "point_timeout": point_timeout, "budget": budget, "measured": out["points"],
                "stopped": out["stopped"]}
        left = timeout - (time.perf_counter() - start)
        child = bench_disk.run_child(spec, cgroup=cg, drop=root, script=__file__,
                                     timeout=max(1.0, left))
        if "error" in child and os.path.exists(partial):
            # Stopped (a point or the timeout) or failed: the points it measured count.
            with open(partial) as f:
                child = dict(json.load(f), **child)
        if os.path.exists(partial):
            os.remove(partial)
        out["points"] += child.pop("points", [])
        stop = child.pop("stopped", None)
        if stop is None and child.get("returncode") == -9:
            # Killed by the cap's OOM killer: at the point it was measuring.
            stop = next(walk(name, out["points"], out["stopped"]), None)
            stop = stop and dict(stop, after_s=None, killed=True)
        peak = max((out.get("memory") or {}).get("peak_bytes") or 0,
                   (child.get("memory") or {}).get("peak_bytes") or 0)
        out.update(child)
        if out.get("memory"):
            out["memory"]["peak_bytes"] = peak
        if stop is None or time.perf_counter() - start >= timeout:
            break
        log(f"  {name}: {_stop_text(stop)}; going on")
        out["stopped"].append(stop)
        out.pop("error", None)
    if not out["stopped"]:
        del out["stopped"]
    return out


def sweep_logged(label, where, budget):
    """sweep(), with its outcome logged under label."""
    name, folder, ds, args, cg, root, kd_info = where
    out = sweep(name, folder, ds, args.metric, cg, root, kd_info, args.timeout,
                args.point_timeout, budget)
    if "error" in out:
        log(f"  ERROR: {out['error']}")
    at = out.get("at_target")
    log(f"  {label}: " + (f"{at['qps']:,.0f} q/s at recall {at['recall']:.4f}" if at
                          else "no point reached recall 0.95"))
    return out


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--dataset", default="mpnet-dict")
    ap.add_argument("--metric", default="l2", choices=["l2"],
                    help="l2, which every system here takes (on unit vectors, the cosine "
                    "order)")
    ap.add_argument("--systems",
                    default="knndirect-disk,knndirect-refined-disk,lancedb,diskann")
    ap.add_argument("--cap-fraction", type=float, default=0.25)
    ap.add_argument("--uncapped", default="",
                    help="systems to sweep a second time with no memory limit (after "
                    "their capped sweep), reported as '<name> (no cap)'")
    ap.add_argument("--timeout", type=float, default=1800,
                    help="seconds a system's whole sweep may take under its cap")
    ap.add_argument("--point-timeout", type=float, default=120,
                    help="seconds one point's batch may take: a system that thrashes "
                    "there is stopped at that point, which is reported, and its sweep "
                    "goes on with the points that cost less")
    ap.add_argument("--dir", default=os.path.join(HERE, "data", "disk-peers"))
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    ap.add_argument("--worker", nargs=2, metavar=("SPEC", "OUT"), help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    if args.worker:
        return bench_disk.worker_main(*args.worker, tasks=TASKS)
    ds = bench_data.resolve(args.dataset, metric=args.metric)
    base_path = ds.base_path
    names = [s for s in args.systems.split(",") if s]
    uncapped = [s for s in args.uncapped.split(",") if s]
    if set(uncapped) - set(names):
        raise SystemExit(f"--uncapped: {sorted(set(uncapped) - set(names))} not in --systems")
    known = sorted(GRIDS) + ["diskann"]
    unknown = [s for s in names if s not in known]
    if unknown:
        raise SystemExit(f"--systems: unknown {unknown}; choose from {known}")
    root = os.geteuid() == 0
    folder = os.path.join(args.dir, f"{ds.name}-{args.metric}")
    res = {"command": "python benchmarks/bench_disk_peers.py " +
                      " ".join(sys.argv[1:] if argv is None else argv),
           "dataset": ds.name, "description": ds.description, "n": ds.n, "dim": ds.dim,
           "queries": ds.n_queries, "metric": args.metric, "k": K, "threads": THREADS,
           "machine": f"{platform.machine()}, {os.cpu_count()} cores", "kernel":
           platform.release(), "started": time.strftime("%Y-%m-%d %H:%M"),
           "loadavg_start": loadavg(), "git": bench_disk.git_state(), "systems": {}}
    builds, kd_info, resident = {}, None, []
    for name in names:
        builds_as = _builds_as(name)
        builds[name] = build(name, os.path.join(folder, builds_as), ds, base_path,
                             args.metric, kd_info)
        if name.startswith("knndirect"):
            import knndirect as kd
            with kd.open(os.path.join(folder, builds_as, "index.kdx")) as ix:
                info = ix.info()
            kd_info = kd_info or info
            resident.append(info["resident_bytes"])
    # One budget for every index: the fraction of the vectors, or the largest
    # knndirect RAM part + 64 MiB for result buffers where that is more. Each
    # system's cap is that budget + its own process baseline (Python, numpy
    # and the library imported, no index), measured here, so that a library's
    # heavier runtime is not charged to its index.
    data_bytes = ds.n * ds.dim * 4
    budget = max([int(args.cap_fraction * data_bytes)] + [r + BUFFERS_MIB * 2**20
                                                          for r in resident])
    res["cap"] = {"budget_bytes": budget, "fraction_of_data": budget / data_bytes,
                  "knndirect_resident_bytes": resident, "caps": {}}
    cg = None
    if root:
        try:
            cg = Cgroup(f"knndirect_disk_peers_{os.getpid()}")
            res["cap"]["cgroup_version"] = cg.version
        except OSError as e:
            log(f"no memory cgroup ({e}): uncapped")
            res["cap"]["error"] = str(e)
    else:
        log("NOT root: no memory cap and no page-cache drops; the figures are uncapped, warm")
        res["cap"]["error"] = "not root"
    res["cap"]["effective"] = cg is not None
    log(f"index budget {budget / 2**20:.0f} MiB = {budget / data_bytes:.2f} of the float32 "
        f"data ({data_bytes / 2**20:.0f} MiB); page cache dropped before each system")
    try:
        for name in names:
            base_rss = bench_disk.run_child(
                {"task": "baseline", "system": name, "queries": ds.query_path, "n": ds.n,
                 "dim": ds.dim, "metric": args.metric, "scratch": folder},
                script=__file__).get("rss_bytes", 0)
            cap = budget + base_rss
            res["cap"]["caps"][name] = {"bytes": cap, "baseline_bytes": base_rss}
            if cg:
                cg.set_limit(cap)
            log(f"[search] {name}: cap {cap / 2**20:.0f} MiB = budget + its baseline "
                f"{base_rss / 2**20:.0f} MiB (load {loadavg()})")
            builds_as = _builds_as(name)
            t = time.perf_counter()
            warm = read_through(os.path.join(folder, builds_as))
            log(f"  read its {warm / 2**20:,.0f} MiB of files once with O_DIRECT in "
                f"{time.perf_counter() - t:.1f} s")
            where = (name, os.path.join(folder, builds_as), ds, args, cg, root, kd_info)
            res["systems"][name] = sweep_logged(name, where, budget if cg else None)
            res["systems"][name]["build"] = builds[name]
            if name in uncapped:
                # The same sweep with no limit: what the system reaches given all
                # of RAM, the bound on what any cap could let it show.
                label = f"{name} (no cap)"
                res["cap"]["caps"][label] = {"bytes": None, "baseline_bytes": base_rss}
                if cg:
                    cg.set_limit(None)
                log(f"[search] {label} (load {loadavg()})")
                read_through(os.path.join(folder, builds_as))
                res["systems"][label] = sweep_logged(label, where, None)
                res["systems"][label]["build"] = builds[name]
    finally:
        if cg:
            cg.remove()
    res["loadavg_end"] = loadavg()
    res["finished"] = time.strftime("%Y-%m-%d %H:%M")
    write(res, args.out)
    return 0


def _qps(out):
    at = (out or {}).get("at_target")
    return at["qps"] if at else None


def _knobs(p):
    return ", ".join(f"{k} {p[k]:g}" for k in ("ef", "oversample", "nprobes",
                                                "refine_factor", "L", "beam_width")
                     if p.get(k) is not None) or "defaults"


def _stop_text(p):
    how = ("killed by the memory cap" if p.get("killed") else
           f"stopped after {p['after_s']:.0f} s")
    return f"{how} at ({_knobs(p)})"


def _short_of(out):
    """Why a system has no point at the target: its error, or its best recall."""
    if out.get("error"):
        return out["error"]
    best = max(out.get("points", []), key=lambda p: p["recall"], default=None)
    return "none reached 0.95" + (f" (best {best['recall']:.3f} at {_knobs(best)})"
                                  if best else "")


def write(res, out_dir):
    os.makedirs(out_dir, exist_ok=True)
    stem = os.path.join(out_dir, f"disk-peers-{res['dataset']}")
    peers = [_qps(res["systems"].get(p)) for p in ("lancedb", "diskann")]
    best_peer = max([p for p in peers if p], default=None)
    cap = res["cap"]
    lines = [f"# Opened from disk under one cap: {res['dataset']}", "",
             f"{res['description']}: n = {res['n']:,}, d = {res['dim']}, {res['metric']}, "
             f"k = {res['k']}, {res['queries']} queries, batch search with {res['threads']} "
             f"threads; {res['machine']}; {res['started']} – {res['finished']}, load "
             f"{res['loadavg_start']} → {res['loadavg_end']}.", "",
             f"Memory: every index gets {cap['budget_bytes'] / 2**20:.0f} MiB ("
             f"{cap['fraction_of_data']:.2f} of the float32 vectors; page cache included), "
             "and each system's cap adds its own process baseline (Python, numpy and the "
             "library imported, before any index is opened)"
             + (", cgroup v%s" % cap.get("cgroup_version") if cap["effective"]
                else f"; NOT applied: {cap.get('error')}") + "; page cache dropped before "
             "each system.", "",
             f"Command: `{res['command']}`", "",
             "| system | build (2 threads) | cap (baseline) | peak memory | QPS at recall ≥ "
             "0.95 | recall | point | vs the better peer |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, out in res["systems"].items():
        at = out.get("at_target")
        mem = out.get("memory") or {}
        ratio = (f"{at['qps'] / best_peer:.2f}×" if at and best_peer
                 and name.startswith("knndirect") else "")
        c = cap["caps"].get(name, {})
        lines.append(f"| {name} | {fmt(out['build'].get('build_s'), '.0f')} s | "
                     f"{fmt(c['bytes'] / 2**20, '.0f') + ' MiB' if c.get('bytes') else 'none'} "
                     f"({fmt(c.get('baseline_bytes', 0) / 2**20, '.0f')}) | "
                     f"{fmt((mem.get('peak_bytes') or 0) / 2**20, '.0f')} MiB | "
                     f"{fmt(at and at['qps'], ',.0f')} | {fmt(at and at['recall'], '.4f')} | "
                     f"{_knobs(at) if at else _short_of(out)} | "
                     f"{ratio} |")
    lines += ["", "Each system's sweep (recall, QPS):", ""]
    for name, out in res["systems"].items():
        pts = sorted(out.get("points", []), key=lambda p: p["recall"])
        shown = [p for p in pts if p["recall"] >= 0.8] or pts[-5:]
        lines.append(f"- {name}: " + "; ".join(
            [f"{p['recall']:.3f} @ {p['qps']:,.0f} ({_knobs(p)})" for p in shown] +
            [_stop_text(p) for p in out.get("stopped", [])]))
    with open(stem + ".json", "w") as f:
        json.dump(res, f, indent=1)
    with open(stem + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    log("wrote " + stem + ".md")


if __name__ == "__main__":
    sys.exit(main())
