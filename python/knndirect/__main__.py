"""Command line: python -m knndirect {build,search,info,verify,bench,demo,doctor} ...

    knndirect build INPUT OUTPUT      build an index from .npy/.fvecs/.bvecs/HDF5
    knndirect search INDEX QUERIES    search, print a summary (and recall with --gt)
    knndirect info INDEX              sizes, backend, alignment, resident memory
    knndirect verify INDEX            check every checksum: "ok" or the error
    knndirect bench [ARGS...]         run benchmarks/run.py with ARGS
    knndirect demo                    build, open and search generated data
    knndirect doctor [PATH]           backend, O_DIRECT, SIMD and a device probe at PATH

Exit status: 0 on success, 1 on an error (printed without a traceback), 2 on
a usage error, 130 when interrupted with Ctrl-C.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
import warnings

import numpy as np

from knndirect import _core

EXIT_ERROR = 1
EXIT_INTERRUPTED = 130
# The CLI feeds its input to Index.add in chunks of about this many bytes of
# float32, so that a memory-mapped input larger than RAM is never converted
# whole.
BUILD_CHUNK_BYTES = 256 << 20


def _demo(args):
    import knndirect as kd
    from knndirect.datasets import clustered, ground_truth, recall_at_k

    print(f"knndirect demo: {args.n:,} x {args.dim} clustered float32, metric={args.metric}, "
          f"k={args.k}")
    print(f"features: {kd.features()}")
    data = clustered(args.n + args.queries, args.dim, seed=args.seed)
    base, queries = data[:args.n], data[args.n:]

    t0 = time.perf_counter()
    index = kd.Index(args.dim, args.metric, m=args.m, ef_construction=args.ef_construction)
    index.add(base, progress=True if sys.stderr.isatty() else None)
    build_s = time.perf_counter() - t0
    print(f"build: {build_s:.1f} s ({args.n / build_s:,.0f} vectors/s, all cores)")

    workdir = tempfile.mkdtemp(prefix="knndirect-demo-", dir=args.dir)
    path = os.path.join(workdir, "demo.kdx")
    try:
        t0 = time.perf_counter()
        index.save(path)
        print(f"save: {time.perf_counter() - t0:.2f} s, {os.path.getsize(path) / 2**20:.1f} MiB "
              f"-> {path}")
        truth, _ = ground_truth(base, queries, args.k, args.metric)

        with kd.open(path, direct_io=True, io_backend=args.io_backend) as opened:
            info = opened.info()
            latencies = []
            found = np.empty((len(queries), args.k), dtype=np.int64)
            opened.search(queries[0], args.k)   # warm the mapped graph and codes
            opened.stats(reset=True)
            for i, q in enumerate(queries):
                t = time.perf_counter()
                _, found[i] = opened.search(q, args.k)
                latencies.append(time.perf_counter() - t)
            st = opened.stats(reset=True)
            t = time.perf_counter()
            _, batch_found = opened.search(queries, args.k)
            batch_s = time.perf_counter() - t
            lat = np.array(latencies) * 1e3
            per_q = st["read_bytes"] / max(1, st["queries"])
            # One read per shortlisted vector, rounded up to the O_DIRECT alignment.
            unit = -(-info["record_size"] // info["alignment"]) * info["alignment"]
            # The ideal counts the shortlist; records read early that the final
            # shortlist dropped come on top (reported apart).
            nq = max(1, st["queries"])
            ideal = (st["rerank_vectors"] - st["early_unused"]) / nq * unit
            print(f"opened: io_backend={info['io_backend']} direct_io={info['direct_io']} "
                  f"alignment={info['alignment']} record_size={info['record_size']} B "
                  f"resident={info['resident_bytes'] / 2**20:.1f} MiB "
                  f"(float32 data {args.n * args.dim * 4 / 2**20:.1f} MiB)"
                  + (f" fallbacks={info['fallbacks']}" if info["fallbacks"] else ""))
            print(f"recall@{args.k}: {recall_at_k(found, truth, args.k):.4f} "
                  f"(batch: {recall_at_k(batch_found, truth, args.k):.4f}) vs numpy brute force")
            print(f"latency, one query at a time: p50 {np.median(lat):.3f} ms, "
                  f"p99 {np.percentile(lat, 99):.3f} ms")
            print(f"batch of {len(queries)}: {len(queries) / batch_s:,.0f} queries/s")
            print(f"reads per query: {st['read_ops'] / max(1, st['queries']):.1f} ops, "
                  f"{per_q / 1024:.1f} KiB (ideal: shortlist x {unit} B = {ideal / 1024:.1f} KiB; "
                  f"read early then dropped: {st['early_unused'] / nq:.1f}), "
                  f"io wait {st['io_wait_seconds'] / max(1, st['queries']) * 1e3:.3f} ms/query")
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0


# -- helpers -----------------------------------------------------------------

def _human_bytes(n):
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def _is_hdf5(path):
    return os.path.splitext(os.fspath(path))[1].lower() in (".hdf5", ".h5")


class _Progress:
    """progress(done, total) for Index.add over a whole build: a tqdm bar
    when tqdm is installed, else a one-line percentage on stderr."""

    def __init__(self, total, label="build"):
        self.total = total
        self.label = label
        self.offset = 0
        self.last = -1
        try:
            from tqdm import tqdm
        except ImportError:
            self.bar = None
        else:
            self.bar = tqdm(total=total, unit="vec", unit_scale=True, desc=label,
                            file=sys.stderr)

    def __call__(self, done, _total):
        done = self.offset + done
        if self.bar is not None:
            self.bar.update(done - self.bar.n)
        else:
            pct = int(100 * done / max(1, self.total))
            if pct != self.last:
                self.last = pct
                sys.stderr.write(f"\r{self.label}: {done:,}/{self.total:,} vectors ({pct}%)")
                sys.stderr.flush()
        return True

    def close(self):
        if self.bar is not None:
            self.bar.close()
        elif self.last >= 0:
            sys.stderr.write("\n")
            sys.stderr.flush()


def _read_ids(path, n):
    from knndirect.datasets import read_vectors

    ids = np.asarray(read_vectors(path, mmap=False))
    if ids.ndim == 2 and ids.shape[1] == 1:
        ids = ids[:, 0]
    if ids.ndim != 1 or ids.shape[0] != n:
        raise ValueError(f"{path}: ids must be a 1-d array of {n} integers, got shape "
                         f"{ids.shape}")
    return ids


def _open_index(args):
    import knndirect as kd

    if getattr(args, "load", False):
        return kd.load(args.index)
    with warnings.catch_warnings():
        # Fallbacks (no O_DIRECT, no io_uring) are reported by the commands.
        warnings.simplefilter("ignore", RuntimeWarning)
        return kd.open(args.index, direct_io=not args.no_direct_io,
                       io_backend=args.io_backend, io_depth=args.io_depth,
                       threads=args.threads)


# -- build ---------------------------------------------------------------------

def _build(args):
    import knndirect as kd
    from knndirect.datasets import ann_hdf5_metric, read_vectors

    metric = args.metric
    if metric is None:
        metric = (ann_hdf5_metric(args.input) if _is_hdf5(args.input) else None) or "l2"
    data = read_vectors(args.input)
    if data.ndim != 2:
        raise ValueError(f"{args.input}: expected a 2-d array (n, dim), got shape {data.shape}")
    if args.limit is not None:
        data = data[:args.limit]
    n, dim = data.shape
    if n == 0:
        raise ValueError(f"{args.input} holds no vectors")
    ids = _read_ids(args.ids, n) if args.ids else None
    if args.memory_budget is not None:
        return _build_collection(args, data, ids, metric)
    if os.path.isdir(args.output):
        raise ValueError(f"{args.output} is a directory (to build a collection there, pass "
                         "--memory-budget)")
    print(f"build: {n:,} x {dim} from {args.input}, metric={metric}, m={args.m}, "
          f"ef_construction={args.ef_construction}, quantization={args.quantization}")
    show = args.progress or (args.progress is None and sys.stderr.isatty())
    progress = _Progress(n) if show else None
    index = kd.Index(dim, metric, m=args.m, ef_construction=args.ef_construction,
                     quantization=args.quantization, seed=args.seed)
    chunk = max(1, BUILD_CHUNK_BYTES // (4 * dim))
    t0 = time.perf_counter()
    try:
        for start in range(0, n, chunk):
            end = min(n, start + chunk)
            if progress is not None:
                progress.offset = start
            index.add(data[start:end], None if ids is None else ids[start:end],
                      threads=args.threads, progress=progress)
    except KeyboardInterrupt:
        if progress is not None:
            progress.close()
        print(f"\ninterrupted after {len(index):,} of {n:,} vectors; {args.output} was not "
              f"written", file=sys.stderr)
        return EXIT_INTERRUPTED
    if progress is not None:
        progress.close()
    build_s = time.perf_counter() - t0
    index.save(args.output)
    print(f"built {len(index):,} vectors in {build_s:.1f} s ({n / max(build_s, 1e-9):,.0f}/s); "
          f"wrote {args.output} ({_human_bytes(os.path.getsize(args.output))})")
    return 0


def _build_collection(args, data, ids, metric):
    """A collection at args.output: the input (memory-mapped) is added in
    chunks of the memory budget, each flushed to a segment, then merged down
    to --segments segments; the vectors are never all in RAM."""
    import knndirect as kd

    n, dim = data.shape
    out = args.output
    created = not os.path.exists(out)
    col = kd.Collection.create(out, dim, metric, m=args.m, ef_construction=args.ef_construction,
                               quantization=args.quantization, seed=args.seed,
                               memory_budget=args.memory_budget, merge_policy=None,
                               threads=args.threads)
    budget = col.info()["memory_budget"]
    print(f"build: {n:,} x {dim} from {args.input} into collection {out}, metric={metric}, "
          f"m={args.m}, ef_construction={args.ef_construction}, "
          f"quantization={args.quantization}, memory budget {_human_bytes(budget)}")
    show = args.progress or (args.progress is None and sys.stderr.isatty())
    t0 = time.perf_counter()
    try:
        progress = _Progress(n) if show else None
        try:
            col.add(data, ids, threads=args.threads, progress=progress)
            col.commit()
        finally:
            if progress is not None:
                progress.close()
        add_s = time.perf_counter() - t0
        print(f"added {n:,} vectors in {add_s:.1f} s as {len(col.segments())} segment(s)")
        if args.segments and len(col.segments()) > args.segments:
            live = len(col)
            progress = _Progress(live, "merge") if show else None
            try:
                col.merge(max_segments=args.segments, progress=progress)
            finally:
                if progress is not None:
                    progress.close()
    except KeyboardInterrupt:
        col.rollback()
        col.close()
        if created:
            shutil.rmtree(out, ignore_errors=True)
        print(f"\ninterrupted; {out} was not written", file=sys.stderr)
        return EXIT_INTERRUPTED
    build_s = time.perf_counter() - t0
    segs = col.segments()
    size = sum(s["bytes"] for s in segs)
    col.close()
    print(f"built {n:,} vectors in {build_s:.1f} s ({n / max(build_s, 1e-9):,.0f}/s); "
          f"wrote collection {out}: {len(segs)} segment(s), {_human_bytes(size)}")
    return 0


# -- search --------------------------------------------------------------------

def _search(args):
    from knndirect.datasets import read_ann_hdf5, read_vectors, recall_at_k

    truth = None
    if _is_hdf5(args.queries):
        _, queries, truth = read_ann_hdf5(args.queries)
    else:
        queries = read_vectors(args.queries)
    if args.gt:
        truth = read_ann_hdf5(args.gt)[2] if _is_hdf5(args.gt) else read_vectors(args.gt)
    queries = np.asarray(queries)
    if queries.ndim == 1:
        queries = queries[None]
    if args.limit is not None:
        queries = queries[:args.limit]
        if truth is not None:
            truth = truth[:args.limit]
    queries = np.ascontiguousarray(queries, dtype=np.float32)
    if truth is not None:
        truth = np.asarray(truth)
        if truth.ndim != 2 or truth.shape[0] != len(queries):
            raise ValueError(f"ground truth has shape {truth.shape}, expected "
                             f"({len(queries)}, k)")
    kw = dict(ef=args.ef, oversample=args.oversample, rerank=not args.no_rerank,
              exact=args.exact, threads=args.threads)
    with _open_index(args) as index:
        info = index.info()
        index.stats(reset=True)
        if args.one_by_one:
            D = np.empty((len(queries), args.k), dtype=np.float32)
            I = np.empty((len(queries), args.k), dtype=np.int64)
            lat = np.empty(len(queries))
            t0 = time.perf_counter()
            for i, q in enumerate(queries):
                t = time.perf_counter()
                D[i], I[i] = index.search(q, args.k, **kw)
                lat[i] = time.perf_counter() - t
            elapsed = time.perf_counter() - t0
        else:
            t0 = time.perf_counter()
            D, I = index.search(queries, args.k, **kw)
            elapsed = time.perf_counter() - t0
        st = index.stats()
    nq = len(queries)
    print(f"searched {nq:,} queries, k={args.k}, in {elapsed:.3f} s "
          f"({nq / max(elapsed, 1e-9):,.0f} queries/s); index {info['count']:,} x "
          f"{info['dim']} {info['metric']}, backend={info['io_backend']}"
          + (f", fallbacks={','.join(info['fallbacks'])}" if info["fallbacks"] else ""))
    if args.one_by_one:
        print(f"latency: p50 {np.median(lat) * 1e3:.3f} ms, p99 "
              f"{np.percentile(lat, 99) * 1e3:.3f} ms")
    if st["queries"] and st["read_ops"]:
        print(f"reads per query: {st['read_ops'] / st['queries']:.1f} ops, "
              f"{st['read_bytes'] / st['queries'] / 1024:.1f} KiB, io wait "
              f"{st['io_wait_seconds'] / st['queries'] * 1e3:.3f} ms")
    if truth is not None:
        k = min(args.k, truth.shape[1])
        print(f"recall@{k}: {recall_at_k(I, truth, k):.4f}")
    if args.out:
        np.savez(args.out, D=D, I=I)
        print(f"wrote {args.out} (D float32 {D.shape}, I int64 {I.shape})")
    return 0


# -- info / verify -----------------------------------------------------------------

# Metric names, in code order, from the C core's table.
_METRIC_NAMES = tuple(m["name"] for m in _core.METRICS)

_INFO_ORDER = ("path", "count", "slots", "dim", "metric", "quantization", "m",
               "ef_construction", "storage", "io_backend", "direct_io", "alignment",
               "record_size", "code_size", "resident_bytes", "default_ef",
               "default_oversample", "fallbacks")
_INFO_BYTES = ("record_size", "code_size", "resident_bytes", "file_bytes", "alignment")


def _info(args):
    import knndirect as kd

    with _open_index(args) as index:
        info = dict(index.info())
        if isinstance(index, kd.Collection):
            info["file_bytes"] = sum(s["bytes"] for s in index.segments())
    if not args.load and "file_bytes" not in info:
        info["file_bytes"] = os.path.getsize(args.index)
    info["vector_bytes"] = info["count"] * info["dim"] * 4
    if args.json:
        info["features"] = kd.features()
        print(json.dumps(info, indent=2, sort_keys=True, default=str))
        return 0
    keys = [k for k in _INFO_ORDER if k in info]
    keys += sorted(k for k in info if k not in keys)
    width = max(len(k) for k in keys)
    for key in keys:
        value = info[key]
        if key in _INFO_BYTES or key == "vector_bytes":
            value = f"{value:,} B" if value < 1024 else f"{_human_bytes(value)} ({value:,} B)"
        elif isinstance(value, (list, tuple)):
            value = ", ".join(map(str, value)) if value else "none"
        elif isinstance(value, int) and not isinstance(value, bool):
            value = f"{value:,}"
        print(f"{key:<{width}}  {value}")
    return 0


def _verify(args):
    import knndirect as kd

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            with kd.open(args.index) as index:
                index.verify()
    except (ValueError, OSError, KeyError) as e:
        msg = str(e)
        print(msg if args.index in msg else f"{args.index}: {msg}", file=sys.stderr)
        return EXIT_ERROR
    print("ok")
    return 0


# -- bench ---------------------------------------------------------------------

def _find_bench():
    """benchmarks/run.py in the current directory or the source tree this
    package runs from."""
    here = os.path.dirname(os.path.abspath(__file__))
    for root in (os.getcwd(), os.path.dirname(os.path.dirname(here))):
        path = os.path.join(root, "benchmarks", "run.py")
        if os.path.isfile(path):
            return path
    return None


def _bench(argv):
    import subprocess

    script = _find_bench()
    if script is None:
        print("knndirect bench: benchmarks/run.py not found. The benchmark suite ships with "
              "the source tree, not the wheel: run this from a checkout of knndirect.",
              file=sys.stderr)
        return EXIT_ERROR
    try:
        return subprocess.call([sys.executable, script] + list(argv))
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


# -- doctor ----------------------------------------------------------------------

def _doctor(args):
    from knndirect._doctor import run

    if args.probe_seconds < 0 or args.probe_mib <= 0:
        raise ValueError("--probe-seconds must be >= 0 and --probe-mib > 0")
    return run(args)


# -- main ----------------------------------------------------------------------

def _add_open_options(p):
    g = p.add_mutually_exclusive_group()
    g.add_argument("--open", dest="load", action="store_false",
                   help="open with the vectors on disk (default)")
    g.add_argument("--load", dest="load", action="store_true",
                   help="load the whole index into memory instead")
    p.set_defaults(load=False)
    p.add_argument("--io-backend", default="auto",
                   choices=("auto", "io_uring", "threads", "pread", "mmap"))
    p.add_argument("--io-depth", type=int, default=128, help="reads in flight (default 128)")
    p.add_argument("--no-direct-io", action="store_true", help="buffered reads, no O_DIRECT")
    p.add_argument("--threads", type=int, default=None, help="native threads (default: all)")


def _parser():
    from knndirect import __version__

    parser = argparse.ArgumentParser(
        prog="knndirect", description="k-NN search over indexes larger than RAM: build, "
        "search, inspect and verify knndirect index files.")
    parser.add_argument("--version", action="version", version=f"knndirect {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    b = sub.add_parser("build", help="build an index from .npy, .fvecs, .bvecs or HDF5",
                       description="Build an index from INPUT (.npy, .fvecs, .bvecs, or the "
                       "'train' dataset of an ann-benchmarks .hdf5) and save it atomically "
                       "to OUTPUT. Ctrl-C stops the build and writes nothing (exit 130).")
    b.add_argument("input")
    b.add_argument("output")
    b.add_argument("--metric", choices=_METRIC_NAMES, default=None,
                   help="default: the HDF5 file's 'distance' attribute, else l2")
    b.add_argument("--m", type=int, default=16, help="graph degree (default 16)")
    b.add_argument("--ef-construction", type=int, default=200,
                   help="build beam width (default 200)")
    b.add_argument("--quantization", choices=("1bit", "4bit", "8bit", "1bit+4bit"), default="1bit")
    b.add_argument("--ids", default=None, metavar="IDS.npy",
                   help="int64 ids, one per vector (.npy or .ivecs)")
    b.add_argument("--threads", type=int, default=None, help="build threads (default: all)")
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--limit", type=int, default=None, metavar="N", help="first N vectors only")
    b.add_argument("--memory-budget", default=None, metavar="SIZE",
                   help="build a collection (a directory) in chunks of SIZE (e.g. 1GiB): "
                   "the input may be larger than RAM")
    b.add_argument("--segments", type=int, default=1, metavar="N",
                   help="with --memory-budget: merge down to N segments, as far as the budget "
                   "allows (default 1; 0 keeps "
                   "the chunks as segments)")
    g = b.add_mutually_exclusive_group()
    g.add_argument("--progress", dest="progress", action="store_true", default=None,
                   help="show progress even when stderr is not a terminal")
    g.add_argument("--no-progress", dest="progress", action="store_false")

    s = sub.add_parser("search", help="search an index and print a summary",
                       description="Search INDEX with QUERIES (.npy, .fvecs, .bvecs, or an "
                       "ann-benchmarks .hdf5, whose 'test' and 'neighbors' give the queries "
                       "and the ground truth).")
    s.add_argument("index")
    s.add_argument("queries")
    s.add_argument("--k", type=int, default=10)
    s.add_argument("--ef", type=int, default=None, help="graph beam width")
    s.add_argument("--oversample", type=float, default=None,
                   help="shortlist = ceil(k * oversample)")
    s.add_argument("--exact", action="store_true", help="brute force")
    s.add_argument("--no-rerank", action="store_true", help="quantized estimates only")
    s.add_argument("--gt", default=None, metavar="TRUTH",
                   help="true neighbour ids (.ivecs, .npy or .hdf5) to report recall@k")
    s.add_argument("--out", default=None, metavar="RESULTS.npz", help="save D and I")
    s.add_argument("--limit", type=int, default=None, metavar="N", help="first N queries only")
    s.add_argument("--one-by-one", action="store_true",
                   help="one query per call, reporting latency percentiles")
    _add_open_options(s)

    i = sub.add_parser("info", help="sizes, backend, alignment and resident memory")
    i.add_argument("index")
    i.add_argument("--json", action="store_true", help="print JSON")
    _add_open_options(i)

    v = sub.add_parser("verify", help="check every checksum of an index file")
    v.add_argument("index")

    sub.add_parser("bench", help="run the benchmark suite (benchmarks/run.py ARGS...)",
                   add_help=False)

    demo = sub.add_parser("demo", help="build, save, open with O_DIRECT and search on "
                                       "generated clustered data")
    demo.add_argument("--n", type=int, default=100_000, help="vectors (default 100000)")
    demo.add_argument("--dim", type=int, default=128)
    demo.add_argument("--metric", choices=_METRIC_NAMES, default="l2")
    demo.add_argument("--queries", type=int, default=1000)
    demo.add_argument("--k", type=int, default=10)
    demo.add_argument("--m", type=int, default=16)
    demo.add_argument("--ef-construction", type=int, default=200)
    demo.add_argument("--io-backend", default="auto",
                      choices=("auto", "io_uring", "threads", "pread", "mmap"))
    demo.add_argument("--dir", default=None,
                      help="where to write the index (default: the temp dir; O_DIRECT needs a "
                           "filesystem that supports it)")
    demo.add_argument("--keep", action="store_true", help="keep the index file")
    demo.add_argument("--seed", type=int, default=0)

    doc = sub.add_parser("doctor", help="what io_backend='auto' and O_DIRECT do at PATH, and "
                                        "why; SIMD level; a short device probe",
                         description="Report the I/O backend that io_backend='auto' takes on "
                         "PATH's filesystem and why, whether O_DIRECT works and its alignment, "
                         "the SIMD kernels in use, and a device probe (QD1 latency and batch "
                         "IOPS of 4 KiB reads through the engine) on a temporary index in "
                         "PATH's directory, deleted afterwards. PATH may be an index file.")
    doc.add_argument("path", nargs="?", default=".", metavar="PATH",
                     help="a directory or file on the filesystem to check (default: .)")
    doc.add_argument("--json", action="store_true", help="print the report as JSON")
    doc.add_argument("--probe-seconds", type=float, default=2.0,
                     help="length of the device probe (default 2; 0 skips it)")
    doc.add_argument("--probe-mib", type=float, default=16,
                     help="size of the temporary probe file in MiB (default 16)")
    return parser


_COMMANDS = {"build": _build, "search": _search, "info": _info, "verify": _verify,
             "demo": _demo, "doctor": _doctor}


def main(argv=None):
    """Entry point of `python -m knndirect` and the `knndirect` script.
    Returns the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] == "bench":
        # Everything after "bench" belongs to benchmarks/run.py.
        return _bench(argv[1:])
    args = _parser().parse_args(argv)
    try:
        return _COMMANDS[args.command](args)
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # stdout was closed early (e.g. piped into head): stop quietly.
        try:
            sys.stdout = open(os.devnull, "w")
        except OSError:
            pass
        return EXIT_ERROR
    except (ValueError, TypeError, KeyError, OSError, ImportError) as e:
        msg = e.args[0] if isinstance(e, KeyError) and e.args else e
        print(f"knndirect {args.command}: error: {msg}", file=sys.stderr)
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
