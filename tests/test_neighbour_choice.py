"""The rule insertion chooses a node's neighbours by (csrc/hnsw.c,
select_diverse): of the candidates, nearest first, keep each that is no
closer to a neighbour kept before it than to the node, up to the cap. The
core checks the kept neighbours one, one, two, then four at a time; the
choice must be the rule's whatever the number kept and wherever the
neighbour that turns a candidate away sits. Integer coordinates make every
squared distance exact, so the reference below decides ties the same way."""
import numpy as np
import pytest

from knndirect import _core


def choose(x, node, candidates, cap):
    raw = _core._select_diverse(np.ascontiguousarray(x, np.float32).tobytes(), x.shape[1],
                                node, np.asarray(candidates, np.uint32).tobytes(), cap)
    return np.frombuffer(raw, np.uint32).tolist()


def rule(x, node, candidates, cap):
    x = x.astype(np.int64)
    kept = []
    for r in candidates:
        if len(kept) == cap:
            break
        to_node = int(((x[r] - x[node]) ** 2).sum())
        if all(int(((x[r] - x[k]) ** 2).sum()) >= to_node for k in kept):
            kept.append(r)
    return kept


def candidates_of(x, node):
    d = ((x.astype(np.int64) - x[node]) ** 2).sum(1)
    order = np.lexsort((np.arange(len(x)), d))  # nearest first, ties by row
    return [int(r) for r in order if r != node]


def test_choice_is_the_rule():
    rng = np.random.default_rng(5)
    sizes = []
    for dim in (2, 3, 8, 32):
        for trial in range(60):
            x = rng.integers(-20, 21, size=(int(rng.integers(2, 120)), dim))
            node = int(rng.integers(0, len(x)))
            cand = candidates_of(x, node)
            for cap in (1, 2, 3, 5, 16, 40):
                got = choose(x, node, cand, cap)
                assert got == rule(x, node, cand, cap), (dim, trial, cap)
                sizes.append(len(got))
    # Low dimensions keep few neighbours, high ones many: between them the
    # kept lists cover the one, two and four-a-pass checks.
    assert min(sizes) == 1 and max(sizes) > 12, (min(sizes), max(sizes))


def test_bad_rows_raise():
    x = np.zeros((4, 2), np.float32)
    with pytest.raises(ValueError):
        choose(x, 4, [0, 1], 2)
    with pytest.raises(ValueError):
        choose(x, 0, [1, 9], 2)
