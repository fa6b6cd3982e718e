"""Rows in centre order: each add stores its rows grouped by the quantizer
centre their code names, each group in input order (docs/design.md, "Rows
in centre order"). Ids, vectors and answers stay what they were."""
import numpy as np
import pytest

import knndirect as kd
from conftest import METRICS, brute_force, clustered
from knndirect import _container, _index

N, DIM = 12000, 32


def rows_of(path):
    """(id, centre) of each row of a saved 1-bit index, in row order; a
    code's last two bytes are its centre (docs/format.md, codes)."""
    ids = np.frombuffer(_container.read_section(path, "ids"), np.int64)
    codes = np.frombuffer(_container.read_section(path, "codes"), np.uint8).reshape(len(ids), -1)
    return ids, codes[:, -2].astype(np.int64) | codes[:, -1].astype(np.int64) << 8


def stretches(centre):
    """Where the centres start over: each stretch is one core add."""
    cut = np.flatnonzero(np.diff(centre) < 0) + 1
    return np.split(np.arange(len(centre)), cut)


def assert_grouped(ids, centre, most_stretches):
    """A centre's rows are adjacent within each stretch; in the first (the
    add's rows, before the held-out calibration queries, which go in
    drawn order), in input order: default ids are input positions."""
    parts = stretches(centre)
    assert len(parts) <= most_stretches, len(parts)
    for n, rows in enumerate(parts):
        for c in np.unique(centre[rows]):
            at = rows[centre[rows] == c]
            assert at[-1] - at[0] == len(at) - 1
            if n < len(parts) - 1:
                assert (np.diff(ids[at]) > 0).all()


@pytest.mark.parametrize("metric", METRICS)
def test_rows_grouped_by_centre_answers_unchanged(metric, tmp_path):
    x = clustered(N + 40, DIM, seed=5)
    base, queries = x[:N], x[N:]
    index = kd.Index(DIM, metric, seed=1)
    index.add(base, threads=2)
    path = tmp_path / "grouped.kdx"
    index.save(path)
    ids, centre = rows_of(path)
    assert len(np.unique(centre)) > 16
    assert not (ids == np.arange(N)).all()
    # the add, then its held-out calibration queries: two stretches
    assert_grouped(ids, centre, 2)
    assert sorted(ids.tolist()) == list(range(N))
    np.testing.assert_array_equal(index.get_vectors(ids), base[ids])
    _, truth = brute_force(base, queries, 10, metric)
    np.testing.assert_array_equal(index.search(queries, 10, exact=True)[1], truth)
    for opened in (kd.load(path), kd.open(path)):
        np.testing.assert_array_equal(opened.search(queries, 10, exact=True)[1], truth)
        np.testing.assert_array_equal(opened.get_vectors(ids[:300]), base[ids[:300]])
        opened.close()
    index.close()


def test_chunks_grouped_each_with_given_ids(monkeypatch, tmp_path):
    """A large add is grouped chunk by chunk; the ids given stay with their
    vectors."""
    monkeypatch.setattr(_index, "CHUNK_BYTES", 0)
    monkeypatch.setattr(_index, "ADD_CHUNK", 4000)
    x = clustered(N, DIM, seed=6)
    given = np.random.default_rng(3).permutation(N).astype(np.int64) * 7 + 11
    index = kd.Index(DIM, "l2", seed=1)
    index.add(x, ids=given, threads=2)
    path = tmp_path / "chunks.kdx"
    index.save(path)
    ids, centre = rows_of(path)
    at = {int(v): i for i, v in enumerate(given)}
    position = np.array([at[int(v)] for v in ids])     # input position of each row
    # three chunks, then the held-out queries
    assert 4 <= len(stretches(centre)) <= 5
    assert_grouped(position, centre, 4)
    np.testing.assert_array_equal(index.get_vectors(given[:500]), x[:500])
    index.close()


@pytest.mark.parametrize("quantization", ["4bit", "8bit"])
def test_scalar_codes_keep_input_order(quantization, tmp_path):
    x = clustered(3000, DIM, seed=7)
    index = kd.Index(DIM, "l2", quantization=quantization)
    index.add(x, threads=2)
    path = tmp_path / "scalar.kdx"
    index.save(path)
    ids = np.frombuffer(_container.read_section(path, "ids"), np.int64)
    # in input order (the last rows are the held-out calibration queries,
    # at most 1/25 of them, in drawn order)
    assert (np.diff(ids[:2800]) > 0).all()
    index.close()
