"""Open-loop load: requests arrive as a Poisson process whatever the server
does, and latency runs from each request's intended arrival, so time spent
queued (or behind a late dispatcher) counts: no coordinated omission.

  * poisson_arrivals / sleep_until: the arrival schedule, for a load of any
    shape (soak.py serves an endless one);
  * open_loop: a fixed number of arrivals at one rate into a bounded queue
    that sheds when full, served by a pool of threads (bench_disk.py);
  * find_rate: the highest rate whose trial passes, by doubling or halving
    and then bisecting.
"""
import math
import queue
import threading
import time

import numpy as np


def pct(values, q):
    """The q-th percentile of values, NaN when there are none."""
    return float(np.percentile(np.asarray(values), q)) if len(values) else float("nan")


def poisson_arrivals(rate, rng, start):
    """Intended arrival times (time.perf_counter() clock), without end: start
    plus exponential gaps of mean 1 / rate drawn one at a time from rng."""
    t = start
    while True:
        t += rng.exponential(1.0 / rate)
        yield t


def sleep_until(due):
    """Sleep until perf_counter() reaches `due` (at once when it has)."""
    wait = due - time.perf_counter()
    if wait > 0:
        time.sleep(wait)


def open_loop(search, queries, gt, rate, seconds, workers, qsize, seed, *, k=10,
              p99_limit_s=0.050, shed_limit=0.001):
    """Poisson arrivals at `rate` for `seconds` (at least 200): a dispatcher
    puts each query in a bounded queue at its intended arrival time, or sheds
    it when the queue is full; `workers` threads serve the queue with
    search(query) -> ids. Latency = completion - intended arrival. "ok": p99
    <= p99_limit_s and at most shed_limit of the arrivals shed."""
    # Imported here, not at the top: bench_disk.py imports this module before
    # it puts its snapshot of knndirect on sys.path.
    from knndirect.datasets import recall_at_k
    rng = np.random.default_rng(seed)
    n = max(200, int(rate * seconds))
    arrivals = np.cumsum(rng.exponential(1.0 / rate, n))
    which = rng.integers(0, len(queries), n)
    lat = np.full(n, np.nan)
    lag = np.zeros(n)
    found = np.full((n, k), -1, np.int64)
    jobs = queue.Queue(maxsize=qsize)

    def serve():
        while True:
            item = jobs.get()
            if item is None:
                return
            i, due = item
            found[i] = search(queries[which[i]])
            lat[i] = time.perf_counter() - due

    pool = [threading.Thread(target=serve, daemon=True) for _ in range(workers)]
    for th in pool:
        th.start()
    shed = 0
    t0 = time.perf_counter() + 0.02
    for i in range(n):
        due = t0 + arrivals[i]
        sleep_until(due)
        lag[i] = time.perf_counter() - due
        try:
            jobs.put_nowait((i, due))
        except queue.Full:
            shed += 1
    for _ in pool:
        jobs.put(None)
    for th in pool:
        th.join()
    elapsed = time.perf_counter() - t0
    served = ~np.isnan(lat)
    ls = lat[served]
    res = {"rate": rate, "offered": n, "served": int(served.sum()), "shed": shed,
           "shed_fraction": shed / n, "elapsed_s": elapsed,
           "throughput": float(served.sum()) / elapsed,
           "p50_ms": pct(ls, 50) * 1e3, "p99_ms": pct(ls, 99) * 1e3,
           "p999_ms": pct(ls, 99.9) * 1e3, "dispatch_lag_p99_ms": pct(lag, 99) * 1e3,
           "recall": recall_at_k(found[served], gt[which[served]], k) if served.any() else 0.0}
    res["ok"] = bool(res["p99_ms"] <= p99_limit_s * 1e3 and res["shed_fraction"] <= shed_limit)
    return res


def find_rate(trial, start, max_trials, precision=1.08):
    """The highest rate that passes: trial(rate) -> a result with "ok",
    "p50_ms", "p99_ms" and "shed_fraction". Double (or halve) until one rate
    passes and one fails, then bisect geometrically until they are within
    `precision` of each other, at most max_trials trials."""
    trials, lo, hi, rate = [], None, None, start
    while len(trials) < max_trials:
        r = trial(rate)
        trials.append(r)
        print(f"    rate {rate:8.1f}/s: p50 {r['p50_ms']:7.2f} ms  p99 {r['p99_ms']:8.2f} ms  "
              f"shed {r['shed_fraction']:6.2%}  -> {'ok' if r['ok'] else 'too much'}",
              flush=True)
        if r["ok"]:
            lo = rate if lo is None else max(lo, rate)
        else:
            hi = rate if hi is None else min(hi, rate)
        if hi is None:
            rate *= 2
        elif lo is None:
            rate /= 2
        elif hi / lo <= precision:
            break
        else:
            rate = math.sqrt(lo * hi)
    best = max((t for t in trials if t["ok"]), key=lambda t: t["rate"], default=None)
    return {"sustainable_rate": best["rate"] if best else 0.0, "at_rate": best,
            "trials": trials}
