"""Recall targets: how recall@k grows with the beam (ef) and the shortlist,
measured on queries with known answers, and the cheapest (ef, oversample)
for a target read back from that table.

The table is measured by the core (``recall_sweep``): for each ef of a
geometric ladder, one graph search per query keeps the longest shortlist,
and every shorter shortlist is its prefix, so all lengths are scored from the
same search. The index keeps the table as opaque bytes in its file (format
2, section "calibration"); this module encodes and reads them.

Queries are what the table is worth. At build time they are vectors of the
add itself, held out of the graph until the table is measured and inserted
right after: unseen queries from the data's own distribution. A vector
already in the graph, asked for its neighbours with itself excluded, is not
one (its own links lead straight to the answer: recall is overstated), nor
is one searched with its node hidden (the graph was pruned around it: recall
is understated); see docs/design.md, "Recall targets".
"""
from __future__ import annotations

import json
import math

import numpy as np

from ._core import CorruptIndexError

FORMAT = 1
K = 10  # the k a build-time table is measured at
# Indexes smaller than this get no table: a default search keeps ef 64 and
# the fixed oversample (near exact at this size); recall= widens the beam to
# every node.
MIN_INDEX = 1000
# Calibration queries. 200 queries of k = 10 give 2,000 neighbours: a recall
# near 0.95 is estimated within about +-0.01 (one standard error 0.005).
QUERIES = 200
# Fewer held-out vectors than this and the table would be noise: wait.
MIN_QUERIES = 50
# The table is measured again once the index has doubled.
GROWTH = 2.0
DEFAULT_TARGET = 0.95
# A default search reaches DEFAULT_TARGET with 95% confidence (one-sided
# normal bound); recall=r aims at r itself.
SURE_Z = 1.645
# Shortlist lengths, as multiples of k, up to MAX_OVERSAMPLE x the default;
# while the longest still adds recall (more than FLAT over the one before,
# at the widest beam), the ladder is measured again with lengths twice as
# long, up to LONGEST x the default (1-bit codes over many similar vectors
# need deep shortlists: 1M x 256 clustered went on gaining past 16 x k).
LENGTH_STEPS = (1, 1.5, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192)
MAX_OVERSAMPLE = 2.0
LONGEST = 16.0
# ef ladder: from k up by sqrt(2), until recall stops rising or this cap.
EF_STEP = math.sqrt(2.0)
EF_CAP = 4096
# The ladder stops once recall reaches this, or two steps add less than FLAT:
# recall at the longest shortlist, or with refined codes at the first one of
# REFINED_PROBE x k (refined, a short shortlist holds about all the beam
# found, and the ladder must go on to the beam where that reaches the target).
SATURATED = 0.99
FLAT = 0.002
REFINED_PROBE = 2
# What one shortlisted row costs, in code distances of the graph search:
# one 4 KiB O_DIRECT read (3.4 us of CPU, docs/benchmarks.md "I/O probe")
# plus its float32 rescoring (0.2-0.5 us), against 50-180 ns a code distance
# (384-768 dims, 1-bit codes; benchmarks/bench_recall.py prints both). The
# same price holds in RAM, so that an index makes the same choice loaded or
# opened and gives the same answers either way.
ROW_COST = 32
# What re-estimating one candidate from its 4-bit refinement costs, in the
# same units: 140-350 ns at 256-768 dims, 1.3-2.2 times the beam's time per
# code distance at 100k (benchmarks/bench_refine_cost.py measures both); a
# little more for the colder caches of larger indexes.
REFINED_COST = 2.5


def lengths(k, default_oversample, max_oversample=None):
    top = default_oversample * (max_oversample or MAX_OVERSAMPLE)
    return sorted({max(k, math.ceil(k * s)) for s in LENGTH_STEPS if s <= top})


def measure(core, queries, truth, k, *, hidden=None, threads=0, max_oversample=None,
            source="build"):
    """The calibration table of core for these queries (float32, C order)
    and their true neighbours (int64, (n, k), -1 padded). max_oversample
    given: the lengths stop there (no deeper ladder)."""
    top = max_oversample or MAX_OVERSAMPLE
    while True:
        cal = _ladder(core, queries, truth, k, hidden, threads, top, source)
        last = cal["recall"][-1]
        if (max_oversample or top >= LONGEST or len(last) < 2
                or last[-1] - last[-2] <= FLAT):
            return cal
        top *= 2


def _ladder(core, queries, truth, k, hidden, threads, top, source):
    info = core.info()
    lens = np.asarray(lengths(k, info["default_oversample"], top), np.int64)
    cap = max(k, min(EF_CAP, info["count"]))
    truth = np.ascontiguousarray(truth, np.int64).ravel()
    efs, table, stderr, scored, refined = [], [], [], [], []
    probe = -1
    if "+" in info["quantization"]:
        probe = int(np.searchsorted(lens, REFINED_PROBE * k))
        probe = min(probe, len(lens) - 1)
    ef = k
    while True:
        recall, spread, nodes, reest, used = core.recall_sweep(queries, hidden, truth, k, ef,
                                                               lens, threads)
        efs.append(ef)
        table.append([round(float(r), 5) for r in recall])
        stderr.append([round(float(s) / math.sqrt(max(used - 1, 1)), 5) for s in spread])
        scored.append(round(nodes, 1))
        refined.append(round(reest, 1))
        best = [row[probe] for row in table]
        flat = len(best) >= 3 and best[-1] - best[-3] < FLAT and ef >= 4 * k
        if best[-1] >= SATURATED or flat or ef >= cap:
            break
        ef = min(cap, max(ef + 1, round(ef * EF_STEP)))
    cal = {
        "format": FORMAT,
        "source": source,
        "k": int(k),
        "count": int(info["count"]),
        "queries": int(queries.shape[0]),
        "ef": efs,
        "shortlist": [int(x) for x in lens],
        "recall": table,
        "stderr": stderr,
        "scored": scored,
    }
    if any(refined):  # refined codes: a key older builds ignore
        cal["refined"] = refined
    return cal


def encode(cal) -> bytes:
    return json.dumps(cal, separators=(",", ":")).encode()


def decode(blob: bytes):
    """The stored table, or None for none."""
    if not blob:
        return None
    try:
        cal = json.loads(blob.decode())
        ok = (isinstance(cal, dict) and cal.get("format") == FORMAT
              and len(cal["recall"]) == len(cal["ef"]) == len(cal["scored"])
              == len(cal["stderr"]) == len(cal.get("refined", cal["ef"]))
              and all(len(row) == len(cal["shortlist"])
                      for row in cal["recall"] + cal["stderr"]))
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        ok = False
    if not ok:
        raise CorruptIndexError("the index's recall calibration is unreadable")
    return cal


def _between(x0, x1, y0, y1, y):
    """x where the line through (x0, y0), (x1, y1) reaches y."""
    return x1 if y1 <= y0 else x0 + (x1 - x0) * (y - y0) / (y1 - y0)


def choose(cal, target, k, sure=False):
    """(ef, oversample, expected recall) of the cheapest measured point whose
    recall reaches target, ef interpolated (log scale) between the two
    measured beams that bracket it; the best measured point when none
    reaches it. sure: the recall less SURE_Z standard errors must reach it
    (a default of 0.95 is then met with 95% confidence, not a coin toss)."""
    efs, lens, measured = cal["ef"], cal["shortlist"], np.asarray(cal["recall"])
    sure = measured - (SURE_Z if sure else 0.0) * np.asarray(cal["stderr"])
    log_ef = np.log(efs)
    scored = np.asarray(cal["scored"]) + REFINED_COST * np.asarray(cal.get("refined", 0.0))
    best = None
    for j, length in enumerate(lens):
        hit = np.flatnonzero(sure[:, j] >= target)
        if not hit.size:
            continue
        i = int(hit[0])
        # Where between beam i - 1 and beam i the bound reaches target (0..1).
        f = 1.0 if i == 0 else _between(0.0, 1.0, sure[i - 1, j], sure[i, j], target)
        lo = max(i - 1, 0)
        ef = math.exp(log_ef[lo] + f * (log_ef[i] - log_ef[lo]))
        cost = scored[lo] + f * (scored[i] - scored[lo]) + length * ROW_COST
        expect = measured[lo, j] + f * (measured[i, j] - measured[lo, j])
        if best is None or cost < best[0]:
            best = (cost, math.ceil(ef), length, float(expect))
    if best is None:
        i, j = np.unravel_index(int(np.argmax(measured)), measured.shape)
        best = (0.0, efs[i], lens[j], float(measured[i, j]))
    _, ef, length, expect = best
    # Measured at the table's k: a larger k keeps the beam as wide relative to k.
    scale = max(1.0, k / cal["k"])
    return max(k, math.ceil(ef * scale)), length / cal["k"], round(expect, 4)


def curve(cal):
    """The table as a list of points, plus the choices for common targets."""
    points = [{"ef": ef, "oversample": length / cal["k"], "recall": r, "stderr": e}
              for ef, row, errs in zip(cal["ef"], cal["recall"], cal["stderr"])
              for length, r, e in zip(cal["shortlist"], row, errs)]
    targets = {}
    for t in (0.9, 0.95, 0.98, 0.99):
        ef, os_, expect = choose(cal, t, cal["k"])
        targets[t] = {"ef": ef, "oversample": os_, "expected_recall": expect}
    ef, os_, expect = choose(cal, DEFAULT_TARGET, cal["k"], sure=True)
    return {k: v for k, v in cal.items() if k not in ("recall", "stderr")} | {
        "points": points, "targets": targets,
        "default": {"ef": ef, "oversample": os_, "expected_recall": expect}}


def due(cal, count):
    """Whether an index of count vectors should measure its table again."""
    return cal is None or count >= GROWTH * cal["count"]


def holdout(n, count_after, seed):
    """Positions of an add of n vectors to hold out as calibration queries:
    none when no table is due or too few would be held out."""
    m = min(QUERIES, n // 2)
    if m < MIN_QUERIES:
        return None
    rng = np.random.default_rng([seed & (2**63 - 1), count_after])
    return np.sort(rng.choice(n, m, replace=False))
