"""knndirect.ray on one host: build time and CPU by shard count, the fan-out
overhead of a sharded search, and whether a clustered partition that routes
queries to fewer shards is worth it.

    python benchmarks/bench_ray.py --n 100000 --dim 128 --json benchmarks/results/ray.json \
        --md benchmarks/results/ray.md

Data: kd.datasets.clustered(n + queries, dim, seed=1); the last --queries rows
are held-out queries; exact ground truth (k = 10, l2). Rows of that generator
are i.i.d., so the contiguous row ranges kdr.build gives each shard are a
balanced random partition.

1. Build. The single-collection baseline (no Ray): kd.Collection.create, add
   all vectors, commit, merge(max_segments=1), in this process; wall time and
   CPU seconds (time.process_time(), all its threads). Then kdr.build into 1,
   2 and 4 shards on a local Ray cluster of --cpus CPUs, after one warm-up
   build; --build-rounds rounds of all four, order rotated, medians. CPU seconds of a Ray
   build: utime + stime + cutime + cstime (/proc/PID/stat) summed over this
   driver and every process descending from it (gcs_server, raylet, the
   ray::  worker processes that run the build tasks and Ray Data), read just
   before and just after kdr.build; split into workers (ray::*), Ray's own
   processes and the driver (which fits the quantizer).
2. Fan-out. One batch of --queries queries, k = 10, default ef/oversample,
   --rounds rounds, the configurations interleaved in each round (order
   rotated) so that load drifts hit them alike: (a) one collection holding
   all vectors, in this process; (b) the 4-shard index through kdr.open (one
   actor per shard); (c) the same 4 shard collections opened with
   kd.Collection.open in this process and searched one after another, top k
   merged here, and (d) the same with one thread per shard at once (the C
   core releases the GIL, so I/O waits overlap as they do across actors):
   the faster of (c) and (d) is the physical bound of any fan-out on this
   host, the same graph searches and reads with no Ray. p50 of the rounds,
   QPS = queries / p50; ratios are taken in this run. Goal: (b) >= 0.7 x (a):
   PASS; else "blocked" when the bound is below 0.7 x (a) too; else FAIL.
3. Routing. k-means (numpy, k-means++ seeding, on a sample) into 4 centroids;
   every row goes to its nearest centroid, one collection per cluster (the
   4-shard build's quantizer, as kdr.build shares it). Each query searches
   only the shards of its nearest 1, 2 (or all 4) centroids; recall@10
   against exact truth, shards searched per query and in-process QPS, against
   the 4 balanced shards searched in full (c).
"""
import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOAL_RATIO = 0.7
TICK = os.sysconf("SC_CLK_TCK")


def _loadavg():
    return [round(float(v), 2) for v in open("/proc/loadavg").read().split()[:3]]


def _proc_table():
    """pid -> (ppid, cpu seconds incl. reaped children, name) for every process."""
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                raw = f.read()
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmd = f.read().split(b"\0")[0].decode(errors="replace")
        except OSError:
            continue
        comm = raw[raw.index("(") + 1:raw.rindex(")")]
        rest = raw[raw.rindex(")") + 2:].split()
        ticks = sum(int(v) for v in rest[11:15])          # utime stime cutime cstime
        out[int(name)] = (int(rest[1]), ticks / TICK, cmd or comm)
    return out


def tree_cpu():
    """CPU seconds of this process and all its descendants, by kind."""
    table = _proc_table()
    me = os.getpid()
    kids = {}
    for pid, (ppid, _, _) in table.items():
        kids.setdefault(ppid, []).append(pid)
    seen, todo = [], [me]
    while todo:
        pid = todo.pop()
        seen.append(pid)
        todo.extend(kids.get(pid, []))
    by = {"driver": 0.0, "workers": 0.0, "ray_system": 0.0}
    pids = {}
    for pid in seen:
        if pid not in table:
            continue
        _, cpu, cmd = table[pid]
        kind = ("driver" if pid == me else "workers" if cmd.startswith("ray::")
                else "ray_system")
        by[kind] += cpu
        pids[pid] = (kind, cpu)
    return by, pids


def cpu_delta(before, after):
    """Per kind: CPU used between two tree_cpu() snapshots (a process that
    appeared in between counts from zero)."""
    out = {"driver": 0.0, "workers": 0.0, "ray_system": 0.0}
    for pid, (kind, cpu) in after[1].items():
        out[kind] += cpu - before[1].get(pid, (kind, 0.0))[1]
    out = {k: round(v, 2) for k, v in out.items()}
    out["total"] = round(sum(out.values()), 2)
    out["processes"] = len(after[1])
    return out


def merge_top_k(parts, k):
    """Global top k (l2) of per-shard (D, I) pairs over the same queries."""
    D = np.concatenate([p[0] for p in parts], axis=1)
    ids = np.concatenate([p[1] for p in parts], axis=1)
    order = np.argsort(D, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(D, order, 1), np.take_along_axis(ids, order, 1)


def kmeans(x, c, iters, seed):
    """Lloyd's k-means with k-means++ seeding; returns the centroids."""
    rng = np.random.default_rng(seed)
    x = x.astype(np.float64)
    cent = [x[rng.integers(len(x))]]
    for _ in range(1, c):
        d = np.min(((x[:, None, :] - np.array(cent)[None]) ** 2).sum(-1), axis=1)
        cent.append(x[rng.choice(len(x), p=d / d.sum())])
    cent = np.array(cent)
    for _ in range(iters):
        lab = nearest(x, cent)
        for j in range(c):
            if (lab == j).any():
                cent[j] = x[lab == j].mean(0)
    return cent.astype(np.float32)


def centroid_order(x, cent):
    d = (x.astype(np.float64) ** 2).sum(1)[:, None] - 2 * x @ cent.T.astype(np.float64) \
        + (cent.astype(np.float64) ** 2).sum(1)[None]
    return np.argsort(d, axis=1, kind="stable")


def nearest(x, cent, block=65536):
    return np.concatenate([centroid_order(x[s:s + block], cent)[:, 0]
                           for s in range(0, len(x), block)])


def routed_search(shards, order, q, k, route):
    """Each query searches the shards of its nearest `route` centroids."""
    D = np.full((len(q), route * k), np.inf, np.float32)
    I = np.full((len(q), route * k), -1, np.int64)
    for j in range(route):
        for s, col in enumerate(shards):
            rows = np.flatnonzero(order[:, j] == s)
            if len(rows):
                d, i = col.search(q[rows], k)
                D[rows, j * k:(j + 1) * k] = d
                I[rows, j * k:(j + 1) * k] = i
    return merge_top_k([(D, I)], k)


def interleaved(configs, rounds):
    """p50 and all times of each config, rounds interleaved, order rotated."""
    names = list(configs)
    times = {n: [] for n in names}
    for r in range(rounds):
        for n in names[r % len(names):] + names[:r % len(names)]:
            t = time.perf_counter()
            configs[n]()
            times[n].append(time.perf_counter() - t)
    return times


def _snapshot(work):
    """Copy the package (with its built _core) so that a rebuild of the tree
    by someone else cannot change what this run measures."""
    dst = os.path.join(work, "pkg")
    shutil.copytree(os.path.join(ROOT, "python", "knndirect"), os.path.join(dst, "knndirect"),
                    ignore=shutil.ignore_patterns("__pycache__"))
    return dst


def _git():
    def run(*a):
        return subprocess.run(["git", "-C", ROOT, *a], capture_output=True, text=True).stdout
    return {"commit": run("rev-parse", "--short", "HEAD").strip(),
            "dirty": sorted(line[3:] for line in run("status", "--short").splitlines())}


def _machine():
    mem = int(open("/proc/meminfo").readline().split()[1]) * 1024
    return {"machine": f"{platform.machine()}, {os.cpu_count()} cores, "
                       f"{mem / 2**30:.0f} GiB RAM", "kernel": platform.release(),
            "python": platform.python_version()}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--shards", default="1,2,4")
    ap.add_argument("--cpus", type=int, default=2)
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--build-rounds", type=int, default=3)
    ap.add_argument("--worker-niceness", type=int, default=0,
                    help="nice value of Ray's workers (Ray's own default is 15)")
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--kmeans-sample", type=int, default=20_000)
    ap.add_argument("--work", default=None, help="directory for the indexes (default: a temp dir)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--md", default=None)
    args = ap.parse_args(argv)
    argv_used = sys.argv[1:] if argv is None else list(argv)
    command = "python benchmarks/bench_ray.py " + " ".join(argv_used)

    work = args.work or tempfile.mkdtemp(prefix="bench_ray-")
    os.makedirs(work, exist_ok=True)
    pkg = _snapshot(work)
    sys.path.insert(0, pkg)
    import ray

    import knndirect as kd
    import knndirect.ray as kdr

    k, nq = args.k, args.queries
    out = {"command": command, **_machine(), "cores": os.cpu_count(), "git": _git(),
           "knndirect": kd.__file__, "n": args.n, "dim": args.dim, "queries": nq, "k": k,
           "ray": ray.__version__, "ray_cpus": args.cpus,
           "ray_worker_niceness": args.worker_niceness, "rounds": args.rounds,
           "started": time.strftime("%Y-%m-%d %H:%M:%S"), "loadavg_start": _loadavg(),
           "build": {}, "search": {}, "routing": {}}
    print(f"load {out['loadavg_start']}, package {kd.__file__}", flush=True)
    x = kd.datasets.clustered(args.n + nq, args.dim, seed=1)
    x, q = np.ascontiguousarray(x[:args.n]), np.ascontiguousarray(x[args.n:])
    truth, _ = kd.datasets.ground_truth(x, q, k)
    widest = max(int(s) for s in args.shards.split(","))
    try:
        # -- 1. build: the single collection (no Ray) and kdr.build by shard
        # count, --build-rounds rounds, the order rotated each round
        single = os.path.join(work, "single")
        # Ray starts its workers at nice 15 by default; on a shared host that
        # would rank the actors below every other job while the in-process
        # baselines run at nice 0. --worker-niceness 0 (the default here)
        # puts both at the same priority; the value is recorded.
        os.environ["RAY_worker_niceness"] = str(args.worker_niceness)
        ray.init(num_cpus=args.cpus, include_dashboard=False, configure_logging=False,
                 log_to_driver=False, runtime_env={"env_vars": {"PYTHONPATH": pkg}})
        ray.data.DataContext.get_current().enable_progress_bars = False
        ds = ray.data.from_numpy(x).materialize()
        kdr.build(ds, os.path.join(work, "warm"), column="data", num_shards=args.cpus)
        shutil.rmtree(os.path.join(work, "warm"))        # workers started, imports done

        def build_collection():
            shutil.rmtree(single, ignore_errors=True)
            t, c = time.perf_counter(), time.process_time()
            col = kd.Collection.create(single, args.dim, merge_policy=None)
            col.add(x)
            col.commit()
            col.merge(max_segments=1)
            col.close()
            return {"wall_s": time.perf_counter() - t, "cpu_s": time.process_time() - c}

        def build_ray(s):
            path = os.path.join(work, f"s{s}")
            shutil.rmtree(path, ignore_errors=True)
            before = tree_cpu()
            t = time.perf_counter()
            doc = kdr.build(ds, path, column="data", num_shards=s)
            wall = time.perf_counter() - t
            cpu = cpu_delta(before, tree_cpu())
            return {"wall_s": wall, "cpu_s": cpu["total"], "cpu": cpu,
                    "shard_counts": [sh["count"] for sh in doc["shards"]]}

        shard_counts = [int(v) for v in args.shards.split(",")]
        jobs = {"collection": build_collection}
        for s in shard_counts:
            jobs[f"ray_{s}"] = (lambda s=s: build_ray(s))
        runs = {name: [] for name in jobs}
        names = list(jobs)
        load0 = _loadavg()
        for r in range(args.build_rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:
                res = jobs[name]()
                res["loadavg"] = _loadavg()
                runs[name].append(res)
                print(f"build round {r} {name}: {res['wall_s']:.1f} s wall, "
                      f"{res['cpu_s']:.1f} CPU s {res.get('cpu', '')}", flush=True)
        base_w = np.array([v["wall_s"] for v in runs["collection"]])
        base_c = np.array([v["cpu_s"] for v in runs["collection"]])
        out["build"]["loadavg"] = [load0, _loadavg()]
        out["build"]["rounds"] = args.build_rounds
        for name, rs in runs.items():
            w = np.array([v["wall_s"] for v in rs])
            c = np.array([v["cpu_s"] for v in rs])
            entry = {"wall_s": round(float(np.median(w)), 2), "cpu_s": round(float(np.median(c)), 2),
                     "rounds": [{k_: (round(v_, 2) if isinstance(v_, float) else v_)
                                 for k_, v_ in v.items()} for v in rs]}
            if name != "collection":
                s = int(name.split("_")[1])
                parts = {kind: round(float(np.median([v["cpu"][kind] for v in rs])), 2)
                         for kind in ("workers", "ray_system", "driver")}
                entry.update({
                    "shards": s, "cpu_parts": parts, "threads_per_task": max(1, args.cpus // s),
                    "shard_counts": rs[-1]["shard_counts"],
                    "speedup_vs_collection": round(float(np.median(base_w) / np.median(w)), 3),
                    "speedup_median_of_rounds": round(float(np.median(base_w / w)), 3),
                    "cpu_vs_collection": round(float(np.median(c) / np.median(base_c)), 3),
                    "cpu_vs_collection_median_of_rounds": round(float(np.median(c / base_c)), 3)})
            out["build"][name] = entry

        # -- 2. fan-out against one collection and against the in-process bound
        col = kd.Collection.open(single)
        shard_dir = os.path.join(work, f"s{widest}")
        names = sorted(n for n in os.listdir(shard_dir) if n.startswith("shard-"))
        local = [kd.Collection.open(os.path.join(shard_dir, n)) for n in names]
        index = kdr.open(shard_dir)
        pool = ThreadPoolExecutor(len(local))        # the C core searches without the GIL
        configs = {
            "collection": lambda: col.search(q, k),
            f"ray_{widest}_shards": lambda: index.search(q, k),
            f"inprocess_{widest}_shards": lambda: merge_top_k([c.search(q, k) for c in local],
                                                              k),
            f"threads_{widest}_shards": lambda: merge_top_k(
                list(pool.map(lambda c: c.search(q, k), local)), k)}
        for f in configs.values():                  # warm: actors, page cache of the graph
            f()
        load0 = _loadavg()
        times = interleaved(configs, args.rounds)
        for name, f in configs.items():
            p50 = float(np.median(times[name]))
            out["search"][name] = {
                "p50_ms": round(p50 * 1e3, 2), "qps": round(nq / p50, 1),
                "rounds_ms": [round(v * 1e3, 2) for v in times[name]],
                "recall": round(kd.datasets.recall_at_k(f()[1], truth, k), 4)}
        base = np.array(times["collection"])
        fan = np.array(times[f"ray_{widest}_shards"])
        seq = np.array(times[f"inprocess_{widest}_shards"])
        thr = np.array(times[f"threads_{widest}_shards"])
        bound = seq if np.median(seq) <= np.median(thr) else thr   # the faster of the two
        ratio = float(np.median(base) / np.median(fan))
        bound_ratio = float(np.median(base) / np.median(bound))
        status = ("PASS" if ratio >= GOAL_RATIO else
                  "blocked" if bound_ratio < GOAL_RATIO else "FAIL")
        out["search"]["goal"] = {
            "want": f"QPS of {widest} shards on Ray >= {GOAL_RATIO} x one collection",
            "ratio": round(ratio, 3), "ratio_median_of_rounds": round(float(np.median(base / fan)), 3),
            "bound_ratio": round(bound_ratio, 3),
            "bound_ratio_median_of_rounds": round(float(np.median(base / bound)), 3),
            "bound": ("sequential" if bound is seq else "threads"),
            "sequential_ratio": round(float(np.median(base) / np.median(seq)), 3),
            "threads_ratio": round(float(np.median(base) / np.median(thr)), 3),
            "ray_vs_bound": round(float(np.median(bound) / np.median(fan)), 3),
            "status": status, "loadavg_start": load0, "loadavg_end": _loadavg()}
        print(json.dumps(out["search"], indent=1), flush=True)
        index.close()
        pool.shutdown()
        ray.shutdown()

        # -- 3. routing: k-means shards, queries to the nearest 1 / 2 / all shards
        rng = np.random.default_rng(7)
        sample = x[rng.choice(args.n, min(args.n, args.kmeans_sample), replace=False)]
        t = time.perf_counter()
        cent = kmeans(sample, widest, 20, seed=7)
        labels = nearest(x, cent)
        kmeans_s = time.perf_counter() - t
        quant = kd.load(os.path.join(shard_dir, "quantizer.kdx"))
        clustered_shards = []
        load0, t, c = _loadavg(), time.perf_counter(), time.process_time()
        for s in range(widest):
            rows = np.flatnonzero(labels == s)
            sc = kd.Collection.create(os.path.join(work, f"kmeans-{s}"), args.dim,
                                      merge_policy=None, _quantizer=quant)
            sc.add(x[rows], rows.astype(np.int64))
            sc.commit()
            sc.merge(max_segments=1)
            sc.close()
        build_wall, build_cpu = time.perf_counter() - t, time.process_time() - c
        clustered_shards = [kd.Collection.open(os.path.join(work, f"kmeans-{s}"))
                            for s in range(widest)]
        sizes = [len(sc) for sc in clustered_shards]
        qorder = centroid_order(q, cent)
        truth_shard = labels[truth]                     # the shard of every true neighbour
        routes = [r for r in (1, 2, widest) if r <= widest]
        rconfigs = {f"balanced_all_{widest}": configs[f"inprocess_{widest}_shards"],
                    "collection": configs["collection"]}
        for r in routes:
            rconfigs[f"kmeans_route_{r}"] = (lambda r=r: routed_search(clustered_shards, qorder,
                                                                        q, k, r))
        for f in rconfigs.values():
            f()
        load1 = _loadavg()
        rtimes = interleaved(rconfigs, args.rounds)
        table = {}
        for name, f in rconfigs.items():
            p50 = float(np.median(rtimes[name]))
            per_q = (widest if name.startswith("balanced") else 1 if name == "collection"
                     else int(name.rsplit("_", 1)[1]))
            table[name] = {"shards_per_query": per_q, "p50_ms": round(p50 * 1e3, 2),
                           "qps": round(nq / p50, 1),
                           "qps_vs_balanced_all": round(
                               float(np.median(rtimes[f"balanced_all_{widest}"])) / p50, 3),
                           "recall": round(kd.datasets.recall_at_k(f()[1], truth, k), 4)}
            if name.startswith("kmeans"):
                r = per_q
                reach = (truth_shard[:, :, None] == qorder[:, None, :r]).any(-1)
                table[name]["truth_reachable"] = round(float(reach.mean()), 4)
                table[name]["rows_searched_per_query"] = round(float(
                    np.mean(np.array(sizes)[qorder[:, :r]].sum(1))), 1)
        table[f"balanced_all_{widest}"]["rows_searched_per_query"] = args.n
        table["collection"]["rows_searched_per_query"] = args.n
        out["routing"] = {
            "kmeans": {"sample": len(sample), "iters": 20, "seconds": round(kmeans_s, 2)},
            "shard_sizes": sizes, "balanced_sizes": [len(c) for c in local],
            "largest_over_mean": round(max(sizes) / (args.n / widest), 3),
            "queries_per_shard_route1": np.bincount(qorder[:, 0], minlength=widest).tolist(),
            "build_wall_s": round(build_wall, 2), "build_cpu_s": round(build_cpu, 2),
            "build_loadavg": [load0, _loadavg()], "loadavg_start": load1,
            "loadavg_end": _loadavg(), "table": table}
        print(json.dumps(out["routing"], indent=1), flush=True)
        for c_ in clustered_shards + local + [col]:
            c_.close()
    finally:
        if ray.is_initialized():
            ray.shutdown()
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    out["loadavg_end"] = _loadavg()
    out["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
    out["rusage_self_maxrss_mib"] = round(
        resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
            f.write("\n")
    if args.md:
        with open(args.md, "w") as f:
            f.write(report(out))
    return out


def report(o):
    """ray.md: the figures of one run as Markdown tables."""
    ray_builds = {k_: b for k_, b in o["build"].items() if k_.startswith("ray_")}
    w = max(b["shards"] for b in ray_builds.values())
    col = o["build"]["collection"]
    lines = [
        "# knndirect.ray on one host", "",
        f"{o['n']:,} × {o['dim']} float32, kd.datasets.clustered(seed=1), l2, k = {o['k']}, "
        f"{o['queries']:,} held-out queries, exact ground truth; m = 16, ef_construction = 200, "
        f"1-bit codes, default ef / oversample; {o['machine']}, kernel {o['kernel']}, "
        f"Ray {o['ray']} (local cluster, num_cpus = {o['ray_cpus']}, workers at nice "
        f"{o['ray_worker_niceness']} like this process; Ray's default is 15); git {o['git']['commit']}; "
        f"{o['started']} – {o['finished']}.", "",
        f"Command: `{o['command']}`", "",
        f"Machine load (1/5/15-min load averages): {o['loadavg_start']} at the start, "
        f"{o['loadavg_end']} at the end. The host is shared: other jobs ran beside this one, so "
        "absolute times are noisy; every comparison is a ratio taken in this run (the "
        "configurations interleaved round by round, order rotated, medians of the rounds).", "",
        f"## Build ({o['build']['rounds']} rounds; load {o['build']['loadavg'][0]} → "
        f"{o['build']['loadavg'][1]})", "",
        "Wall time and CPU seconds, medians of the rounds. The single collection's CPU is "
        "time.process_time() of this process (all threads); a Ray build's is utime + stime "
        "(+ reaped children) from /proc/PID/stat summed over the driver and every process under "
        "it, read before and after kdr.build: workers = the ray:: processes running the build "
        "tasks and Ray Data, Ray = gcs_server, raylet and helpers, driver = this process (it "
        "fits the quantizer). One warm-up kdr.build ran first (worker start-up and imports "
        "are not counted).", "",
        "| build | shards | threads per task | wall | speed-up vs one collection | CPU s (workers + Ray + driver) | CPU vs one collection |",
        "| --- | --- | --- | --- | --- | --- | --- |",
        f"| one collection, no Ray | 1 | {o['cores']} | {col['wall_s']:.1f} s | 1.00× | "
        f"{col['cpu_s']:.1f} | 1.00× |"]
    for b in ray_builds.values():
        c = b["cpu_parts"]
        lines.append(f"| kdr.build | {b['shards']} | {b['threads_per_task']} | {b['wall_s']:.1f} s | "
                     f"{b['speedup_vs_collection']:.2f}× ({b['speedup_median_of_rounds']:.2f}×) | "
                     f"{b['cpu_s']:.1f} ({c['workers']:.1f} + {c['ray_system']:.1f} + "
                     f"{c['driver']:.1f}) | {b['cpu_vs_collection']:.2f}× |")
    lines += ["", "Speed-up: ratio of the median walls (in brackets: the median of the "
              "per-round ratios)."]
    s, g = o["search"], o["search"]["goal"]
    lines += ["", f"## Fan-out: one batch of {o['queries']:,} queries", "",
              "| configuration | p50 per batch | QPS | QPS vs one collection | recall@10 |",
              "| --- | --- | --- | --- | --- |"]
    labels = {"collection": "one collection (all vectors, in-process)",
              f"ray_{w}_shards": f"{w} shards on Ray (kdr.open, one actor per shard)",
              f"inprocess_{w}_shards": f"{w} shard collections in-process, one after another, no Ray",
              f"threads_{w}_shards": f"{w} shard collections in-process, one thread per shard at once, no Ray"}
    for name, label in labels.items():
        r = s[name]
        lines.append(f"| {label} | {r['p50_ms']:.1f} ms | {r['qps']:,.0f} | "
                     f"{s['collection']['p50_ms'] / r['p50_ms']:.2f}× | {r['recall']:.4f} |")
    lines += ["", f"Goal: {g['want']}: **{g['status']}** — measured {g['ratio']:.2f}× (median of "
              f"per-round ratios {g['ratio_median_of_rounds']:.2f}×); the in-process bound (the same "
              f"{w} shards, no Ray; the faster of one-after-another, {g['sequential_ratio']:.2f}×, "
              f"and one thread per shard, {g['threads_ratio']:.2f}×) is {g['bound_ratio']:.2f}× "
              f"({g['bound_ratio_median_of_rounds']:.2f}×), and Ray reaches "
              f"{g['ray_vs_bound']:.2f}× of that bound. Status rule: PASS if the measured ratio "
              f"≥ {GOAL_RATIO}; blocked if it is not and the no-Ray bound is below {GOAL_RATIO} too "
              f"(no fan-out could reach the goal on this host); FAIL otherwise. Load {g['loadavg_start']} → "
              f"{g['loadavg_end']}.",
              "", "## Routing: a k-means partition vs balanced shards", ""]
    r = o["routing"]
    lines += [f"k-means (numpy, k-means++ seeding, {r['kmeans']['iters']} iterations on "
              f"{r['kmeans']['sample']:,} sampled rows) into {w} centroids; each row to its "
              f"nearest; one collection per cluster with the shared quantizer "
              f"(build {r['build_wall_s']:.1f} s wall, {r['build_cpu_s']:.1f} CPU s in-process). "
              f"Cluster shard sizes {r['shard_sizes']} (largest {r['largest_over_mean']:.2f}× "
              f"the mean) against balanced {r['balanced_sizes']}; queries whose nearest centroid "
              f"is each shard: {r['queries_per_shard_route1']}. All in-process, interleaved "
              "rounds.", "",
              "| configuration | shards per query | rows searched per query | p50 per batch | QPS | QPS vs balanced, all shards | recall@10 | true neighbours in the searched shards |",
              "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, t in r["table"].items():
        reach = f"{t['truth_reachable']:.4f}" if "truth_reachable" in t else "1"
        lines.append(f"| {name} | {t['shards_per_query']} | {t['rows_searched_per_query']:,.0f} | "
                     f"{t['p50_ms']:.1f} ms | {t['qps']:,.0f} | {t['qps_vs_balanced_all']:.2f}× | "
                     f"{t['recall']:.4f} | {reach} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
