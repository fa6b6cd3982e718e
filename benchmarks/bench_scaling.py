"""1 -> 2 thread search scaling at recall@10 0.95: knndirect against hnswlib,
measured interleaved.

    python benchmarks/bench_scaling.py            # the three sets below, 9 rounds
    python benchmarks/bench_scaling.py --dataset clustered-100k-384,minilm-wordnet,clustered-100k-768 --rounds 9
    nice -n 19 python benchmarks/bench_scaling.py --dataset clustered-20k-128 --rounds 3 \\
        --out /tmp/scaling-smoke                  # smoke run (a minute; not a result)

For each dataset (default clustered-100k-384, minilm-wordnet,
clustered-100k-768; a set whose data is missing, such as minilm-wordnet before
benchmarks/embed_wordnet.py has made its embeddings, is skipped with a note):

1. Build. Both indexes once, in this process, with the same M 16,
   ef_construction 200 and 2 build threads: kd.Index(dim, metric, m,
   ef_construction).add(x, threads=2), and hnswlib in its native space
   (cosine / l2 / ip), through benchmarks/systems.py's adapters.
2. Operating point. Each system's cheapest search parameters that reach
   recall@10 >= 0.95 on the 1000 queries, chosen at 1 thread. knndirect:
   the grid ef {16,24,32,48,64,96,128} x oversample {2,3,5,10}
   (index.search(q, k, ef=, oversample=, threads=)); hnswlib: set_ef over
   systems.EF_SWEEP (knn_query(q, k, num_threads=)). Each point is searched
   once for its recall; a point that reaches the target is then timed (a
   warm-up on --warmup queries, the median of --repeats passes over the whole
   batch) and the fastest such point is kept. Along ef (for each oversample)
   the sweep stops after two points that reach the target: a wider beam only
   costs more. If no point reaches the target, the highest-recall point is
   used and the table says so.
3. Scaling. --rounds rounds (default 9; a run with fewer than 7 is marked
   provisional). Each round times knndirect-1T, knndirect-2T, hnswlib-1T,
   hnswlib-2T, in an order rotated by one from round to round so that load
   drifts fall on all four alike; each timing is a warm-up on --warmup
   queries, then the median of --repeats passes of the whole 1000-query batch
   as one call. QPS = queries / that median. Per system: the median over
   rounds of the 1T and 2T QPS and of the per-round ratio 2T/1T (the two
   timings of one round, taken close together). Goal per dataset:
   knndirect's median ratio >= hnswlib's: PASS, else FAIL.
4. The machine's own bound, timed in the same rotation (--no-bound to
   leave it out): a job with no serial part and no shared writes, SHA-256
   over a private 1 MiB buffer per thread (hashlib releases the GIL for each
   update), 64 MiB in all, split evenly. Its 2T/1T is what 2 threads can give
   on this machine at that moment (a VM's vCPUs, turbo, the host's load);
   where both systems sit at it, the goal cannot separate them here. The
   paired rounds are also counted (sign test: how likely that many rounds
   below hnswlib's or more, were the two ratios alike).

Writes benchmarks/results/scaling.json and scaling.md (--out to change the
folder), naming the machine, its load averages, the commit and the command.
"""
from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import os
import shlex
import statistics
import sys
import threading
import time
from math import comb
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

import bench_data  # noqa: E402
from run import loadavg, machine_meta, write_result  # noqa: E402
from worker import timed_passes  # noqa: E402
from systems import EF_SWEEP, SYSTEMS  # noqa: E402

DEFAULT_DATASETS = "clustered-100k-384,minilm-wordnet,clustered-100k-768"
KD_EF_GRID = [16, 24, 32, 48, 64, 96, 128]
KD_OVERSAMPLE_GRID = [2, 3, 5, 10]
MIN_ROUNDS = 7
CONFIGS = [("knndirect", 1), ("knndirect", 2), ("hnswlib", 1), ("hnswlib", 2)]
EXAMPLE_COMMANDS = [
    "python benchmarks/bench_scaling.py",
    "python benchmarks/bench_scaling.py --dataset " + DEFAULT_DATASETS + " --rounds 9",
]


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", default=DEFAULT_DATASETS,
                    help="comma-separated sets (bench_data names: clustered-<n>-<d>, "
                         "minilm-wordnet[-<n>k], or a file); default: " + DEFAULT_DATASETS)
    ap.add_argument("--rounds", type=int, default=9,
                    help=f"interleaved rounds (default 9; fewer than {MIN_ROUNDS} marks the "
                         "result provisional)")
    ap.add_argument("--repeats", type=int, default=3,
                    help="timed passes of the batch per timing, median kept (default 3)")
    ap.add_argument("--warmup", type=int, default=200,
                    help="queries searched before each timing (default 200)")
    ap.add_argument("--target", type=float, default=0.95, help="recall@k target (default 0.95)")
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--m", type=int, default=16)
    ap.add_argument("--ef-construction", type=int, default=200)
    ap.add_argument("--build-threads", type=int, default=2)
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--metric", default=None, choices=["cosine", "l2", "ip"],
                    help="default: bench_data's (cosine for the named sets)")
    ap.add_argument("--make-missing", action="store_true",
                    help="let bench_data make a missing MiniLM set (runs embed_wordnet.py, "
                         "about half an hour of CPU) instead of skipping it")
    ap.add_argument("--out", default=str(HERE / "results"),
                    help="folder for scaling.json and scaling.md")
    ap.add_argument("--no-bound", action="store_true",
                    help="leave out the machine's own bound (a perfectly parallel job)")
    ap.add_argument("--machine-label", default=os.environ.get(
        "KNNDIRECT_BENCH_MACHINE", "2-core VM"))
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    return args


def log(msg):
    print(f"[scaling] {msg}", flush=True)


def missing_reason(spec, n_queries):
    """Why a dataset cannot be used without making it first (None: usable).
    Clustered sets are generated and cached on first use, so never missing."""
    if bench_data.CLUSTERED_RE.match(spec):
        return None
    if bench_data.MINILM_RE.match(spec):
        folder = bench_data.DATA / spec
        have_split = ((folder / f"base-q{n_queries}.npy").exists()
                      and (folder / f"queries-{n_queries}.npy").exists())
        if (folder / "vectors.npy").exists() or have_split:
            return None
        mm = bench_data.MINILM_RE.match(spec)
        subset = f" --subset {bench_data._parse_count(mm.group(1), mm.group(2))}" \
            if mm.group(1) else ""
        return (f"no MiniLM embeddings at {folder.relative_to(REPO)}/vectors.npy; make them "
                f"with `python benchmarks/embed_wordnet.py --out "
                f"{folder.relative_to(REPO)}{subset}` (about half an hour of CPU) or rerun "
                "with --make-missing")
    if spec in bench_data.DICT_SETS:
        folder = bench_data.DATA / spec
        if (folder / "vectors.npy").exists():
            return None
        return (f"no embeddings at {folder.relative_to(REPO)}/vectors.npy; make them with "
                f"`python benchmarks/embed_texts.py {spec}` or rerun with --make-missing")
    if not Path(spec).exists():
        return f"{spec}: not a named set nor an existing file"
    return None


class ParallelBound:
    """What 2 threads can give on this machine: SHA-256 over a private buffer
    per thread, split evenly, nothing shared; timed like a system (search
    returns no ids)."""
    note = ("SHA-256 over a private 1 MiB buffer per thread, 64 MiB in all, split "
            "evenly: no serial part, no shared writes")
    CHUNKS = 64

    def __init__(self):
        self.buffers = [os.urandom(1 << 20) for _ in range(2)]

    def search(self, index, q, point, threads):
        def run(buffer, times):
            h = hashlib.sha256()
            for _ in range(times):
                h.update(buffer)
        workers = [threading.Thread(target=run, args=(self.buffers[i], self.CHUNKS // threads))
                   for i in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()


def sign_test(below, rounds):
    """One-sided: the chance of `below` or more of `rounds` paired rounds
    falling below, were each a coin toss."""
    return sum(comb(rounds, i) for i in range(below, rounds + 1)) / 2 ** rounds


def recall(ids, gt, k):
    from knndirect.datasets import recall_at_k
    return float(recall_at_k(ids, gt, k))


def timed(system, index, q, point, threads, repeats, warmup):
    """Warm-up on the first `warmup` queries, then the median of `repeats`
    passes over the whole batch; returns (median seconds, all seconds, ids)."""
    return timed_passes(system, index, q, point, threads, repeats, max(warmup, 1), min_time=0)


def candidate_points(name, k):
    """Sweep order: lists of points along which a larger ef only costs more."""
    if name == "knndirect":
        return [[{"ef": ef, "oversample": os_} for ef in KD_EF_GRID if ef >= k]
                for os_ in KD_OVERSAMPLE_GRID]
    return [[{"ef": ef} for ef in EF_SWEEP if ef >= k]]


def choose_point(name, system, index, q, gt, args):
    """The fastest point (1 thread) with recall >= target; the sweep's rows."""
    rows = []
    for line in candidate_points(name, args.k):
        reached = 0
        for point in line:
            if reached >= 2:
                rows.append({"params": point, "skipped": "two smaller ef already reach the "
                                                         "target"})
                continue
            t = time.perf_counter()
            ids = system.search(index, q, point, 1)
            one = time.perf_counter() - t
            row = {"params": point, "recall": recall(ids, gt, args.k),
                   "qps_one_pass": len(q) / one}
            if row["recall"] >= args.target:
                reached += 1
                med, _, _ = timed(system, index, q, point, 1, args.repeats, args.warmup)
                row["qps"] = len(q) / med
            rows.append(row)
            log(f"  {name} {point}: recall {row['recall']:.4f}"
                + (f", {row['qps']:,.0f} QPS (1T)" if "qps" in row else ""))
    hits = [r for r in rows if "qps" in r]
    if hits:
        best = max(hits, key=lambda r: r["qps"])
        return {"params": best["params"], "recall": best["recall"], "qps_1t_sweep": best["qps"],
                "target_reached": True}, rows
    done = [r for r in rows if "recall" in r]
    best = max(done, key=lambda r: r["recall"])
    return {"params": best["params"], "recall": best["recall"], "target_reached": False}, rows


def bench_dataset(spec, args):
    ds = bench_data.resolve(spec, n_queries=args.queries, metric=args.metric, k=args.k)
    dsj = ds.to_json()
    log(f"{ds.name}: n={ds.n:,} d={ds.dim} {ds.metric}, {ds.n_queries} queries, k={ds.k}")
    x = bench_data.load_base(dsj)
    q = bench_data.load_queries(dsj)
    gt = np.load(ds.gt_path)
    cfg = {"metric": ds.metric, "m": args.m, "ef_construction": args.ef_construction,
           "k": args.k, "dim": ds.dim, "n": ds.n, "quick": False, "scratch": None}
    out = {"dataset": dsj, "loadavg_start": loadavg(),
           "date": dt.datetime.now().strftime("%Y-%m-%d %H:%M"), "systems": {}, "notes": []}
    systems, indexes = {}, {}
    for name in ("knndirect", "hnswlib"):
        system = SYSTEMS[name](cfg)
        entry = {"note": system.note}
        out["systems"][name] = entry
        try:
            entry["version"] = system.import_lib()
        except Exception as e:  # noqa: BLE001 - an absent peer is skipped
            entry["skipped"] = f"cannot import: {type(e).__name__}: {e}"
            log(f"{name}: skipped ({entry['skipped']})")
            continue
        t = time.perf_counter()
        indexes[name] = system.build(x, args.build_threads)
        entry["build_s"] = time.perf_counter() - t
        entry["build_threads"] = args.build_threads
        log(f"{name}: built in {entry['build_s']:.1f} s ({args.build_threads} threads)")
        entry["chosen"], entry["sweep"] = choose_point(name, system, indexes[name], q, gt, args)
        if not entry["chosen"]["target_reached"]:
            out["notes"].append(f"{name}: no swept point reaches recall {args.target}; its "
                                f"highest-recall point ({entry['chosen']['params']}, "
                                f"{entry['chosen']['recall']:.4f}) is used")
        log(f"{name}: chosen {entry['chosen']['params']} recall "
            f"{entry['chosen']['recall']:.4f}")
        systems[name] = system
    del x
    configs = [c for c in CONFIGS if c[0] in systems]
    if not args.no_bound:
        systems["bound"], indexes["bound"] = ParallelBound(), None
        out["systems"]["bound"] = {"note": ParallelBound.note, "version": "",
                                   "chosen": {"params": {}}}
        configs += [("bound", 1), ("bound", 2)]
    rounds = []
    for r in range(args.rounds):
        s = r % len(configs) if configs else 0
        order = configs[s:] + configs[:s]
        row = {"round": r + 1, "order": [f"{n}-{t}T" for n, t in order],
               "loadavg": loadavg(), "qps": {}}
        for name, threads in order:
            point = out["systems"][name]["chosen"]["params"]
            med, times, ids = timed(systems[name], indexes[name], q, point, threads,
                                    args.repeats, args.warmup)
            row["qps"][f"{name}-{threads}T"] = len(q) / med
            if r == 0 and name != "bound":  # the chosen point's recall, as timed
                out["systems"][name].setdefault("recall_by_threads", {})[str(threads)] = \
                    recall(ids, gt, args.k)
        rounds.append(row)
        log(f"round {r + 1}/{args.rounds} (load {row['loadavg'][0]}): " + ", ".join(
            f"{key} {v:,.0f}" for key, v in row["qps"].items()))
    out["rounds"] = rounds
    for name in systems:
        e = out["systems"][name]
        q1 = [rw["qps"][f"{name}-1T"] for rw in rounds]
        q2 = [rw["qps"][f"{name}-2T"] for rw in rounds]
        ratios = [b / a for a, b in zip(q1, q2)]
        e.update({"qps_1t": statistics.median(q1), "qps_2t": statistics.median(q2),
                  "ratio": statistics.median(ratios), "ratio_min": min(ratios),
                  "ratio_max": max(ratios), "ratios": ratios})
        if name != "bound":
            systems[name].close(indexes[name])
    kd, hn = out["systems"]["knndirect"], out["systems"]["hnswlib"]
    if "ratio" in kd and "ratio" in hn:
        wins = sum(a >= b for a, b in zip(kd["ratios"], hn["ratios"]))
        out["goal"] = {"goal": "knndirect scaling >= hnswlib scaling (median 2T/1T over rounds)",
                       "knndirect": kd["ratio"], "hnswlib": hn["ratio"],
                       "pass": kd["ratio"] >= hn["ratio"],
                       "rounds_knndirect_ge_hnswlib": f"{wins}/{len(rounds)}",
                       "sign_test_p": sign_test(len(rounds) - wins, len(rounds)),
                       "provisional": args.rounds < MIN_ROUNDS}
        if "bound" in out["systems"]:
            out["goal"]["bound"] = out["systems"]["bound"]["ratio"]
    else:
        out["goal"] = {"goal": "knndirect scaling >= hnswlib scaling", "pass": None,
                       "reason": "hnswlib skipped" if "ratio" in kd else "knndirect skipped"}
    out["loadavg_end"] = loadavg()
    return out


def _fmt_params(p):
    return ", ".join(f"{k}={v}" for k, v in p.items())


def markdown(res):
    m = res["meta"]
    c = res["config"]
    lines = [
        "# Search scaling, 1 -> 2 threads, at recall@{k} >= {t}".format(k=c["k"], t=c["target"]),
        "",
        f"{m['date']}, {m['machine_label']}: {m['cpu']}, {m['nproc']} cores, kernel "
        f"{m['kernel']}, Python {m['python']}, numpy {m['numpy']}; knndirect at "
        f"{m['knndirect_commit']}. Load averages (1/5/15 min): {m['loadavg_start']} at the "
        f"start, {m.get('loadavg_end')} at the end.",
        "",
        f"Both indexes built once per set (M {c['m']}, ef_construction "
        f"{c['ef_construction']}, {c['build_threads']} build threads). Each system's "
        f"operating point: its fastest swept point (1 thread) with recall@{c['k']} >= "
        f"{c['target']}. Then {c['rounds']} rounds, each timing knndirect-1T, "
        "knndirect-2T, hnswlib-1T, hnswlib-2T in an order rotated every round; a timing is "
        f"a warm-up on {c['warmup']} queries and the median of {c['repeats']} passes of the "
        f"{c['queries']}-query batch. QPS: median over rounds; 2T/1T: median over rounds of "
        "the per-round ratio (range in brackets).",
    ]
    if c["rounds"] < MIN_ROUNDS:
        lines += ["", f"**Provisional:** {c['rounds']} rounds (fewer than {MIN_ROUNDS})."]
    for name, d in res["datasets"].items():
        lines += ["", f"## {name}", ""]
        if "skipped" in d:
            lines += [f"Skipped: {d['skipped']}"]
            continue
        ds = d["dataset"]
        lines += [f"n = {ds['n']:,}, d = {ds['dim']}, {ds['metric']}, {ds['n_queries']} "
                  f"queries, k = {ds['k']}. Load {d['loadavg_start']} -> "
                  f"{d['loadavg_end']}.", "",
                  "| system | point (recall >= target) | recall@10 | QPS 1T | QPS 2T | "
                  "2T/1T [min-max] | build s |",
                  "| --- | --- | --- | ---: | ---: | --- | ---: |"]
        for sname, e in d["systems"].items():
            if "skipped" in e:
                lines.append(f"| {sname} | skipped: {e['skipped']} "
                             "| | | | | |")
                continue
            ch = e["chosen"]
            ratio = f"{e['ratio']:.2f}x [{e['ratio_min']:.2f}-{e['ratio_max']:.2f}]"
            if sname == "bound":
                lines.append(f"| the machine's bound ({e['note']}) | | | "
                             f"{e['qps_1t'] / ds['n_queries']:.1f} passes/s | "
                             f"{e['qps_2t'] / ds['n_queries']:.1f} passes/s | {ratio} | |")
                continue
            flag = "" if ch["target_reached"] else " (target not reached)"
            lines.append(
                f"| {sname} {e['version']} | {_fmt_params(ch['params'])}{flag} | "
                f"{ch['recall']:.4f} | {e['qps_1t']:,.0f} | {e['qps_2t']:,.0f} | {ratio} | "
                f"{e['build_s']:.1f} |")
        g = d["goal"]
        if g.get("pass") is None:
            lines += ["", f"Goal {g['goal']}: not evaluated ({g['reason']})."]
        else:
            lines += ["", f"Goal {g['goal']}: knndirect {g['knndirect']:.2f}x vs hnswlib "
                          f"{g['hnswlib']:.2f}x: **{'PASS' if g['pass'] else 'FAIL'}**"
                          + (" (provisional)" if g["provisional"] else "")
                          + f"; knndirect's ratio >= hnswlib's in "
                            f"{g['rounds_knndirect_ge_hnswlib']} rounds (sign test: p = "
                            f"{g['sign_test_p']:.2f} for as many below or more, were the two "
                            "alike)"
                          + (f"; the machine's bound in the same rounds: {g['bound']:.2f}x."
                             if "bound" in g else ".")]
        for note in d.get("notes", []):
            lines += ["", f"Note: {note}"]
    lines += ["", "## Commands", "", "This result:", "", "```", m["command"], "```", "",
              "The full run:", "", "```"] + EXAMPLE_COMMANDS + ["```", ""]
    return "\n".join(lines)


def write(res, out_dir):
    return write_result(res, out_dir, "scaling", markdown)


def main(argv=None):
    args = parse_args(argv)
    meta = machine_meta(args.machine_label)
    meta["loadavg_start"] = loadavg()
    meta["command"] = shlex.join(["python", "benchmarks/bench_scaling.py"] + list(
        sys.argv[1:] if argv is None else argv))
    if (os.cpu_count() or 1) < 2:
        log("this machine has fewer than 2 cores: 2 threads cannot scale here")
    res = {"meta": meta,
           "config": {"k": args.k, "target": args.target, "m": args.m,
                      "ef_construction": args.ef_construction,
                      "build_threads": args.build_threads, "rounds": args.rounds,
                      "repeats": args.repeats, "warmup": args.warmup,
                      "queries": args.queries, "kd_ef_grid": KD_EF_GRID,
                      "kd_oversample_grid": KD_OVERSAMPLE_GRID, "hnswlib_ef_sweep": EF_SWEEP},
           "datasets": {}}
    if args.rounds < MIN_ROUNDS:
        log(f"{args.rounds} rounds: fewer than {MIN_ROUNDS}, the result is provisional")
    for spec in [s.strip() for s in args.dataset.split(",") if s.strip()]:
        reason = None if args.make_missing else missing_reason(spec, args.queries)
        if reason:
            log(f"{spec}: skipped: {reason}")
            res["datasets"][spec] = {"skipped": reason}
        else:
            d = bench_dataset(spec, args)
            res["datasets"][d["dataset"]["name"]] = d
        meta["loadavg_end"] = loadavg()
        write(res, args.out)
    md = write(res, args.out)
    print()
    print(markdown(res))
    log(f"wrote {md} and scaling.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
