"""What a cheaper build costs the search: one set built with each
ef_construction (2 threads, M 16, each build in a fresh process), then every
graph searched over one grid of (ef, oversample), the graphs interleaved at
each point, and the 1-thread QPS at recall@10 0.95 read off each graph's
Pareto front.

    python benchmarks/build_tradeoff.py clustered-100k-384
    python benchmarks/build_tradeoff.py minilm-wordnet --efc 200,128,100,64

The figure to read is build time against QPS at 0.95, both relative to the
first ef_construction given (the default, 200): a lower ef_construction is
a trade only if the second falls less than the first.

A value written EFC:1bit builds with insertion's beam over the 1-bit codes
(their best re-scored with the 8-bit build codes) from the first row, and
EFC:8bit with the beam over the build codes throughout, whatever the core's
rules (the cache, the centres' share of the spread) would choose; the core's
test hook (_set_beam_rule) forces either:

    python benchmarks/build_tradeoff.py minilm-dict --efc 200:8bit,200,150:1bit
"""
import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_data  # noqa: E402
import report  # noqa: E402

BUILD = """
import sys, time
sys.path.insert(0, sys.argv[1])
import knndirect as kd, bench_data
ds = bench_data.resolve(sys.argv[2]); x = bench_data.load_base(ds.to_json())
kd._core._set_beam_rule({"": 0, "1bit": 1, "8bit": -1}[sys.argv[5]])
t = time.perf_counter()
ix = kd.Index(ds.dim, ds.metric, m=16, ef_construction=int(sys.argv[3]), seed=0)
ix.add(x, threads=2)
print(time.perf_counter() - t)
if sys.argv[4]:
    ix.save(sys.argv[4])
"""
EFS, OVERSAMPLES = "24,32,48,64,96,128,192", "3,5,10"


def timed_build(dataset, ef_construction, beam="", path=""):
    """Seconds one build of dataset takes in a fresh process (2 threads, M
    16, index seed 0); beam "1bit" or "8bit" forces insertion's beam, and
    the index is saved to path when one is given."""
    out = subprocess.run([sys.executable, "-c", BUILD, str(HERE), dataset, str(ef_construction),
                          path, beam], capture_output=True, text=True, check=True)
    return float(out.stdout.split()[-1])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dataset")
    ap.add_argument("--efc", default="200,100,64",
                    help="ef_construction values, base first; EFC:1bit or EFC:8bit forces a beam")
    ap.add_argument("--passes", type=int, default=3, help="timed passes a point (median)")
    ap.add_argument("--ef", default=EFS, help="the grid's beams")
    ap.add_argument("--oversample", default=OVERSAMPLES,
                    help="the grid's shortlists, in multiples of k (1-bit sets of 256 "
                         "dimensions need 12-20 to reach 0.95)")
    args = ap.parse_args(argv)
    try:
        grid = [(int(ef), float(os_)) for ef in args.ef.split(",")
                for os_ in args.oversample.split(",")]
    except ValueError:
        ap.error("--ef and --oversample: comma-separated numbers")
    efcs = args.efc.split(",")
    parts = {efc: efc.partition(":")[::2] for efc in efcs}  # (ef_construction, beam)
    for efc, (value, beam) in parts.items():
        if not value.isdigit() or beam not in ("", "1bit", "8bit"):
            ap.error(f"--efc {efc}: a number, or a number and ':1bit' or ':8bit'")
    ds = bench_data.resolve(args.dataset)
    j = ds.to_json()
    q, truth = bench_data.load_queries(j), np.load(j["gt_path"])
    import knndirect as kd

    with tempfile.TemporaryDirectory() as tmp:
        build, ixs = {}, {}
        for efc in efcs:
            p = f"{tmp}/efc-{efc.replace(':', '-')}.kdx"
            value, beam = parts[efc]
            build[efc] = timed_build(args.dataset, value, beam, p)
            print(f"ef_construction {efc}: build {build[efc]:.1f} s", flush=True)
            ixs[efc] = kd.load(p)
        runs = {efc: [] for efc in efcs}
        for ef, os_ in grid:
            qps = {efc: [] for efc in efcs}
            for r in range(args.passes):
                for efc in (efcs if r % 2 == 0 else efcs[::-1]):
                    ixs[efc].search(q[:100], 10, ef=ef, oversample=os_, threads=1)
                    t = time.perf_counter()
                    _, ids = ixs[efc].search(q, 10, ef=ef, oversample=os_, threads=1)
                    qps[efc].append(len(q) / (time.perf_counter() - t))
                    if r == 0:
                        rec = kd.datasets.recall_at_k(ids, truth)
                        runs[efc].append({"recall": rec, "qps": 0.0, "ef": ef, "os": os_})
            for efc in efcs:
                runs[efc][-1]["qps"] = statistics.median(qps[efc])
        for ix in ixs.values():
            ix.close()
    base = efcs[0]
    at = {efc: report.qps_at_recall(report.pareto_front(runs[efc])) for efc in efcs}
    print(f"\n{ds.name}: 1-thread QPS at recall@10 0.95 (medians of {args.passes} interleaved "
          f"passes), builds with 2 threads\n")
    print("| ef_construction | build s | build ÷ base | QPS@0.95 | QPS ÷ base | max recall "
          "| recall − base's, same (ef, oversample): median, range |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for efc in efcs:
        qa = at[efc]
        qps = f"{qa:,.0f}" if qa else "-"
        ratio = f"{qa / at[base]:.3f}" if qa and at[base] else "-"
        diff = [a["recall"] - b["recall"] for a, b in zip(runs[efc], runs[base])]
        print(f"| {efc} | {build[efc]:.1f} | {build[efc] / build[base]:.3f} | {qps} | {ratio} | "
              f"{max(r['recall'] for r in runs[efc]):.4f} | {statistics.median(diff):+.4f}, "
              f"{min(diff):+.4f} to {max(diff):+.4f} |")


if __name__ == "__main__":
    main()
