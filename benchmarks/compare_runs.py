"""Graph quality of two builds: knndirect's recall@k at every search point
of two benchmarks/run.py results on the same dataset (say, before and after
a change to the build), side by side.

    python benchmarks/compare_runs.py OLD.json NEW.json [--system knndirect] [--threads 1]

Recall at equal search parameters (ef, oversample) is the same search cost
for both graphs, so its difference is the change in graph quality; the
build times and QPS@0.95 of both runs are printed beside it.
"""
import argparse
import json
import statistics


def points(result, system, threads):
    runs = result["systems"][system]["search"]["runs"]
    return {(r["params"].get("ef"), r["params"].get("oversample")): r["recall"]
            for r in runs if r["threads"] == threads and not r["params"].get("default")}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--system", default="knndirect")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    old, new = (json.load(open(p)) for p in (args.old, args.new))
    a, b = points(old, args.system, args.threads), points(new, args.system, args.threads)
    common = sorted(set(a) & set(b))
    if not common:
        raise SystemExit("no search point in common")
    print("| ef | oversample | recall old | recall new | new - old |")
    print("| --- | --- | --- | --- | --- |")
    for key in common:
        print(f"| {key[0]} | {key[1]} | {a[key]:.4f} | {b[key]:.4f} | {b[key] - a[key]:+.4f} |")
    diffs = [b[k] - a[k] for k in common]
    near = [b[k] - a[k] for k in common if 0.9 <= a[k] <= 0.99]
    print(f"\n{len(common)} points: mean {statistics.mean(diffs):+.4f}, "
          f"min {min(diffs):+.4f}, max {max(diffs):+.4f}")
    if near:
        print(f"{len(near)} points with old recall 0.90-0.99: mean {statistics.mean(near):+.4f}, "
              f"min {min(near):+.4f}")
    for name, res in (("old", old), ("new", new)):
        s = res["systems"][args.system]
        builds = {b["build_threads"]: round(b["build_s"], 1) for b in s.get("builds", [])}
        print(f"{name}: commit {res['meta'].get('knndirect_commit')}, build s by threads {builds}, "
              f"QPS@0.95 {s.get('qps_at_target')}")


if __name__ == "__main__":
    main()
