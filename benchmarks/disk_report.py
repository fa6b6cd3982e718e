"""bench_disk.py's results: the figures its targets are judged on
(summarize), the Markdown report (markdown) and the result files
(write_results: disk.json and disk.md)."""
import json
import math
import os

from report import pareto_front, qps_at_recall

K = 10                  # neighbours per query: bench_disk.py searches and judges at k = 10
TARGET_RECALL = 0.95
TARGETS = {"read_volume": 1.1, "uring_vs_pread": 3.0, "overhead_vs_qd1": 2.0,
           "load_vs_bound": 0.7, "vs_diskann": 1.0, "vs_diskann_aim": 2.0}


def shortlist(oversample, k=K):
    """Vectors reranked (each one read) at an oversample: ceil(k x oversample)."""
    return int(math.ceil(k * oversample - 1e-9))


def qps_at_target(points):
    pts = [{"recall": p["recall"], "qps": p["qps"], "params": p} for p in points
           if p.get("qps")]
    front = pareto_front(pts)
    return qps_at_recall(front, TARGET_RECALL), front


def io_bound_busy(res, point):
    """QD32 IOPS with every core running graph searches / shortlist."""
    fio = res["device"].get("qd32_busy", {}).get("fio") or {}
    return fio["iops"] / shortlist(point["oversample"]) if fio.get("iops") else None


def cpu_bound_with_reads(res, cpu_bound, point):
    """The in-RAM CPU bound with the CPU time the reads themselves take (the
    device probe's CPU per read at depth 32): cores / (CPU per query in RAM +
    shortlist x CPU per read). Not a target's bound; it says how far the
    kernel's share of each read moves the CPU limit."""
    per_read = res["device"]["qd32"].get("cpu_us_per_read")
    cores = res.get("cores")
    if not (per_read and cores and cpu_bound):
        return None
    return cores / (cores / cpu_bound + shortlist(point["oversample"]) * per_read * 1e-6)


def summarize(res):
    """The figures the targets are judged on, and the verdicts."""
    s = {"points": {}}
    dev = res["device"]
    qd1_us = dev["qd1"].get("lat_mean_us")
    info = res["index"]
    rec = info["record_size"]
    t = []
    for label, point in res["points"].items():
        name = f"{label} point (ef {point['ef']}, oversample {point['oversample']:g})"
        uring = res["single"]["io_uring"].get("single", {}).get(label)
        pread = res["single"]["pread"].get("single", {}).get(label)
        mem = res["memory"]["single"].get(label)
        sp = s["points"][label] = {}
        if uring:
            ideal = uring["shortlist_per_query"] * rec
            ratio = uring["bytes_per_query"] / ideal
            kratio = uring["kernel_bytes_per_query"] / ideal
            worst = max(ratio, kratio)
            sp["read_volume"] = {"bytes_per_query": uring["bytes_per_query"],
                                 "kernel_bytes_per_query": uring["kernel_bytes_per_query"],
                                 "ideal": ideal, "ratio": ratio, "kernel_ratio": kratio}
            t.append((f"Read volume ≤ 1.1 × shortlist × record_size, io_uring, {name}",
                      f"{uring['bytes_per_query'] / 1024:.1f} KiB counted, "
                      f"{uring['kernel_bytes_per_query'] / 1024:.1f} KiB by the kernel, ideal "
                      f"{ideal / 1024:.1f} KiB: {worst:.3f}×", worst <= TARGETS["read_volume"]))
        if uring and pread:
            ratio = pread["p50_ms"] / uring["p50_ms"]
            sp["uring_vs_pread"] = ratio
            t.append((f"Single stream: io_uring p50 ≥ 3× lower than pread, {name}",
                      f"{uring['p50_ms']:.2f} ms vs {pread['p50_ms']:.2f} ms: {ratio:.2f}×",
                      ratio >= TARGETS["uring_vs_pread"]))
        if uring and mem and qd1_us:
            ov = uring["p50_ms"] - mem["p50_ms"]
            sp["rerank_overhead_ms"] = ov
            sp["rerank_overhead_vs_qd1"] = ov * 1e3 / qd1_us
            floor = dev.get("batches", {}).get(label, {}).get("batch_ms")
            sp["device_batch_ms"] = floor
            t.append((f"Rerank overhead (p50 capped − p50 in RAM) ≤ 2× the device's QD1 "
                      f"latency, {name}",
                      f"{uring['p50_ms']:.3f} − {mem['p50_ms']:.3f} = {ov:.3f} ms = "
                      f"{ov * 1e3 / qd1_us:.1f}× {qd1_us:.0f} µs (the device's own time for "
                      f"one batch of {shortlist(point['oversample'])} reads: "
                      f"{fmt(floor, '.3f')} ms = {fmt(floor * 1e3 / qd1_us if floor else None, '.1f')}"
                      f"× QD1)", ov * 1e3 <= TARGETS["overhead_vs_qd1"] * qd1_us))
        out = res["load_disk"].get(label, {})
        r = out.get("load", {}).get(label)
        if r:
            bound = min(b for b in (out["io_bound"], out["cpu_bound"]) if b)
            frac = r["sustainable_rate"] / bound
            which = "I/O" if out["io_bound"] and out["io_bound"] <= out["cpu_bound"] else "CPU"
            sp["load"] = {"rate": r["sustainable_rate"], "bound": bound, "fraction": frac,
                          "binding": which, "io_bound": out["io_bound"],
                          "cpu_bound": out["cpu_bound"],
                          "cpu_bound_with_reads": cpu_bound_with_reads(res, out["cpu_bound"],
                                                                       point),
                          "io_bound_cores_busy": io_bound_busy(res, point)}
            t.append((f"Throughput: sustainable rate ≥ 70% of min(I/O bound, CPU bound), "
                      f"{name}",
                      f"{r['sustainable_rate']:.0f}/s vs the {which} bound {bound:.0f}/s "
                      f"(I/O {fmt(out['io_bound'], '.0f')}/s, CPU {out['cpu_bound']:.0f}/s): "
                      f"{frac:.0%}", frac >= TARGETS["load_vs_bound"]))
    d = res["points"]["default"]
    d_rec = res["memory"]["single"]["default"]["recall"]
    t.append((f"SPEC: the default search (ef {d['ef']}, oversample {d['oversample']:g}) reaches "
              f"recall@10 ≥ 0.95", f"{d_rec:.4f}", d_rec >= TARGET_RECALL))
    grid = res.get("grid", {}).get("grid", [])
    kd_qps, kd_front = qps_at_target(grid) if grid else (None, [])
    s["knndirect_qps_at_095"] = kd_qps
    s["knndirect_front"] = [{"recall": p["recall"], "qps": p["qps"], "ef": p["params"]["ef"],
                             "oversample": p["params"]["oversample"]} for p in kd_front]
    da = res.get("diskann", {})
    if da.get("points") and not da.get("skipped"):
        da_qps, da_front = qps_at_target(da["points"])
        s["diskann_qps_at_095"] = da_qps
        s["diskann_front"] = [{"recall": p["recall"], "qps": p["qps"], "L": p["params"]["L"],
                               "beam_width": p["params"]["beam_width"]} for p in da_front]
        if kd_qps and da_qps:
            ratio = kd_qps / da_qps
            s["vs_diskann"] = ratio
            t.append(("Against diskannpy: QPS at recall@10 = 0.95 under the same cap ≥ 1.0× "
                      "(aim 2×), batch, 2 threads",
                      f"{kd_qps:.0f} vs {da_qps:.0f} q/s: {ratio:.2f}×"
                      + (" (the 2× aim met)" if ratio >= TARGETS["vs_diskann_aim"]
                         else " (the 2× aim not met)"), ratio >= TARGETS["vs_diskann"]))
        else:
            t.append(("Against diskannpy: QPS at recall@10 = 0.95",
                      f"knndirect {fmt(kd_qps, '.0f')}, diskannpy {fmt(da_qps, '.0f')} q/s "
                      "(– = 0.95 not reached in its sweep)", None))
    s["targets"] = [{"target": a, "measured": b, "pass": c} for a, b, c in t]
    s["cap_effective"] = bool(res["cap"].get("effective"))
    return s


def fmt(x, spec=".2f", none="–"):
    return none if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def markdown(res):
    s = res["summary"]
    info, cap, dev = res["index"], res["cap"], res["device"]
    qd1, qd32 = dev["qd1"], dev["qd32"]
    qd1_us = qd1.get("lat_mean_us")
    iops32 = qd32.get("iops")
    points = res["points"]
    mem = res["memory"]
    rec = info["record_size"]
    gib, mib = 2**30, 2**20
    L = []
    add = L.append

    def xqd1(ms):
        return fmt(ms * 1e3 / qd1_us if qd1_us else None, ".1f") + "×"

    add(f"knndirect under a memory cap, {res['n']:,} × {res['dim']} float32 clustered "
        f"(l2, k = {res['k']}, {res['queries']:,} held-out queries, exact ground truth), "
        f"m = {info['m']}, ef_construction = {info['ef_construction']}; {res['machine']}, "
        f"kernel {res['kernel']}; {res['started']} – {res['finished']}.")
    add("")
    if cap.get("effective"):
        capline = (f"cgroup v{cap['cgroup_version']} memory limit {cap['cap_bytes'] / mib:.0f} "
                   f"MiB (page cache included) against {info['data_bytes'] / gib:.2f} GiB of "
                   f"float32 data ({cap['cap_bytes'] / info['data_bytes']:.0%}; the index file "
                   f"is {info['file_bytes'] / gib:.2f} GiB); the opened index keeps "
                   f"{info['resident_bytes'] / mib:.0f} MiB in RAM (graph, codes, ids); page "
                   f"cache dropped before every configuration")
    else:
        capline = f"NO memory cap ({cap.get('error')}): every figure is uncapped"
    add(f"- Memory: {capline}.")
    b = res.get("build", {})
    if b:
        add(f"- Build: {b['build_s']:.0f} s ({b['build_s'] / 60:.0f} min) on "
            f"{b.get('threads')} threads, load average {b.get('loadavg_start')} at its start.")
    busy = max(res["loadavg_start"][0], res["loadavg_end"][0]) > 2.5
    add(f"- Machine load (1/5/15-min load averages): {res['loadavg_start']} at the start, "
        f"{res['loadavg_end']} at the end; "
        + ("the machine was shared with other work during the run" if busy else
           "the machine was otherwise quiet") + "; each configuration's own figures are in "
        "disk.json.")
    pts = "; ".join(f"**{label}**: ef {p['ef']}, oversample {p['oversample']:g} (shortlist "
                    f"{shortlist(p['oversample'])})" for label, p in points.items())
    add(f"- Operating points: {pts}. The lower point is the recall-tuned lower oversample: "
        f"a grid point below the default oversample that keeps recall@10 ≥ {TARGET_RECALL}, or "
        f"the default's recall where that is lower (a wider beam may pay for the shorter "
        f"shortlist); the tuned point is a grid point with recall@10 ≥ {TARGET_RECALL}; each is "
        f"the candidate whose lower bound min(I/O bound, CPU bound) is highest (a point equal "
        f"to an earlier one is not repeated).")
    add(f"- Vector record {rec} B, read alignment {info['alignment']} B.")
    add("")
    add("**Device** (fio, random 4 KiB reads, O_DIRECT, over the index's vector section)")
    add("")
    add("| queue depth | engine | IOPS | mean latency | p50 | p99 |")
    add("| --- | --- | --- | --- | --- | --- |")
    probes = [(str(qd1.get("depth", 1)), qd1), (str(qd32.get("depth", 32)), qd32)]
    busy = dev.get("qd32_busy", {})
    if busy.get("fio"):
        probes.append((f"32, while {busy['threads']} threads run graph searches (rerank=False; "
                       f"{fmt(busy['graph_qps_alone'], ',.0f')} q/s alone, "
                       f"{fmt(busy['graph_qps_with_fio'], ',.0f')} q/s beside fio)",
                       busy["fio"]))
    probes += [(f"{p.get('depth')}, submitted and awaited as one batch ({label} shortlist): "
                f"**{fmt(p.get('batch_ms'), '.3f')} ms per batch**", p)
               for label, p in dev.get("batches", {}).items()]
    for name, p in probes:
        if "error" in p:
            add(f"| {name} | – | {p['error']} | | | |")
        else:
            add(f"| {name} | {p['engine']} | {p['iops']:,.0f} | {p['lat_mean_us']:.0f} µs"
                f" | {p['clat_p50_us']:.0f} µs | {p['clat_p99_us']:.0f} µs |")
    add("")
    add(f"**Single stream** ({res['queries']:,} queries one at a time; latency also in "
        f"multiples of the device's QD1 latency, {fmt(qd1_us, '.0f')} µs; per query: reads "
        f"(with io_uring, those started while the beam ran, and of them the ones "
        f"the final shortlist dropped), "
        f"bytes as the index counts them against the ideal shortlist × record_size, bytes "
        f"the kernel read for the process (/proc/self/io), graph-search time and I/O wait; "
        f"batch = all queries in one call, 2 threads)")
    add("")
    add("| point | backend | recall@10 | p50 | p99 | p50 / QD1 | reads | KiB (ideal) | kernel "
        "KiB | graph | I/O wait | batch q/s | peak memory |")
    add("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for label in points:
        x = mem["single"][label]
        add(f"| {label} | in RAM (kd.load, no cap) | {x['recall']:.4f} | {x['p50_ms']:.3f} ms | "
            f"{x['p99_ms']:.3f} ms | {xqd1(x['p50_ms'])} | – | – | – | "
            f"{x['graph_ms_per_query']:.3f} ms | – | {mem['batch'][label]['qps']:,.0f} | – |")
        for backend in res["single"]:
            out = res["single"][backend]
            x = out.get("single", {}).get(label)
            if not x:
                add(f"| {label} | {backend} | error: {out.get('error')} |" + " |" * 10)
                continue
            m = out.get("memory") or {}
            how = "page cache, cold" if backend == "mmap" else "O_DIRECT"
            add(f"| {label} | {backend} ({how}) | {x['recall']:.4f} | {x['p50_ms']:.3f} ms | "
                f"{x['p99_ms']:.3f} ms | {xqd1(x['p50_ms'])} | {x['reads_per_query']:.1f}"
                + (f" ({x['early_reads_per_query']:.0f} early, "
                   f"{x['early_unused_per_query']:.1f} of them unused)"
                   if x.get('early_reads_per_query') else "") + " | "
                f"{x['bytes_per_query'] / 1024:.0f} ({x['shortlist_per_query'] * rec / 1024:.0f}) | "
                f"{x['kernel_bytes_per_query'] / 1024:.0f} | {x['graph_ms_per_query']:.3f} ms | "
                f"{x['io_wait_ms_per_query']:.3f} ms | "
                f"{out.get('batch', {}).get(label, {}).get('qps', 0):,.0f} | "
                f"{fmt(m.get('peak_bytes', 0) / mib, '.0f')} MiB |")
    add("")
    for label in points:
        sp = s["points"][label]
        if "rerank_overhead_ms" not in sp:
            continue
        u = res["single"]["io_uring"]["single"][label]
        m = mem["single"][label]
        add(f"**Rerank overhead, {label} point** (io_uring under the cap − the same index in "
            f"RAM, p50): {u['p50_ms']:.3f} − {m['p50_ms']:.3f} = **{sp['rerank_overhead_ms']:.3f}"
            f" ms** = {sp['rerank_overhead_vs_qd1']:.1f}× the device's QD1 latency "
            f"({qd1_us:.0f} µs), for {u['reads_per_query']:.0f} reads issued as one batch "
            f"(serially ~{u['reads_per_query'] * qd1_us / 1e3:.1f} ms; the device alone "
            f"takes {fmt(dev.get('batches', {}).get(label, {}).get('batch_ms'), '.3f')} ms "
            f"for such a batch). Means per query "
            f"from the index's counters: graph search {u['graph_ms_per_query']:.3f} ms "
            f"(in RAM {m['graph_ms_per_query']:.3f} ms), I/O wait "
            f"{u['io_wait_ms_per_query']:.3f} ms. The device's own latency at depth 32 is "
            f"{fmt(qd32.get('lat_mean_us'), '.0f')} µs mean, "
            f"{fmt(qd32.get('clat_p99_us'), '.0f')} µs p99.")
        add("")
    grid_ram = mem.get("grid", [])
    grid_cap = res.get("grid", {}).get("grid", [])
    if grid_ram:
        efs = sorted({p["ef"] for p in grid_ram})
        oss = sorted({p["oversample"] for p in grid_ram})
        cell = {(p["ef"], p["oversample"]): p for p in grid_ram}
        ccell = {(p["ef"], p["oversample"]): p for p in grid_cap}
        add("**Grid** (batch of all queries, 2 threads): recall@10, then q/s in RAM / q/s "
            "under the cap with io_uring")
        add("")
        add("| ef \\ oversample | " + " | ".join(f"{o:g}" for o in oss) + " |")
        add("| --- |" + " --- |" * len(oss))
        for e in efs:
            add(f"| {e} | " + " | ".join(
                (f"{cell[(e, o)]['recall']:.3f}" if (e, o) in cell else "") for o in oss) + " |")
        add("")
        add("| ef \\ oversample | " + " | ".join(f"{o:g}" for o in oss) + " |")
        add("| --- |" + " --- |" * len(oss))
        for e in efs:
            add(f"| {e} | " + " | ".join(
                (f"{cell[(e, o)]['qps']:,.0f} / "
                 f"{fmt(ccell[(e, o)]['qps'] if (e, o) in ccell else None, ',.0f')}"
                 if (e, o) in cell else "") for o in oss) + " |")
        add("")
        add("I/O bound (QD32 IOPS / shortlist): " + ", ".join(
            f"{o:g} → {iops32 / shortlist(o):,.0f}/s" for o in oss) + "." if iops32 else "")
        add("")
    add(f"**Open-loop load** (Poisson arrivals, {res['load']['workers']} worker threads, queue "
        f"{res['load']['queue']}, shedding when full; {res['load']['seconds']:g} s per trial; "
        f"latency from the intended arrival; sustainable = the highest rate with p99 ≤ "
        f"{res['load']['p99_limit_ms']:.0f} ms and ≤ {res['load']['shed_limit']:.1%} shed)")
    add("")
    add("| point | where | sustainable rate | p50 / p99 there | shed | recall@10 | I/O bound | "
        "CPU bound (in-RAM batch) | rate / min(bounds) | CPU bound counting the reads | "
        "I/O bound with the cores busy |")
    add("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for label in points:
        out = res["load_disk"].get(label, {})
        r = out.get("load", {}).get(label)
        sp = s["points"][label].get("load")
        if r:
            a = r["at_rate"] or {}
            add(f"| {label} | under the cap, io_uring | **{r['sustainable_rate']:,.0f}/s** | "
                f"{fmt(a.get('p50_ms'))} / {fmt(a.get('p99_ms'))} ms | "
                f"{fmt(a.get('shed_fraction'), '.2%')} | {fmt(a.get('recall'), '.4f')} | "
                f"{fmt(out['io_bound'], ',.0f')}/s | {out['cpu_bound']:,.0f}/s | "
                f"{sp['fraction']:.0%} ({sp['binding']}-bound) | "
                f"{fmt(sp['cpu_bound_with_reads'], ',.0f')}/s | "
                f"{fmt(sp['io_bound_cores_busy'], ',.0f')}/s |")
        else:
            add(f"| {label} | under the cap | error: {out.get('error')} | | | | | | | | |")
        rm = mem.get("load", {}).get(label)
        if rm:
            a = rm["at_rate"] or {}
            cpu = mem["batch"][label]["qps"]
            add(f"| {label} | in RAM (the same generator, no I/O) | "
                f"{rm['sustainable_rate']:,.0f}/s | {fmt(a.get('p50_ms'))} / "
                f"{fmt(a.get('p99_ms'))} ms | {fmt(a.get('shed_fraction'), '.2%')} | "
                f"{fmt(a.get('recall'), '.4f')} | – | {cpu:,.0f}/s | "
                f"{rm['sustainable_rate'] / cpu:.0%} of the CPU bound | – | – |")
    add("")
    per_read = qd32.get("cpu_us_per_read")
    busy_fio = dev.get("qd32_busy", {}).get("fio") or {}
    if per_read:
        add(f"The last two columns are not the targets' bounds; they show what those leave out. "
            f"CPU bound counting the reads: the in-RAM CPU time per query plus the CPU time of "
            f"its reads, {per_read:.1f} µs per read (all cores, outside idle, I/O wait and "
            f"steal, while the depth-32 probe ran: {qd32['iops']:,.0f} IOPS took "
            f"{qd32['iops'] * per_read / 1e6:.2f} cores)."
            + (f" I/O bound with the cores busy: the depth-32 probe's IOPS while every core ran "
               f"graph searches ({busy_fio['iops']:,.0f} against {qd32['iops']:,.0f} on an "
               f"otherwise idle machine) / shortlist." if busy_fio.get("iops") else ""))
        add("")
    da = res.get("diskann", {})
    add("**Against diskannpy** (same data, same cap, page cache dropped; batch search with "
        "2 threads; QPS at recall@10 = 0.95 interpolated in log-QPS on each Pareto front, as "
        "benchmarks/report.py does)")
    add("")
    if da.get("skipped") or not da.get("points"):
        add(f"diskannpy skipped: {da.get('skipped', da.get('error'))}")
    else:
        bs = da["build"]["build_s"]
        add(f"diskannpy {da['version']} disk index: R = {da['R']}, build L = {da['L_build']}, "
            f"full-precision vectors on disk (pq_disk_bytes = 0), {da['pq_bytes']} B of PQ "
            f"code per vector in RAM and {da['cache_nodes']:,} graph nodes cached (together "
            f"about what knndirect keeps in RAM); build {bs:.0f} s ({bs / 60:.0f} min, "
            f"{da['build'].get('threads')} threads); index {da['index_bytes'] / gib:.2f} GiB; "
            f"peak memory {fmt((da.get('memory') or {}).get('peak_bytes', 0) / mib, '.0f')} "
            f"MiB. Swept: search L × beam width W.")
        add("")
        add("| system | QPS at recall 0.95 (batch, 2 threads) | Pareto front (recall: q/s) | "
            "best single-stream p50 at recall ≥ 0.95 |")
        add("| --- | --- | --- | --- |")
        kd_front = ", ".join(f"{p['recall']:.3f}: {p['qps']:,.0f}" for p in
                             s.get("knndirect_front", []) if p["recall"] >= 0.85)
        da_front = ", ".join(f"{p['recall']:.3f}: {p['qps']:,.0f}" for p in
                             s.get("diskann_front", []) if p["recall"] >= 0.85)
        da_single = min((p for p in da["points"] if "p50_ms" in p
                         and p["recall"] >= TARGET_RECALL), key=lambda p: p["p50_ms"],
                        default=None)
        uring = res["single"]["io_uring"].get("single", {})
        kd_single = min(((lab, x) for lab, x in uring.items() if x["recall"] >= TARGET_RECALL),
                        key=lambda lx: lx[1]["p50_ms"], default=None)
        add(f"| knndirect (io_uring) | **{fmt(s.get('knndirect_qps_at_095'), ',.0f')}** | "
            f"{kd_front} | "
            + (f"{kd_single[1]['p50_ms']:.3f} ms ({kd_single[0]} point)" if kd_single else "–")
            + " |")
        add(f"| diskannpy | **{fmt(s.get('diskann_qps_at_095'), ',.0f')}** | {da_front} | "
            + (f"{da_single['p50_ms']:.3f} ms (L = {da_single['L']}, W = "
               f"{da_single['beam_width']})" if da_single else "–") + " |")
        if s.get("vs_diskann"):
            add("")
            add(f"knndirect / diskannpy at recall 0.95: **{s['vs_diskann']:.2f}×**.")
    add("")
    rows = [(f"single stream, {b}", x) for b, x in res["single"].items()]
    rows += [("batch grid, io_uring", res.get("grid", {}))]
    rows += [(f"open loop, {label} point", x) for label, x in res["load_disk"].items()]
    rows += [("diskannpy search", da)]
    rows = [(label, x["memory"]) for label, x in rows if x.get("memory")]
    if rows:
        add("**The cap at work** (the children's memory cgroup, sampled every 50 ms; the "
            "limit counts page cache and anonymous memory together)")
        add("")
        add("| configuration | peak | cap | page cache (max) | anonymous (max) | "
            "times the limit was reached |")
        add("| --- | --- | --- | --- | --- | --- |")
        for label, m in rows:
            add(f"| {label} | {m['peak_bytes'] / mib:.0f} MiB | {m['limit_bytes'] / mib:.0f} MiB"
                f" | {m['max_cache_bytes'] / mib:.0f} MiB | {m['max_anon_bytes'] / mib:.0f} MiB | "
                f"{m['limit_hits']:,} |")
        add("")
    add("**Targets**")
    add("")
    add("| target | measured | verdict |")
    add("| --- | --- | --- |")
    for t in s["targets"]:
        v = "pass" if t["pass"] else ("fail" if t["pass"] is False else "n/a")
        add(f"| {t['target']} | {t['measured']} | **{v}** |")
    add("")
    add(f"Command: `{res['command']}` (as root, for the cgroup and the cache drops).")
    return "\n".join(L)


def write_results(res, out_dir):
    text = markdown(res)
    with open(os.path.join(out_dir, "disk.json"), "w") as f:
        json.dump(res, f, indent=1, default=str)
    with open(os.path.join(out_dir, "disk.md"), "w") as f:
        f.write("# Larger than RAM\n\n" + text + "\n")
    print()
    print(text)
