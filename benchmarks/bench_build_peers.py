"""Build time against the peers, interleaved: the figure behind "builds at
the speed of the fastest peer", measured so that one noisy build cannot
decide it.

    python benchmarks/bench_build_peers.py                      # 3 sets, 5 rounds
    python benchmarks/bench_build_peers.py --dataset minilm-wordnet --systems knndirect,hnswlib,scann --rounds 5

Each round builds every system once (M 16, ef_construction 200, --threads
build threads, 2 by default) on each dataset, each build in a fresh process
(benchmarks/worker.py, as run.py uses it; nothing is saved), in an order
rotated by one from round to round so that load drifts fall on all systems
alike. Reported per set: each system's median build seconds, and the median
over rounds of knndirect's build time over each peer's in the same round.
Graph quality at equal search cost is run.py's business (see
benchmarks/compare_runs.py); this script times builds only.

Writes benchmarks/results/build-peers.json and .md (--out to change the
folder), naming the machine, its load averages, the commit and the command.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_data  # noqa: E402
from run import machine_meta, run_worker  # noqa: E402

DEFAULT_SETS = "minilm-wordnet,clustered-100k-384,clustered-100k-768"


def bench_set(spec, systems, args, log_path):
    ds = bench_data.resolve(spec)
    cfg = {"metric": ds.metric, "m": 16, "ef_construction": 200, "k": 10, "dim": ds.dim,
           "n": ds.n, "quick": False, "scratch": str(bench_data.DATA / "indexes" / ds.name)}
    Path(cfg["scratch"]).mkdir(parents=True, exist_ok=True)
    times = {name: [] for name in systems}
    for rnd in range(args.rounds):
        order = systems[rnd % len(systems):] + systems[:rnd % len(systems)]
        for name in order:
            r = run_worker({"phase": "build", "system": name, "cfg": cfg,
                            "dataset": ds.to_json(), "threads": args.threads, "save_to": None},
                           args.timeout, log_path)
            if "build_s" not in r:
                raise SystemExit(f"{name} on {ds.name}: {r}")
            times[name].append(r["build_s"])
            print(f"[build-peers] {ds.name} round {rnd + 1}: {name} {r['build_s']:.1f} s",
                  flush=True)
    ratios = {peer: statistics.median(a / b for a, b in zip(times["knndirect"], times[peer]))
              for peer in systems if peer != "knndirect"}
    return {"dataset": ds.name, "n": ds.n, "dim": ds.dim, "metric": ds.metric, "times": times,
            "median_s": {k: statistics.median(v) for k, v in times.items()},
            "ratio_median": ratios}


def report(result):
    m = result["meta"]
    lines = ["# Build time against the peers, interleaved", "",
             f"{m['date']}, {m['machine_label']}: {m['cpu']}, {m['nproc']} cores; knndirect "
             f"{m['knndirect_commit']}. Load average {m['loadavg_start']:.2f} at the start, "
             f"{m['loadavg_end']:.2f} at the end. {result['rounds']} rounds, each system built "
             f"once per round in a fresh process with {result['threads']} threads, M 16, "
             "ef_construction 200, in an order rotated every round.", "",
             "| set | system | median build s | all builds s | knndirect / system (median of "
             "per-round ratios) |", "| --- | --- | ---: | --- | ---: |"]
    for s in result["sets"]:
        for name, ts in s["times"].items():
            ratio = "" if name == "knndirect" else f"{s['ratio_median'][name]:.2f}"
            lines.append(f"| {s['dataset']} ({s['n']:,} x {s['dim']}, {s['metric']}) | {name} | "
                         f"{s['median_s'][name]:.1f} | {', '.join(f'{t:.1f}' for t in ts)} | "
                         f"{ratio} |")
    lines += ["", "Command:", "", "```", result["command"], "```", ""]
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dataset", default=DEFAULT_SETS)
    ap.add_argument("--systems", default="knndirect,hnswlib,scann")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=3600)
    ap.add_argument("--out", default=str(HERE / "results"))
    ap.add_argument("--machine-label", default=os.environ.get(
        "KNNDIRECT_BENCH_MACHINE", "2-core VM"))
    args = ap.parse_args(argv)
    systems = args.systems.split(",")
    if systems[0] != "knndirect":
        raise SystemExit("--systems must start with knndirect")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = machine_meta(args.machine_label)
    result = {"meta": meta, "rounds": args.rounds, "threads": args.threads,
              "command": "python benchmarks/bench_build_peers.py " + shlex.join(sys.argv[1:]),
              "sets": [bench_set(spec, systems, args, out / "build-peers.log")
                       for spec in args.dataset.split(",")]}
    meta["loadavg_end"] = machine_meta(None)["loadavg_start"]
    (out / "build-peers.json").write_text(json.dumps(result, indent=1))
    (out / "build-peers.md").write_text(report(result))
    print(report(result))


if __name__ == "__main__":
    main()
