"""Cost of the storage layer: saving and loading an index through each kind
of target and source, against a path.

    python benchmarks/bench_storage.py [--n 200000] [--dim 128] [--runs 7]

Save targets: a path (atomic: temporary file, fsync, rename), an open file
object (open(..., "wb"), flushed and fsynced so that it does what the path
does, and once more without the fsync), an io.BytesIO, and to_bytes().
Load sources: a path, bytes already in memory, an open file object
(open(..., "rb")) and an io.BytesIO. The file is in the page cache for every
load (bytes in memory are, too).

The configurations run round-robin, `--runs` rounds; each figure is the
median over rounds, and each ratio is the median of the per-round ratios
(both sides measured in the same round). The machine is shared: medians, not
means. Build time is reported so the save can be put against indexing time.
"""
import argparse
import io
import json
import os
import statistics
import sys
import tempfile
import time

import numpy as np

import knndirect as kd
from knndirect.datasets import clustered


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=200_000)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--dir", default=None,
                    help="directory on the disk under test (default: a temporary one)")
    ap.add_argument("--json", default=None, help="also write the figures to this file")
    ap.add_argument("--reuse", action="store_true",
                    help="load the index built by an earlier run (benchmarks/data/storage) "
                    "instead of building it again")
    args = ap.parse_args(argv)
    if args.runs < 5:
        ap.error("--runs must be at least 5 (figures are medians)")

    tmp = tempfile.TemporaryDirectory(dir=args.dir)
    d = tmp.name
    x = clustered(args.n, args.dim, seed=1)
    print("knndirect %s, %d x %d l2, %d rounds, directory %s" % (
        kd.__version__ if hasattr(kd, "__version__") else "", args.n, args.dim, args.runs, d),
        flush=True)
    cache = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "storage",
                         "storage_%d_%d.kdx" % (args.n, args.dim))
    if args.reuse and os.path.exists(cache) and os.path.exists(cache + ".json"):
        idx = kd.load(cache)
        build_s = json.load(open(cache + ".json"))["build_s"]
        print("reusing %s (built in %.1f s)" % (cache, build_s))
    else:
        build_s, idx = timed(lambda: _build(x))
        os.makedirs(os.path.dirname(cache), exist_ok=True)
        idx.save(cache)
        json.dump({"build_s": build_s}, open(cache + ".json", "w"))
    path = os.path.join(d, "index.kdx")
    idx.save(path)
    size = os.path.getsize(path)
    print("build %.1f s; index file %.1f MiB" % (build_s, size / 2**20), flush=True)

    def save_path():
        idx.save(path)

    def save_file_fsync():
        with open(os.path.join(d, "file.kdx"), "wb") as f:
            idx.save(f)
            f.flush()
            os.fsync(f.fileno())

    def save_file():
        with open(os.path.join(d, "file.kdx"), "wb") as f:
            idx.save(f)

    def save_bytesio():
        b = io.BytesIO()
        idx.save(b)
        return b

    def to_bytes():
        return idx.to_bytes()

    blob = idx.to_bytes()

    def load_path():
        return kd.load(path)

    def load_bytes():
        return kd.load(blob)

    def load_file():
        with open(path, "rb") as f:
            return kd.load(f)

    def load_bytesio():
        return kd.load(io.BytesIO(blob))

    saves = [("path (atomic, fsync)", save_path), ("file object + fsync", save_file_fsync),
             ("file object", save_file), ("io.BytesIO", save_bytesio), ("to_bytes()", to_bytes)]
    loads = [("path", load_path), ("bytes", load_bytes), ("file object", load_file),
             ("io.BytesIO", load_bytesio)]
    saves = [("save: " + name, fn) for name, fn in saves]
    loads = [("load: " + name, fn) for name, fn in loads]
    times = {name: [] for name, _ in saves + loads}
    for r in range(args.runs):
        for name, fn in saves:
            t, out = timed(fn)
            del out
            times[name].append(t)
        for name, fn in loads:
            t, got = timed(fn)
            assert len(got) == args.n
            got.close()
            times[name].append(t)
        print("round %d done" % (r + 1), flush=True)

    def ratio(a, b):
        return statistics.median(x / y for x, y in zip(times[a], times[b]))

    med = {k: statistics.median(v) for k, v in times.items()}
    print()
    print("| save to | median | vs path | share of build time |")
    print("| --- | --- | --- | --- |")
    for name, _ in saves:
        print("| %s | %.1f ms | %.3f | %.2f%% |" % (
            name[6:], med[name] * 1e3, ratio(name, saves[0][0]), 100 * med[name] / build_s))
    print()
    print("| load from | median | vs path |")
    print("| --- | --- | --- |")
    for name, _ in loads:
        print("| %s | %.1f ms | %.3f |" % (name[6:], med[name] * 1e3, ratio(name, "load: path")))
    print()
    file_vs_path = ratio("save: file object + fsync", "save: path (atomic, fsync)")
    bytes_vs_path = ratio("load: bytes", "load: path")
    print("targets: save through a file object (+fsync) / save to a path = %.3f (<= 1.05: %s);"
          % (file_vs_path, "met" if file_vs_path <= 1.05 else "MISSED"))
    print("         load from bytes / load from a path = %.3f (<= 1.05: %s)"
          % (bytes_vs_path, "met" if bytes_vs_path <= 1.05 else "MISSED"))
    print("writing the index costs %.2f%% of indexing time (build %.1f s + save to a path)"
          % (100 * med["save: path (atomic, fsync)"] /
             (build_s + med["save: path (atomic, fsync)"]),
             build_s))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"n": args.n, "dim": args.dim, "runs": args.runs, "build_s": build_s,
                       "file_bytes": size, "times_s": times, "median_s": med,
                       "file_fsync_vs_path": file_vs_path, "bytes_vs_path": bytes_vs_path},
                      f, indent=1)
    idx.close()
    tmp.cleanup()
    return 0


def _build(x):
    idx = kd.Index(x.shape[1], "l2")
    idx.add(x)
    return idx


if __name__ == "__main__":
    sys.exit(main())
