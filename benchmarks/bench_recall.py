"""Recall targets at scale: does search(recall=r) give r, does the default
give at least 0.95, and what does the calibration cost?

    python benchmarks/bench_recall.py                                # the 100k sets
    python benchmarks/bench_recall.py --sets minilm-wordnet --metrics cosine,l2,ip
    python benchmarks/bench_recall.py --sets clustered-1m-256 --metrics cosine \
        --stem recall-targets-1m
    python benchmarks/bench_recall.py --quick --out /tmp/recall      # smoke run
    python benchmarks/bench_recall.py --sets clustered-1m-768 --metrics l2 \
        --quantization 1bit,1bit+4bit --stem refine-1m-768           # the refinement A/B

Per set and metric:

1. Build with the defaults (kd.Index(dim, metric).add(x, threads=2); with
   --quantization, once per code type, each a row of its own), in this
   process. The add holds 200 of its vectors out, measures the
   calibration on them, and inserts them last; the calibration's own
   seconds (info()["calibration"]["seconds"]) are reported against the
   build's wall time, the rest of the add.
2. In RAM: the default search and recall=0.90/0.95/0.98 on the set's
   held-out queries (never added), recall@10 against the exact ground
   truth, the chosen ef and oversample, QPS on one thread (median of 3
   passes) and the rows re-ranked per query.
3. Opened from disk (O_DIRECT, io_uring) in a child process inside a
   memory cgroup capped at 1/4 of the float32 vectors (page cache
   included; never below the index's RAM part + 160 MiB for Python), the
   index file read once with O_DIRECT (the disk's host-side cache would
   otherwise slow the first search), then the page cache dropped (sync;
   echo 3 > /proc/sys/vm/drop_caches):
   the same searches, with vector reads per query. Needs root; without it
   the disk figures are uncapped and warm, and the results say so.

PASS per set: default recall >= 0.95 in RAM and on disk, and every target
within +-0.02 of its measured recall.

Writes benchmarks/results/recall-targets.{json,md} (--out, --stem to change).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_data  # noqa: E402
from cgroup import Cgroup  # noqa: E402
from diskio import drop_caches, read_through  # noqa: E402
from run import loadavg, machine_meta, write_result  # noqa: E402

TARGETS = (0.90, 0.95, 0.98)
TOLERANCE = 0.02
DEFAULT_FLOOR = 0.95
PYTHON_MIB = 160


def log(msg):
    print(f"[recall] {msg}", flush=True)


def per_query_recall(ids, truth, k):
    return np.array([len(set(a[:k]) & set(b[:k])) / k for a, b in zip(ids, truth)])


def recall_at(ids, truth, k):
    return float(per_query_recall(ids, truth, k).mean())


def searches(index, queries, truth, k, repeats):
    """The default search and each target: recall, ef/oversample chosen,
    QPS on one thread (median of `repeats` passes), rows re-ranked and
    read per query."""
    import knndirect as kd  # noqa: F401 (the child imports it here too)
    out = {}
    info = index.info()
    for target in (None, *TARGETS):
        kw = {} if target is None else {"recall": target}
        index.search(queries[:50], k, threads=1, **kw)       # warm up
        index.stats(reset=True)
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            _, ids = index.search(queries, k, threads=1, **kw)
            times.append(time.perf_counter() - t)
        st = index.stats(reset=True)
        nq = st["queries"] or 1
        cal = info["calibration"]
        chosen = cal["default"] if target is None else None
        if chosen is None and cal:
            chosen = cal["targets"].get(target) or cal["targets"].get(str(target))
        out["default" if target is None else f"{target:.2f}"] = {
            "recall": recall_at(ids, truth, k),
            "ef": chosen and chosen["ef"], "oversample": chosen and chosen["oversample"],
            "expected": chosen and chosen["expected_recall"],
            "qps": len(queries) / float(np.median(times)),
            "reranked_per_query": st["rerank_vectors"] / nq,
            "reads_per_query": st["read_ops"] / nq,
        }
    return out


def cost_check(index, queries, truth, k, ef):
    """The two prices the calibration's cost model weighs (ROW_COST in
    knndirect/_calibration.py), measured here on one thread: nanoseconds
    per code distance of the graph search, and per re-scored row in RAM."""
    q = np.ascontiguousarray(queries)
    _, _, scored, *_ = index._core.recall_sweep(q, None, np.ascontiguousarray(
        truth[:, :k], np.int64).ravel(), k, ef, np.array([k], np.int64), 1)
    index.stats(reset=True)
    index.search(q, k, ef=ef, oversample=1, rerank=False, threads=1)
    graph = index.stats(reset=True)
    index.search(q, k, ef=ef, oversample=1, threads=1)
    short = index.stats(reset=True)
    index.search(q, k, ef=ef, oversample=20, threads=1)
    deep = index.stats(reset=True)
    return {"ef": ef, "code_distances_per_query": scored,
            "ns_per_code_distance": 1e9 * graph["graph_seconds"] / graph["queries"] / scored,
            "rescore_ns_per_row": 1e9 * (deep["rerank_seconds"] - short["rerank_seconds"])
            / max(deep["rerank_vectors"] - short["rerank_vectors"], 1)}


def disk_child(spec_path, out_path):
    import knndirect as kd
    spec = json.load(open(spec_path))
    q = np.load(spec["queries"])
    truth = np.load(spec["truth"])
    with kd.open(spec["index"], preload=("graph", "codes")) as index:
        res = searches(index, q, truth, spec["k"], spec["repeats"])
        res["backend"] = index.info()["io_backend"]
    json.dump(res, open(out_path, "w"))


def run_disk(index_path, queries_path, truth_path, k, repeats, cgroup):
    work = tempfile.mkdtemp(prefix="kd-recall-")
    spec, out = os.path.join(work, "spec.json"), os.path.join(work, "out.json")
    json.dump({"index": index_path, "queries": queries_path, "truth": truth_path, "k": k,
               "repeats": repeats}, open(spec, "w"))
    read_through(index_path)  # the disk's host-side cache: see diskio.read_through
    dropped = drop_caches()
    r = subprocess.run([sys.executable, __file__, "--disk-child", spec, out],
                       preexec_fn=cgroup.enter if cgroup else None)
    try:
        res = json.load(open(out))
    except (OSError, ValueError):
        res = {"error": f"disk child exited with {r.returncode}"}
    res["cache_dropped"] = bool(dropped)
    shutil.rmtree(work, ignore_errors=True)
    return res


def bench_one(spec, metric, quantization, args, scratch, cg):
    import knndirect as kd
    ds = bench_data.resolve(spec, n_queries=args.queries, metric=metric, k=args.k)
    base = bench_data.load_base(ds.to_json())
    queries = bench_data.load_queries(ds.to_json())
    truth = np.load(ds.gt_path)
    log(f"{spec} {metric} {quantization}: {base.shape[0]:,} x {base.shape[1]}, "
        f"{len(queries)} queries (load {loadavg()})")
    index = kd.Index(base.shape[1], metric, quantization=quantization, seed=args.seed)
    t = time.perf_counter()
    index.add(base, threads=args.threads)
    add_s = time.perf_counter() - t
    cal = index.info()["calibration"]
    build_s = add_s - cal["seconds"]
    log(f"  build {build_s:.1f} s + calibration {cal['seconds']:.2f} s "
        f"({100 * cal['seconds'] / build_s:.1f}% of the build), ladder ef {cal['ef']}")
    entry = {"set": spec, "metric": metric, "quantization": quantization,
             "n": int(base.shape[0]), "dim": int(base.shape[1]),
             "build_s": build_s, "calibration_s": cal["seconds"],
             "calibration_share": cal["seconds"] / build_s, "ladder_ef": cal["ef"],
             "calibration_queries": cal["queries"], "seed": args.seed,
             "shortlists": cal["shortlist"]}
    entry["memory"] = searches(index, queries, truth, args.k, args.repeats)
    entry["cost_model"] = cost_check(index, queries, truth, args.k,
                                     entry["memory"]["default"]["ef"])
    log("  cost model: {ns_per_code_distance:.0f} ns a code distance, "
        "{rescore_ns_per_row:.0f} ns a re-scored row in RAM".format(**entry["cost_model"]))
    path = scratch / f"{spec}-{metric}-{quantization}.kdx"
    index.save(path)
    data_bytes = base.nbytes
    index.close()
    # The RAM part of the index as opened (graph, codes, ids): the built
    # index's own figure counts the vectors it holds.
    with kd.open(path, preload=()) as opened:
        resident = opened.info()["resident_bytes"]
    entry["resident_bytes"] = resident
    del base
    qpath, tpath = scratch / "q.npy", scratch / "t.npy"
    np.save(qpath, queries)
    np.save(tpath, np.asarray(truth))
    cap = max(data_bytes // 4, resident + PYTHON_MIB * 2**20)
    entry["cap_bytes"] = cap if cg else None
    if cg:
        cg.set_limit(cap)
    places = ("memory",)
    if not args.no_disk:
        entry["disk"] = run_disk(str(path), str(qpath), str(tpath), args.k, args.repeats, cg)
        places += ("disk",)
    path.unlink()
    ok = all(abs(entry[w][f"{t:.2f}"]["recall"] - t) <= TOLERANCE
             for w in places for t in TARGETS if "error" not in entry[w])
    ok = ok and all(entry[w]["default"]["recall"] >= DEFAULT_FLOOR
                    for w in places if "error" not in entry[w])
    entry["pass"] = ok
    for where in places:
        r = entry[where]
        if "error" in r:
            log(f"  {where}: {r['error']}")
            continue
        log(f"  {where}: " + ", ".join(
            f"{name} {v['recall']:.4f} (ef {v['ef']}, os {v['oversample']}, "
            f"{v['qps']:,.0f} q/s, {v['reranked_per_query']:.0f} rows/q)"
            for name, v in r.items() if isinstance(v, dict)))
    return entry


def markdown(res):
    lines = [f"# Recall targets ({res['date']})", "",
             f"Command: `{res['command']}`  ",
             f"Machine: {res['machine_label']}, {res['cpu']}, {res['nproc']} cores  ",
             f"Commit: {res['knndirect_commit']}; load at start {res['loadavg_start']:.2f}", "",
             "Index seed (it draws the calibration sample): "
             + ", ".join(sorted({str(e.get("seed", 0)) for e in res["sets"]})) + ".", "",
             "Recall@10 on the set's held-out queries (never added) against exact ground "
             "truth. In RAM: built here with the defaults, 2 build threads. On disk: opened "
             "with O_DIRECT in a child process in a memory cgroup capped at 1/4 of the "
             "float32 vectors, or at the opened index's RAM part (graph, codes, ids) + "
             f"{PYTHON_MIB} MiB for Python where that is more (both shown), page cache "
             "dropped first. QPS: one search thread, median "
             "of 3 passes. Rows: re-ranked per query (on disk each is a read).", "",
             "| set | metric | codes | build s | calibration s (share), queries | where | default | "
             "recall=0.90 | recall=0.95 | recall=0.98 | PASS |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for e in res["sets"]:
        for where in [w for w in ("memory", "disk") if w in e]:
            r = e[where]
            if "error" in r:
                cells = [r["error"]] + [""] * 3
            else:
                cells = [f"{r[n]['recall']:.4f} (ef {r[n]['ef']}, os {r[n]['oversample']:g}, "
                         f"{r[n]['qps']:,.0f} q/s, {r[n]['reranked_per_query']:.0f} rows)"
                         for n in ("default", "0.90", "0.95", "0.98")]
            head = (f"| {e['set']} | {e['metric']} | {e.get('quantization', '1bit')} | "
                    f"{e['build_s']:.1f} | "
                    f"{e['calibration_s']:.2f} ({100 * e['calibration_share']:.1f}%), "
                    f"{e.get('calibration_queries', 200)} | "
                    if where == "memory" else "| | | | | | ")
            if where == "disk" and e.get("cap_bytes"):
                where = (f"disk, cap {e['cap_bytes'] / 2**20:,.0f} MiB "
                         f"(1/4: {e['n'] * e['dim'] / 2**20:,.0f}; index RAM "
                         f"{e['resident_bytes'] / 2**20:,.0f})")
            lines.append(head + f"{where} | " + " | ".join(cells) +
                         (f" | {'PASS' if e['pass'] else 'FAIL'} |" if where == "memory"
                          else " | |"))
    return "\n".join(lines) + "\n"


def main(argv=None):
    if argv is None and len(sys.argv) == 4 and sys.argv[1] == "--disk-child":
        return disk_child(sys.argv[2], sys.argv[3])
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sets", default="minilm-wordnet,clustered-100k-384,clustered-100k-768")
    ap.add_argument("--metrics", default="cosine,l2,ip")
    ap.add_argument("--quantization", default="1bit",
                    help="code types, comma-separated: a build and a row each")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0,
                    help="index seed: another seed draws another calibration sample")
    ap.add_argument("--no-disk", action="store_true", help="in RAM only (no disk child)")
    ap.add_argument("--quick", action="store_true", help="clustered-20k-64, cosine only")
    ap.add_argument("--out", default=str(HERE / "results"))
    ap.add_argument("--stem", default="recall-targets", help="result file names (.json, .md)")
    ap.add_argument("--machine-label", default=os.environ.get(
        "KNNDIRECT_BENCH_MACHINE", "2-core VM, shared"))
    args = ap.parse_args(argv)
    if args.quick:
        args.sets, args.metrics = "clustered-20k-64", "cosine"
    meta = machine_meta(args.machine_label)
    res = {**meta, "command": " ".join(["python", "benchmarks/bench_recall.py",
                                        *(argv if argv is not None else sys.argv[1:])]),
           "sets": []}
    cg = None
    if os.geteuid() == 0:
        try:
            cg = Cgroup(f"knndirect_bench_recall_{os.getpid()}")
        except OSError as e:
            log(f"no memory cgroup ({e}): disk runs uncapped")
    else:
        log("NOT root: no memory cap and no page-cache drops")
    (HERE / "data").mkdir(exist_ok=True)  # a fresh checkout has no cache yet
    scratch = Path(tempfile.mkdtemp(prefix="kd-recall-idx-", dir=str(HERE / "data")))
    try:
        for spec in [s for s in args.sets.split(",") if s]:
            for metric in [m for m in args.metrics.split(",") if m]:
                for quantization in [q for q in args.quantization.split(",") if q]:
                    res["sets"].append(bench_one(spec, metric, quantization, args, scratch, cg))
                    write_result(res, args.out, args.stem, markdown)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        if cg:
            cg.remove()
    res["pass"] = all(e["pass"] for e in res["sets"])
    write_result(res, args.out, args.stem, markdown)
    log(f"{'PASS' if res['pass'] else 'FAIL'}; wrote {args.out}/{args.stem}.md")


if __name__ == "__main__":
    main()
