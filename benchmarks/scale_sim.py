"""Project measured per-node figures to 1B × 768 on N nodes (a paper plan, not a
measurement).

    python benchmarks/scale_sim.py [--disk benchmarks/results/disk.json]
                                   [--ray benchmarks/results/ray.json] [--point tuned]
                                   [--cores 32] [--ram-gib 256] [--drives 4] [--drive-tb 3.84]
                                   [--drive-iops 700000] [--target-qps 5000] [--json OUT]

Measured inputs (printed with their source):
  disk.json, at --point (tuned: the recall@10 = 0.95 point of the 1M × 768
  larger-than-RAM run): reads and bytes per query, graph time per query,
  single-query p50, batch q/s, the CPU bound counting the reads (q/s on 2
  cores), the open-loop sustainable rate over its bound (how much of the
  bound a real arrival process got), resident and file bytes per vector, build
  core-seconds per vector, QD32 IOPS of that machine's device.
  ray.json: how close kdr's fan-out came to the in-process bound on one host
  (Ray QPS / sequential in-process QPS over the same shards), and the CPU of
  a 4-shard build over a single-collection build.

Model (every assumption is a flag or stated here):
  - Every query goes to every shard (kdr.search fans out to all). A shard of
    S vectors costs, per query, the measured reads (shortlist = oversample ×
    k, unchanged by S) and the measured core time × log(S) / log(1M) (HNSW
    hops grow with log n at a fixed ef; --growth multiplies both for the
    case that a larger shard needs a wider beam or shortlist for the same
    recall, which is not measured).
  - The merged recall equals the per-shard recall (each true neighbour lives
    in one shard and that shard's own top k holds it with the per-shard
    recall), so the 0.95 point per shard is the 0.95 point overall.
  - A replica group (nodes holding the 1B vectors once) then serves
    min(CPU, I/O) bound × derate, where per node CPU bound = cores / (shards
    per node × core ms per shard query) and I/O bound = node IOPS / (shards
    per node × reads per shard query): the group's QPS does not grow with its
    node count (more nodes = more, smaller shards, each doing the whole
    query stream). QPS grows with replica groups.
  - derate = measured sustainable rate / bound at 1M (open loop, p99 ≤ 50 ms)
    × Ray's measured fan-out efficiency (capped at 1).
  - Latency p50 ≈ the slowest shard's single-query p50 × log factor + the
    fan-out (--fanout-ms, an assumption: one Ray actor call and a merge).
"""
import argparse
import json
import math
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
N0 = 1_000_000


def measured(disk, ray, point):
    d = json.load(open(disk))
    s = d["single"]["io_uring"]["single"][point]
    ld = d["summary"]["points"][point]["load"]
    cores = d["cores"]
    m = {
        "source_disk": os.path.relpath(disk, ROOT), "point": point, "n0": d["n"],
        "dim": d["dim"], "recall": s["recall"],
        "ef": d["points"][point]["ef"], "oversample": d["points"][point]["oversample"],
        "reads_per_query": s["reads_per_query"], "bytes_per_query": s["bytes_per_query"],
        "graph_ms_per_query": s["graph_ms_per_query"], "p50_ms": s["p50_ms"],
        "batch_qps": d["single"]["io_uring"]["batch"][point]["qps"], "cores_measured": cores,
        "cpu_bound_with_reads_qps": ld["cpu_bound_with_reads"],
        "core_ms_per_query": 1000.0 * cores / ld["cpu_bound_with_reads"],
        "io_bound_qps": ld["io_bound"], "sustainable_qps": ld["rate"],
        "sustainable_over_bound": ld["rate"] / ld["bound"],
        "resident_bytes_per_vector": d["index"]["resident_bytes"] / d["n"],
        "file_bytes_per_vector": d["index"]["file_bytes"] / d["n"],
        "device_qd32_iops": d["device"]["qd32"]["iops"],
        "build_core_s_per_vector": d["build"]["build_s"] * d["build"]["threads"] / d["n"],
        "build_loadavg": d["build"]["loadavg_start"]}
    m["fanout_efficiency"] = 1.0
    m["build_cpu_4_shards_vs_one"] = 1.0
    if ray and os.path.exists(ray):
        r = json.load(open(ray))
        m["source_ray"] = os.path.relpath(ray, ROOT)
        m["fanout_efficiency"] = min(1.0, r["search"]["goal"]["ray_vs_bound"])
        four = r["build"].get("ray_4")
        if four:
            m["build_cpu_4_shards_vs_one"] = four["cpu_vs_collection"]
    return m


def layout(m, a, nodes, shards_per_node):
    shards = nodes * shards_per_node
    S = a.n / shards
    grow = math.log(S) / math.log(m["n0"]) * a.growth
    core_ms = m["core_ms_per_query"] * grow
    reads = m["reads_per_query"] * a.growth
    node_iops = a.drives * a.drive_iops
    cpu_q = 1000.0 * a.cores / (shards_per_node * core_ms)
    io_q = node_iops / (shards_per_node * reads)
    derate = m["sustainable_over_bound"] * m["fanout_efficiency"]
    group_q = min(cpu_q, io_q) * derate
    groups = max(1, math.ceil(a.target_qps / group_q))
    ram = S * shards_per_node * m["resident_bytes_per_vector"]
    ssd = S * shards_per_node * m["file_bytes_per_vector"]
    build_core_s = a.n * m["build_core_s_per_vector"] * grow / a.growth
    return {
        "nodes_per_group": nodes, "shards_per_node": shards_per_node, "shards": shards,
        "shard_vectors_M": round(S / 1e6, 1),
        "resident_gib_per_node": round(ram / 2**30, 1),
        "ram_fits": ram < 0.5 * a.ram_gib * 2**30,
        "ssd_tb_per_node": round(ssd / 1e12, 2),
        "ssd_fits": ssd < 0.8 * a.drives * a.drive_tb * 1e12,
        "reads_per_query": round(shards * reads),
        "mib_read_per_query": round(shards * m["bytes_per_query"] * a.growth / 2**20, 1),
        "core_ms_per_query": round(shards * core_ms, 1),
        "group_cpu_bound_qps": round(cpu_q), "group_io_bound_qps": round(io_q),
        "binding": "CPU" if cpu_q < io_q else "I/O",
        "group_qps": round(group_q), "groups_for_target": groups,
        "total_nodes": groups * nodes,
        "p50_ms": round(m["p50_ms"] * grow + a.fanout_ms, 2),
        "build_hours_one_group": round(build_core_s / (nodes * a.cores) / 3600, 1)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--disk", default=os.path.join(ROOT, "benchmarks/results/disk.json"))
    ap.add_argument("--ray", default=os.path.join(ROOT, "benchmarks/results/ray.json"))
    ap.add_argument("--point", default="tuned", choices=["default", "lower", "tuned"])
    ap.add_argument("--n", type=float, default=1e9)
    ap.add_argument("--cores", type=int, default=32, help="cores per node")
    ap.add_argument("--ram-gib", type=float, default=256, help="RAM per node")
    ap.add_argument("--drives", type=int, default=4, help="NVMe drives per node")
    ap.add_argument("--drive-tb", type=float, default=3.84)
    ap.add_argument("--drive-iops", type=float, default=700_000,
                    help="random 4 KiB read IOPS per drive (datasheets of PCIe 4 data-centre "
                         "drives say ~1M; derated)")
    ap.add_argument("--growth", type=float, default=1.0,
                    help="extra factor on reads and core time per shard query (1 = none)")
    ap.add_argument("--fanout-ms", type=float, default=1.0)
    ap.add_argument("--target-qps", type=float, default=5000)
    ap.add_argument("--layouts", default="2x1,4x1,5x1,5x4,10x2,20x1")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    m = measured(args.disk, args.ray, args.point)
    rows = []
    for spec in args.layouts.split(","):
        nodes, spn = (int(v) for v in spec.split("x"))
        rows.append(layout(m, args, nodes, spn))
    print("measured inputs:")
    for key, v in m.items():
        print(f"  {key}: {round(v, 4) if isinstance(v, float) else v}")
    print(f"\nnode: {args.cores} cores, {args.ram_gib:.0f} GiB RAM, {args.drives} × "
          f"{args.drive_tb} TB NVMe at {args.drive_iops:,.0f} IOPS each; growth {args.growth}; "
          f"fan-out {args.fanout_ms} ms; target {args.target_qps:,.0f} QPS at recall "
          f"{m['recall']}\n")
    cols = [("nodes_per_group", "nodes/group"), ("shards_per_node", "shards/node"),
            ("shard_vectors_M", "shard (M vec)"), ("resident_gib_per_node", "RAM GiB/node"),
            ("ssd_tb_per_node", "SSD TB/node"), ("reads_per_query", "reads/query"),
            ("mib_read_per_query", "MiB/query"), ("core_ms_per_query", "core ms/query"),
            ("group_cpu_bound_qps", "CPU bound"), ("group_io_bound_qps", "I/O bound"),
            ("group_qps", "QPS/group"), ("groups_for_target", "groups"),
            ("total_nodes", "nodes"), ("p50_ms", "p50 ms"),
            ("build_hours_one_group", "build h")]
    print("| " + " | ".join(c[1] for c in cols) + " | fits |")
    print("|" + " --- |" * (len(cols) + 1))
    for r in rows:
        flags = ", ".join(f for f, ok in (("RAM!", r["ram_fits"]), ("SSD!", r["ssd_fits"]))
                          if not ok) or "yes"
        print("| " + " | ".join(f"{r[c[0]]:,}" if isinstance(r[c[0]], (int, float))
                                 else str(r[c[0]]) for c in cols) + f" | {flags} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"measured": m, "args": vars(args), "layouts": rows}, f, indent=1)
    return m, rows


if __name__ == "__main__":
    main()
