"""Exact (brute-force) search: batches scored four queries at a time, the
vector section streamed from disk in chunks, and filtered search choosing
between an exact scan of the allowed vectors and a filtered graph search."""
import numpy as np
import pytest

from conftest import (assert_exact_match, brute_force, build, open_quiet, recall_at_k,
                      split)

N, NQ, K = 24000, 37, 10   # 24000 x 512 B records: two stream chunks


@pytest.fixture(scope="module")
def data():
    return split(N, NQ, 128, seed=5100)


@pytest.fixture(scope="module")
def indexes(data, tmp_path_factory):
    base, _ = data
    out = {}
    for metric in ("l2", "ip", "cosine"):
        idx = build(base, metric)
        path = tmp_path_factory.mktemp("exact") / f"{metric}.kdx"
        idx.save(path)
        out[metric] = (idx, path)
    yield out
    for idx, _ in out.values():
        idx.close()


@pytest.mark.parametrize("metric", ["l2", "ip", "cosine"])
@pytest.mark.parametrize("threads", [1, 2])
def test_exact_batch_in_memory(indexes, data, metric, threads):
    base, queries = data
    idx, _ = indexes[metric]
    D, I = idx.search(queries, K, exact=True, threads=threads)
    assert_exact_match(D, I, base, queries, metric)


@pytest.mark.parametrize("metric", ["l2", "cosine"])
@pytest.mark.parametrize("backend", ["auto", "threads", "pread", "mmap"])
def test_exact_streams_from_disk(indexes, data, metric, backend):
    base, queries = data
    _, path = indexes[metric]
    with open_quiet(path, backend) as idx:
        idx.stats(reset=True)
        D, I = idx.search(queries, K, exact=True)
        st = idx.stats()
        info = idx.info()
    assert_exact_match(D, I, base, queries, metric)
    # One pass over the section serves the whole batch.
    assert st["exact_queries"] == NQ
    assert st["read_bytes"] >= N * info["record_size"]
    assert st["read_bytes"] <= N * info["record_size"] + 4096 * 8


@pytest.mark.parametrize("nq", [1, 3, 4, 5, 64])
def test_exact_any_batch_size(indexes, data, nq):
    base, _ = data
    queries = split(N, nq, 128, seed=5200 + nq)[1]
    idx, _ = indexes["l2"]
    D, I = idx.search(queries, 7, exact=True)
    assert_exact_match(D, I, base, queries, "l2")


def test_exact_skips_removed_on_disk(data, tmp_path):
    base, queries = data
    idx = build(base[:3000], "l2")
    gone = np.arange(0, 3000, 3)
    idx.remove(gone)
    path = tmp_path / "r.kdx"
    idx.save(path)
    keep = np.setdiff1d(np.arange(3000), gone)
    for index in (idx, open_quiet(path)):
        D, I = index.search(queries, K, exact=True)
        assert not np.isin(I, gone).any()
        assert_exact_match(D, I, base[keep], queries, "l2", ids=keep)
        index.close()


def test_exact_far_from_origin_keeps_precision():
    """Distances are summed as (q - x)^2, not |q|^2 - 2qx + |x|^2, so data far
    from the origin still ranks exactly."""
    rng = np.random.default_rng(3)
    base = (1000.0 + rng.standard_normal((500, 16))).astype(np.float32)
    q = (1000.0 + rng.standard_normal((5, 16))).astype(np.float32)
    idx = build(base, "l2")
    D, I = idx.search(q, 5, exact=True)
    assert_exact_match(D, I, base, q, "l2")


@pytest.mark.parametrize("offset", [0.0, 10.0, 1000.0])
def test_l2_panels_equal_direct_sums(offset):
    """Batches of twelve or more take l2 from inner products, bounded for
    rounding, and score only the rows the bound lets through by (q - x)^2
    with the pair kernel (the re-rank's); a lone query scores every row with
    it. Far from the origin the inner products lose most of their digits,
    so a bound too tight would drop true neighbours: both ways must give the
    same ids and distances, to the bit."""
    rng = np.random.default_rng(11)
    base = (offset + rng.standard_normal((3000, 32))).astype(np.float32)
    queries = (offset + rng.standard_normal((24, 32))).astype(np.float32)
    idx = build(base, "l2")
    D, I = idx.search(queries, 10, exact=True)
    for j in range(24):
        d1, i1 = idx.search(queries[j:j + 1], 10, exact=True)
        np.testing.assert_array_equal(I[j], i1[0])
        np.testing.assert_array_equal(D[j], d1[0])
    assert_exact_match(D, I, base, queries, "l2")
    idx.close()


@pytest.mark.parametrize("selectivity", [0.001, 0.01, 0.1, 0.5])
@pytest.mark.parametrize("where", ["memory", "disk"])
def test_filter_selectivity(indexes, data, selectivity, where):
    base, queries = data
    idx, path = indexes["l2"]
    if where == "disk":
        idx = open_quiet(path)
    rng = np.random.default_rng(int(selectivity * 1e4))
    allowed = np.sort(rng.choice(N, max(1, int(N * selectivity)), replace=False))
    idx.stats(reset=True)
    D, I = idx.search(queries, K, filter=allowed)
    st = idx.stats()
    assert np.isin(I[I >= 0], allowed).all()
    gt_D, gt_I = brute_force(base[allowed], queries, K, "l2", ids=allowed)
    if st["exact_queries"] == NQ:
        # the exact path was chosen: the answer is exact
        assert_exact_match(D, I, base[allowed], queries, "l2", ids=allowed)
    else:
        assert recall_at_k(I, gt_I) >= 0.9
    if selectivity <= 0.01:
        assert st["exact_queries"] == NQ, "a tight filter should be answered by an exact scan"
    if selectivity >= 0.5:
        # Every query by the graph: none chosen or fallen back to exact.
        assert st["exact_queries"] == 0, "a loose filter should use the graph"
    if where == "disk":
        idx.close()


def test_filter_exact_scan_on_disk_is_one_batch(indexes, data):
    base, queries = data
    _, path = indexes["l2"]
    allowed = np.arange(0, N, 1000)  # 24 ids
    with open_quiet(path) as idx:
        idx.stats(reset=True)
        D, I = idx.search(queries, K, filter=allowed)
        st = idx.stats()
        rs = idx.info()["record_size"]
    assert_exact_match(D, I, base[allowed], queries, "l2", ids=allowed)
    # one read per allowed vector for the whole batch of queries
    assert st["read_ops"] == len(allowed)
    assert st["read_bytes"] == len(allowed) * rs


def test_a_long_filter_of_repeats_strangers_and_removed_ids(data):
    """A filter of many ids, the allowed ones repeated and shuffled among
    unknown, negative and removed ones (its ids are looked up ahead of
    their turn): exactly the live allowed ids can come back."""
    base, queries = data
    idx = build(base[:2000], "l2")
    removed = np.arange(0, 300, 3)
    idx.remove(removed)
    rng = np.random.default_rng(5)
    allowed = rng.permutation(np.concatenate([
        np.arange(300), np.arange(150), 10**12 + np.arange(200), -1 - np.arange(50)]))
    live = np.setdiff1d(np.arange(300), removed)
    D, I = idx.search(queries, K, filter=allowed, exact=True)
    assert_exact_match(D, I, base[live], queries, "l2", ids=live)
    _, I = idx.search(queries, K, filter=allowed)
    assert np.isin(I, live).all()

def test_filter_with_removed_and_unknown_ids(data):
    base, queries = data
    idx = build(base[:2000], "l2")
    idx.remove([5, 6, 7])
    allowed = np.array([5, 6, 7, 8, 9, 10, 10**12, -3])
    D, I = idx.search(queries, K, filter=allowed)
    live = np.array([8, 9, 10])
    assert set(I[I >= 0].ravel()) <= set(live.tolist())
    assert (I[:, 3:] == -1).all() and np.isinf(D[:, 3:]).all()
    assert_exact_match(D[:, :3], I[:, :3], base[live], queries, "l2", ids=live)
