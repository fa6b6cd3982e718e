"""Larger than RAM: knndirect searched under a memory cap a quarter of its
float32 data, against the device's own limits and against diskannpy.

    sudo python benchmarks/bench_disk.py [--n 1000000] [--dim 768] [--queries 1000]
        [--cap-fraction 0.25] [--dir DIR] [--skip-build] [--peers diskann]
    sudo python benchmarks/bench_disk.py --quick          # 100k x 768, 200 queries
    sudo python benchmarks/bench_disk.py --build-only     # data, ground truth, indexes

What one run does:
  * data: knndirect.datasets.clustered(n + queries, dim) generated in chunks
    straight into a .npy memmap (never held twice; the same rows clustered()
    returns), the last `queries` rows held out as queries; exact ground truth
    (float64 brute force, knndirect.datasets.ground_truth, in blocks); the
    index built once (m=16, ef_construction=200, all cores) and saved; the
    diskannpy disk index built once. All cached in --dir and reused.
  * device probe: fio random 4 KiB O_DIRECT reads over the index file's vector
    section, queue depth 1 (latency) and 32 (IOPS), so that every figure can be
    put against the device's limit.
  * the measurements run in child processes, each started after the page
    cache is dropped; the capped ones in a memory cgroup (v1 or v2, whichever
    is mounted) whose limit counts page cache too: cap-fraction x the float32
    data, raised if needed to what the index keeps in RAM
    (info()["resident_bytes"]) + an allowance for Python and numpy.
      - in RAM (no cap): the same file kd.load-ed: recall and batch QPS over an
        ef x oversample grid, which picks two more operating points, each the
        candidate with the highest min(I/O bound, CPU bound): "lower" (the
        recall-tuned lower oversample: below the default's, with recall >= 0.95
        or the default's recall where that is lower) and "tuned" (recall >=
        0.95); then one query at a time, batches and the open loop at every
        point: the CPU side of every bound and the in-RAM side of the rerank
        overhead;
      - under the cap, for io_uring, threads, pread and mmap: single stream
        (p50/p99, recall@10, reads and bytes per query as the index counts
        them and as the kernel does, graph time, I/O wait) and batch QPS;
      - under the cap, io_uring: batch QPS over the grid (the recall/QPS front);
      - under the cap, io_uring: an open-loop load: Poisson arrivals, a bounded
        queue that sheds when full, a pool of worker threads, latency from the
        intended arrival time; the highest rate with p99 <= 50 ms and <= 0.1%
        shed, at every operating point;
      - diskannpy's disk index (PQ codes and a node cache in RAM, graph and full
        vectors on disk) under the same cap: QPS at recall 0.95.
Writes benchmarks/results/disk.json and disk.md. Needs root for the cgroup
and the cache drops; without root it runs uncapped and warm, and says so.

The pieces other benchmarks share live beside it: cgroup.py (the memory
cap), device_probe.py (fio), openloop.py (the load generator), diskio.py
(cache drops, /proc/self/io, the vector section's place) and disk_report.py
(the summary, disk.md and disk.json).
"""
from __future__ import annotations

import argparse
import atexit
import json
import os
import platform
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from cgroup import Cgroup, MemoryWatch  # noqa: E402
from device_probe import fio_randread  # noqa: E402
from disk_report import K, TARGET_RECALL, fmt, shortlist, summarize, write_results  # noqa: E402
from diskio import drop_caches, proc_io, vector_section  # noqa: E402
from openloop import find_rate, open_loop, pct  # noqa: E402

P99_LIMIT_S = 0.050
SHED_LIMIT = 0.001
OVERSAMPLES = (1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 12.0, 16.0, 20.0, 24.0, 32.0)
GRID_EFS = (32, 64, 128, 192, 256, 384, 512)
OVERSAMPLES_QUICK = (1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0)
GRID_EFS_QUICK = (32, 64, 128, 256)
BACKENDS = ("io_uring", "threads", "pread", "mmap")


# ---------------------------------------------------------------- small helpers

def log(msg):
    print(msg, flush=True)


def loadavg():
    return [round(x, 2) for x in os.getloadavg()]


# ---------------------------------------------------------------- data

def clustered_into(out_base, out_queries, n, dim, *, n_clusters=64, spread=0.5, seed=0,
                   step=65536):
    """knndirect.datasets.clustered(n + len(out_queries), dim, seed=seed), written
    row block by row block into out_base (n rows, e.g. a memmap) and
    out_queries (the rows after them), so the whole set is never in memory.
    Draws from the generator in the same order as clustered(), so the rows
    are the same."""
    rng = np.random.default_rng(seed)
    scale = (1.0 / np.sqrt(1.0 + np.arange(dim) / 8.0)).astype(np.float32)
    centres = rng.standard_normal((n_clusters, dim), dtype=np.float32) * scale
    total = n + len(out_queries)
    for start in range(0, total, step):
        end = min(total, start + step)
        labels = rng.integers(0, n_clusters, end - start)
        noise = rng.standard_normal((end - start, dim), dtype=np.float32)
        block = centres[labels] + spread * noise * scale
        a, b = start, min(end, n)
        if b > a:
            out_base[a:b] = block[:b - a]
        if end > n:
            q0 = max(start, n)
            out_queries[q0 - n:end - n] = block[q0 - start:]


def check_generator():
    """The chunked writer gives the rows knndirect.datasets.clustered gives."""
    from knndirect.datasets import clustered
    n, nq, dim = 70_000, 100, 16
    ref = clustered(n + nq, dim, seed=3)
    base, q = np.empty((n, dim), np.float32), np.empty((nq, dim), np.float32)
    clustered_into(base, q, n, dim, seed=3)
    if not (np.array_equal(ref[:n], base) and np.array_equal(ref[n:], q)):
        raise RuntimeError("clustered_into no longer matches knndirect.datasets.clustered")


def prepare_data(args, paths):
    """Base vectors (.npy memmap), queries, warm-up queries and ground truth."""
    from knndirect.datasets import ground_truth

    if not (os.path.exists(paths["base"]) and os.path.exists(paths["queries"])):
        check_generator()
        t = time.perf_counter()
        tmp_base, tmp_q = paths["base"] + ".tmp.npy", paths["queries"] + ".tmp.npy"
        base = np.lib.format.open_memmap(tmp_base, mode="w+", dtype=np.float32,
                                         shape=(args.n, args.dim))
        q = np.empty((args.queries, args.dim), np.float32)
        clustered_into(base, q, args.n, args.dim, seed=args.seed)
        base.flush()
        del base
        np.save(tmp_q, q)
        os.replace(tmp_base, paths["base"])
        os.replace(tmp_q, paths["queries"])
        log(f"data: {args.n:,} x {args.dim} clustered float32 (+{args.queries} held-out "
            f"queries) written to {paths['base']} in {time.perf_counter() - t:.0f} s")
    base = np.load(paths["base"], mmap_mode="r")
    q = np.load(paths["queries"])
    if not os.path.exists(paths["warm"]):
        # Warm-up queries: base rows, so they share nothing with the measured queries.
        rows = np.linspace(0, args.n - 1, 32).astype(np.int64)
        np.save(paths["warm"], np.ascontiguousarray(base[rows]))
    if not os.path.exists(paths["gt"]):
        t = time.perf_counter()
        ids, _ = ground_truth(base, q, K, "l2", block=16384)
        np.save(paths["gt"], ids)
        log(f"ground truth: exact top-{K} (float64 brute force) in "
            f"{time.perf_counter() - t:.0f} s -> {paths['gt']}")
    return base, q


def write_diskann_bin(base, path, rows=65536):
    """DiskANN's .bin layout: int32 count, int32 dim, then the rows."""
    n, dim = base.shape
    with open(path + ".tmp", "wb") as f:
        f.write(struct.pack("<ii", n, dim))
        for s in range(0, n, rows):
            f.write(np.ascontiguousarray(base[s:s + rows], dtype=np.float32).tobytes())
    os.replace(path + ".tmp", path)


# ---------------------------------------------------------------- children

def child_env(args_snapshot):
    env = dict(os.environ)
    if args_snapshot:
        env["PYTHONPATH"] = args_snapshot + os.pathsep + env.get("PYTHONPATH", "")
    return env


def run_child(spec, *, cgroup=None, snapshot=None, drop=False, timeout=None, script=None):
    """Run `bench_disk.py --worker SPEC` (or script's) in the cgroup when given
    and return its result dict, with the group's memory figures under "memory"."""
    workdir = tempfile.mkdtemp(prefix="kd-disk-")
    spec_path, out_path = os.path.join(workdir, "spec.json"), os.path.join(workdir, "out.json")
    with open(spec_path, "w") as f:
        json.dump(spec, f)
    dropped = drop_caches() if drop else False
    watch = MemoryWatch(cgroup) if cgroup else None
    load0 = loadavg()
    t = time.perf_counter()
    try:
        r = subprocess.run([sys.executable, os.path.abspath(script or __file__), "--worker",
                            spec_path, out_path], env=child_env(snapshot), timeout=timeout,
                           preexec_fn=cgroup.enter if cgroup else None)
        rc = r.returncode
    except subprocess.TimeoutExpired:
        rc = "timeout"
    wall = time.perf_counter() - t
    mem = watch.finish() if watch else None
    try:
        with open(out_path) as f:
            out = json.load(f)
    except (OSError, ValueError):
        out = {"error": f"worker exited with {rc} and wrote no result"}
    shutil.rmtree(workdir, ignore_errors=True)
    if rc != 0 and "error" not in out:
        out["error"] = f"worker exited with {rc}"
    out.update({"returncode": rc, "memory": mem, "capped": cgroup is not None,
                "cache_dropped": dropped,
                "wall_s": wall, "loadavg_start": load0, "loadavg_end": loadavg()})
    return out


def single_stream(index, queries, gt, kw, warm):
    """One query at a time: latencies, recall, and read counters per query."""
    from knndirect.datasets import recall_at_k
    for q in warm:
        index.search(q, K, **kw)
    index.stats(reset=True)
    io0 = proc_io()
    lat = np.empty(len(queries))
    found = np.empty((len(queries), K), np.int64)
    for i, q in enumerate(queries):
        t = time.perf_counter()
        _, found[i] = index.search(q, K, **kw)
        lat[i] = time.perf_counter() - t
    io1 = proc_io()
    st = index.stats()
    nq = max(1, st["queries"])
    return {"n": len(queries), "p50_ms": pct(lat, 50) * 1e3, "p99_ms": pct(lat, 99) * 1e3,
            "mean_ms": float(lat.mean()) * 1e3, "recall": recall_at_k(found, gt, K),
            "reads_per_query": st["read_ops"] / nq, "bytes_per_query": st["read_bytes"] / nq,
            "rerank_per_query": st["rerank_vectors"] / nq,
            # records read while the beam ran that the final shortlist dropped:
            # re-scored and counted in rerank_vectors, but not in the shortlist
            "early_reads_per_query": st.get("early_reads", 0) / nq,
            "early_unused_per_query": st.get("early_unused", 0) / nq,
            "shortlist_per_query": (st["rerank_vectors"] - st.get("early_unused", 0)) / nq,
            "io_wait_ms_per_query": st["io_wait_seconds"] / nq * 1e3,
            "graph_ms_per_query": st.get("graph_seconds", 0.0) / nq * 1e3,
            "rerank_ms_per_query": st.get("rerank_seconds", 0.0) / nq * 1e3,
            "kernel_bytes_per_query": (io1["read_bytes"] - io0["read_bytes"]) / len(queries)}


def batch_qps(search, queries, gt, min_s=1.0, passes=3):
    """Whole passes over the query set as one call: QPS of the median pass."""
    from knndirect.datasets import recall_at_k
    search(queries[:min(64, len(queries))])
    times, found = [], None
    t_all = time.perf_counter()
    while len(times) < passes or (time.perf_counter() - t_all < min_s and len(times) < 20):
        t = time.perf_counter()
        found = search(queries)
        times.append(time.perf_counter() - t)
    return {"qps": len(queries) / statistics.median(times), "recall": recall_at_k(found, gt, K),
            "passes": len(times)}


def worker_main(spec_path, out_path, tasks=None):
    import warnings
    warnings.simplefilter("ignore", RuntimeWarning)
    with open(spec_path) as f:
        spec = json.load(f)
    out = {"task": spec["task"]}
    try:
        out.update((tasks or TASKS)[spec["task"]](spec))
    except Exception as e:  # reported in the results, the run goes on
        import traceback
        traceback.print_exc()
        out["error"] = f"{type(e).__name__}: {e}"
    with open(out_path, "w") as f:
        json.dump(out, f)
    return 0


def _inputs(spec):
    q = np.load(spec["queries"])
    gt = np.load(spec["gt"])
    warm = np.load(spec["warm"])
    return q, gt, warm


def task_build(spec):
    import knndirect as kd
    base = np.load(spec["base"], mmap_mode="r")
    n, dim = base.shape
    index = kd.Index(dim, "l2", m=spec["m"], ef_construction=spec["ef_construction"])
    chunk = 50_000
    t = time.perf_counter()
    for s in range(0, n, chunk):
        index.add(np.ascontiguousarray(base[s:s + chunk]), threads=spec["threads"])
        done = min(n, s + chunk)
        el = time.perf_counter() - t
        print(f"  build: {done:,}/{n:,} vectors, {el:.0f} s, load {loadavg()[0]}",
              file=sys.stderr, flush=True)
    build_s = time.perf_counter() - t
    index.save(spec["index"])
    return {"build_s": build_s, "n": n, "dim": dim, "file_bytes": os.path.getsize(spec["index"]),
            "knndirect": kd.__file__}


def _kw(point):
    """search() keywords of an operating point {"ef": .., "oversample": ..};
    None leaves the index's default."""
    return {k: v for k, v in (point or {}).items() if v is not None}


def _grid(index, q, gt, efs, oversamples, count_reads=False):
    """One batch pass (after a short warm-up) per (ef, oversample), 2 threads."""
    points = []
    for ef in efs:
        for os_ in oversamples:
            index.stats(reset=True)
            b = batch_qps(lambda x, e=ef, o=os_: index.search(x, K, ef=e, oversample=o,
                                                              threads=2)[1],
                          q, gt, min_s=0, passes=1)
            b.update({"ef": ef, "oversample": os_})
            if count_reads:
                st = index.stats()
                b["reads_per_query"] = st["read_ops"] / max(1, st["queries"])
            points.append(b)
    return points


def _measure(index, spec, q, gt, warm, where):
    """Single stream and batch at each operating point, then the open loop."""
    out = {"single": {}, "batch": {}, "load": {}}
    for label, point in spec.get("points", {}).items():
        if spec.get("single", True):
            out["single"][label] = single_stream(index, q, gt, _kw(point), warm)
        if spec.get("batch", True):
            out["batch"][label] = batch_qps(
                lambda x, kw=_kw(point): index.search(x, K, threads=2, **kw)[1], q, gt)
    for label, start in spec.get("load", {}).items():
        kw = _kw(spec["points"][label])
        if start is None:
            start = 0.5 * out["batch"][label]["qps"]
        print(f"  {where}, open loop at the {label} point {kw}:", flush=True)
        index.stats(reset=True)
        r = find_rate(
            lambda rate, kw=kw: open_loop(lambda x: index.search(x, K, **kw)[1], q, gt, rate,
                                          spec["load_seconds"], spec["workers"],
                                          spec["queue"], seed=int(rate), k=K,
                                          p99_limit_s=P99_LIMIT_S, shed_limit=SHED_LIMIT),
            start, spec["max_trials"])
        st = index.stats()
        r["reads_per_query"] = st["read_ops"] / max(1, st["queries"])
        out["load"][label] = r
    return out


def task_memory(spec):
    """The index fully in RAM (kd.load): recall and QPS over the grid, and the
    CPU side of every bound."""
    import knndirect as kd
    q, gt, warm = _inputs(spec)
    t = time.perf_counter()
    index = kd.load(spec["index"])
    out = {"load_s": time.perf_counter() - t, "info": index.info(), "knndirect": kd.__file__}
    if spec.get("grid_efs"):
        out["grid"] = _grid(index, q, gt, spec["grid_efs"], spec["grid_oversamples"])
    out.update(_measure(index, spec, q, gt, warm, "in RAM"))
    index.close()
    return out


def evict_vectors(path):
    """Drop the page cache's copy of an index file's vector section (pages
    no process maps any more), leaving its graph and codes cached."""
    off, length = vector_section(path)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, off, length, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def task_disk(spec):
    """The opened index under the cap: single stream, batch, grid, open loop."""
    import knndirect as kd
    points = spec.get("points", {})
    if spec["backend"] == "mmap" and len(points) > 1:
        # Each point from a cold start: the index closed (its mapping gone)
        # and the vectors evicted, or a point would find the pages that the
        # ones before it read.
        out = {"single": {}, "batch": {}, "load": {}}
        for label, point in points.items():
            evict_vectors(spec["index"])
            part = task_disk(dict(spec, points={label: point}))
            for key in ("single", "batch"):
                out[key].update(part.get(key, {}))
            out.update({k: v for k, v in part.items() if k not in out})
        return out
    q, gt, warm = _inputs(spec)
    t = time.perf_counter()
    index = kd.open(spec["index"], io_backend=spec["backend"])
    out = {"open_s": time.perf_counter() - t, "info": index.info(), "knndirect": kd.__file__}
    if spec.get("grid_efs"):
        out["grid"] = _grid(index, q, gt, spec["grid_efs"], spec["grid_oversamples"],
                            count_reads=True)
    out.update(_measure(index, spec, q, gt, warm, "under the cap"))
    index.close()
    return out


def task_diskann_build(spec):
    import diskannpy
    t = time.perf_counter()
    diskannpy.build_disk_index(
        data=spec["bin"], distance_metric=spec.get("metric", "l2"), index_directory=spec["dir"],
        complexity=spec["L"], graph_degree=spec["R"],
        search_memory_maximum=spec["search_gb"], build_memory_maximum=spec["build_gb"],
        num_threads=spec["threads"], pq_disk_bytes=0, vector_dtype=np.float32)
    return {"build_s": time.perf_counter() - t}


def task_diskann_search(spec):
    import diskannpy
    q, gt, warm = _inputs(spec)
    t = time.perf_counter()
    index = diskannpy.StaticDiskIndex(
        index_directory=spec["dir"], num_threads=2, num_nodes_to_cache=spec["cache_nodes"],
        cache_mechanism=1, distance_metric=spec.get("metric", "l2"), vector_dtype=np.float32,
        dimensions=q.shape[1])
    out = {"open_s": time.perf_counter() - t, "points": []}
    for w in spec["beam_widths"]:
        for L in spec["Ls"]:
            io0 = proc_io()
            b = batch_qps(lambda x, L=L, w=w: np.asarray(
                index.batch_search(x, K, L, 2, w).identifiers, np.int64), q, gt, min_s=0.5)
            io1 = proc_io()
            passes = b["passes"] + 64 / len(q)
            b.update({"L": L, "beam_width": w, "kernel_bytes_per_query":
                      (io1["read_bytes"] - io0["read_bytes"]) / (passes * len(q))})
            if w == spec["single_beam_width"]:
                for x in warm:
                    index.search(x, K, L, w)
                lat = np.empty(len(q))
                for i, x in enumerate(q):
                    t = time.perf_counter()
                    index.search(x, K, L, w)
                    lat[i] = time.perf_counter() - t
                b.update({"p50_ms": pct(lat, 50) * 1e3, "p99_ms": pct(lat, 99) * 1e3})
            print(f"  diskann L={L} W={w}: recall {b['recall']:.3f} QPS {b['qps']:.0f}",
                  flush=True)
            out["points"].append(b)
            if b["recall"] >= 0.98:   # past the 0.95 the comparison is read at
                break
    return out


def task_busy_probe(spec):
    """The depth-32 probe again while every core runs graph searches over the
    codes (rerank=False: no reads of their own), as the CPU side of a search
    load would: on a virtual disk the device's rate depends on the CPU left to
    drive it."""
    import knndirect as kd
    q = np.load(spec["queries"])
    index = kd.open(spec["index"], io_backend="io_uring")
    cores = os.cpu_count() or 1

    def burn(seconds, stop=None):
        done, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds and not (stop and stop.is_set()):
            index.search(q, K, rerank=False, threads=cores)
            done += len(q)
        return done / (time.perf_counter() - t0)

    alone = burn(spec["seconds"])
    stop, rate = threading.Event(), []
    t = threading.Thread(target=lambda: rate.append(burn(10 * spec["seconds"], stop)))
    t.start()
    time.sleep(1)
    fio = fio_randread(spec["index"], spec["offset"], spec["length"], 32, spec["seconds"])
    fio.pop("cpu_us_per_read", None)   # the searches' CPU time is in it too
    stop.set()
    t.join()
    index.close()
    return {"fio": fio, "graph_qps_alone": alone, "graph_qps_with_fio": rate[0],
            "threads": cores}


TASKS = {"build": task_build, "memory": task_memory, "disk": task_disk,
         "busy_probe": task_busy_probe,
         "diskann_build": task_diskann_build, "diskann_search": task_diskann_search}


# ---------------------------------------------------------------- parent

def snapshot_package(dest):
    """Copy the knndirect package (its built extension included) aside, so that
    every child of this run measures the same build even if the source tree is
    rebuilt meanwhile. Returns the directory to put on PYTHONPATH, or None."""
    import importlib.util
    spec = importlib.util.find_spec("knndirect")
    if spec is None or not spec.submodule_search_locations:
        return None
    src = list(spec.submodule_search_locations)[0]
    root = tempfile.mkdtemp(prefix="snapshot-", dir=dest)
    atexit.register(shutil.rmtree, root, True)
    shutil.copytree(src, os.path.join(root, "knndirect"),
                    ignore=shutil.ignore_patterns("__pycache__"))
    r = subprocess.run([sys.executable, "-c", "import knndirect, sys; "
                        "sys.stdout.write(knndirect.__file__)"],
                       env=child_env(root), capture_output=True, text=True)
    return root if r.returncode == 0 and r.stdout.startswith(root) else None


def git_state():
    def git(*a):
        r = subprocess.run(["git", "-C", REPO, *a], capture_output=True, text=True)
        return r.stdout.strip() if r.returncode == 0 else None
    return {"commit": git("rev-parse", "--short", "HEAD"),
            "csrc_dirty": bool(git("status", "--porcelain", "csrc"))}


def _best_bound(points, iops32):
    """Of grid points, the one whose lower bound, min(I/O bound = QD32 IOPS /
    shortlist, CPU bound = in-RAM batch QPS), is highest; None if none."""
    def bound(p):
        io = iops32 / shortlist(p["oversample"]) if iops32 else float("inf")
        return min(io, p["qps"])
    return max(points, key=bound, default=None)


def choose_lower(grid, iops32, d_os, d_recall):
    """The recall-tuned lower oversample: a grid point below the default
    oversample that keeps recall >= 0.95, or the default point's recall where
    that is lower (a wider beam may pay for the shorter shortlist), with the
    highest lower bound."""
    want = min(d_recall, TARGET_RECALL)
    return _best_bound([p for p in grid if p["oversample"] < d_os and p["recall"] >= want],
                       iops32)


def choose_tuned(grid, iops32):
    """The grid point with recall >= 0.95 with the highest lower bound."""
    return _best_bound([p for p in grid if p["recall"] >= TARGET_RECALL], iops32)


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--n", type=int, default=None, help="base vectors (default 1,000,000; "
                    "--quick 100,000)")
    ap.add_argument("--dim", type=int, default=768)
    ap.add_argument("--queries", type=int, default=None, help="held-out queries (default "
                    "1000; --quick 200)")
    ap.add_argument("--cap-fraction", type=float, default=0.25,
                    help="memory cap as a fraction of the float32 data (default 0.25)")
    ap.add_argument("--cap-overhead-mib", type=float, default=300,
                    help="allowance for Python, numpy and the libraries when the cap is "
                    "raised to what the index keeps in RAM (default 300)")
    ap.add_argument("--dir", default=os.path.join(HERE, "data", "disk"),
                    help="data, ground truth and indexes (a real disk; default "
                    "benchmarks/data/disk)")
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    ap.add_argument("--skip-build", action="store_true",
                    help="reuse the data and indexes in --dir; fail rather than build")
    ap.add_argument("--rebuild", action="store_true", help="rebuild the indexes")
    ap.add_argument("--build-only", action="store_true",
                    help="prepare the data, ground truth and indexes, then stop")
    ap.add_argument("--peers", default="diskann", help="'diskann' or '' (default diskann)")
    ap.add_argument("--quick", action="store_true", help="development run: 100k x 768, "
                    "200 queries, short probes and load trials")
    ap.add_argument("--m", type=int, default=16)
    ap.add_argument("--ef-construction", type=int, default=200)
    ap.add_argument("--build-threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--workers", type=int, default=8, help="open-loop worker threads")
    ap.add_argument("--queue", type=int, default=64, help="open-loop queue size")
    ap.add_argument("--load-seconds", type=float, default=None,
                    help="seconds per open-loop trial (default 20; --quick 4)")
    ap.add_argument("--max-trials", type=int, default=9, help="open-loop trials per search")
    ap.add_argument("--probe-seconds", type=int, default=None,
                    help="seconds per fio probe (default 10; --quick 3)")
    ap.add_argument("--diskann-R", type=int, default=64)
    ap.add_argument("--diskann-L", type=int, default=100)
    ap.add_argument("--diskann-pq-bytes", type=int, default=192,
                    help="diskann's in-RAM PQ code size per vector (default 192: with its "
                    "node cache, about the RAM knndirect keeps at 768 dims, ~296 B per "
                    "vector; with 48 its beam cannot tell neighbours apart on this data: "
                    "recall 0.38 at L 200 on 100k x 768, 0.99 at L 400 with 192)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--worker", nargs=2, metavar=("SPEC", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return args
    args.n = args.n or (100_000 if args.quick else 1_000_000)
    args.queries = args.queries or (200 if args.quick else 1000)
    args.load_seconds = args.load_seconds or (4.0 if args.quick else 20.0)
    args.probe_seconds = args.probe_seconds or (3 if args.quick else 10)
    if not args.quick and args.n < 500_000:
        log(f"note: --n {args.n:,} is below the 500k the larger-than-RAM figures call for")
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.worker:
        return worker_main(*args.worker)
    # SIGTERM unwinds like Ctrl-C: the running child is killed, the cgroup removed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    os.makedirs(args.dir, exist_ok=True)
    os.makedirs(args.out, exist_ok=True)
    res = {"command": "python benchmarks/bench_disk.py " + " ".join(sys.argv[1:] if argv is None
                                                                    else argv),
           "n": args.n, "dim": args.dim, "queries": args.queries, "k": K,
           "cores": os.cpu_count(),
           "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
                      f"{os.sysconf('SC_PHYS_PAGES') * os.sysconf('SC_PAGE_SIZE') / 2**30:.0f}"
                      f" GiB RAM", "kernel": platform.release(),
           "started": time.strftime("%Y-%m-%d %H:%M"), "loadavg_start": loadavg(),
           "git": git_state(), "load": {"workers": args.workers, "queue": args.queue,
                                        "seconds": args.load_seconds,
                                        "p99_limit_ms": P99_LIMIT_S * 1e3,
                                        "shed_limit": SHED_LIMIT}}
    snap = snapshot_package(args.dir)
    if snap:
        sys.path.insert(0, snap)
    import knndirect as kd
    res["knndirect"] = {"path": kd.__file__, "snapshot": bool(snap), "features": kd.features()}
    log(f"knndirect from {kd.__file__}" + (" (a snapshot: the whole run measures this build)"
                                           if snap else ""))

    tag = f"{args.n}x{args.dim}"
    paths = {"base": os.path.join(args.dir, f"base-{tag}-s{args.seed}.npy"),
             "queries": os.path.join(args.dir, f"queries-{tag}-s{args.seed}-{args.queries}.npy"),
             "warm": os.path.join(args.dir, f"warm-{tag}-s{args.seed}.npy"),
             "gt": os.path.join(args.dir, f"gt-{tag}-s{args.seed}-{args.queries}-k{K}.npy"),
             "index": os.path.join(args.dir, f"kd-{tag}-s{args.seed}-m{args.m}-"
                                             f"efc{args.ef_construction}.kdx"),
             "diskann": os.path.join(args.dir, f"diskann-{tag}-s{args.seed}-R{args.diskann_R}"
                                               f"-L{args.diskann_L}-pq{args.diskann_pq_bytes}")}
    if args.skip_build:
        missing = [p for k, p in paths.items() if k in ("base", "queries", "index")
                   and not os.path.exists(p)]
        if missing:
            raise SystemExit("--skip-build: missing " + ", ".join(missing))
    base, q = prepare_data(args, paths)
    data_bytes = args.n * args.dim * 4
    common = {"queries": paths["queries"], "gt": paths["gt"], "warm": paths["warm"],
              "index": paths["index"]}

    # -- build (once) ------------------------------------------------------------
    meta_path = paths["index"] + ".build.json"
    if args.rebuild or not os.path.exists(paths["index"]):
        log(f"building knndirect: {args.n:,} x {args.dim}, m={args.m}, "
            f"ef_construction={args.ef_construction}, {args.build_threads} threads "
            f"(load {loadavg()})")
        b = run_child({"task": "build", "base": paths["base"], "index": paths["index"],
                       "m": args.m, "ef_construction": args.ef_construction,
                       "threads": args.build_threads}, snapshot=snap)
        if "error" in b:
            raise SystemExit("build failed: " + b["error"])
        b["threads"] = args.build_threads
        with open(meta_path, "w") as f:
            json.dump(b, f)
    build = json.load(open(meta_path)) if os.path.exists(meta_path) else {}
    res["build"] = build
    if build:
        log(f"knndirect build: {build['build_s']:.0f} s on {build.get('threads')} threads "
            f"(load during build {build.get('loadavg_start')} -> {build.get('loadavg_end')})")

    with kd.open(paths["index"]) as ix:
        info = ix.info()
    if args.build_only:
        err = build_diskann(args, paths, base, info, snap) \
            if "diskann" in args.peers.split(",") else None
        if err:
            log(err)
        log("--build-only: data, ground truth and indexes are in " + args.dir)
        return 0
    file_bytes = os.path.getsize(paths["index"])
    vec_off, vec_len = vector_section(paths["index"])
    d_os, d_ef = info["default_oversample"], info["default_ef"]
    res["index"] = {"file_bytes": file_bytes, "vector_section": [vec_off, vec_len],
                    "data_bytes": data_bytes, **{k: info[k] for k in (
                        "resident_bytes", "record_size", "alignment", "code_size",
                        "default_oversample", "default_ef", "m", "ef_construction")}}
    log(f"index {paths['index']}: {file_bytes / 2**30:.2f} GiB, float32 data "
        f"{data_bytes / 2**30:.2f} GiB, resident {info['resident_bytes'] / 2**20:.0f} MiB, "
        f"record {info['record_size']} B, default oversample {d_os}, ef {d_ef}")

    # -- device probe ----------------------------------------------------------------
    log(f"device probe: fio randread 4 KiB O_DIRECT over the vector section, "
        f"{args.probe_seconds} s at depth 1 and 32 (load {loadavg()})")
    qd1 = fio_randread(paths["index"], vec_off, vec_len, 1, args.probe_seconds)
    qd32 = fio_randread(paths["index"], vec_off, vec_len, 32, args.probe_seconds)
    res["device"] = {"qd1": qd1, "qd32": qd32, "loadavg": loadavg()}
    log(f"  depth 1: {qd1}\n  depth 32: {qd32}")
    busy = run_child(dict(common, task="busy_probe", offset=vec_off, length=vec_len,
                          seconds=args.probe_seconds), snapshot=snap)
    res["device"]["qd32_busy"] = busy
    log(f"  depth 32 while {busy.get('threads')} threads run graph searches: "
        f"{busy.get('fio', busy.get('error'))}; graph searches "
        f"{fmt(busy.get('graph_qps_alone'), ',.0f')} q/s alone, "
        f"{fmt(busy.get('graph_qps_with_fio'), ',.0f')} q/s beside fio")
    iops32 = qd32.get("iops")

    # -- the cap ---------------------------------------------------------------------
    root = os.geteuid() == 0
    cg, cap = None, None
    floor = info["resident_bytes"] + int(args.cap_overhead_mib * 2**20)
    cap = max(int(args.cap_fraction * data_bytes), floor)
    res["cap"] = {"fraction": args.cap_fraction, "fraction_bytes":
                  int(args.cap_fraction * data_bytes), "floor_bytes": floor,
                  "cap_bytes": cap, "resident_bytes": info["resident_bytes"],
                  "overhead_bytes": int(args.cap_overhead_mib * 2**20)}
    if not root:
        log("NOT root: no memory cap and no page-cache drops; every figure is uncapped and "
            "warm, and the results say so")
        res["cap"]["error"] = "not root"
    else:
        try:
            cg = Cgroup(f"knndirect_bench_disk_{os.getpid()}")
            cg.set_limit(cap)
            res["cap"].update({"cgroup_version": cg.version, "cgroup": cg.path})
            log(f"memory cap: cgroup v{cg.version} {cg.path}, limit {cap / 2**20:.0f} MiB "
                f"(page cache included) = max({args.cap_fraction} x float32 data "
                f"{data_bytes / 2**20:.0f} MiB = {args.cap_fraction * data_bytes / 2**20:.0f}"
                f" MiB, resident {info['resident_bytes'] / 2**20:.0f} MiB + "
                f"{args.cap_overhead_mib:.0f} MiB for Python = {floor / 2**20:.0f} MiB); "
                f"the float32 data is {data_bytes / cap:.1f}x the cap")
            if cap > 0.25 * data_bytes:
                log("  note: the cap is above 1/4 of the data (the index's RAM part needs it)")
            log("before every configuration: sync; echo 3 > /proc/sys/vm/drop_caches")
        except OSError as e:
            log(f"no memory cgroup ({e}): uncapped")
            res["cap"]["error"] = str(e)
            cg = None
    res["cap"]["effective"] = cg is not None

    def capped(spec, label):
        log(f"[{label}] under the cap (load {loadavg()})")
        out = run_child(spec, cgroup=cg, snapshot=snap, drop=root)
        m = out.get("memory")
        if m:
            log(f"  memory: peak {m['peak_bytes'] / 2**20:.0f} MiB of the "
                f"{m['limit_bytes'] / 2**20:.0f} MiB cap (at most page cache "
                f"{m['max_cache_bytes'] / 2**20:.0f} MiB, anonymous "
                f"{m['max_anon_bytes'] / 2**20:.0f} MiB; limit reached {m['limit_hits']} times)")
        if "error" in out:
            log(f"  ERROR: {out['error']}")
        return out

    efs = sorted(set(GRID_EFS_QUICK if args.quick else GRID_EFS) | {d_ef})
    oversamples = sorted(set(OVERSAMPLES_QUICK if args.quick else OVERSAMPLES) | {d_os})
    load_kw = dict(load_seconds=args.load_seconds, workers=args.workers, queue=args.queue,
                   max_trials=args.max_trials)
    try:
        # -- in RAM: recall and QPS over the grid, then the operating points --------
        log(f"[in RAM] kd.load, no cap: grid of ef {efs} x oversample {oversamples} "
            f"(load {loadavg()})")
        mem = run_child(dict(common, task="memory", grid_efs=efs, grid_oversamples=oversamples),
                        snapshot=snap, drop=root)
        if "error" in mem:
            raise SystemExit("in-RAM run failed: " + mem["error"])
        d_rec = next(p["recall"] for p in mem["grid"]
                     if p["ef"] == d_ef and p["oversample"] == d_os)
        chosen = {"lower": choose_lower(mem["grid"], iops32, d_os, d_rec),
                  "tuned": choose_tuned(mem["grid"], iops32)}
        points = {"default": {"ef": None, "oversample": None}}
        res["points"] = {"default": {"ef": d_ef, "oversample": d_os}}
        for label, p in chosen.items():
            at = {"ef": p["ef"], "oversample": p["oversample"]} if p else None
            if at and at not in res["points"].values():
                points[label] = res["points"][label] = at
        why = {"lower": f"oversample < {d_os:g} keeping recall >= "
                        f"{min(d_rec, TARGET_RECALL):.4f}",
               "tuned": f"recall >= {TARGET_RECALL}"}
        log(f"  default point ef {d_ef}, oversample {d_os}: recall {d_rec:.4f}; "
            + "; ".join(f"{label} point ({why[label]}, highest min(I/O, CPU) bound): ef "
                        f"{p['ef']}, oversample {p['oversample']}, recall {p['recall']:.4f}"
                        + ("" if label in points else " (the same as an earlier point)")
                        if p else f"no grid point for the {label} point ({why[label]})"
                        for label, p in chosen.items()))
        res["device"]["batches"] = {}
        for label, point in res["points"].items():
            depth = shortlist(point["oversample"])
            pb = fio_randread(paths["index"], vec_off, vec_len, depth, args.probe_seconds,
                              batch=True)
            res["device"]["batches"][label] = pb
            log(f"device probe, one batch of {depth} reads at a time ({label} point's "
                f"shortlist): {fmt(pb.get('batch_ms'), '.3f')} ms per batch, "
                f"{pb.get('iops', 0):,.0f} IOPS")
        log(f"[in RAM] single stream, batch and open loop at {list(points)} (load {loadavg()})")
        mem2 = run_child(dict(common, task="memory", points=points,
                              load={label: None for label in points}, **load_kw),
                         snapshot=snap, drop=root)
        if "error" in mem2:
            raise SystemExit("in-RAM run failed: " + mem2["error"])
        mem.update({k: mem2[k] for k in ("single", "batch", "load")})
        res["memory"] = mem
        for label in points:
            x = mem["single"][label]
            log(f"  {label}: p50 {x['p50_ms']:.3f} ms, p99 {x['p99_ms']:.3f} ms, recall "
                f"{x['recall']:.4f}, batch {mem['batch'][label]['qps']:.0f} q/s, open loop "
                f"{mem['load'][label]['sustainable_rate']:.0f}/s")

        # -- single stream per backend under the cap ----------------------------------
        singles = {}
        for backend in BACKENDS:
            out = capped(dict(common, task="disk", backend=backend, points=points),
                         f"single stream and batch, {backend}")
            singles[backend] = out
            for label, x in out.get("single", {}).items():
                log(f"  {backend} {label}: p50 {x['p50_ms']:.3f} ms, p99 {x['p99_ms']:.3f} ms, "
                    f"recall {x['recall']:.4f}, {x['reads_per_query']:.1f} reads/query, "
                    f"{x['bytes_per_query'] / 1024:.1f} KiB/query (kernel "
                    f"{x['kernel_bytes_per_query'] / 1024:.1f} KiB), graph "
                    f"{x['graph_ms_per_query']:.3f} ms, I/O wait {x['io_wait_ms_per_query']:.3f}"
                    f" ms; batch {out.get('batch', {}).get(label, {}).get('qps', 0):.0f} q/s")
        res["single"] = singles

        # -- batch grid under the cap (io_uring) --------------------------------------
        res["grid"] = capped(dict(common, task="disk", backend="io_uring", grid_efs=efs,
                                  grid_oversamples=oversamples),
                             "batch grid, io_uring, 2 threads")

        # -- open loop under the cap (io_uring) ---------------------------------------
        loads = {}
        for label, point in res["points"].items():
            reads = shortlist(point["oversample"])
            io_bound = iops32 / reads if iops32 else None
            cpu_bound = mem["batch"][label]["qps"]
            start = 0.5 * min(b for b in (io_bound, cpu_bound) if b)
            out = capped(dict(common, task="disk", backend="io_uring", points=points,
                              batch=False, single=False, load={label: start}, **load_kw),
                         f"open loop, {label} point")
            out["io_bound"], out["cpu_bound"] = io_bound, cpu_bound
            loads[label] = out
        res["load_disk"] = loads

        # -- diskannpy under the cap ---------------------------------------------------
        res["diskann"] = run_diskann(args, paths, base, info, cg, cap, snap, root) \
            if "diskann" in args.peers.split(",") else {"skipped": "not asked (--peers)"}
    finally:
        if cg:
            cg.remove()
    res["loadavg_end"] = loadavg()
    res["finished"] = time.strftime("%Y-%m-%d %H:%M")
    res["summary"] = summarize(res)
    write_results(res, args.out)
    return 0


def diskann_params(args, info):
    """diskann keeps its PQ codes in RAM (pq_bytes per vector: diskann derives
    the chunk count from search_memory_maximum / n) and a cache of graph nodes
    (about one 4 KiB sector each). The cache takes what knndirect's RAM part
    takes beyond the PQ codes, so both hold about the same in RAM."""
    pq = args.diskann_pq_bytes
    search_gb = (pq + 0.5) * args.n / 2**30
    cache_nodes = max(1000, int((info["resident_bytes"] - pq * args.n) // 4096)) \
        if info else None
    return {"R": args.diskann_R, "L_build": args.diskann_L, "search_memory_maximum_gb": search_gb,
            "pq_bytes": pq, "cache_nodes": cache_nodes, "pq_disk_bytes": 0}


def build_diskann(args, paths, base, info, snap):
    """Build diskann's disk index once (cached in --dir). Returns an error
    string, or None."""
    d = paths["diskann"]
    done_flag = os.path.join(d, "build.json")
    if os.path.exists(done_flag) and not args.rebuild:
        return None
    try:
        import diskannpy  # noqa: F401
    except Exception as e:
        return f"diskannpy cannot be imported ({e})"
    p = diskann_params(args, info)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    binp = os.path.join(args.dir, f"diskann-base-{args.n}x{args.dim}.bin")
    write_diskann_bin(base, binp)
    build_gb = max(4.0, 2.5 * args.n * args.dim * 4 / 2**30)
    log(f"building diskann: R={p['R']}, L={p['L_build']}, search memory "
        f"{p['search_memory_maximum_gb']:.3f} GB ({p['pq_bytes']} PQ bytes/vector), "
        f"build memory {build_gb:.1f} GB, {args.build_threads} threads "
        f"(load {loadavg()})")
    b = run_child({"task": "diskann_build", "bin": binp, "dir": d, "R": p["R"],
                   "L": p["L_build"], "search_gb": p["search_memory_maximum_gb"],
                   "build_gb": build_gb, "threads": args.build_threads}, snapshot=snap)
    os.remove(binp)
    if "error" in b:
        return "diskann build failed: " + b["error"]
    b["threads"] = args.build_threads
    with open(done_flag, "w") as f:
        json.dump(b, f)
    log(f"diskann build: {b['build_s']:.0f} s")
    return None


def run_diskann(args, paths, base, info, cg, cap, snap, root):
    try:
        import importlib.metadata as md
        version = md.version("diskannpy")
    except Exception as e:
        return {"skipped": f"diskannpy not installed ({e})"}
    d = paths["diskann"]
    out = dict(diskann_params(args, info), version=version)
    done_flag = os.path.join(d, "build.json")
    if args.skip_build and not os.path.exists(done_flag):
        return dict(out, skipped=f"--skip-build and no diskann index at {d}")
    err = build_diskann(args, paths, base, info, snap)
    if err:
        return dict(out, skipped=err)
    out["build"] = json.load(open(done_flag))
    log(f"diskann build: {out['build']['build_s']:.0f} s")
    out["index_bytes"] = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))
    cache_nodes = out["cache_nodes"]
    Ls = [10, 20, 30, 50, 70, 100, 150, 200, 300, 400, 600, 800, 1000]
    spec = {"task": "diskann_search", "dir": d, "queries": paths["queries"], "gt": paths["gt"],
            "warm": paths["warm"], "Ls": Ls, "beam_widths": [2, 4, 8],
            "single_beam_width": 4, "cache_nodes": cache_nodes}
    log(f"[diskann search] under the cap (load {loadavg()})")
    r = run_child(spec, cgroup=cg, snapshot=snap, drop=root)
    out.update(r)
    if "error" in r:
        out["skipped"] = "diskann search failed: " + r["error"]
    return out


if __name__ == "__main__":
    sys.exit(main())
