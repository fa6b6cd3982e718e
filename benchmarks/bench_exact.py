"""Exact (brute-force) search against the machine's limits and against peers.

    python benchmarks/bench_exact.py [--n 300000] [--dim 768] [--k 100] [--repeats 5]

Measured in one run, on the same data:
  * memory: a read probe (knndirect._core._read_probe: every core streaming a
    float32 buffer) gives the memory bandwidth; exact search over the in-memory
    index is reported as the bandwidth it sustains (bytes of vectors scanned /
    time) and as a fraction of the probe, and against numpy (matmul +
    argpartition) for one query;
  * batches of 64 queries, ip and l2, against faiss-cpu's IndexFlatIP and
    IndexFlatL2 when installed, and against numpy's float32 matrix product of
    the same shape with no top-k kept (BLAS: the bound on the arithmetic);
  * disk: the index is saved, the page cache dropped (root only; said when it
    cannot be), and exact search over kd.open streams the vector section with
    O_DIRECT; a probe measures the file's sequential O_DIRECT read bandwidth
    with fio (io_uring, 1 MiB blocks, 24 in flight: the stream's own depth)
    when fio is installed, else with a Python O_DIRECT reader.

Medians of --repeats runs. Writes benchmarks/results/exact.json and .md.
"""
from __future__ import annotations

import argparse
import json
import mmap
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

from diskio import drop_caches, vector_section

import knndirect as kd
from knndirect import _core
from knndirect.datasets import clustered

HERE = os.path.dirname(os.path.abspath(__file__))


def median_time(fn, repeats):
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def fio_bandwidth(path, offset, length):
    if shutil.which("fio") is None:
        return None, "fio not installed"
    cmd = ["fio", "--name=seqprobe", f"--filename={path}", "--rw=read", "--bs=1M",
           "--iodepth=24", "--direct=1", "--ioengine=io_uring", f"--offset={offset}",
           f"--size={length}", "--readonly", "--output-format=json"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        cmd[cmd.index("--ioengine=io_uring")] = "--ioengine=libaio"
        r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        return None, "fio failed: " + r.stderr.strip()[:200]
    job = json.loads(r.stdout)["jobs"][0]["read"]
    return job["bw_bytes"], "fio io_uring/libaio, 1 MiB, depth 24, O_DIRECT"


def python_direct_bandwidth(path, offset, length, block=8 << 20):
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    buf = mmap.mmap(-1, block)
    t = time.perf_counter()
    done = 0
    try:
        while done < length:
            n = os.preadv(fd, [buf], offset + done)
            if n <= 0:
                break
            done += n
    finally:
        os.close(fd)
    return done / (time.perf_counter() - t), "Python O_DIRECT preadv, 8 MiB, depth 1"



def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--n", type=int, default=300_000)
    ap.add_argument("--dim", type=int, default=768)
    ap.add_argument("--k", type=int, default=100)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--dir", default=None, help="where the index file goes (default: temp dir)")
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    args = ap.parse_args(argv)
    threads = os.cpu_count() or 1
    rows = []
    res = {"n": args.n, "dim": args.dim, "k": args.k, "threads": threads,
           "machine": f"{platform.machine()}, {threads} cores", "features": kd.features()}

    print(f"data: {args.n:,} x {args.dim} float32 ({args.n * args.dim * 4 / 2**30:.2f} GiB), "
          f"k={args.k}, {threads} threads", flush=True)
    x = clustered(args.n, args.dim, seed=1)
    queries = clustered(args.batch, args.dim, seed=2)
    # Exact search needs only the vectors: the cheapest graph will do.
    index = kd.Index(args.dim, "ip", m=4, ef_construction=8)
    index.add(x)
    nbytes = x.nbytes

    probe = statistics.median(_core._read_probe(x, threads) for _ in range(args.repeats))
    membw = nbytes / probe
    one = median_time(lambda: index.search(queries[0], args.k, exact=True), args.repeats)
    q0 = queries[0]
    npy = median_time(lambda: np.argpartition(-(x @ q0), args.k)[:args.k], args.repeats)
    res["memory"] = {"probe_GBps": membw / 1e9, "single_query_ms": one * 1e3,
                     "single_query_GBps": nbytes / one / 1e9,
                     "fraction_of_probe": nbytes / one / membw,
                     "numpy_ms": npy * 1e3, "speedup_vs_numpy": npy / one}
    rows.append(("in memory, 1 query", f"{one * 1e3:.1f} ms", f"{nbytes / one / 1e9:.1f} GB/s",
                 f"{nbytes / one / membw:.0%} of {membw / 1e9:.1f} GB/s probe",
                 f"numpy matmul+argpartition {npy * 1e3:.1f} ms: {npy / one:.1f}x"))

    # The batch rows: the bound is BLAS's float32 matrix product of the same
    # shape with no top-k kept (OpenBLAS through numpy), the peer faiss-cpu's
    # flat index of the same metric.
    flops = 2.0 * args.batch * args.n * args.dim
    gemm = median_time(lambda: x @ queries.T, args.repeats)
    res["memory"]["sgemm_ms"] = gemm * 1e3
    try:
        import faiss
        faiss.omp_set_num_threads(threads)
    except ImportError:
        faiss = None
    for metric in ("ip", "l2"):
        scored = index if metric == "ip" else kd.Index(args.dim, "l2", m=4, ef_construction=8)
        if scored is not index:
            scored.add(x)
        batch = median_time(lambda s=scored: s.search(queries, args.k, exact=True), args.repeats)
        res["memory"][f"batch_{metric}_ms"] = batch * 1e3
        peer = "faiss-cpu not installed"
        if faiss is not None:
            flat = (faiss.IndexFlatIP if metric == "ip" else faiss.IndexFlatL2)(args.dim)
            flat.add(x)
            fb = median_time(lambda f=flat: f.search(queries, args.k), args.repeats)
            res["memory"][f"faiss_flat_{metric}_batch_ms"] = fb * 1e3
            res["memory"][f"batch_{metric}_speedup_vs_faiss"] = fb / batch
            peer = f"faiss IndexFlat{metric.upper()} {fb * 1e3:.0f} ms: {fb / batch:.2f}x"
            del flat
        if scored is not index:
            scored.close()
        rows.append((f"in memory, batch of {args.batch}, {metric}", f"{batch * 1e3:.0f} ms",
                     f"{flops / batch / 1e9:.0f} GFLOP/s",
                     f"{gemm / batch:.0%} of numpy sgemm alone ({flops / gemm / 1e9:.0f} GFLOP/s, "
                     "no top-k)", peer))

    workdir = tempfile.mkdtemp(prefix="kd-exact-", dir=args.dir)
    try:
        path = os.path.join(workdir, "exact.kdx")
        index.save(path)
        index.close()
        del x
        off, length = vector_section(path)
        dropped = drop_caches()
        bw, how = fio_bandwidth(path, off, length)
        if bw is None:
            bw, how = python_direct_bandwidth(path, off, length)
        with kd.open(path) as opened:
            info = opened.info()
            times = []
            for _ in range(args.repeats):
                drop_caches()
                t = time.perf_counter()
                opened.search(queries[0], args.k, exact=True)
                times.append(time.perf_counter() - t)
            disk = statistics.median(times)
            st = opened.stats()
        scanned = st["read_bytes"] / max(1, st["queries"])
        res["disk"] = {"probe": how, "probe_MBps": bw / 1e6, "single_query_ms": disk * 1e3,
                       "MBps": scanned / disk / 1e6, "fraction_of_probe": scanned / disk / bw,
                       "io_backend": info["io_backend"], "direct_io": info["direct_io"],
                       "page_cache_dropped": dropped}
        rows.append(("from disk (O_DIRECT stream), 1 query", f"{disk * 1e3:.0f} ms",
                     f"{scanned / disk / 1e6:.0f} MB/s",
                     f"{scanned / disk / bw:.0%} of {bw / 1e6:.0f} MB/s probe ({how})",
                     f"backend {info['io_backend']}, direct_io={info['direct_io']}"))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    md = [f"Exact search, {args.n:,} x {args.dim} float32, k={args.k}, {threads} threads "
          f"({res['machine']}, kernels {res['features']['simd']}); medians of {args.repeats}"
          + ("" if res.get("disk", {}).get("page_cache_dropped", True)
             else "; page cache NOT dropped (not root)"),
          "", "| case | time | throughput | vs the machine | vs peer |",
          "| --- | --- | --- | --- | --- |"]
    md += ["| " + " | ".join(r) + " |" for r in rows]
    text = "\n".join(md)
    print(text)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "exact.json"), "w") as f:
        json.dump(res, f, indent=2)
    with open(os.path.join(args.out, "exact.md"), "w") as f:
        f.write(text + "\n\nCommand: `python benchmarks/bench_exact.py "
                + " ".join(sys.argv[1:]) + "`\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
