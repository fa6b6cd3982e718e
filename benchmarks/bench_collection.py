"""Collections: a build larger than RAM, the cost of adds and merges, many
segments against one, and adds while serving.

    sudo python benchmarks/bench_collection.py [build] [incremental] [segments] [ingest]
        [--n 200000] [--dim 768] [--seed 1] [--out benchmarks/results/collection.json]

With no part named, all four run, in that order. Each part measures against a
reference taken in the same run (the machine is noisy: ratios, not absolute
times, are what the goals judge).

1. build: n x dim clustered float32 vectors are written to a .npy. Reference:
   kd.Index over the whole array in this process, no cap (timed add). Then a
   child process runs the CLI,
       python -m knndirect build X.npy DIR --memory-budget B --segments 1 --no-progress
   inside a memory cgroup whose limit is 1/4 (--cap-fraction) of the float32
   vectors' size, page cache included, with B = 1/4 of the cap
   (--budget-fraction). Recorded: completed or not (and OOM kills), wall time,
   the cgroup's peak, the child's peak RSS (wait4), wall / reference (goal
   <= 1.5). When it fails, it runs once more at --retry-cap-fraction of the
   float32 size with the same budget, as a diagnostic (the goal still
   fails). Then recall@10 of the collection (kd.open(DIR)) and of the
   in-RAM index on held-out queries against exact ground truth, at the
   default search and at a tuned point (same for both; goal: the
   collection's recall at most 0.01 below the index's).
2. incremental: 1% more vectors added to the collection of part 1 (or, when
   no capped build completed, to the merged halves below) and committed,
   --repeats times (median), against the reference build (goal <= 3%). A
   collection with merge_policy=None and a memory budget larger than the
   data gets half the vectors (commit) and the other half (commit): merge()
   of its two segments against the reference build of the same vectors in
   RAM (goal <= 0.6x).
3. segments: the vectors as 8 equal segments (merge_policy=None, one commit
   per eighth), and a copy of that directory merged into one segment
   (Collection.merge). Both opened read-only from disk (kd.open: graph and
   codes preloaded, float32 vectors read with O_DIRECT, the page cache
   dropped before the opens). ef is swept; each point times a batch search of
   all queries (threads=2), the two collections interleaved, median of
   --repeats passes. The recall target is 0.95, or the best level both reach.
   Each collection then runs at its smallest ef that reaches it: --pairs
   paired batch passes (one each, back to back) give the QPS ratio (median
   of the pairs' ratios; goal: 8 segments / 1 segment >= 0.5), and single
   queries, interleaved, give p50 / p99 latency. Log-QPS interpolated on
   each Pareto front (report.py) is shown beside it.
4. ingest: a collection of n vectors with the default merge policy
   ("tiered"), opened writable. Two Python threads search single queries in
   a loop: first alone (--baseline-seconds), then while the main thread adds
   batches of --batch vectors and commits each (--ingest-seconds), then
   while background merges finish (--drain-timeout). Reported: vectors added
   and committed per second, search latency p50 / p99 in each phase, the
   segments and background merges. No goal is set for it.

Needs root: the page cache is dropped by this script (`echo 3 >
/proc/sys/vm/drop_caches`, after a sync) before every cold measurement, and
the capped build runs in a memory cgroup this script creates
(benchmarks/cgroup.py: v1 memory.limit_in_bytes or v2 memory.max). The data,
indexes and collections live under benchmarks/data/collection (git ignores
it) and are removed at the end unless --keep.
"""
import argparse
import json
import math
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time

import numpy as np

import diskio
from cgroup import Cgroup, MemoryWatch
from report import pareto_front, qps_at_recall

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PARTS = ("build", "incremental", "segments", "ingest")
K = 10
GOAL_BUILD_RATIO = 1.5
GOAL_RECALL_GAP = 0.01
GOAL_ADD_SHARE = 0.03
GOAL_MERGE_RATIO = 0.6
GOAL_SEGMENT_QPS = 0.5
TARGET_RECALL = 0.95
SEGMENTS = 8
# What the child's Python, numpy and knndirect take before any vector: a cap
# below this plus some room cannot run at all (tiny scales only).
CAP_ROOM = 32 << 20


def mib(b):
    return None if b is None else b / 2**20


def median(xs):
    return statistics.median(xs) if xs else None


def pct(xs, p):
    return float(np.percentile(np.asarray(xs), p)) if len(xs) else None


def log(msg):
    print(msg, flush=True)


# ------------------------------------------------------------------ machine

def meminfo_total():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    return None


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def git_head():
    try:
        head = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return head + (" (working tree modified)" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


def machine_facts():
    import knndirect as kd
    return {"cores": os.cpu_count(), "ram_bytes": meminfo_total(), "kernel": platform.release(),
            "cpu": cpu_model(), "python": platform.python_version(), "numpy": np.__version__,
            "knndirect": getattr(kd, "__version__", None), "git": git_head(),
            "features": dict(kd.features()), "load_start": list(os.getloadavg())}


def drop_caches():
    """sync, then `echo 3 > /proc/sys/vm/drop_caches`."""
    if not diskio.drop_caches():
        raise PermissionError("dropping the page cache needs root")


def wait_for_load(max_load, max_wait):
    """Wait (up to max_wait s) until the 1-minute load average is below max_load."""
    t0 = time.time()
    while os.getloadavg()[0] > max_load and time.time() - t0 < max_wait:
        log("load average %.2f > %.2f: waiting" % (os.getloadavg()[0], max_load))
        time.sleep(15)
    return time.time() - t0


# ------------------------------------------------------------------ cgroup child

def oom_kills(cg):
    """OOM kills in the group so far (v1 memory.oom_control, v2 memory.events)."""
    name = "memory.oom_control" if cg.version == 1 else "memory.events"
    try:
        with open(os.path.join(cg.path, name)) as f:
            for line in f:
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
    except (OSError, ValueError):
        pass
    return None


def run_capped(cmd, cg, limit, log_path, timeout):
    """Run cmd in cgroup cg with memory limit `limit` (None: no limit),
    cold page cache, stdout+stderr to log_path. Wall time, exit, the child's
    own rusage (wait4) and the group's memory peak."""
    cg.set_limit(limit)
    drop_caches()
    oom0 = oom_kills(cg)
    watch = MemoryWatch(cg)
    with open(log_path, "w") as logf:
        t0 = time.perf_counter()
        p = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, cwd=ROOT,
                             preexec_fn=cg.enter)
        killed = []

        def kill():
            killed.append(True)
            os.kill(p.pid, signal.SIGKILL)
        timer = threading.Timer(timeout, kill)
        timer.start()
        _, status, ru = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t0
        timer.cancel()
    p.returncode = os.waitstatus_to_exitcode(status)
    mem = watch.finish()
    oom1 = oom_kills(cg)
    with open(log_path) as f:
        out = f.read()
    return {"cmd": cmd, "returncode": p.returncode, "wall_s": wall,
            "timed_out": bool(killed), "timeout_s": timeout,
            "oom_kills": None if oom0 is None or oom1 is None else oom1 - oom0,
            "child_maxrss_bytes": ru.ru_maxrss * 1024, "child_majflt": ru.ru_majflt,
            "child_user_s": ru.ru_utime, "child_sys_s": ru.ru_stime,
            "memory": mem, "log_tail": out[-3000:]}


# ------------------------------------------------------------------ the run

class Run:
    """What the parts share, each made once when first needed: the data, its
    ground truth, the in-RAM reference build and the capped CLI build."""

    def __init__(self, args):
        import knndirect as kd
        self.kd = kd
        self.args = args
        self.dir = args.dir or os.path.join(HERE, "data", "collection")
        os.makedirs(self.dir, exist_ok=True)
        self.results = {}
        self.goals = []
        self._x = self._q = self._pool = self._truth = None
        self._ram = None
        self._cli = None
        self.npy = os.path.join(self.dir, "X_%d_%d_%d.npy" % (args.n, args.dim, args.seed))
        self.float_bytes = args.n * args.dim * 4
        self.pool_used = 0
        self.pool_wrapped = False

    # -- data
    def data(self):
        if self._x is None:
            from knndirect.datasets import clustered
            a = self.args
            n_inc = a.repeats * max(1, a.n // 100)
            n_pool = max(20 * a.batch, a.n)
            t0 = time.perf_counter()
            allx = clustered(a.n + a.nq + n_inc + n_pool, a.dim, seed=a.seed)
            self._x = allx[:a.n]
            self._q = allx[a.n:a.n + a.nq]
            self._inc = allx[a.n + a.nq:a.n + a.nq + n_inc]
            self._pool = allx[a.n + a.nq + n_inc:]
            np.save(self.npy, self._x)
            log("data: %d x %d clustered float32 (seed %d) + %d queries + %d more to add, "
                "in %.1f s; base written to %s (%.0f MiB)"
                % (a.n, a.dim, a.seed, a.nq, n_inc + n_pool, time.perf_counter() - t0,
                   self.npy, mib(self.float_bytes)))
        return self._x, self._q

    def increments(self):
        self.data()
        step = max(1, self.args.n // 100)
        return [self._inc[i * step:(i + 1) * step] for i in range(self.args.repeats)]

    def pool_batch(self, size):
        """The next `size` vectors to ingest; wraps around (new ids) when spent."""
        self.data()
        if self.pool_used + size > len(self._pool):
            self.pool_used = 0
            self.pool_wrapped = True
        out = self._pool[self.pool_used:self.pool_used + size]
        self.pool_used += size
        return out

    def truth(self):
        if self._truth is None:
            from knndirect.datasets import ground_truth
            x, q = self.data()
            path = os.path.join(self.dir, "truth_%d_%d_%d_%d.npy"
                                % (self.args.n, self.args.dim, self.args.seed, self.args.nq))
            if os.path.exists(path):
                self._truth = np.load(path)
            else:
                t0 = time.perf_counter()
                self._truth = ground_truth(x, q, K)[0]
                np.save(path, self._truth)
                log("exact ground truth of %d queries in %.1f s" % (len(q),
                                                                    time.perf_counter() - t0))
        return self._truth

    def recall(self, I):
        from knndirect.datasets import recall_at_k
        return float(recall_at_k(I, self.truth(), K))

    # -- the in-RAM reference
    def ram(self):
        """(index, seconds): kd.Index over all n vectors, no cap, timed add."""
        if self._ram is None:
            x, _ = self.data()
            kd = self.kd
            log("reference: in-RAM kd.Index build of %d x %d (no cap) ..." % x.shape)
            load = os.getloadavg()[0]
            t0 = time.perf_counter()
            index = kd.Index(self.args.dim, "l2")
            index.add(x)
            secs = time.perf_counter() - t0
            self._ram = (index, secs)
            info = index.info()
            self.results["reference"] = {
                "what": "kd.Index(dim, 'l2') (m=16, ef_construction=200, 1bit); add of the whole "
                        "array in RAM, this process, all threads",
                "n": self.args.n, "dim": self.args.dim, "build_s": secs, "load_1min": load,
                "default_ef": info.get("default_ef"),
                "default_oversample": info.get("default_oversample")}
            log("reference build: %.1f s" % secs)
        return self._ram

    # -- the capped CLI build
    def cli_build(self):
        """The capped CLI build: first at the goal's cap; when that fails, once
        more at --retry-cap-fraction (a diagnostic: the same memory budget, so
        the cap is all that changes). {"goal": attempt, "retry": attempt or
        None, "runtime_floor_bytes": ...}."""
        if self._cli is not None:
            return self._cli
        a = self.args
        self.data()
        cg = Cgroup("knndirect_bench_collection_%d" % os.getpid())
        try:
            # The child's own floor: Python, numpy and knndirect imported.
            probe = run_capped([sys.executable, "-c", "import numpy, knndirect, "
                                "knndirect.__main__, knndirect.datasets"],
                               cg, None, os.path.join(self.dir, "probe.log"), 120)
            floor = probe["memory"]["peak_bytes"]
            cap_goal = int(self.float_bytes * a.cap_fraction)
            cap = cap_goal
            cap_raised = False
            if cap < floor + CAP_ROOM:
                cap = floor + CAP_ROOM
                cap_raised = True
            budget = max(1 << 16, int(cap * a.budget_fraction))
            log("capped build: memory cgroup v%d %s; the child's runtime alone (python + numpy "
                "+ knndirect imported, cold) peaks at %.1f MiB" % (cg.version, cg.path,
                                                                    mib(floor)))
            first = self._cli_attempt(cg, cap, budget, "cap %.2f of the float32 size%s" % (
                a.cap_fraction, ", raised to the runtime's floor + 32 MiB" if cap_raised else ""))
            first["cap_goal_bytes"] = cap_goal
            first["cap_raised_to_floor"] = cap_raised
            retry = None
            if not first["completed"] and a.retry_cap_fraction > a.cap_fraction:
                cap2 = max(cap, int(self.float_bytes * a.retry_cap_fraction))
                log("capped build failed; once more at a cap of %.2f of the float32 size, same "
                    "memory budget (a diagnostic, not the goal)" % a.retry_cap_fraction)
                retry = self._cli_attempt(cg, cap2, budget, "retry: cap %.2f of the float32 "
                                          "size, same budget" % a.retry_cap_fraction)
        finally:
            cg.remove()
        self._cli = {"goal": first, "retry": retry, "runtime_floor_bytes": floor,
                     "cgroup_version": cg.version, "float32_bytes": self.float_bytes}
        return self._cli

    def cli_done(self):
        """The completed capped build (goal attempt first), or None."""
        cli = self.cli_build()
        for att in (cli["goal"], cli["retry"]):
            if att is not None and att["completed"]:
                return att
        return None

    def _cli_attempt(self, cg, cap, budget, label):
        a = self.args
        out = os.path.join(self.dir, "col_build")
        shutil.rmtree(out, ignore_errors=True)
        cmd = [sys.executable, "-m", "knndirect", "build", self.npy, out,
               "--memory-budget", str(budget), "--segments", "1", "--no-progress"]
        log("capped build (%s): limit %.1f MiB, memory budget %.1f MiB, page cache dropped "
            "first\n  $ %s" % (label, mib(cap), mib(budget), " ".join(cmd)))
        res = run_capped(cmd, cg, cap, os.path.join(self.dir, "cli_build.log"), a.build_timeout)
        res.update({"label": label, "cap_bytes": cap, "memory_budget_bytes": budget,
                    "float32_bytes": self.float_bytes, "dir": out})
        m = re.search(r"added [\d,]+ vectors in ([\d.]+) s as (\d+) segment", res["log_tail"])
        if m:
            res["add_s"], res["segments_before_merge"] = float(m.group(1)), int(m.group(2))
        m = re.search(r"built [\d,]+ vectors in ([\d.]+) s", res["log_tail"])
        if m:
            res["cli_build_s"] = float(m.group(1))
            if "add_s" in res:
                res["merge_s"] = res["cli_build_s"] - res["add_s"]
        res["stage_reached"] = ("done" if "cli_build_s" in res else
                                "merge" if "add_s" in res else "adds")
        res["completed"] = res["returncode"] == 0 and not res["timed_out"]
        if res["completed"]:
            col = self.kd.open(out)
            res["segments"] = len(col.segments())
            res["count"] = len(col)
            res["bytes_on_disk"] = sum(s["bytes"] for s in col.segments())
            col.close()
            res["completed"] = res["count"] == a.n
        log("capped build: %s, wall %.1f s, cgroup peak %.1f MiB of %.1f MiB (page cache at "
            "most %.1f MiB, anonymous at most %.1f MiB, limit hit %d times), child peak RSS "
            "%.1f MiB, exit %d%s%s"
            % ("completed" if res["completed"] else "FAILED", res["wall_s"],
               mib(res["memory"]["peak_bytes"]), mib(cap), mib(res["memory"]["max_cache_bytes"]),
               mib(res["memory"]["max_anon_bytes"]), res["memory"]["limit_hits"],
               mib(res["child_maxrss_bytes"]), res["returncode"],
               ", %s OOM kill(s)" % res["oom_kills"] if res["oom_kills"] else "",
               "" if res["completed"] else ", died during the %s" % res["stage_reached"]))
        if not res["completed"]:
            log(res["log_tail"][-1500:])
        return res

    def goal(self, part, name, figure, goal, status, note=""):
        self.goals.append({"part": part, "goal": name, "figure": figure, "target": goal,
                           "status": status, "note": note})
        log("  goal %s: %s -> %s%s" % (name, figure, status, (" (%s)" % note) if note else ""))


def tuned_point(args):
    ef, over = args.tuned.split(",")
    return {"ef": int(ef), "oversample": float(over)}


# ------------------------------------------------------------------ part 1

def segments_note(res):
    """What the segment count of a completed build means: --segments 1 asks
    for one, and merges stop where the budget does (a RuntimeWarning)."""
    if not res["completed"] or res["segments"] == 1:
        return ""
    return ("%d segments, not 1: each merge's build codes must fit --memory-budget, so merges "
            "stop at the fewest segments it allows; searches run over all of them "
            "(part 3 measures the cost)" % res["segments"])


def part_build(run):
    a = run.args
    ram, t_ram = run.ram()
    cli = run.cli_build()
    res, done = cli["goal"], run.cli_done()
    out = {"cli": cli, "reference_build_s": t_ram}
    ratio = res["wall_s"] / t_ram if res["completed"] else None
    out["wall_ratio"] = ratio
    out["retry_wall_ratio"] = (cli["retry"]["wall_s"] / t_ram
                               if cli["retry"] and cli["retry"]["completed"] else None)
    retry_note = ""
    if cli["retry"] is not None:
        r = cli["retry"]
        retry_note = "at a cap of %.0f MiB (%.2f of the float32 size, same budget): %s" % (
            mib(r["cap_bytes"]), r["cap_bytes"] / run.float_bytes,
            "completed in %.1f s = %.2fx the in-RAM build, peak %.0f MiB" % (
                r["wall_s"], r["wall_s"] / t_ram, mib(r["memory"]["peak_bytes"]))
            if r["completed"] else "failed too (exit %d, during the %s)" % (
                r["returncode"], r["stage_reached"]))
    if res["cap_raised_to_floor"]:
        run.goal("build", "completes under a cap of 1/4 of the float32 size",
                 "cap %.0f MiB would be below the child's runtime (%.0f MiB)"
                 % (mib(res["cap_goal_bytes"]), mib(cli["runtime_floor_bytes"])), "completes",
                 "blocked", "at n=%d, dim=%d the vectors are too small for a 1/4 cap; ran at "
                 "%.0f MiB" % (a.n, a.dim, mib(res["cap_bytes"])))
    else:
        run.goal("build", "completes under a cap of 1/4 of the float32 size",
                 "%s; peak %.0f MiB of cap %.0f MiB" % (
                     "completed, %d segment(s)" % res["segments"] if res["completed"] else
                     "did not complete (exit %d%s, during the %s, %.1f s in)" % (
                         res["returncode"], ", OOM kill" if res["oom_kills"] else "",
                         res["stage_reached"], res["wall_s"]),
                     mib(res["memory"]["peak_bytes"]), mib(res["cap_bytes"])),
                 "completes", "PASS" if res["completed"] and not res["oom_kills"] else "FAIL",
                 retry_note or segments_note(res))
    if ratio is None:
        run.goal("build", "wall / in-RAM build", "no build under the cap",
                 "<= %.1f" % GOAL_BUILD_RATIO, "FAIL", retry_note)
    else:
        run.goal("build", "wall / in-RAM build", "%.2f (%.1f s / %.1f s)" % (
            ratio, res["wall_s"], t_ram), "<= %.1f" % GOAL_BUILD_RATIO,
            "PASS" if ratio <= GOAL_BUILD_RATIO else "FAIL")
    if done is not None:
        _, q = run.data()
        drop_caches()
        col = run.kd.open(done["dir"])
        points = {"default": {}, "tuned": tuned_point(a), "low": {"ef": 24, "oversample": 2.0}}
        rec = {}
        for name, kw in points.items():
            rc = run.recall(col.search(q, K, **kw)[1])
            rr = run.recall(ram.search(q, K, **kw)[1])
            rec[name] = {"params": kw, "collection": rc, "in_ram": rr, "gap": rr - rc}
        col.close()
        out["recall"] = rec
        out["recall_of"] = done["label"]
        for name in ("default", "tuned"):
            r = rec[name]
            ok = r["collection"] >= r["in_ram"] - GOAL_RECALL_GAP
            run.goal("build", "recall@10 at the %s point (%s) within %.2f of the in-RAM index"
                     % (name, ", ".join("%s=%g" % kv for kv in r["params"].items()) or
                        "ef, oversample defaults", GOAL_RECALL_GAP),
                     "collection %.4f, in-RAM %.4f" % (r["collection"], r["in_ram"]),
                     ">= in-RAM - %.2f" % GOAL_RECALL_GAP, "PASS" if ok else "FAIL",
                     "" if done is res else "collection of the " + done["label"])
    else:
        run.goal("build", "recall@10 within 0.01 of the in-RAM index", "no collection",
                 ">= in-RAM - 0.01", "blocked", "no capped build completed")
    run.results["build"] = out


# ------------------------------------------------------------------ part 2

def part_incremental(run):
    a, kd = run.args, run.kd
    _, t_ram = run.ram()
    x, q = run.data()
    out = {"reference_build_s": t_ram}

    # Two halves, then merge().
    d = os.path.join(run.dir, "col_halves")
    shutil.rmtree(d, ignore_errors=True)
    half = a.n // 2
    col = kd.Collection.create(d, a.dim, "l2", memory_budget=run.float_bytes + (64 << 20),
                               merge_policy=None)
    t0 = time.perf_counter()
    col.add(x[:half])
    col.commit()
    t1 = time.perf_counter()
    col.add(x[half:])
    col.commit()
    t2 = time.perf_counter()
    nseg = len(col.segments())
    col.close()
    drop_caches()
    col = kd.Collection.open(d, writable=True)
    load = os.getloadavg()[0]
    t3 = time.perf_counter()
    col.merge()
    t_merge = time.perf_counter() - t3
    after = len(col.segments())
    report = merge_report(col)
    col.close()
    drop_caches()
    col = kd.open(d)
    rec_default = run.recall(col.search(q, K)[1])
    rec_tuned = run.recall(col.search(q, K, **tuned_point(a))[1])
    col.close()
    ram, _ = run.ram()
    ram_default = run.recall(ram.search(q, K)[1])
    ram_tuned = run.recall(ram.search(q, K, **tuned_point(a))[1])
    ratio = t_merge / t_ram
    out["merge_halves"] = {"half_builds_s": [t1 - t0, t2 - t1], "segments_before": nseg,
                           "segments_after": after, "merge_s": t_merge, "load_1min": load,
                           "ratio_to_reference": ratio, "core_report": report,
                           "recall_default": rec_default, "recall_tuned": rec_tuned,
                           "in_ram_recall_default": ram_default, "in_ram_recall_tuned": ram_tuned}
    log("two halves (%.1f s + %.1f s to build, %d segments), merge(): %.1f s = %.2fx the "
        "in-RAM build; recall default %.4f (in-RAM %.4f), tuned %.4f (in-RAM %.4f)"
        % (t1 - t0, t2 - t1, nseg, t_merge, ratio, rec_default, ram_default, rec_tuned,
           ram_tuned))
    run.goal("incremental", "merge of two halves / in-RAM build of the union",
             "%.2f (%.1f s / %.1f s)" % (ratio, t_merge, t_ram), "<= %.1f" % GOAL_MERGE_RATIO,
             "PASS" if ratio <= GOAL_MERGE_RATIO and after == 1 else "FAIL",
             "page cache dropped before; merged recall@10 default %.4f vs in-RAM %.4f"
             % (rec_default, ram_default))

    # 1% more: on the collection of part 1 when its build completed, else on
    # the merged halves (both: n vectors in one segment, merge_policy None).
    done = run.cli_done()
    if done is not None:
        target, which = done["dir"], "the capped CLI build of part 1 (%s)" % done["label"]
    else:
        target, which = d, "the merged halves (the capped build of part 1 did not complete)"
    col = kd.Collection.open(target, writable=True)
    times = []
    for inc in run.increments():
        t0 = time.perf_counter()
        col.add(inc)
        col.commit()
        times.append(time.perf_counter() - t0)
    segs = len(col.segments())
    col.close()
    t = median(times)
    out["add_1pct"] = {"vectors": len(run.increments()[0]), "times_s": times, "on": which,
                       "median_s": t, "share_of_reference": t / t_ram,
                       "share_of_capped_build": t / done["wall_s"] if done else None,
                       "segments_after": segs}
    log("add 1%% (%d vectors) + commit on %s: %s s, median %.2f s = %.2f%% of the in-RAM build"
        % (out["add_1pct"]["vectors"], which, ", ".join("%.2f" % x for x in times), t,
           100 * t / t_ram))
    run.goal("incremental", "add 1% + commit / full build", "%.2f%% (%.2f s / %.1f s)"
             % (100 * t / t_ram, t, t_ram), "<= %.0f%%" % (100 * GOAL_ADD_SHARE),
             "PASS" if t / t_ram <= GOAL_ADD_SHARE else "FAIL",
             "median of %d, on %s; the full build is the in-RAM reference" % (len(times), which))
    run.results["incremental"] = out
    if not a.keep:
        shutil.rmtree(d, ignore_errors=True)


# ------------------------------------------------------------------ part 3

def merge_report(col):
    """The core's report of the collection's last merge (phase times, build
    code bits), where the collection gives one."""
    rep = col.info().get("last_merge")
    return {k: v for k, v in rep.items()} if isinstance(rep, dict) else None


def phases(rep):
    """'fit 1.0 s, encode ...' from a merge report, or ''."""
    if not rep:
        return ""
    keys = ("fit", "encode", "repair", "insert", "write")
    parts = ["%s %.1f s" % (k, rep[k + "_seconds"]) for k in keys
             if isinstance(rep.get(k + "_seconds"), (int, float))]
    bits = rep.get("build_code_bits")
    return " (core: %s%s)" % (", ".join(parts), "; %s-bit build codes" % bits if bits else "")


def batch_qps(col, q, ef, threads):
    t0 = time.perf_counter()
    col.search(q, K, ef=ef, threads=threads)
    return len(q) / (time.perf_counter() - t0)


def single_latencies(cols, q, efs):
    """Single-query latencies of each collection at its ef, the collections
    interleaved query by query (the same noise for all)."""
    lats = {name: [] for name in cols}
    for v in q:
        for name, col in cols.items():
            t0 = time.perf_counter()
            col.search(v, K, ef=efs[name])
            lats[name].append(time.perf_counter() - t0)
    return lats


def part_segments(run):
    a, kd = run.args, run.kd
    x, q = run.data()
    run.truth()
    d8 = os.path.join(run.dir, "col_eight")
    d1 = os.path.join(run.dir, "col_merged")
    for d in (d8, d1):
        shutil.rmtree(d, ignore_errors=True)
    col = kd.Collection.create(d8, a.dim, "l2", memory_budget=run.float_bytes + (64 << 20),
                               merge_policy=None)
    t0 = time.perf_counter()
    bounds = np.linspace(0, a.n, SEGMENTS + 1).astype(int)
    for lo, hi in zip(bounds, bounds[1:]):
        col.add(x[lo:hi])
        col.commit()
    t_build8 = time.perf_counter() - t0
    sizes = [s["live"] for s in col.segments()]
    col.close()
    shutil.copytree(d8, d1)
    drop_caches()
    col = kd.Collection.open(d1, writable=True)
    t0 = time.perf_counter()
    col.merge()
    t_merge8 = time.perf_counter() - t0
    report8 = merge_report(col)
    col.close()
    log("8 segments (%s vectors) built in %.1f s; a copy merged into one in %.1f s"
        % ("/".join(map(str, sizes)), t_build8, t_merge8))
    drop_caches()
    cols = {"8 segments": kd.open(d8), "1 segment": kd.open(d1)}
    info = {name: c.info() for name, c in cols.items()}
    for name, c in cols.items():
        c.search(q[:200], K, threads=a.search_threads)
        for v in q[:100]:
            c.search(v, K)
    efs = [int(e) for e in a.efs.split(",")]
    points = {name: [] for name in cols}
    for ef in efs:
        rec = {name: run.recall(c.search(q, K, ef=ef, threads=a.search_threads)[1])
               for name, c in cols.items()}
        qps = {name: [] for name in cols}
        for _ in range(a.repeats):
            for name, c in cols.items():   # interleaved: the same noise for both
                qps[name].append(batch_qps(c, q, ef, a.search_threads))
        for name in cols:
            points[name].append({"ef": ef, "recall": rec[name], "qps": median(qps[name]),
                                 "qps_passes": qps[name], "params": {"ef": ef}})
        log("  ef %4d: " % ef + "; ".join("%s recall %.4f QPS %.0f" % (
            name, rec[name], median(qps[name])) for name in cols))
    best = {name: max(p["recall"] for p in pts) for name, pts in points.items()}
    common = min(best.values())
    if common >= TARGET_RECALL:
        target, how = TARGET_RECALL, "0.95 (both reach it)"
    else:
        target = math.floor(common * 200) / 200   # a level both reach, rounded down to 0.005
        how = "%.3f, the best level both reach (max recall %s)" % (
            target, ", ".join("%s %.4f" % kv for kv in best.items()))
    at = {}
    ef_at = {name: min(p["ef"] for p in pts if p["recall"] >= target)
             for name, pts in points.items()}
    lat_all = single_latencies(cols, q, ef_at)
    # The goal's figure: each collection at its smallest ef reaching the
    # target, timed in pairs (one pass each, back to back), the median of the
    # pairs' ratios: the machine's noise hits both sides of a pair alike.
    paired = {name: [] for name in cols}
    for _ in range(a.pairs):
        for name, c in cols.items():
            paired[name].append(batch_qps(c, q, ef_at[name], a.search_threads))
    pair_ratios = [x / y for x, y in zip(paired["8 segments"], paired["1 segment"])]
    for name, pts in points.items():
        front = pareto_front(pts)
        qps_t = qps_at_recall(front, target)
        ef_t = ef_at[name]
        lats = lat_all[name]
        at[name] = {"qps_at_target": qps_t, "ef_at_target": ef_t,
                    "qps_at_ef": next(p["qps"] for p in pts if p["ef"] == ef_t),
                    "recall_at_ef": next(p["recall"] for p in pts if p["ef"] == ef_t),
                    "p50_ms": 1e3 * pct(lats, 50), "p99_ms": 1e3 * pct(lats, 99),
                    "mean_ms": 1e3 * float(np.mean(lats)),
                    "paired_qps": paired[name], "paired_qps_median": median(paired[name])}
    for c in cols.values():
        c.close()
    q8, q1 = at["8 segments"]["qps_at_target"], at["1 segment"]["qps_at_target"]
    interp_ratio = q8 / q1
    ratio = median(pair_ratios)
    p50 = at["8 segments"]["p50_ms"] / at["1 segment"]["p50_ms"]
    run.results["segments"] = {
        "segment_sizes": sizes, "build_8_s": t_build8, "merge_8_to_1_s": t_merge8,
        "merge_8_to_1_ratio_to_reference": (t_merge8 / run._ram[1]) if run._ram else None,
        "merge_8_to_1_core_report": report8,
        "points": points, "target_recall": target, "target_how": how, "at_target": at,
        "qps_ratio": ratio, "pair_ratios": pair_ratios, "interpolated_qps_ratio": interp_ratio,
        "p50_ratio": p50,
        "io": {name: {k: i.get(k) for k in ("io_backend", "direct_io", "segments",
                                            "resident_bytes")} for name, i in info.items()},
        "cache": "page cache dropped before opening; graph and codes preloaded; float32 "
                 "vectors read with O_DIRECT (never cached); warm-up: 200 batch + 100 single "
                 "queries", "search_threads": a.search_threads}
    e8, e1 = at["8 segments"]["ef_at_target"], at["1 segment"]["ef_at_target"]
    log("at recall %s: 8 segments at ef %d, 1 segment at ef %d: paired QPS ratio %.2f (%s); "
        "interpolated QPS %.0f vs %.0f, ratio %.2f; p50 %.2f ms vs %.2f ms, ratio %.2f"
        % (how, e8, e1, ratio, ", ".join("%.2f" % x for x in pair_ratios), q8, q1,
           interp_ratio, at["8 segments"]["p50_ms"], at["1 segment"]["p50_ms"], p50))
    run.goal("segments", "QPS 8 segments / 1 segment at equal recall (%.3f)" % target,
             "%.2f (median of %d paired passes, ef %d vs %d: %.0f / %.0f QPS)" % (
                 ratio, a.pairs, e8, e1, at["8 segments"]["paired_qps_median"],
                 at["1 segment"]["paired_qps_median"]), ">= %.1f" % GOAL_SEGMENT_QPS,
             "PASS" if ratio >= GOAL_SEGMENT_QPS else "FAIL",
             "batch of %d queries, threads=%d; log-QPS interpolated on the fronts: %.2f; p50 "
             "single-query latency ratio %.2f" % (len(q), a.search_threads, interp_ratio, p50))
    if not a.keep:
        for d in (d8, d1):
            shutil.rmtree(d, ignore_errors=True)


# ------------------------------------------------------------------ part 4

def part_ingest(run):
    a, kd = run.args, run.kd
    x, q = run.data()
    d = os.path.join(run.dir, "col_ingest")
    shutil.rmtree(d, ignore_errors=True)
    col = kd.Collection.create(d, a.dim, "l2", memory_budget=run.float_bytes + (64 << 20))
    t0 = time.perf_counter()
    col.add(x)
    col.commit()
    t_build = time.perf_counter() - t0
    col.close()
    log("ingest: collection of %d vectors (merge_policy 'tiered', one segment) built in %.1f s"
        % (a.n, t_build))
    drop_caches()
    col = kd.Collection.open(d, writable=True)
    for v in q[:100]:
        col.search(v, K)
    phase = ["baseline"]
    stop = threading.Event()
    lat = {"baseline": [], "ingest": [], "drain": []}
    errors = []

    def searcher(offset):
        i = offset
        try:
            while not stop.is_set():
                ph = phase[0]
                t = time.perf_counter()
                col.search(q[i % len(q)], K)
                lat[ph].append(time.perf_counter() - t)
                i += 1
        except Exception as e:   # reported, never hidden
            errors.append(repr(e))

    threads = [threading.Thread(target=searcher, args=(j * len(q) // 2,), daemon=True)
               for j in range(2)]
    for t in threads:
        t.start()
    time.sleep(a.baseline_seconds)
    base_s = a.baseline_seconds
    phase[0] = "ingest"
    added, adds, commits, seg_trace = 0, [], [], []
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < a.ingest_seconds:
        b = run.pool_batch(a.batch)
        ta = time.perf_counter()
        col.add(b)
        tb = time.perf_counter()
        col.commit()
        tc = time.perf_counter()
        adds.append(tb - ta)
        commits.append(tc - tb)
        added += len(b)
        seg_trace.append((tc - t0, len(col.segments()), col.info()["merging"]))
    ingest_s = time.perf_counter() - t0
    # Drain: background merges run to the end and their results are committed
    # (a commit may start the next merge), until none runs and none is pending.
    phase[0] = "drain"
    t1 = time.perf_counter()
    drain_commits = 0
    while time.perf_counter() - t1 < a.drain_timeout:
        while col.info()["merging"] and time.perf_counter() - t1 < a.drain_timeout:
            time.sleep(0.1)
        info = col.info()
        if not info["merging"] and not info["pending"]:
            break
        col.commit()
        drain_commits += 1
    drain_s = time.perf_counter() - t1
    drained = not col.info()["merging"] and not col.info()["pending"]
    stop.set()
    for t in threads:
        t.join()
    final_segments = [s["live"] for s in col.segments()]
    count = len(col)
    col.close()
    rate = added / ingest_s
    out = {"n_start": a.n, "collection_build_s": t_build, "batch": a.batch,
           "baseline_s": base_s, "ingest_s": ingest_s, "added": added, "batches": len(adds),
           "vectors_per_s": rate, "add_s_median": median(adds), "commit_s_median": median(commits),
           "commit_s_max": max(commits) if commits else None,
           "drain_s": drain_s, "drain_commits": drain_commits, "drained": drained,
           "final_segments": final_segments, "final_count": count,
           "merges_seen": sum(1 for _, _, m in seg_trace if m),
           "segments_max": max((s for _, s, _ in seg_trace), default=None),
           "pool_reused": run.pool_wrapped, "search_errors": errors[:5]}
    for ph in ("baseline", "ingest", "drain"):
        ls = lat[ph]
        span = {"baseline": base_s, "ingest": ingest_s, "drain": drain_s}[ph]
        out[ph] = {"searches": len(ls), "searches_per_s": len(ls) / span if span else None,
                   "p50_ms": 1e3 * pct(ls, 50) if ls else None,
                   "p99_ms": 1e3 * pct(ls, 99) if ls else None,
                   "max_ms": 1e3 * max(ls) if ls else None}
    b, i = out["baseline"], out["ingest"]
    out["p50_ratio"] = i["p50_ms"] / b["p50_ms"] if b["p50_ms"] and i["p50_ms"] else None
    out["p99_ratio"] = i["p99_ms"] / b["p99_ms"] if b["p99_ms"] and i["p99_ms"] else None
    run.results["ingest"] = out
    log("ingest: %d vectors in %.1f s = %.0f vectors/s added+committed (batches of %d: add "
        "median %.3f s, commit median %.3f s, max %.3f s); segments at most %d, at the end %s "
        "after %.1f s waiting for merges" % (added, ingest_s, rate, a.batch, out["add_s_median"],
                                             out["commit_s_median"], out["commit_s_max"],
                                             out["segments_max"], final_segments, drain_s))
    log("search latency (2 threads, single queries): baseline p50 %.2f ms p99 %.2f ms "
        "(%d searches); while ingesting p50 %.2f ms p99 %.2f ms (%d); ratio p50 %.2f, p99 %.2f"
        % (b["p50_ms"], b["p99_ms"], b["searches"], i["p50_ms"], i["p99_ms"], i["searches"],
           out["p50_ratio"], out["p99_ratio"]))
    if errors:
        log("search errors during ingest: %s" % errors[:3])
    if not a.keep:
        shutil.rmtree(d, ignore_errors=True)


# ------------------------------------------------------------------ report

def show_path(x):
    """A path under the repository, relative to it; anything else as it is."""
    if os.path.isabs(x) and os.path.abspath(x).startswith(ROOT + os.sep):
        return os.path.relpath(x, ROOT)
    return x


def fmt(v, spec="%.2f"):
    return "—" if v is None else spec % v


def markdown(doc):
    m, a = doc["machine"], doc["args"]
    L = []
    L.append("# Collections: larger-than-RAM build, adds, merges, segments, ingest")
    L.append("")
    L.append("Written by `benchmarks/bench_collection.py`. Command:")
    L.append("")
    L.append("```")
    L.append(doc["command"])
    L.append("```")
    L.append("")
    L.append("Machine: %d cores (%s), %.1f GiB RAM, kernel %s, Python %s, numpy %s, knndirect "
             "%s (git %s), SIMD %s. Load average (1/5/15 min) at start %s, at end %s. Run "
             "took %.1f min." % (m["cores"], m["cpu"], m["ram_bytes"] / 2**30, m["kernel"],
                                 m["python"], m["numpy"], m["knndirect"], m["git"],
                                 m["features"].get("simd"),
                                 "/".join("%.2f" % x for x in m["load_start"]),
                                 "/".join("%.2f" % x for x in m["load_end"]),
                                 doc["elapsed_s"] / 60))
    L.append("")
    L.append("Scale: n = %d vectors, dim = %d, clustered float32 (`knndirect.datasets."
             "clustered`, seed %d; %.0f MiB of float32), %d held-out queries, k = %d, l2, "
             "m = 16, ef_construction = 200, 1-bit codes. %s" % (
                 a["n"], a["dim"], a["seed"], mib(a["n"] * a["dim"] * 4), a["nq"], K,
                 doc["scale_note"] or ""))
    L.append("")
    L.append("Method: this script drops the page cache itself (`sync; echo 3 > "
             "/proc/sys/vm/drop_caches`) before every cold step (the capped build, each "
             "collection open, each timed merge), and runs the capped build in a memory "
             "cgroup it creates (limit counts the page cache). Ratios compare figures from "
             "this same run.")
    L.append("")
    L.append("## Goals")
    L.append("")
    L.append("| part | goal | measured | target | result |")
    L.append("| --- | --- | --- | --- | --- |")
    for g in doc["goals"]:
        L.append("| %s | %s | %s | %s | **%s**%s |" % (g["part"], g["goal"], g["figure"],
                                                      g["target"], g["status"],
                                                      (" — " + g["note"]) if g["note"] else ""))
    r = doc["results"]
    if "reference" in r:
        ref = r["reference"]
        L.append("")
        L.append("Reference: %s: **%.1f s** (load %.2f at its start)." % (
            ref["what"], ref["build_s"], ref["load_1min"]))
    if "build" in r:
        b = r["build"]
        cli = b["cli"]
        atts = [x for x in (cli["goal"], cli["retry"]) if x is not None]
        c0 = atts[0]
        L.append("")
        L.append("## 1. Build larger than RAM (CLI, under a memory cap)")
        L.append("")
        L.append("`%s` in a child in memory cgroup v%d (the limit counts its page cache), page "
                 "cache dropped before. The child's runtime alone (python + numpy + knndirect "
                 "imported, cold) peaks at %.1f MiB in the group.%s" % (
                     " ".join(["python"] + [show_path(x) for x in c0["cmd"][1:]]),
                     cli["cgroup_version"], mib(cli["runtime_floor_bytes"]),
                     " When the build at the goal's cap fails, it runs once more at a larger "
                     "cap with the same memory budget: a diagnostic of what it needs, not the "
                     "goal." if len(atts) > 1 else ""))
        L.append("")
        L.append("| | " + " | ".join(x["label"] for x in atts) + " |")
        L.append("| --- |" + " --- |" * len(atts))

        def row(name, f):
            L.append("| %s | %s |" % (name, " | ".join(f(x) for x in atts)))
        row("memory limit / --memory-budget", lambda x: "%.1f MiB / %.1f MiB" % (
            mib(x["cap_bytes"]), mib(x["memory_budget_bytes"])))
        row("completed", lambda x: "%s (exit %d%s%s)" % (
            "yes" if x["completed"] else "**no**, died during the %s" % x["stage_reached"],
            x["returncode"], ", %d OOM kill(s)" % x["oom_kills"] if x["oom_kills"] else "",
            ", timed out" if x["timed_out"] else ""))
        row("wall time (child, exec to exit)", lambda x: "%.1f s" % x["wall_s"])
        row("adds (segments written) / merge, as the CLI prints", lambda x: "%s s / %s s (%s "
            "segments before the merge)" % (fmt(x.get("add_s"), "%.1f"),
                                             fmt(x.get("merge_s"), "%.1f"),
                                             x.get("segments_before_merge", "—")))
        row("wall / in-RAM build (%.1f s)" % b["reference_build_s"],
            lambda x: "%.2f" % (x["wall_s"] / b["reference_build_s"]) if x["completed"] else "—")
        row("cgroup peak (anonymous + page cache)", lambda x: "%.1f MiB" % mib(
            x["memory"]["peak_bytes"]))
        row("max anonymous / max page cache (sampled every 0.5 s)", lambda x: "%.1f / %.1f MiB" % (
            mib(x["memory"]["max_anon_bytes"]), mib(x["memory"]["max_cache_bytes"])))
        row("times the limit was hit (reclaim)", lambda x: "%d" % x["memory"]["limit_hits"])
        row("child peak RSS (wait4 ru_maxrss: every mapped file page, also shared libraries "
            "cached and charged elsewhere)", lambda x: "%.1f MiB" % mib(x["child_maxrss_bytes"]))
        row("child CPU user / sys, major faults", lambda x: "%.1f s / %.1f s, %d" % (
            x["child_user_s"], x["child_sys_s"], x["child_majflt"]))
        row("collection on disk", lambda x: "%.1f MiB, %d segment(s)" % (
            mib(x["bytes_on_disk"]), x["segments"]) if x.get("bytes_on_disk") else "—")
        if "recall" in b:
            L.append("")
            L.append("Recall@10 of the collection of the %s (kd.open) and of the in-RAM "
                     "reference, same queries and search parameters:" % b["recall_of"])
            L.append("")
            L.append("| recall@10 at | collection (kd.open) | in-RAM kd.Index | gap |")
            L.append("| --- | --- | --- | --- |")
            for name, x in b["recall"].items():
                L.append("| %s (%s) | %.4f | %.4f | %+.4f |" % (
                    name, ", ".join("%s=%g" % kv for kv in x["params"].items()) or "defaults",
                    x["collection"], x["in_ram"], -x["gap"]))
    if "incremental" in r:
        inc = r["incremental"]
        L.append("")
        L.append("## 2. Incremental cost")
        L.append("")
        if "add_1pct" in inc:
            ad = inc["add_1pct"]
            L.append("Add 1%% (%d vectors) to %s and commit, %d times: %s s; median **%.2f s "
                     "= %.2f%%** of the in-RAM build (%.1f s)%s. Segments afterwards: %d." % (
                         ad["vectors"], ad["on"], len(ad["times_s"]),
                         ", ".join("%.2f" % t for t in ad["times_s"]), ad["median_s"],
                         100 * ad["share_of_reference"], inc["reference_build_s"],
                         ", %.2f%% of the capped CLI build" % (100 * ad["share_of_capped_build"])
                         if ad["share_of_capped_build"] else "", ad["segments_after"]))
            L.append("")
        mh = inc["merge_halves"]
        L.append("Two halves of %d (built %.1f s + %.1f s, merge_policy=None, budget larger "
                 "than the data), page cache dropped, then `merge()`: **%.1f s = %.2fx** the "
                 "in-RAM build of the union (%.1f s)%s; %d segment(s) after. Recall@10 of the "
                 "merged collection: default %.4f (in-RAM %.4f), tuned %.4f (in-RAM %.4f)." % (
                     a["n"] // 2, mh["half_builds_s"][0], mh["half_builds_s"][1], mh["merge_s"],
                     mh["ratio_to_reference"], inc["reference_build_s"],
                     phases(mh.get("core_report")), mh["segments_after"],
                     mh["recall_default"], mh["in_ram_recall_default"], mh["recall_tuned"],
                     mh["in_ram_recall_tuned"]))
    if "segments" in r:
        s = r["segments"]
        L.append("")
        L.append("## 3. Eight segments against one")
        L.append("")
        L.append("8 segments of %s vectors (built %.1f s), and a copy merged into one "
                 "(`merge()`, %.1f s%s%s). %s. Batch: all %d queries in one call, threads=%d, "
                 "median of %d interleaved passes." % (
                     "/".join(map(str, s["segment_sizes"])), s["build_8_s"], s["merge_8_to_1_s"],
                     ", %.2fx the in-RAM build" % s["merge_8_to_1_ratio_to_reference"]
                     if s["merge_8_to_1_ratio_to_reference"] else "",
                     phases(s.get("merge_8_to_1_core_report")), s["cache"], a["nq"],
                     s["search_threads"], a["repeats"]))
        L.append("")
        names = list(s["points"])
        L.append("| ef | " + " | ".join("%s recall | %s QPS" % (n, n) for n in names) + " |")
        L.append("| --- |" + " --- | --- |" * len(names))
        for i, p in enumerate(s["points"][names[0]]):
            L.append("| %d | " % p["ef"] + " | ".join(
                "%.4f | %.0f" % (s["points"][n][i]["recall"], s["points"][n][i]["qps"])
                for n in names) + " |")
        L.append("")
        L.append("At recall %s:" % s["target_how"])
        L.append("")
        L.append("| | smallest ef reaching it | recall there | QPS there, paired passes "
                 "(median) | QPS interpolated on the front | single query p50 | p99 |")
        L.append("| --- | --- | --- | --- | --- | --- | --- |")
        for n in names:
            x = s["at_target"][n]
            L.append("| %s | %d | %.4f | %.0f | %.0f | %.2f ms | %.2f ms |" % (
                n, x["ef_at_target"], x["recall_at_ef"], x["paired_qps_median"],
                x["qps_at_target"], x["p50_ms"], x["p99_ms"]))
        L.append("")
        L.append("QPS ratio 8 / 1 at equal recall: **%.2f** (median of the paired passes' "
                 "ratios %s; from the interpolated fronts %.2f); single-query p50 latency ratio "
                 "8 / 1: **%.2f**." % (s["qps_ratio"], ", ".join(
                     "%.2f" % x for x in s["pair_ratios"]), s["interpolated_qps_ratio"],
                     s["p50_ratio"]))
    if "ingest" in r:
        g = r["ingest"]
        L.append("")
        L.append("## 4. Ingest while serving")
        L.append("")
        L.append("A collection of %d vectors (merge_policy 'tiered', built as one segment in "
                 "%.1f s), page cache dropped, opened writable. Two Python threads search "
                 "single queries (k=10, defaults) in a loop: %.0f s alone, then %.1f s while "
                 "the main thread adds batches of %d and commits each; then (drain) the "
                 "wait for background merges to finish, committing their results (%.1f s, "
                 "%d commits%s). No goal is set for this part." % (
                     g["n_start"], g["collection_build_s"], g["baseline_s"], g["ingest_s"],
                     g["batch"], g["drain_s"], g["drain_commits"],
                     "" if g["drained"] else "; **merges still running at the time limit**"))
        L.append("")
        L.append("| | value |")
        L.append("| --- | --- |")
        L.append("| added and committed | %d vectors in %d batches, **%.0f vectors/s** |" % (
            g["added"], g["batches"], g["vectors_per_s"]))
        L.append("| per batch: add / commit (median), commit max | %.3f s / %.3f s, %.3f s |" % (
            g["add_s_median"], g["commit_s_median"], g["commit_s_max"]))
        L.append("| segments: most seen / at the end | %s / %d (%s) |" % (
            g["segments_max"], len(g["final_segments"]),
            ", ".join(map(str, g["final_segments"]))))
        L.append("| commits that saw a background merge running | %d of %d |" % (
            g["merges_seen"], g["batches"]))
        L.append("")
        L.append("| phase | searches | searches/s | p50 | p99 | max |")
        L.append("| --- | --- | --- | --- | --- | --- |")
        for ph in ("baseline", "ingest", "drain"):
            x = g[ph]
            L.append("| %s | %d | %s | %s ms | %s ms | %s ms |" % (
                ph, x["searches"], fmt(x["searches_per_s"], "%.0f"), fmt(x["p50_ms"]),
                fmt(x["p99_ms"]), fmt(x["max_ms"])))
        L.append("")
        L.append("Latency with ingest / without: p50 **%s**, p99 **%s**.%s" % (
            fmt(g["p50_ratio"]), fmt(g["p99_ratio"]),
            " Search errors: %s." % g["search_errors"] if g["search_errors"] else ""))
        if g["pool_reused"]:
            L.append("")
            L.append("The vectors prepared for ingest ran out; they were added again under new "
                     "ids.")
    L.append("")
    return "\n".join(L)


# ------------------------------------------------------------------ main

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("parts", nargs="*", choices=PARTS + ("all",), default="all",
                    help="which measurements (default: all four)")
    ap.add_argument("--n", type=int, default=200_000, help="vectors (default 200000)")
    ap.add_argument("--dim", type=int, default=768, help="dimension (default 768)")
    ap.add_argument("--seed", type=int, default=1, help="data seed (default 1)")
    ap.add_argument("--nq", type=int, default=1000, help="held-out queries (default 1000)")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "collection.json"),
                    help="results JSON; the Markdown goes beside it with .md "
                    "(default benchmarks/results/collection.json)")
    ap.add_argument("--dir", default=None, help="data and collections (default "
                    "benchmarks/data/collection)")
    ap.add_argument("--keep", action="store_true", help="keep data and collections")
    ap.add_argument("--repeats", type=int, default=3,
                    help="repeats of the cheap measurements (default 3)")
    ap.add_argument("--cap-fraction", type=float, default=0.25,
                    help="the build's memory cap, as a fraction of the float32 size (0.25)")
    ap.add_argument("--budget-fraction", type=float, default=0.25,
                    help="--memory-budget of the build, as a fraction of the cap (0.25)")
    ap.add_argument("--retry-cap-fraction", type=float, default=0.5,
                    help="when the capped build fails, run it once more at this cap (a "
                    "diagnostic; 0: no retry; default 0.5)")
    ap.add_argument("--build-timeout", type=float, default=3600,
                    help="seconds before the capped build is killed (default 3600)")
    ap.add_argument("--tuned", default="128,10", metavar="EF,OVERSAMPLE",
                    help="the tuned search point of the recall comparisons (default 128,10)")
    ap.add_argument("--efs", default="10,12,16,24,32,48,64,96,128", help="ef sweep of part 3")
    ap.add_argument("--pairs", type=int, default=7,
                    help="paired batch passes at the equal-recall point of part 3 (default 7)")
    ap.add_argument("--search-threads", type=int, default=2,
                    help="threads of part 3's batch searches (default 2)")
    ap.add_argument("--batch", type=int, default=1000, help="vectors per ingest batch")
    ap.add_argument("--baseline-seconds", type=float, default=10,
                    help="part 4: seconds of searches alone (default 10)")
    ap.add_argument("--ingest-seconds", type=float, default=20,
                    help="part 4: seconds of adds and commits while searching (default 20)")
    ap.add_argument("--drain-timeout", type=float, default=60,
                    help="part 4: seconds to wait for background merges after the ingest "
                    "(default 60)")
    ap.add_argument("--max-load", type=float, default=None,
                    help="first wait (up to --max-wait s) for the 1-min load to fall below this")
    ap.add_argument("--max-wait", type=float, default=600)
    args = ap.parse_args(argv)
    chosen = args.parts if isinstance(args.parts, list) else [args.parts]
    parts = [p for p in PARTS if p in chosen or "all" in chosen]
    if os.geteuid() != 0:
        log("bench_collection.py needs root: it drops the page cache (echo 3 > "
            "/proc/sys/vm/drop_caches) and caps the build in a memory cgroup it creates")
        return 2
    if args.max_load is not None:
        wait_for_load(args.max_load, args.max_wait)
    t_start = time.perf_counter()
    machine = machine_facts()
    command = " ".join(["python", os.path.relpath(os.path.abspath(__file__), ROOT)] +
                       (argv if argv is not None else sys.argv[1:]))
    log("bench_collection: %s; %d cores, %.1f GiB RAM, kernel %s, load %s" % (
        ", ".join(parts), machine["cores"], machine["ram_bytes"] / 2**30, machine["kernel"],
        "/".join("%.2f" % x for x in machine["load_start"])))
    log("page cache: dropped by this script (sync; echo 3 > /proc/sys/vm/drop_caches) before "
        "each cold step; the capped build runs in a memory cgroup created by this script")
    run = Run(args)
    scale_note = (None if args.n >= 1_000_000 else
                  "the goals are set at 1M x 768; this run is smaller (see "
                  "results/collection-1m.md for part 1 at 1M)")
    loads = {}
    failed = {}
    try:
        for name in parts:
            loads[name] = list(os.getloadavg())
            log("\n== %s (load %.2f)" % (name, loads[name][0]))
            try:
                {"build": part_build, "incremental": part_incremental,
                 "segments": part_segments, "ingest": part_ingest}[name](run)
            except Exception as e:   # one part's failure is reported; the others run
                import traceback
                traceback.print_exc()
                failed[name] = repr(e)
                run.goal(name, "the part ran", repr(e)[:200], "runs", "FAIL")
    finally:
        if not args.keep:
            for f in os.listdir(run.dir):   # only what this script made
                p = os.path.join(run.dir, f)
                if os.path.isdir(p) and f.startswith("col_"):
                    shutil.rmtree(p, ignore_errors=True)
                elif re.match(r"^(X_|truth_).*\.npy$|^(probe|cli_build)\.log$", f):
                    os.unlink(p)
    machine["load_end"] = list(os.getloadavg())
    doc = {"command": command, "args": vars(args), "parts": parts, "machine": machine,
           "scale_note": scale_note, "loads_at_part_start": loads, "failed": failed,
           "elapsed_s": time.perf_counter() - t_start, "results": run.results,
           "goals": run.goals}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1, default=str)
    md_path = os.path.splitext(args.out)[0] + ".md"
    md = markdown(doc)
    with open(md_path, "w") as f:
        f.write(md)
    log("\n" + md)
    log("wrote %s and %s (%.1f min)" % (args.out, md_path, doc["elapsed_s"] / 60))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
