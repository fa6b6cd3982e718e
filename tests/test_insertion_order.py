"""Insertion order: an add inserts the nodes with upper levels first, then
the level-0 nodes a quantizer centre at a time (docs/design.md, "Insertion
order"). Every row must still be inserted once and be reachable, and the
graph must not get worse when the input arrives sorted.

Sorted input hurt the input-order insertion with 2 threads, not with one:
two workers inserted neighbours of one cluster at the same moment while
their region was still empty. Over three seeds recall@10 at ef 16 fell
from 0.982-0.987 to 0.948-0.976, and runs of consecutive rows (1327 to
1334, say) could no longer be found from their own vectors."""
import numpy as np
import pytest

import knndirect as kd
from conftest import brute_force, clustered, recall_at_k

N, DIM = 6000, 32


def arrivals(labels):
    """The input as drawn, and sorted by cluster: one cluster's rows after
    another, as data grouped by source or category arrives."""
    return {"drawn": np.arange(len(labels)), "by cluster": np.argsort(labels, kind="stable")}


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("arrival", ["drawn", "by cluster"])
def test_every_row_is_found_from_its_own_vector(arrival, threads):
    x, labels = clustered(N, DIM, seed=21, labels=True)
    order = arrivals(labels)[arrival]
    ids = (order * 3 + 7).astype(np.int64)
    with kd.Index(DIM, "l2", seed=2) as index:
        index.add(x[order], ids=ids, threads=threads)
        assert index.info()["centres"] > 16
        found = index.search(x[order], 1, ef=32)[1][:, 0]
    # A row left out of the insertion would have no in-links and never come
    # back. Measured: 0.9975-1.0 sorted, 1.0 as drawn (four seeds).
    assert np.mean(found == ids) >= 0.99, np.flatnonzero(found != ids)[:10]


@pytest.mark.parametrize("quantization", ["1bit", "8bit"])
def test_input_sorted_by_cluster_builds_as_good_a_graph(quantization):
    """Measured with the skeleton: sorted 0.981-0.987 against 0.977-0.988
    as drawn (1-bit, three seeds, two data seeds)."""
    x, labels = clustered(N + 300, DIM, seed=21, labels=True)
    base, queries = x[:N], x[N:]
    _, truth = brute_force(base, queries, 10, "l2")
    got = {}
    for arrival, order in arrivals(labels[:N]).items():
        got[arrival] = []
        for seed in (0, 1, 2):
            with kd.Index(DIM, "l2", seed=seed, quantization=quantization) as index:
                index.add(base[order], ids=order.astype(np.int64), threads=2)
                found = index.search(queries, 10, ef=16, oversample=4)[1]
                got[arrival].append(recall_at_k(found, truth))
    drawn, by_cluster = np.mean(got["drawn"]), np.mean(got["by cluster"])
    assert by_cluster >= drawn - 0.01, got
    assert drawn >= 0.95, got
