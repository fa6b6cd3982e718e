"""Native worker threads and concurrent Python callers give the same answers
as a serial run."""
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import knndirect as kd
from conftest import brute_force, build, clustered, open_quiet, recall_at_k, split

N, NQ, D_, K = 6000, 120, 128, 10


@pytest.fixture(scope="module")
def data():
    return split(N, NQ, D_, seed=10000)


@pytest.fixture(scope="module")
def mem(data):
    base, queries = data
    index = build(base, "l2")
    yield index
    index.close()


@pytest.fixture(scope="module")
def path(mem, tmp_path_factory):
    p = tmp_path_factory.mktemp("thr") / "t.kdx"
    mem.save(p)
    return p


@pytest.fixture(params=["memory", "open-auto", "open-threads"])
def index(request, mem, path):
    if request.param == "memory":
        yield mem
        return
    o = open_quiet(path, request.param[len("open-"):])
    yield o
    o.close()


def _identical(a, b):
    np.testing.assert_array_equal(a[1], b[1])
    np.testing.assert_array_equal(a[0], b[0])


@pytest.mark.parametrize("kwargs", [{}, {"exact": True}, {"rerank": False},
                                    {"filter": np.arange(0, N, 2)}])
def test_threads_1_vs_2_identical(index, data, kwargs):
    base, queries = data
    index.stats(reset=True)
    a = index.search(queries, K, threads=1, **kwargs)
    # The filtered case runs the filtered graph search (half the ids allowed:
    # graph cost 0.1 * 200 * 32 / 0.5 + 200 = 1480 < 3000 allowed), not the scan.
    assert index.stats()["exact_queries"] == (NQ if kwargs.get("exact") else 0)
    b = index.search(queries, K, threads=2, **kwargs)
    c = index.search(queries, K, **kwargs)  # default: all cores
    _identical(a, b)
    _identical(a, c)


def test_batch_equals_one_by_one(index, data):
    base, queries = data
    D, I = index.search(queries[:30], K)
    for i in range(30):
        d1, i1 = index.search(queries[i], K)
        np.testing.assert_array_equal(i1, I[i])
        np.testing.assert_array_equal(d1, D[i])


def test_concurrent_python_threads_match_serial(index, data):
    base, queries = data
    chunks = np.array_split(np.arange(NQ), 8)
    serial = [index.search(queries[c], K) for c in chunks]
    serial_exact = [index.search(queries[c], K, exact=True) for c in chunks]

    def work(j):
        out = []
        for _ in range(3):
            out.append((index.search(queries[chunks[j]], K),
                        index.search(queries[chunks[j]], K, exact=True),
                        index.get_vectors(np.arange(j, N, 97))))
        return out

    with ThreadPoolExecutor(max_workers=4) as ex:
        results = list(ex.map(work, range(len(chunks))))
    for j, runs in enumerate(results):
        for res, res_exact, vecs in runs:
            _identical(res, serial[j])
            _identical(res_exact, serial_exact[j])
            assert np.ascontiguousarray(vecs).tobytes() == base[j::97].tobytes()


def test_concurrent_single_queries(index, data):
    base, queries = data
    serial = [index.search(q, K) for q in queries[:40]]
    with ThreadPoolExecutor(max_workers=4) as ex:
        par = list(ex.map(lambda q: index.search(q, K, threads=1), queries[:40]))
    for a, b in zip(par, serial):
        _identical(a, b)


def test_add_threads_argument(data):
    base, queries = data
    _, gtI = brute_force(base[:3000], queries, K, "l2")
    for t in (1, 2):
        idx = kd.Index(D_, "l2")
        idx.add(base[:3000], threads=t)
        assert len(idx) == 3000
        r = recall_at_k(idx.search(queries, K)[1], gtI)
        assert r >= 0.95, "recall %.3f after add(threads=%d)" % (r, t)
        idx.close()


def test_same_seed_single_thread_build_is_reproducible(data, tmp_path):
    base, queries = data
    a = kd.Index(D_, "l2", seed=123)
    a.add(base[:2000], threads=1)
    a.add(base[2000:3000], threads=1)
    b = kd.Index(D_, "l2", seed=123)
    b.add(base[:2000], threads=1)
    b.add(base[2000:3000], threads=1)
    _identical(a.search(queries, K, rerank=False), b.search(queries, K, rerank=False))
    _identical(a.search(queries, K), b.search(queries, K))
    # The files too, byte for byte: unused list slots hold no stale heap bytes.
    a.save(tmp_path / "a.kdx")
    b.save(tmp_path / "b.kdx")
    assert (tmp_path / "a.kdx").read_bytes() == (tmp_path / "b.kdx").read_bytes()
    a.close()
    b.close()


def test_add_and_remove_while_searching():
    """Writers are serialized against readers: no crash, no error, and the
    final state is consistent."""
    base = clustered(4000, 32, seed=10001)
    idx = kd.Index(32, "cosine")
    idx.add(base[:1000])
    errors = []
    stop = threading.Event()

    def reader():
        rng = np.random.default_rng(threading.get_ident() % 1000)
        try:
            while not stop.is_set():
                q = base[rng.integers(0, 4000, size=8)]
                D, I = idx.search(q, 5)
                assert I.shape == (8, 5)
                assert (I < 4000).all()
                D, I = idx.search(q, 5, exact=True)
                assert (I < 4000).all()
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    readers = [threading.Thread(target=reader) for _ in range(3)]
    for t in readers:
        t.start()
    try:
        for start in range(1000, 4000, 500):
            idx.add(base[start:start + 500])
            idx.remove(np.arange(start - 1000, start - 1000 + 100))
    finally:
        stop.set()
        for t in readers:
            t.join()
    assert not errors, errors[:3]
    removed = np.concatenate([np.arange(s - 1000, s - 900) for s in range(1000, 4000, 500)])
    assert len(idx) == 4000 - len(removed)
    D, I = idx.search(base[:200], 5, exact=True)
    assert not np.isin(I, removed).any()
    D, I = idx.search(base[3000:3200], 1)
    assert (I[:, 0] == np.arange(3000, 3200)).mean() >= 0.95
    idx.close()
