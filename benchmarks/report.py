"""From raw sweep points to what the results say: Pareto fronts, QPS at a
target recall, the targets' pass/fail, and the JSON / Markdown / PNG files."""
from __future__ import annotations

import json
import math
import os
from pathlib import Path

TARGET_RECALL = 0.95
SPEEDUP_VS_HNSWLIB = 1.5
SPEEDUP_VS_BEST_PEER = 1.0
BUILD_VS_HNSWLIB = 1.0
RESIDENT_FRACTION = 1 / 8
RESIDENT_TARGET_DIM = 768

NOT_PEERS = ("knndirect", "knndirect-disk", "knndirect-refined", "knndirect-refined-disk")


# -- fronts and interpolation ----------------------------------------------------
def pareto_front(runs):
    """The runs no other run beats on both recall and QPS, by recall ascending
    (so QPS descending)."""
    pts = sorted(runs, key=lambda r: (-r["recall"], -r["qps"]))
    front = []
    best_qps = -1.0
    for r in pts:  # by recall descending: keep a point only if it is faster
        if r["qps"] > best_qps:
            front.append(r)
            best_qps = r["qps"]
    return front[::-1]


def qps_at_recall(front, target=TARGET_RECALL):
    """QPS at `target` recall on a Pareto front: log-QPS interpolated linearly in
    recall between the two points around the target. If the fastest point is
    already above the target, its QPS (no extrapolation). None if no point
    reaches the target."""
    if not front or front[-1]["recall"] < target:
        return None
    if front[0]["recall"] >= target:
        return front[0]["qps"]
    for lo, hi in zip(front, front[1:]):
        if lo["recall"] < target <= hi["recall"]:
            t = (target - lo["recall"]) / (hi["recall"] - lo["recall"])
            return math.exp(math.log(lo["qps"]) + t * (math.log(hi["qps"]) - math.log(lo["qps"])))
    return None


def summarize_system(entry, threads_list):
    """Add fronts, QPS at the target, max recall and the default row to a
    system's entry (in place)."""
    search = entry.get("search") or {}
    runs = search.get("runs", [])
    entry["fronts"], entry["qps_at_target"], entry["max_recall"] = {}, {}, {}
    for t in threads_list:
        rs = [r for r in runs if r["threads"] == t]
        if not rs:
            continue
        front = pareto_front(rs)
        entry["fronts"][str(t)] = [{"recall": r["recall"], "qps": r["qps"],
                                    "params": r["params"]} for r in front]
        entry["qps_at_target"][str(t)] = qps_at_recall(front)
        entry["max_recall"][str(t)] = max(r["recall"] for r in rs)
        for r in rs:
            if r["params"].get("default"):
                entry.setdefault("default", {})[str(t)] = {
                    "recall": r["recall"], "qps": r["qps"],
                    **({"latency_ms": r["latency_ms"]} if "latency_ms" in r else {})}
    return entry


def _ratio(a, b):
    return a / b if a and b else None


def evaluate_targets(result):
    """The issue's targets, as rows of (name, measured, goal, pass)."""
    systems = result["systems"]
    threads_list = result["config"]["threads"]
    ds = result["dataset"]
    rows = []
    kd = systems.get("knndirect", {})
    hn = systems.get("hnswlib", {})
    for t in threads_list:
        key = str(t)
        kq = (kd.get("qps_at_target") or {}).get(key)
        hq = (hn.get("qps_at_target") or {}).get(key)
        peers = {name: (e.get("qps_at_target") or {}).get(key)
                 for name, e in systems.items() if name not in NOT_PEERS}
        reached = {n: q for n, q in peers.items() if q}
        best_name = max(reached, key=reached.get) if reached else None
        r1 = _ratio(kq, hq)
        ran = hn.get("status") == "ok" and kd.get("status") == "ok"
        rows.append({
            "target": f"QPS@{TARGET_RECALL} knndirect / hnswlib, {t} thread{'s' * (t > 1)}",
            "measured": r1, "goal": f">= {SPEEDUP_VS_HNSWLIB}",
            "detail": f"{_fmt_qps(kq)} vs {_fmt_qps(hq)}" if ran else
            "knndirect or hnswlib not in this run",
            # knndirect short of the recall fails; hnswlib short of it passes
            "pass": None if not ran else
            (kq is not None and (hq is None or r1 >= SPEEDUP_VS_HNSWLIB))})
        r2 = _ratio(kq, reached.get(best_name)) if best_name else None
        rows.append({
            "target": f"QPS@{TARGET_RECALL} knndirect / best peer, {t} thread{'s' * (t > 1)}",
            "measured": r2, "goal": f">= {SPEEDUP_VS_BEST_PEER}",
            "detail": (f"{_fmt_qps(kq)} vs {_fmt_qps(reached.get(best_name))} ({best_name})"
                       if best_name else ("no peer reached the recall" if peers else
                                          "no peer in this run")),
            "pass": None if not best_name else (r2 is not None and r2 >= SPEEDUP_VS_BEST_PEER)})
    bt = max(result["config"]["build_threads"])
    kb = _build_s(kd, bt)
    hb = _build_s(hn, bt)
    r3 = _ratio(kb, hb)
    rows.append({"target": f"build time knndirect / hnswlib, {bt} threads", "measured": r3,
                 "goal": f"<= {BUILD_VS_HNSWLIB}",
                 "detail": f"{_fmt_s(kb)} vs {_fmt_s(hb)}" if kb and hb else
                 f"{_fmt_s(kb)}; hnswlib not built in this run",
                 "pass": None if r3 is None else r3 <= BUILD_VS_HNSWLIB})
    opened = kd.get("opened_resident_bytes")
    if opened is None:
        opened = (systems.get("knndirect-disk", {}).get("search") or {}).get(
            "info", {}).get("resident_bytes")
    if opened is not None:
        f32 = ds["n"] * ds["dim"] * 4
        frac = opened / f32
        applies = ds["dim"] == RESIDENT_TARGET_DIM
        rows.append({"target": "resident bytes of an opened index / float32 size"
                     + ("" if applies else f" (goal is set at d={RESIDENT_TARGET_DIM})"),
                     "measured": frac, "goal": "<= 1/8 = 0.125",
                     "detail": f"{opened / ds['n']:.0f} B/vector vs {4 * ds['dim']} B",
                     "pass": (frac <= RESIDENT_FRACTION) if applies else None,
                     "informative_pass": frac <= RESIDENT_FRACTION})
    for t in threads_list:
        d = (kd.get("default") or {}).get(str(t))
        if d:
            rows.append({"target": f"default parameters reach recall@{result['config']['k']} "
                                   f">= {TARGET_RECALL} ({t} thread{'s' * (t > 1)})",
                         "measured": d["recall"], "goal": f">= {TARGET_RECALL}",
                         "detail": f"{_fmt_qps(d['qps'])} QPS",
                         "pass": d["recall"] >= TARGET_RECALL})
            break
    return rows


def _build_s(entry, threads):
    for b in entry.get("builds", []):
        if b.get("build_threads") == threads and "build_s" in b:
            return b["build_s"]
    return None


# -- formatting --------------------------------------------------------------
def _fmt_qps(q):
    if q is None:
        return "not reached"
    return f"{q:,.0f}"


def _fmt_s(s):
    return "n/a" if s is None else f"{s:.1f} s"


def _fmt_ratio(r):
    return "n/a" if r is None else f"{r:.2f}"


def _mib(b):
    return "n/a" if b is None else f"{b / 2**20:,.1f}"


def _pass(p):
    return {True: "PASS", False: "FAIL", None: "n/a"}[p]


def _params(p):
    return ", ".join(f"{k}={v}" for k, v in p.items() if k != "default")


def system_rows(result):
    """One row per system for the main table."""
    cfg = result["config"]
    ds = result["dataset"]
    out = []
    for name, e in result["systems"].items():
        if e.get("status") != "ok":
            out.append([name, f"{e.get('status')}: {e.get('reason', '')}"])
            continue
        s = e.get("search", {})
        builds = {b["build_threads"]: b for b in e.get("builds", []) if "build_s" in b}
        bmax = builds.get(max(cfg["build_threads"]), {})
        row = {"system": name}
        for t in sorted(cfg["build_threads"], reverse=True):
            row[f"build s ({t}T)"] = (f"{builds[t]['build_s']:.1f}" if t in builds else
                                      ("=knndirect" if e.get("builds_as") else "n/a"))
        row["peak RSS MiB"] = _mib(bmax.get("peak_rss"))
        row["on disk MiB"] = _mib(bmax.get("disk_bytes"))
        resident = s.get("info", {}).get("resident_bytes")
        if resident is None:
            resident = s.get("resident_rss_bytes")
        row["resident B/vec"] = "n/a" if resident is None else f"{resident / ds['n']:.0f}"
        for t in cfg["threads"]:
            row[f"QPS@{TARGET_RECALL} {t}T"] = _fmt_qps(e["qps_at_target"].get(str(t)))
        row["max recall"] = ", ".join(f"{e['max_recall'][str(t)]:.3f}" for t in cfg["threads"]
                                      if str(t) in e["max_recall"])
        out.append(row)
    return out


def markdown(result, png_name=None, notes=True):
    ds, cfg, meta = result["dataset"], result["config"], result["meta"]
    lines = [f"### {ds['name']}: n = {ds['n']:,}, d = {ds['dim']}, {ds['metric']}, "
             f"k = {cfg['k']}, {ds['n_queries']:,} queries", ""]
    lines.append(f"{ds['description']}. Measured {meta['date']} on {meta['machine_label']} "
                 f"({meta['cpu']}, {meta['nproc']} cores; load average "
                 f"{meta['loadavg_start']:.2f} at start, {meta.get('loadavg_end', 0):.2f} at "
                 f"end), knndirect {meta['knndirect_commit']}. M = {cfg['m']}, "
                 f"ef_construction = {cfg['ef_construction']} for every graph; QPS = batch "
                 f"of all queries, median of {cfg['repeats']} passes after a warm-up; "
                 f"QPS@{TARGET_RECALL} interpolated on each system's Pareto front.")
    lines.append("")
    rows = system_rows(result)
    full = [r for r in rows if isinstance(r, dict)]
    if full:
        cols = list(full[0].keys())
        lines.append("| " + " | ".join(cols) + " |")
        lines.append("| " + " | ".join("---" for _ in cols) + " |")
        for r in rows:
            if isinstance(r, dict):
                lines.append("| " + " | ".join(str(r.get(c, "")) for c in cols) + " |")
            else:
                lines.append(f"| {r[0]} | {r[1]} |" + " |" * (len(cols) - 2))
    else:
        for r in rows:
            lines.append(f"- {r[0]}: {r[1]}")
    lines.append("")
    kd = result["systems"].get("knndirect", {})
    if kd.get("default"):
        parts = []
        for t, d in kd["default"].items():
            s = f"{t}T: recall {d['recall']:.4f} at {_fmt_qps(d['qps'])} QPS"
            if "latency_ms" in d:
                s += f" (one query at a time: p50 {d['latency_ms']['p50']:.3f} ms, " \
                     f"p99 {d['latency_ms']['p99']:.3f} ms)"
            parts.append(s)
        info = kd.get("search", {}).get("info", {})
        lines.append(f"knndirect with default parameters (no tuning: ef "
                     f"{info.get('default_ef', 'default')}, oversample "
                     f"{info.get('default_oversample', 'default')}): "
                     + "; ".join(parts) + ".")
        kdd = result["systems"].get("knndirect-disk", {})
        if kdd.get("default"):
            parts = []
            for t, d in kdd["default"].items():
                s = f"{t}T: recall {d['recall']:.4f} at {_fmt_qps(d['qps'])} QPS"
                if "latency_ms" in d:
                    s += f" (one at a time: p50 {d['latency_ms']['p50']:.3f} ms)"
                parts.append(s)
            dinfo = kdd.get("search", {}).get("info", {})
            lines.append(f"Opened from disk (kd.open, io backend "
                         f"{dinfo.get('io_backend')}, direct I/O {dinfo.get('direct_io')}): "
                         + "; ".join(parts) + ".")
        if kd.get("opened_resident_bytes"):
            f32 = ds["n"] * ds["dim"] * 4
            lines.append(f"Resident bytes of the opened index: "
                         f"{kd['opened_resident_bytes'] / ds['n']:.0f} per vector, "
                         f"{kd['opened_resident_bytes'] / f32:.3f} of the float32 size.")
        lines.append("")
    lines.append("Targets (same run):")
    lines.append("")
    lines.append("| target | measured | goal | detail | result |")
    lines.append("| --- | --- | --- | --- | --- |")
    for row in result["targets"]:
        m = row["measured"]
        ms = "n/a" if m is None else (f"{m:.3f}" if m < 10 else f"{m:.1f}")
        res = _pass(row["pass"])
        if row["pass"] is None and "informative_pass" in row:
            res = "(" + _pass(row["informative_pass"]).lower() + ")"
        lines.append(f"| {row['target']} | {ms} | {row['goal']} | {row['detail']} | {res} |")
    lines.append("")
    system_notes = []
    for name, e in result["systems"].items():
        if e.get("note") and notes:
            system_notes.append(f"- **{name}** {e.get('version', '')}: {e['note']}")
    if system_notes:
        lines += ["Systems:", ""] + system_notes + [""]
    if png_name:
        lines += [f"![recall against QPS, {ds['name']}]({png_name})", ""]
    return "\n".join(lines)


def fronts_markdown(result):
    lines = ["<details><summary>Pareto fronts (recall@k, QPS, parameters)</summary>", ""]
    for name, e in result["systems"].items():
        for t, front in (e.get("fronts") or {}).items():
            pts = "; ".join(f"{p['recall']:.3f} / {p['qps']:,.0f} ({_params(p['params'])})"
                            for p in front)
            lines.append(f"- {name}, {t}T: {pts}")
    lines += ["", "</details>", ""]
    return "\n".join(lines)


def plot(result, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    threads = result["config"]["threads"]
    fig, axes = plt.subplots(1, len(threads), figsize=(6.2 * len(threads), 4.6), squeeze=False)
    ds = result["dataset"]
    styles = {"knndirect": dict(color="black", lw=2.2, marker="o"),
              "knndirect-disk": dict(color="gray", lw=1.5, marker="o", ls="--")}
    for ax, t in zip(axes[0], threads):
        for name, e in result["systems"].items():
            front = (e.get("fronts") or {}).get(str(t))
            if not front:
                continue
            ax.plot([p["recall"] for p in front], [p["qps"] for p in front], label=name,
                    markersize=3.5, **styles.get(name, dict(marker=".", lw=1.2)))
        ax.axvline(TARGET_RECALL, color="red", lw=0.8, ls=":")
        ax.set_yscale("log")
        ax.set_xlabel(f"recall@{result['config']['k']}")
        ax.set_ylabel("queries per second (batch)")
        ax.set_title(f"{ds['name']} (n={ds['n']:,}, d={ds['dim']}, {ds['metric']}), "
                     f"{t} thread{'s' * (t > 1)}", fontsize=9)
        lo = min([p["recall"] for e in result["systems"].values()
                  for p in (e.get("fronts") or {}).get(str(t), [])] or [0.5])
        ax.set_xlim(max(lo, 0.6) - 0.01, 1.002)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, loc="lower left")
    fig.suptitle(f"{result['meta']['date']}, {result['meta']['machine_label']}", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_all(result, out_dir):
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    name = result["dataset"]["name"]
    png = plot(result, out_dir / f"{name}.png")
    md = markdown(result, png_name=png.name if png else None) + "\n" + fronts_markdown(result)
    (out_dir / f"{name}.md").write_text(md)
    tmp = out_dir / f".{name}.json.tmp"
    tmp.write_text(json.dumps(result, indent=1, default=str))
    os.replace(tmp, out_dir / f"{name}.json")
    return out_dir / f"{name}.md"


# -- README ----------------------------------------------------------------------
BEGIN = "<!-- benchmarks:begin (written by benchmarks/run.py --readme) -->"
END = "<!-- benchmarks:end -->"


def readme_block(results, results_rel="benchmarks/results", note=None):
    parts = [note + "\n"] if note else []
    for r in results:
        md = markdown(r, png_name=None, notes=False)
        png = Path(results_rel) / f"{r['dataset']['name']}.png"
        parts.append(md + f"\n![recall against QPS, {r['dataset']['name']}]({png})\n")
    return "\n".join(parts)


def update_readme(readme_path, results, results_rel="benchmarks/results", note=None):
    text = Path(readme_path).read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{readme_path} has no benchmark markers ({BEGIN} ... {END})")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    Path(readme_path).write_text(head + BEGIN + "\n" + readme_block(results, results_rel, note) + "\n"
                                 + END + tail)
