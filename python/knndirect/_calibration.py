"""Recall targets: how recall@k grows with the beam (ef) and the shortlist,
measured on queries with known answers, and the cheapest (ef, oversample)
for a target read back from that table.

The table is measured by the core (``recall_sweep``): for each ef of a
geometric ladder, one graph search per query keeps the longest shortlist,
and every shorter shortlist is its prefix, so all lengths are scored from the
same search, by the true neighbours each prefix holds (its exact rerank would
keep every one of them). The index keeps the table as opaque bytes in its file (format
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
from statistics import NormalDist
from time import perf_counter

import numpy as np

from ._core import CorruptIndexError, in_half

FORMAT = 1
K = 10  # the k a build-time table is measured at
# Indexes smaller than this get no table: a default search keeps ef 64 and
# the fixed oversample (near exact at this size); recall= searches
# exactly.
MIN_INDEX = 1000
# Calibration queries. 200 queries of k = 10 give 2,000 neighbours: a recall
# near 0.95 is estimated within about +-0.01 (one standard error 0.005) where
# queries are alike. Real text varies more from query to query (mpnet-dict:
# 0.0064 at 0.96, about 0.011 at 0.90), so where the standard error at the
# point chosen for a promised target exceeds STDERR_BOUND (recall='s
# +-TOLERANCE is then 2.5 standard errors: 99% of tables), more held-out
# queries are measured on the same beams, up to MOST_QUERIES in all (a
# build on threads takes BUDGET's rule instead).
QUERIES = 200
MOST_QUERIES = 400
# A build with more than one thread measures as many of the rest as fit in
# BUDGET of the add's time, at the cost per query its first QUERIES took:
# the default's bound narrows as 1/sqrt(queries), and at 1M x 768 the first
# 200 read 0.013 easy (the default gave 0.9479-0.9482; all 400 gave
# 0.9575-0.9577, for 2.7-3.4% of the build against 1.7-2.0%). Counts cannot stand in for the time:
# the brute force for the truth is bound by the FMA units and a build by
# memory, so their ratio moves with the index's size (the share of a query
# fell from 0.016% of a 100k x 768 build to 0.009-0.010% of a 1M one). A
# build with one thread, whose file must come out the same every time, keeps
# the error rule alone. 45 builds at 100k: 3.1-5.8% of the build (the first
# 200 alone can pass the budget), one default below 0.95 against two, 3.1%
# more queries per second (benchmarks/default_margin.py --queries staged,lib).
# Where the first 200 alone would pass it (a slow ladder: 256-d codes under
# ip climb to ef 462-923), the beams after the one running when it passed
# are measured on half of them (_ladder): 5.1-6.0% of the build on 3 of 27
# such builds on an AMD EPYC VM before.
BUDGET = 0.04
TOLERANCE = 0.02
STDERR_BOUND = TOLERANCE / 2.5
PROMISED = (0.90, 0.95, 0.98)
HELD_SHARE = 25  # queries held out past QUERIES: at most 1/25 of the index
# Fewer held-out vectors than this and the table would be noise: wait.
MIN_QUERIES = 50
# The table is measured again once the index has doubled.
GROWTH = 2.0
DEFAULT_TARGET = 0.95
# A default search reaches DEFAULT_TARGET with 95% confidence; recall=r
# aims at r itself. The default takes the cheapest of the table's columns
# whose bound clears the target, so the confidence is the family's: each of
# the m columns that could be picked is tested at SURE_ALPHA / m (one-sided
# normal bounds, Bonferroni), 2.24-2.45 standard errors for 4-7 columns.
# At 1.645 a column, 8 of 72 builds fell below 0.95 (to 0.9434, where a
# column that erred high was the cheapest); under this rule 1 did, for
# 3.8% of the 1-thread queries per second at the median
# (benchmarks/default_margin.py, 4 sets x 3 metrics x 6 index seeds).
SURE_ALPHA = 0.05
# The bound's standard error is read at the target, not at the estimate: the
# sample's spread as a multiple of a binomial one, times the target's
# binomial spread. Per-query recall is bounded and skewed, so a sample that
# missed the few hard queries reads both high and narrow, and a bound from
# its own spread lay more than 2.33 standard errors high in 2.4-3.6% of
# samples of 200-400 where a normal error gives 1%; read at the target,
# 1.3-2.5% (fresh draws at 100k and 1M x 768;
# benchmarks/calibration_control.py).
SPREAD_AT_TARGET = True
# Shortlist lengths, as multiples of k, up to MAX_OVERSAMPLE x the default;
# while the longest still adds recall (more than FLAT over the one before,
# at the widest beam), the ladder is measured again with lengths twice as
# long, up to LONGEST x the default (1-bit codes over many similar vectors
# need deep shortlists: 1M x 256 clustered went on gaining past 16 x k).
# 1.1-1.9, 2.25 and 2.5 x k are recall='s alone: recall climbs
# fastest with the length below 3 x k (0.87 to 0.92 from 1.5 to 2 x k on
# easy data), and a target must not have to take the next column up,
# beyond its +-TOLERANCE. Small indexes need them most: their beam cannot
# narrow below k, so only the length is left to choose (2,000 and 5,000 x
# 64, 16 graphs: l2 targets outside +-0.02 6/48 and 11/48 without 2.5, 1/48
# and 0/48 with it; on ip at 2,000 the 0.90 target gains 0.02-0.04 a row
# from 10 to 15 rows, and 9/48 fell outside until 1.1, 1.2 and 1.4 came,
# 3/48 after; benchmarks/calibration_seeds.py --n; 1.3, 1.6, 1.7, 1.9 and
# 2.25 came with the grown table, which reads between columns, so that a
# read between 2 and 2.5 x k need not take 2.5). The default keeps to the coarse
# columns: its one-sided bound loses little to a coarse grid, and each more
# column is one more chance to pick an estimate that erred high (with them,
# defaults on refined codes came out down to 0.947;
# benchmarks/calibration_seeds.py).
LENGTH_STEPS = (1, 1.1, 1.2, 1.25, 1.3, 1.4, 1.5, 1.6, 1.7, 1.75, 1.9, 2, 2.25, 2.5, 3, 4, 6, 8,
                12, 16, 24, 32, 48, 64, 96, 128, 192)
TARGET_ONLY_STEPS = (1.1, 1.2, 1.25, 1.3, 1.4, 1.6, 1.7, 1.75, 1.9, 2.25, 2.5)
MAX_OVERSAMPLE = 2.0
LONGEST = 16.0
# ef ladder: from k up by sqrt(2), until recall stops rising or this cap.
EF_STEP = math.sqrt(2.0)
EF_CAP = 4096
# The ladder stops once recall reaches this, or two steps add less than FLAT:
# recall at the longest shortlist, or with refined codes at the first one of
# REFINED_PROBE x k (refined, a short shortlist holds about all the beam
# found, and the ladder must go on to the beam where that reaches the target).
# Just past the highest promised target: wider beams serve only targets
# above it, and bought them little (minilm-wordnet, index seed 1: going on
# to 0.99 took the ladder from ef 163 to 327-923 and the calibration from
# 3.0-4.5% of the build to 3.6-7.3%, over the 5% budget, for at most 0.0015
# more recall at recall=0.99; docs/benchmarks.md, "Real text at 117k").
SATURATED = max(PROMISED) + 0.005
FLAT = 0.002
# Beams wider than one whose recall at the probe reached HALF_PAST are
# measured on the first half of the queries alone. They serve the targets
# above the default, and a recall's binomial error goes as p(1 - p) / n:
# at 0.975 or more, half the queries estimate it as closely as all of them
# do 0.95 (0.0244 / 1,000 neighbours against 0.0475 / 2,000). These are the
# widest, dearest beams: clustered-100k-256 under ip climbs to ef 653-923,
# and its first 200 queries took 5.8-5.9% of the build with every beam on
# all of them, 4.2-4.3% with these on half; over 90 builds at 100k the
# largest share fell from 5.9% to 4.8%, recall= as close as before
# (benchmarks/default_margin.py --queries lib,whole).
HALF_PAST = 0.975
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
# How much deeper a true neighbour sits in the shortlist with more vectors
# competing (grown): the table's shortlist is read at L / growth ** depth.
# Each table measures its own depth on the same searches, over a random half
# of the rows (depth_exponent); DEPTH_BOUND is the bound for intrinsic
# dimension >= 2, for tables measured before the depth was.
DEPTH_BOUND = 0.5
# The half's points within this of its highest recall at a beam are left
# out of the fit: there the beam's reach, not the shortlist, decides.
DEPTH_CEILING = 0.02
DEPTH_MIN_POINTS = 4
# The half's truth is read from the whole's nearest HALF_DEPTH * k: fewer
# than k of 4k fall in a random half about once in 10,000 queries (that
# query then counts the ones it has).
HALF_DEPTH = 4


def lengths(k, default_oversample, max_oversample=None):
    top = default_oversample * (max_oversample or MAX_OVERSAMPLE)
    return sorted({max(k, math.ceil(k * s)) for s in LENGTH_STEPS if s <= top})


def measure(core, queries, truth_of, k, *, hidden=None, threads=0, source="build",
            first=None, budget=None):
    """The calibration table of core for these queries (float32, C order).
    truth_of(lo, hi, depth): the depth true neighbours of queries[lo:hi],
    nearest first (int64, (n, depth), -1 padded). first
    given: the table is measured on queries[:first], and on as many of the
    rest as bring its error within STDERR_BOUND (the queries must come in
    random order), or with budget (seconds) given, as many as fit in it at
    the first's cost a query."""
    started = perf_counter()
    n = queries.shape[0]
    first = n if first is None else min(first, n)

    def part(lo, hi, truth):
        return _Part(queries[lo:hi], truth, None if hidden is None else hidden[lo:hi])

    # One brute force gives the head's truth and its half's (the half's k
    # nearest among the whole's HALF_DEPTH * k).
    deep = truth_of(0, first, HALF_DEPTH * k)
    head = part(0, first, deep[:, :k])
    head.half = half_of(core)
    head.half_truth = within(deep, head.half, k).ravel()
    top = MAX_OVERSAMPLE
    measured_to = 0.0
    while True:
        j = len(_lengths(core, k, top)) - 1
        if top > measured_to:
            # One doubling ahead: where the shortlists must deepen, their
            # columns are there already (a shorter shortlist is a prefix).
            measured_to = min(2 * top, LONGEST)
            lens = _lengths(core, k, measured_to)
            rows = _ladder(core, head, k, threads, lens, j,
                           deadline=None if budget is None else started + budget)
        last = rows[-1].recall
        if top >= LONGEST or j < 1 or last[j] - last[j - 1] <= FLAT:
            break
        top *= 2
    depth = depth_exponent(rows, lens, "+" in core.info()["quantization"])
    lens, rows = lens[:j + 1], [r.first(j + 1) for r in rows]
    cal = _table(core, rows, k, lens, source, first)
    if budget is not None:
        spent = max(perf_counter() - started, 1e-9)
        more = min(n - first, max(0, math.floor((budget - spent) * first / spent)))
    else:
        worst = max(_cheapest(cal, t, False)[4] for t in PROMISED)
        # Error shrinks as 1/sqrt(queries): as many more as that asks for.
        more = 0 if worst <= STDERR_BOUND else min(
            n - first, math.ceil(first * ((worst / STDERR_BOUND) ** 2 - 1)))
    if more > 0:
        rest = part(first, first + more, truth_of(first, first + more, k))
        extra = _ladder(core, rest, k, threads, lens, len(lens) - 1, rows)
        cal = _table(core, [a.pooled(b) for a, b in zip(rows, extra)], k, lens, source,
                     first + more)
    if depth is not None:
        cal["depth"] = depth
    return cal


def half_of(core):
    """A random half of core's ids, as the salt that in_half reads it by
    (drawn from the live count, so that a threads=1 build saves the same
    table every time; a hash of each id, so that where the rows lie does
    not change the draw). Nothing is built per sweep: the ids of a half
    made a filter of 500,000 rows on every call at 1M, 12 ms each."""
    rng = np.random.default_rng([core.info()["count"], 0x5EED])
    return int(rng.integers(0, 2**63, dtype=np.int64))


def within(deep, salt, k):
    """Per row of deep (ids, nearest first), the first k in salt's half
    (in_half); -1 where fewer are."""
    deep = np.ascontiguousarray(deep, np.int64)
    member = in_half(deep.ravel(), salt).reshape(deep.shape) & (deep >= 0)
    order = np.argsort(~member, axis=1, kind="stable")[:, :k]
    out = np.take_along_axis(deep, order, axis=1)  # a new int64 array
    out[~np.take_along_axis(member, order, axis=1)] = -1
    return out


def depth_exponent(rows, lens, refined=False):
    """How the depth of a true neighbour in the shortlist grows with the
    vectors competing: the exponent e with which the whole index's recall at
    a length of L * 2 ** e matches its random half's at L, both from the
    same searches (the half's shortlist is its rows among the whole's, in
    order: the same beam, half the competitors). The half's neighbours lie
    further out, and the beam reaches fewer of them, so each curve is taken
    as a share of the most it reaches (at its longest length, on beams
    where the half's has levelled off): the depth of the neighbours the
    beam found. Fitted by least squares over the lengths where the half's
    recall still rises (near its top the beam's reach decides, not the
    shortlist), to 0.01 in [0, 1]; None when too few such lengths were
    measured. At intrinsic dimension d it is about 1/d (l2, cosine: at most
    DEPTH_BOUND for d >= 2); an inner product's top is the end of a
    projection, not a ball, and grows less deep (docs/design.md, "Recall
    targets").

    refined: the beam's best ef are ordered by their refined codes and the
    rest by 1-bit codes, so each curve is cut where its rows leave the
    refined order (the whole's at ef, the half's at ef / 2, about as many
    of its rows) and read as a share of what it reaches there. Taken whole,
    the half's curve runs on into the 1-bit order sooner than the whole's
    and reads as deeper: 0.46 for l2, where recall= on an index grown 1.9
    times then landed +0.016 (at 0.90, +0.03). Refined codes reach their
    prefix's top within a row or two of k: every point below it by more
    than FLAT counts."""
    lens = np.asarray(lens, np.float64)
    # Refined: the whole's cut is its top (past it, it reads 1), so no
    # length is too long to read it at.
    ceiling, longest = (FLAT, np.inf) if refined else (DEPTH_CEILING, lens[-1] / 2)
    beams = []  # per beam: the whole's lengths and curve, the half's lengths and recall
    for r in rows:
        if r.half is None:
            continue
        whole, cut = len(lens), len(lens)
        if refined:
            whole, cut = (int(np.searchsorted(lens, x, "right")) for x in (r.ef, r.ef / 2))
        valid = np.flatnonzero(~np.isnan(r.half[:cut]))
        if len(valid) < 3 or whole < 2 or r.recall[whole - 1] <= 0:
            continue
        top = r.half[valid[-1]]
        if top <= 0 or (not refined and top - r.half[valid[-2]] > FLAT):
            continue  # still rising where it ends: its reach is not known
        use = valid[(r.half[valid] <= top - ceiling) & (lens[valid] <= longest)]
        beams.append((lens[:whole], r.recall[:whole] / r.recall[whole - 1], lens[use],
                      r.half[use] / top))
    if sum(len(at) for _, _, at, _ in beams) < DEPTH_MIN_POINTS:
        return None
    grid = np.linspace(0.0, 1.0, 101)
    errors = [sum(float(((np.interp(at * 2.0 ** e, own, full) - half) ** 2).sum())
                  for own, full, at, half in beams) for e in grid]
    return round(float(grid[int(np.argmin(errors))]), 2)


class _Part:
    """Some of the calibration queries, with their truth and hidden ids."""

    def __init__(self, queries, truth, hidden):
        self.half = self.half_truth = None  # the depth's half: measure sets them
        self.queries = np.ascontiguousarray(queries, np.float32)
        self.truth = np.ascontiguousarray(truth, np.int64).ravel()
        self.hidden = None if hidden is None else np.ascontiguousarray(hidden, np.int64)

    def split(self):
        """The first half of the queries (rounded up) and the rest, as parts."""
        n = self.queries.shape[0]
        h, k = (n + 1) // 2, self.truth.shape[0] // max(n, 1)
        halves = []
        for lo, hi in ((0, h), (h, n)):
            p = _Part(self.queries[lo:hi], self.truth[lo * k:hi * k],
                      None if self.hidden is None else self.hidden[lo:hi])
            if self.half_truth is not None:
                p.half, p.half_truth = self.half, self.half_truth[lo * k:hi * k]
            halves.append(p)
        return halves


class _Beam:
    """One beam's sweep: recall and per-query spread at each shortlist
    length, code distances and refinements per query, queries counted."""

    def __init__(self, ef, recall, spread, scored, refined, used, half=None, whole=True):
        self.ef, self.scored, self.refined, self.used = ef, scored, refined, used
        self.whole = whole  # False: measured on the first half of the queries alone
        self.half = None if half is None else np.asarray(half, np.float64)
        self.recall = np.asarray(recall, np.float64)
        self.spread = np.asarray(spread, np.float64)

    def first(self, m):
        """The first m shortlist lengths."""
        return _Beam(self.ef, self.recall[:m], self.spread[:m], self.scored, self.refined,
                     self.used, None if self.half is None else self.half[:m], self.whole)

    def pooled(self, other):
        """The sweep of both query sets together."""
        n = self.used + other.used
        if not other.used or not self.used:
            return self if other.used == 0 else other
        w0, w1 = self.used / n, other.used / n
        mean = w0 * self.recall + w1 * other.recall
        square = (w0 * (self.spread ** 2 + self.recall ** 2)
                  + w1 * (other.spread ** 2 + other.recall ** 2))
        half = None if self.half is None or other.half is None else (
            w0 * self.half + w1 * other.half)
        return _Beam(self.ef, mean, np.sqrt(np.maximum(square - mean ** 2, 0.0)),
                     w0 * self.scored + w1 * other.scored,
                     w0 * self.refined + w1 * other.refined, n, half, self.whole)


def _lengths(core, k, top):
    return np.asarray(lengths(k, core.info()["default_oversample"], top), np.int64)


def _ladder(core, part, k, threads, lens, longest, beams=None, deadline=None):
    """The sweeps of a geometric ladder of beams, from k up while recall at
    shortlist lens[longest] rises (past HALF_PAST, or once the clock has
    passed deadline, on the first half of the queries); beams given (the
    rows of such a ladder): the same beams, each on as much of this part as
    it was measured on there."""
    info = core.info()
    cap = max(k, min(EF_CAP, info["count"]))
    probe = longest
    if "+" in info["quantization"]:
        probe = min(int(np.searchsorted(lens, REFINED_PROBE * k)), longest)

    def sweep(p, ef, whole=True):
        return _Beam(ef, *core.recall_sweep(p.queries, p.hidden, p.truth, k, ef, lens, threads,
                                            p.half, p.half_truth), whole=whole)

    halves = part.split()
    if beams is not None:
        return [sweep(part, b.ef) if b.whole else sweep(halves[0], b.ef, False)
                for b in beams]
    # Each beam is measured half by half while it is measured whole, so that
    # the stop rule can compare the first half's recall across the switch.
    rows, firsts = [], []
    ef, whole = k, True
    while True:
        first = sweep(halves[0], ef, whole)
        rows.append(first.pooled(sweep(halves[1], ef)) if whole else first)
        firsts.append(first)
        best = [r.recall[probe] for r in (rows if whole else firsts)]
        flat = len(best) >= 3 and best[-1] - best[-3] < FLAT and ef >= 4 * k
        if best[-1] >= SATURATED or flat or ef >= cap:
            return rows
        # A build's budget spent on the first queries: the rest of the
        # ladder on half of them, as past HALF_PAST (their error is then
        # sqrt(2) wider; the budget adds no more queries after).
        whole = (whole and rows[-1].recall[probe] < HALF_PAST
                 and (deadline is None or perf_counter() < deadline))
        ef = min(cap, max(ef + 1, round(ef * EF_STEP)))


def _table(core, rows, k, lens, source, queries):
    cal = {
        "format": FORMAT,
        "source": source,
        "k": int(k),
        "count": int(core.info()["count"]),
        "queries": int(queries),
        "ef": [r.ef for r in rows],
        "shortlist": [int(x) for x in lens],
        "recall": [[round(float(x), 5) for x in r.recall] for r in rows],
        "stderr": [[round(float(s) / math.sqrt(max(r.used - 1, 1)), 5) for s in r.spread]
                   for r in rows],
        "scored": [round(r.scored, 1) for r in rows],
        "beam_queries": [int(r.used) for r in rows],
    }
    refined = [round(r.refined, 1) for r in rows]
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
                      for row in cal["recall"] + cal["stderr"])
              and isinstance(cal.get("serves", cal["count"]), int)
              and cal.get("serves", cal["count"]) >= cal["count"] > 0)
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        ok = False
    if not ok:
        raise CorruptIndexError("the index's recall calibration is unreadable")
    return cal


def _between(x0, x1, y0, y1, y):
    """x where the line through (x0, y0), (x1, y1) reaches y."""
    return x1 if y1 <= y0 else x0 + (x1 - x0) * (y - y0) / (y1 - y0)


def choose(cal, target, k, sure=False, beam=1.0):
    """(ef, oversample, expected recall) of the cheapest measured point whose
    recall reaches target, ef interpolated (log scale) between the two
    measured beams that bracket it; the best measured point when none
    reaches it. sure: the recall less sure_z standard errors must reach it
    (a default of 0.95 is then met with 95% confidence, not a coin toss).
    beam: the interpolated beam times this, before it is rounded: up for
    sure, to the nearest otherwise (a target is a point estimate: rounded
    up, a narrow beam's whole step, 0.01 of recall at ef 17 on refined
    codes, went to overshooting)."""
    _, ef, length, expect, _ = _cheapest(cal, target, sure)
    # (exp(log(10)) is a hair over 10)
    ef = math.ceil(ef * beam - 1e-9) if sure else round(ef * beam)
    # Measured at the table's k: a larger k keeps the beam as wide relative to k.
    scale = max(1.0, k / cal["k"])
    return max(k, math.ceil(ef * scale)), length / cal["k"], round(expect, 4)


def sure_z(columns):
    """Standard errors a default's bound takes off when the cheapest of
    `columns` candidate columns is picked: 95% confidence for the pick."""
    return NormalDist().inv_cdf(1.0 - SURE_ALPHA / max(columns, 1))


def _at_target(measured, target):
    """Per point, what its standard error is multiplied by to read it at the
    target (SPREAD_AT_TARGET): sqrt(t (1 - t) / (p (1 - p))) where the
    estimate p lies above t, 1 elsewhere (and where p is 0 or 1: no spread
    to scale)."""
    if not SPREAD_AT_TARGET:
        return 1.0
    p = np.clip(measured, 0.0, 1.0)
    binomial = p * (1.0 - p)
    ratio = np.divide(target * (1.0 - target), binomial, out=np.ones_like(p),
                      where=(binomial > 0) & (p > target))
    return np.sqrt(np.maximum(ratio, 1.0))


def _cheapest(cal, target, sure):
    """choose's point at the table's k: (cost, ef, shortlist length, expected
    recall, its standard error)."""
    efs, lens, measured = cal["ef"], cal["shortlist"], np.asarray(cal["recall"])
    stderr = np.asarray(cal["stderr"])
    skip = _target_only(cal["k"]) if sure else set()
    if sure:
        candidates = [j for j, length in enumerate(lens)
                      if length not in skip and measured[:, j].max() >= target]
        bound = measured - sure_z(len(candidates)) * stderr * _at_target(measured, target)
    else:
        bound = measured
    log_ef = np.log(efs)
    scored = np.asarray(cal["scored"]) + REFINED_COST * np.asarray(cal.get("refined", 0.0))
    best = None
    for j, length in enumerate(lens):
        if length in skip:
            continue
        hit = np.flatnonzero(bound[:, j] >= target)
        if not hit.size:
            continue
        i = int(hit[0])
        # Where between beam i - 1 and beam i the bound reaches target (0..1).
        f = 1.0 if i == 0 else _between(0.0, 1.0, bound[i - 1, j], bound[i, j], target)
        lo = max(i - 1, 0)
        ef = math.exp(log_ef[lo] + f * (log_ef[i] - log_ef[lo]))
        cost = scored[lo] + f * (scored[i] - scored[lo]) + length * ROW_COST
        expect = measured[lo, j] + f * (measured[i, j] - measured[lo, j])
        se = stderr[lo, j] + f * (stderr[i, j] - stderr[lo, j])
        if best is None or cost < best[0]:
            best = (cost, ef, length, float(expect), float(se))
    if best is None:
        i, j = np.unravel_index(int(np.argmax(measured)), measured.shape)
        best = (0.0, efs[i], lens[j], float(measured[i, j]), float(stderr[i, j]))
    return best


def choose_grown(cal, target, k, growth, graph_growth=None):
    """choose (recall= targets) for an index of growth times the count its
    table was measured on: the shortlist read from the grown table, the
    beam widened by sqrt(graph_growth) (the core's rule for the default).
    graph_growth, when the graph searched is not all that competes for the
    shortlist (a collection's segment), is the graph's own; else growth."""
    graph_growth = growth if graph_growth is None else graph_growth
    return choose(grown(cal, growth), target, k, beam=math.sqrt(max(graph_growth, 1.0)))


def grown(cal, growth):
    """The table as it stands for an index growth times the count it was
    measured on. More vectors compete for each shortlist: the true
    neighbours sit deeper, by the vectors whose estimate beats theirs,
    those within the estimate's error of the k-th distance. At intrinsic
    dimension d that shell holds growth ** (1/d) times as many (growth
    times the density, at a radius shrunk by growth ** (-1/d)), so a
    shortlist of L holds what one of L / sqrt(growth) did for any d >= 2
    (an upper bound on the depth: recall lands above the estimate, not
    below). A table that measured its own depth (depth_exponent) stretches
    by growth ** depth instead. Its columns are the measured lengths and those times the
    stretch (rounded up), each read from the measured columns at length /
    stretch (linear between two: recall is concave in the length, so that
    errs the same way). The shortest measured length, k, stays a column
    while it reads less than one measured gap below itself, along the
    line of the first gap: else a growth of 2% (a build's held-out
    queries) would cost every pick a row, where a row can be worth 0.01 or
    more (refined codes, ip: 0.914 at 1 x k against 0.926 at 1.1 x k)."""
    if growth <= 1.0:
        return cal
    growth = growth ** cal.get("depth", DEPTH_BOUND)
    lens = np.asarray(cal["shortlist"], np.float64)
    low, high = (math.ceil(growth * x - 1e-9) for x in (lens[0], lens[-1]))
    if len(lens) > 1 and lens[0] / growth >= 2 * lens[0] - lens[1]:
        low = int(lens[0])
    served = {int(x) for x in lens} | {math.ceil(growth * x - 1e-9) for x in lens}
    served = sorted(m for m in served if low <= m <= high)
    at = np.minimum(np.asarray(served, np.float64) / growth, lens[-1])

    def columns(rows):
        out = []
        for row in rows:
            row = np.asarray(row, np.float64)
            read = np.interp(at, lens, row)
            below = at < lens[0]                # within the first gap's line
            slope = (row[1] - row[0]) / (lens[1] - lens[0]) if len(lens) > 1 else 0.0
            read[below] = row[0] - (lens[0] - at[below]) * slope
            out.append(read.tolist())
        return out

    return {**cal, "shortlist": served, "recall": columns(cal["recall"]),
            "stderr": columns(cal["stderr"])}


def _target_only(k):
    """The shortlist lengths at k that only recall= chooses from."""
    def at(steps):
        return {max(k, math.ceil(k * s)) for s in steps}
    return at(TARGET_ONLY_STEPS) - at(set(LENGTH_STEPS) - set(TARGET_ONLY_STEPS))


def curve(cal, growth=1.0):
    """The table as a list of points, plus the choices for common targets
    (recall='s for an index growth times the table's count, as
    choose_grown makes them; the default's as the table has it)."""
    points = [{"ef": ef, "oversample": length / cal["k"], "recall": r, "stderr": e}
              for ef, row, errs in zip(cal["ef"], cal["recall"], cal["stderr"])
              for length, r, e in zip(cal["shortlist"], row, errs)]
    targets = {}
    for t in (0.9, 0.95, 0.98, 0.99):
        ef, os_, expect = choose_grown(cal, t, cal["k"], growth)
        targets[t] = {"ef": ef, "oversample": os_, "expected_recall": expect}
    ef, os_, expect = choose(cal, DEFAULT_TARGET, cal["k"], sure=True)
    return {k: v for k, v in cal.items() if k not in ("recall", "stderr")} | {
        "points": points, "targets": targets,
        "default": {"ef": ef, "oversample": os_, "expected_recall": expect}}


def due(cal, count):
    """Whether an index of count vectors should measure a table: it is
    large enough for one, and has none or has outgrown its own GROWTH times."""
    return count >= MIN_INDEX and (cal is None or count >= GROWTH * cal["count"])


def holdout(n, count_after, seed):
    """Positions of an add of n vectors to hold out as calibration queries,
    in random order (measure takes the first QUERIES, then more if need be):
    none when too few would be held out."""
    # More than QUERIES only while they are a small share of the index: the
    # table is measured on the graph without them.
    m = min(n // 2, max(QUERIES, min(MOST_QUERIES, count_after // HELD_SHARE)))
    if m < MIN_QUERIES:
        return None
    rng = np.random.default_rng([seed & (2**63 - 1), count_after])
    return rng.choice(n, m, replace=False)
