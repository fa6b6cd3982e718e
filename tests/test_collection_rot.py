"""Recall must not rot: many rounds of "remove 2%, add 2%, commit, merge"
keep recall@10 within 0.01 of a fresh build over the same vectors (Lucene
lost 7 points of recall@100 in 100 such rounds until low-degree nodes were
repaired).

A build's recall here depends on its 1-bit quantizer, on the random
rotation and k-means start its seed picks far more than on the rows it was
fitted on. Measured on this data after 12 rounds (8 seeds each, 2000
queries): between seeds, an sd of 0.001 at the default search, 0.002-0.003
at ef=16 with a deep rerank (oversample=20) and 0.005 (a range of 0.015) at
ef=16, oversample=2, where only the 20 best estimates are reranked; with 400
queries 0.002-0.003 and 0.006-0.012. A quantizer fitted on the collection's
first 8000 rows instead of the current ones costs 0.001 at the default
search and at most 0.004 at the tight point. So one fresh build against the
collection (itself one draw: seed 0, fitted on its first segment) at a
narrow point compares two draws of the quantizer as much as two graphs (the
earlier form of this test failed by 0.015 on that alone). With the
threshold kept at 0.01, the test therefore compares:

* over 2000 queries, not 400: query sampling was half the noise;
* the requirement itself, at the default search: against fresh builds that
  fit their own quantizer, "a fresh build" being the median of five seeds;
* the graph alone, at a narrow beam with a deep rerank (ef=16,
  oversample=20) and with a shallow one (ef=16, oversample=2), where a
  damaged graph shows first: against fresh graphs over the collection's own
  quantizer (median of three graph seeds; sd 0.001-0.002).

The queries come from other clusters than the vectors (seed 12, not 11):
the beam has to cross between clusters, where a damaged graph shows; from
the vectors' own clusters even the rotted graph below kept up.

Measured before the merge's repair kept surviving neighbours and linked its
new edges back (csrc/merge.c): after 12 rounds 0.017 under at the default
search, 0.04 at ef=16 with the deep rerank and 0.03 at the tight point;
after 50 rounds 0.027, 0.06 and 0.044. With it, within 0.004 at every
point."""
import numpy as np
import pytest

import knndirect as kd
from knndirect.datasets import clustered, ground_truth, recall_at_k

N, DIM, NQ = 8000, 32, 2000
DEFAULT = {}
NARROW = dict(ef=16, oversample=20)   # narrow beam, deep rerank
TIGHT = dict(ef=16, oversample=2)     # narrow beam, shallow rerank


def recall(index, q, truth, **kw):
    return recall_at_k(index.search(q, k=10, **kw)[1], truth, 10)


def fresh(x, ids, seed, quantizer=None):
    f = kd.Index(DIM, seed=seed)
    if quantizer is not None:
        f._core.adopt_quantizer(quantizer._core)
    f.add(x, ids)
    return f


@pytest.mark.parametrize("rounds", [pytest.param(50, marks=pytest.mark.slow), 12])
def test_recall_does_not_rot(tmp_path, rounds):
    pool = clustered(N * 3, DIM, seed=11)
    q = clustered(NQ, DIM, seed=12)
    rng = np.random.default_rng(13)
    col = kd.Collection.create(tmp_path / "col", DIM, merge_policy=None)
    col.add(pool[:N], np.arange(N))
    col.commit()
    live = set(range(N))
    next_row = N
    step = N * 2 // 100
    for _ in range(rounds):
        gone = rng.choice(sorted(live), step, replace=False)
        col.remove(gone)
        live.difference_update(int(i) for i in gone)
        new = np.arange(next_row, next_row + step) % len(pool)
        new = np.array([i for i in new if i not in live])[:step]
        col.add(pool[new], new)
        live.update(int(i) for i in new)
        next_row += step
        col.commit()
        col.merge()
        (seg,) = col.segments()
        assert seg["count"] == seg["live"] == N
    ids = np.array(sorted(live))
    assert np.array_equal(col.ids(), ids)
    x = pool[ids]
    truth = ids[ground_truth(x, q, 10)[0]]
    got = {name: recall(col, q, truth, **kw)
           for name, kw in (("default", DEFAULT), ("narrow", NARROW), ("tight", TIGHT))}
    # The requirement: fresh builds, each fitting its own quantizer.
    want = float(np.median([recall(fresh(x, ids, seed), q, truth) for seed in range(5)]))
    assert got["default"] >= want - 0.01, ("default", got["default"], want)
    # The graph alone: fresh graphs over the collection's quantizer.
    same = [fresh(x, ids, seed, col._quantizer) for seed in range(3)]
    for name, kw in (("narrow", NARROW), ("tight", TIGHT)):
        want = float(np.median([recall(f, q, truth, **kw) for f in same]))
        assert got[name] >= want - 0.01, (name, got[name], want)
