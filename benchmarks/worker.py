"""One benchmark step in a process of its own, so that its peak RSS and its
timings belong to one system alone.

    python benchmarks/worker.py SPEC.json RESULT.json

SPEC has "phase": "build" (load the base vectors, build with N threads,
save; report build seconds, peak RSS, extra RSS, size on disk) or "search"
(load the saved index, report its resident bytes, then sweep the search knob
for each thread count: a warm-up pass, then the median of several timed
passes over the whole query set). Results go to RESULT.json; stdout and
stderr are the libraries' chatter.
"""
from __future__ import annotations

import json
import os
import resource
import sys
import time
import traceback

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_data import load_base, load_queries  # noqa: E402
from systems import SYSTEMS, index_files_size  # noqa: E402


def proc_status():
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0]) * 1024
    return out


def reset_peak_rss():
    """Reset VmHWM to the current RSS (Linux >= 4.0); False if not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def recall(found, truth, k):
    """recall@k of knndirect.datasets (imported here: a worker measuring a
    peer loads knndirect only once its figures are taken)."""
    from knndirect.datasets import recall_at_k
    return recall_at_k(found, truth, k)


def do_build(spec, system):
    ds = spec["dataset"]
    x = load_base(ds)
    rss0 = proc_status()["VmRSS"]
    reset = reset_peak_rss()
    t = time.perf_counter()
    index = system.build(x, spec["threads"])
    build_s = time.perf_counter() - t
    st = proc_status()
    peak = st["VmHWM"] if reset else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    out = {"build_s": build_s, "build_threads": spec["threads"], "rss_before_build": rss0,
           "peak_rss": peak, "build_extra_rss": peak - rss0, "peak_rss_clean": reset}
    if spec.get("save_to"):
        t = time.perf_counter()
        system.save(index, spec["save_to"])
        out["save_s"] = time.perf_counter() - t
        out["disk_bytes"] = index_files_size(spec["save_to"])
    return out


def timed_passes(system, index, q, point, threads, repeats, warmup, min_time=0.5,
                 max_repeats=25):
    """Warm up on the first queries, then time whole passes over the query set:
    at least `repeats` of them, and more (up to max_repeats) until min_time
    seconds are spent, so that fast points are not timed on one short pass."""
    system.search(index, q[:warmup], point, threads)
    times = []
    ids = None
    while len(times) < repeats or (sum(times) < min_time and len(times) < max_repeats):
        t = time.perf_counter()
        r = system.search(index, q, point, threads)
        times.append(time.perf_counter() - t)
        if ids is None:
            ids = r
    return float(np.median(times)), times, ids


def do_search(spec, system):
    ds = spec["dataset"]
    q = load_queries(ds)
    gt = np.load(ds["gt_path"])
    k = spec["k"]
    rss0 = proc_status()["VmRSS"]
    t = time.perf_counter()
    index = system.load(spec["index_dir"])
    load_s = time.perf_counter() - t
    rss1 = proc_status()["VmRSS"]
    out = {"load_s": load_s, "resident_rss_bytes": rss1 - rss0,
           "resident_rss_per_vector": (rss1 - rss0) / ds["n"], "info": system.info(index),
           "runs": []}
    repeats, warmup = spec["repeats"], min(spec["warmup"], len(q))
    deadline = time.monotonic() + spec.get("sweep_budget_s", 1e9)
    for threads in spec["threads"]:
        for point in system.points():
            if time.monotonic() > deadline:
                out.setdefault("notes", []).append("sweep cut short by its time budget")
                break
            med, times, ids = timed_passes(system, index, q, point, threads, repeats, warmup,
                                           spec.get("min_time", 0.5))
            run = {"threads": threads, "params": point, "recall": recall(ids, gt, k),
                   "qps": len(q) / med, "seconds": times}
            out["runs"].append(run)
            if spec.get("latency") and threads == 1 and point.get("default"):
                lat = []
                for i in range(min(len(q), 300)):
                    t = time.perf_counter()
                    system.search(index, q[i:i + 1], point, 1)
                    lat.append(time.perf_counter() - t)
                run["latency_ms"] = {"p50": 1e3 * float(np.percentile(lat, 50)),
                                     "p99": 1e3 * float(np.percentile(lat, 99))}
            print(f"  {system.name} T={threads} {point}: recall {run['recall']:.4f} "
                  f"qps {run['qps']:.0f}", flush=True)
    if getattr(system, "opened_info", None):
        out["opened_info"] = system.opened_info(spec["index_dir"])
    if "resident_bytes" in out["info"]:
        out["resident_bytes_per_vector"] = out["info"]["resident_bytes"] / ds["n"]
    if hasattr(index, "stats"):
        try:
            out["stats"] = index.stats()
        except Exception:  # noqa: BLE001 - reporting only
            pass
    system.close(index)
    return out


def main():
    spec_path, result_path = sys.argv[1], sys.argv[2]
    with open(spec_path) as f:
        spec = json.load(f)
    system = SYSTEMS[spec["system"]](spec["cfg"])
    try:
        version = system.import_lib()
    except Exception as e:  # noqa: BLE001 - an uninstallable peer is skipped
        result = {"skipped": f"cannot import: {type(e).__name__}: {e}"}
    else:
        try:
            fn = do_build if spec["phase"] == "build" else do_search
            result = fn(spec, system)
            result["version"] = version
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            result = {"error": f"{type(e).__name__}: {e}"}
    tmp = result_path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(result, f, indent=1, default=str)
    os.replace(tmp, result_path)


if __name__ == "__main__":
    main()
