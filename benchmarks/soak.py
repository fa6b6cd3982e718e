"""Soak test: an opened index under open-loop Poisson load for many minutes,
in a memory cgroup, reporting latency percentiles, errors and resources per
minute. Not part of CI; run by hand:

    python benchmarks/soak.py                      # 10 minutes, 100 q/s, 192 MiB cap
    python benchmarks/soak.py --minutes 3 --qps 150 --memory-cap 256

What it does:
  1. builds (or reuses) an index of --n clustered vectors of --dim and saves
     it (--path);
  2. starts a child process, in a memory cgroup capped at --memory-cap MiB
     (root and a v1 or v2 memory controller; without them it runs uncapped
     and says so), that opens the index (O_DIRECT reads, --backend) and
  3. serves queries arriving as a Poisson process at --qps: an issuer thread
     schedules arrivals, --workers threads search (k=10; every 20th request
     also reads 10 vectors). Latency runs from the scheduled arrival to the
     answer, so queueing behind a slow request counts (open loop: no
     coordinated omission);
  4. prints per minute: requests, errors, p50 / p99 / p99.9 latency, RSS,
     open descriptors, the cgroup's memory; then the verdict: no errors, p99
     of the last minute within --p99-tolerance (default 1.5x, +1 ms) of the
     first, RSS growth under 16 MiB. Exit status 1 when a check fails.
"""
import argparse
import json
import os
import queue
import subprocess
import sys
import threading
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from cgroup import Cgroup  # noqa: E402
from openloop import poisson_arrivals, sleep_until  # noqa: E402


def clustered(n, d, seed):
    rng = np.random.default_rng(seed)
    s = 1.0 / np.sqrt(1.0 + np.arange(d) / 8.0)
    centres = rng.standard_normal((64, d)) * s
    pts = centres[rng.integers(0, 64, size=n)] + 0.5 * rng.standard_normal((n, d)) * s
    return np.ascontiguousarray(pts, dtype=np.float32)


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def child(args):
    import warnings

    import knndirect as kd

    warnings.simplefilter("ignore", RuntimeWarning)
    index = kd.open(args.path, io_backend=args.backend)
    queries = clustered(4096, args.dim, seed=2)
    info = index.info()
    print(json.dumps({"event": "open", "io_backend": info["io_backend"],
                      "direct_io": info["direct_io"],
                      "resident_mib": info["resident_bytes"] / 2**20}), flush=True)
    work = queue.Queue()
    lock = threading.Lock()
    window = {"lat": [], "errors": 0, "error_text": ""}
    stop = threading.Event()

    def worker(seed):
        rng = np.random.default_rng(seed)
        while True:
            item = work.get()
            if item is None:
                return
            due, n = item
            try:
                index.search(queries[n % 4096], 10)
                if n % 20 == 0:
                    index.get_vectors(rng.integers(0, args.n, size=10))
                err = None
            except Exception as e:  # counted and reported, never fatal
                err = "%s: %s" % (type(e).__name__, e)
            lat = time.perf_counter() - due
            with lock:
                window["lat"].append(lat)
                if err:
                    window["errors"] += 1
                    window["error_text"] = err

    threads = [threading.Thread(target=worker, args=(s,), daemon=True)
               for s in range(args.workers)]
    for t in threads:
        t.start()

    def issuer():
        arrivals = poisson_arrivals(args.qps, np.random.default_rng(1), time.perf_counter())
        n = 0
        while not stop.is_set():
            t = next(arrivals)
            sleep_until(t)
            work.put((t, n))
            n += 1

    issue = threading.Thread(target=issuer, daemon=True)
    issue.start()
    start = time.perf_counter()
    for minute in range(int(args.minutes * 60 / args.report_every + 0.5)):
        time.sleep(max(0.0, start + (minute + 1) * args.report_every - time.perf_counter()))
        with lock:
            lat = np.array(window["lat"])
            errors, text = window["errors"], window["error_text"]
            window.update(lat=[], errors=0, error_text="")
        row = {"event": "window", "window": minute + 1, "requests": int(lat.size),
               "errors": errors, "backlog": work.qsize(),
               "rss_mib": rss_bytes() / 2**20, "fds": len(os.listdir("/proc/self/fd"))}
        if lat.size:
            p50, p99, p999 = np.percentile(lat, [50, 99, 99.9]) * 1e3
            row.update(p50_ms=p50, p99_ms=p99, p999_ms=p999)
        if text:
            row["last_error"] = text[:300]
        print(json.dumps(row), flush=True)
    stop.set()
    issue.join()
    for _ in threads:
        work.put(None)
    for t in threads:
        t.join()
    st = index.stats()
    print(json.dumps({"event": "done", "queries": st["queries"],
                      "read_bytes_per_query": st["read_bytes"] / max(1, st["queries"])}),
          flush=True)
    index.close()
    return 0


def build(args):
    import knndirect as kd

    if os.path.exists(args.path) and not args.rebuild:
        index = kd.open(args.path, preload=())
        ok = len(index) == args.n and index.dim == args.dim
        index.close()
        if ok:
            print("reusing %s" % args.path)
            return
    print("building %d x %d ..." % (args.n, args.dim), flush=True)
    t0 = time.perf_counter()
    index = kd.Index(args.dim, "l2")
    index.add(clustered(args.n, args.dim, seed=1))
    index.save(args.path)
    index.close()
    print("built and saved in %.1f s" % (time.perf_counter() - t0))


def cgroup_for(args):
    if args.memory_cap <= 0:
        return None, "no cap asked (--memory-cap 0)"
    if os.geteuid() != 0:
        return None, "not root: no memory cgroup, running uncapped"
    try:
        cg = Cgroup("knndirect-soak-%d" % os.getpid())
    except OSError as e:
        return None, "no memory cgroup (%s): running uncapped" % e
    cg.set_limit(args.memory_cap << 20)
    return cg, "memory cgroup v%d %s, capped at %d MiB" % (cg.version, cg.path, args.memory_cap)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--minutes", type=float, default=10)
    p.add_argument("--qps", type=float, default=100, help="mean arrival rate (Poisson)")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--n", type=int, default=100_000)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--path", default="/tmp/knndirect-soak.kdx")
    p.add_argument("--backend", default="auto")
    p.add_argument("--memory-cap", type=int, default=192, help="MiB; 0 for none")
    p.add_argument("--report-every", type=float, default=60, help="seconds per window")
    p.add_argument("--p99-tolerance", type=float, default=1.5)
    p.add_argument("--rebuild", action="store_true")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        return child(args)

    build(args)
    cg, note = cgroup_for(args)
    print(note)
    cmd = [sys.executable, os.path.abspath(__file__), "--child"] + [
        a for a in (argv if argv is not None else sys.argv[1:]) if a != "--rebuild"]
    rows = []
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True,
                                preexec_fn=cg.enter if cg else None)
        print("%6s %8s %6s %8s %8s %8s %8s %5s %9s" % ("window", "requests", "errors", "p50 ms",
                                                      "p99 ms", "p99.9 ms", "RSS MiB", "fds",
                                                      "cgroup MiB"))
        for line in proc.stdout:
            row = json.loads(line)
            if row["event"] == "open":
                print("opened: io_backend=%s direct_io=%s resident %.1f MiB"
                      % (row["io_backend"], row["direct_io"], row["resident_mib"]))
            elif row["event"] == "window":
                row["cgroup_mib"] = cg.usage() / 2**20 if cg else float("nan")
                rows.append(row)
                print("%6d %8d %6d %8.2f %8.2f %8.2f %8.1f %5d %9.1f%s" % (
                    row["window"], row["requests"], row["errors"], row.get("p50_ms", 0),
                    row.get("p99_ms", 0), row.get("p999_ms", 0), row["rss_mib"], row["fds"],
                    row["cgroup_mib"],
                    ("  backlog %d" % row["backlog"]) if row["backlog"] > 10 else ""), flush=True)
                if row.get("last_error"):
                    print("       last error: " + row["last_error"])
            else:
                print("done: %d queries, %.1f KiB read per query"
                      % (row["queries"], row["read_bytes_per_query"] / 1024))
        rc = proc.wait()
    finally:
        if cg:
            cg.remove()
    if rc != 0 or not rows:
        print("FAIL: the serving process ended with status %d" % rc)
        return 1
    errors = sum(r["errors"] for r in rows)
    first, last = rows[0], rows[-1]
    p99_ok = last.get("p99_ms", 0) <= args.p99_tolerance * first.get("p99_ms", 0) + 1.0
    rss_growth = last["rss_mib"] - first["rss_mib"]
    checks = [("no errors", errors == 0, "%d errors" % errors),
              ("p99 stable", p99_ok, "first %.2f ms, last %.2f ms"
               % (first.get("p99_ms", 0), last.get("p99_ms", 0))),
              ("RSS flat", rss_growth < 16, "%+.1f MiB from the first window to the last"
               % rss_growth),
              ("descriptors flat", last["fds"] == first["fds"], "%d -> %d"
               % (first["fds"], last["fds"]))]
    for name, ok, detail in checks:
        print("%-16s %s  (%s)" % (name, "ok" if ok else "FAIL", detail))
    return 0 if all(ok for _, ok, _ in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
