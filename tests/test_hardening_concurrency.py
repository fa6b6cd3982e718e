"""Concurrent use: Python threads searching while another adds and removes,
the GIL released during every long call, and several processes searching one
index file.

The C core's locking is also run under ThreadSanitizer by
tests/c/stress_index.c (test_hardening_sanitizers.py, and the tsan stage of
.ci/run)."""
import os
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import knndirect as kd
from knndirect import _core
from conftest import clustered, gil_stall, open_quiet

DIM = 24


def _plan(seed):
    """The writer's operations, fixed in advance: adds of fresh ids and
    removes of live ones, alternating."""
    rng = np.random.default_rng(seed)
    live = set(range(2000))
    next_id = 2000
    ops = []
    for j in range(24):
        if j % 2 == 0:
            ids = np.arange(next_id, next_id + 150, dtype=np.int64)
            next_id += 150
            ops.append(("add", ids))
            live.update(ids.tolist())
        else:
            ids = rng.choice(sorted(live), size=60, replace=False).astype(np.int64)
            ops.append(("remove", ids))
            live.difference_update(ids.tolist())
    return ops, next_id


def _apply(idx, op, vectors):
    kind, ids = op
    if kind == "add":
        idx.add(vectors[ids], ids, threads=1)
    else:
        idx.remove(ids)


def _search(idx, params, queries):
    q, k, mode, filt = params
    if mode == "graph":
        return idx.search(queries[q], k, threads=1)
    if mode == "exact":
        return idx.search(queries[q], k, exact=True, threads=1)
    if mode == "estimates":
        return idx.search(queries[q], k, rerank=False, threads=1)
    return idx.search(queries[q], k, filter=filt, threads=1)


def test_searches_during_adds_and_removes_match_a_serial_replay():
    """Eight threads search (graph, exact, estimates only, filtered) while one
    thread adds and removes. No call fails, no id removed before a search
    began comes back, and every result equals what the same search returns
    on one of the states the index passed through while it ran (replayed
    serially afterwards, with the same seed and single-threaded adds)."""
    vectors = clustered(6000, DIM, seed=7400)
    queries = clustered(64, DIM, seed=7401)
    ops, n_ids = _plan(7402)
    idx = kd.Index(DIM, "l2", m=8, ef_construction=40, seed=3)
    idx.add(vectors[:2000], threads=1)

    version = [0]           # writer operations completed
    removed_at = {}         # id -> the version from which it is gone
    records, errors = [], []
    stop = threading.Event()

    def reader(seed):
        rng = np.random.default_rng(seed)
        try:
            while not stop.is_set():
                q = rng.integers(0, len(queries), size=int(rng.integers(1, 4)))
                k = int(rng.integers(1, 25))
                mode = ("graph", "exact", "estimates", "filter")[int(rng.integers(0, 4))]
                filt = rng.integers(0, n_ids, size=300) if mode == "filter" else None
                params = (q, k, mode, filt)
                v0 = version[0]
                gone = {i for i, v in removed_at.copy().items() if v <= v0}
                D, I = _search(idx, params, queries)
                v1 = version[0]
                assert I.shape == (len(q), k) and D.dtype == np.float32
                back = gone.intersection(I.ravel().tolist())
                assert not back, "removed ids %s came back" % sorted(back)[:5]
                records.append((params, v0, v1 + 1, D, I))
        except Exception as e:  # reported below
            errors.append(e)
            stop.set()

    threads = [threading.Thread(target=reader, args=(s,)) for s in range(8)]
    for t in threads:
        t.start()
    try:
        for n, op in enumerate(ops):
            if stop.is_set():
                break
            _apply(idx, op, vectors)
            if op[0] == "remove":
                for i in op[1].tolist():
                    removed_at[i] = n + 1
            version[0] = n + 1
            time.sleep(0.02)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not errors, errors[:3]
    assert len(records) > 200, "too few searches ran: %d" % len(records)

    # Serial replay: state v is the initial add followed by ops[:v].
    replay = kd.Index(DIM, "l2", m=8, ef_construction=40, seed=3)
    replay.add(vectors[:2000], threads=1)
    pending = list(range(len(records)))
    windows = 0
    for v in range(len(ops) + 1):
        left = []
        for r in pending:
            params, lo, hi, D, I = records[r]
            if lo > v:
                left.append(r)
                continue
            D2, I2 = _search(replay, params, queries)
            if np.array_equal(I, I2) and np.allclose(D, D2, rtol=1e-5, atol=1e-5,
                                                     equal_nan=True):
                windows += hi - lo
                continue
            assert v < hi, ("search %r (run between states %d and %d) matches none of them"
                            % ((params[1], params[2]), lo, hi))
            left.append(r)
        pending = left
        if v < len(ops):
            _apply(replay, ops[v], vectors)
    assert not pending
    assert len(idx) == len(replay)
    idx.close()
    replay.close()


def test_remove_is_final_for_searches_that_start_after_it():
    """One thread removes ids one batch at a time and, after each remove
    returns, publishes them; searching threads never see a published id."""
    vectors = clustered(3000, DIM, seed=7410)
    idx = kd.Index(DIM, "cosine", m=8, ef_construction=40)
    idx.add(vectors)
    published = []
    errors = []
    stop = threading.Event()

    def reader(seed):
        rng = np.random.default_rng(seed)
        try:
            while not stop.is_set():
                gone = set(published)
                q = vectors[rng.integers(0, 3000, size=8)]
                for kw in ({}, {"exact": True}, {"rerank": False}):
                    D, I = idx.search(q, 10, **kw)
                    back = gone.intersection(I.ravel().tolist())
                    assert not back, (kw, sorted(back)[:5])
        except Exception as e:
            errors.append(e)
            stop.set()

    threads = [threading.Thread(target=reader, args=(s,)) for s in range(8)]
    for t in threads:
        t.start()
    try:
        order = np.random.default_rng(7411).permutation(3000)
        for start in range(0, 2400, 40):
            batch = order[start:start + 40]
            idx.remove(batch)
            published.extend(batch.tolist())
            time.sleep(0.005)
            if stop.is_set():
                break
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not errors, errors[:3]
    assert len(idx) == 600
    idx.close()


# ------------------------------------------------------------------ the GIL


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    x = clustered(20000, 64, seed=7420)
    idx = kd.Index(64, "l2", m=6, ef_construction=24)
    idx.add(x[:10000])
    path = str(tmp_path_factory.mktemp("gil") / "big.kdx")
    idx.save(path)
    return idx, x, path


@pytest.mark.parametrize("call", ["add", "search", "exact", "get_vectors", "save"])
def test_gil_released_during_long_calls(big, call, tmp_path):
    """A ticker thread keeps running through add, search (graph and exact),
    get_vectors and save: none of them holds the GIL while it works. (The
    save runs on a disk made slow by the test hook, 100 ms a write.)"""
    idx, x, path = big
    if call == "add":
        # Graph insertion alone: each attempt adds 3,000 new rows to 10,000,
        # never doubling the calibrated count, so no add measures a new
        # calibration table (its searches release the GIL and would hide an
        # insertion that does not).
        scratch = kd.Index(64, "l2", m=16, ef_construction=200)
        scratch.add(x[:10000], threads=1)
        starts = iter(range(10000, 19000, 3000))

        def fn():
            s = next(starts)
            return scratch.add(x[s:s + 3000], threads=1)
    elif call in ("search", "exact"):
        exact = call == "exact"
        q = x[np.random.default_rng(1).integers(0, 20000, size=3000)]
        fn = lambda: idx.search(q, 10, exact=exact, threads=1)
    elif call == "get_vectors":
        o = open_quiet(path, "pread")
        ids = np.random.default_rng(2).integers(0, 10000, size=8000)
        fn = lambda: o.get_vectors(ids)
    elif call == "save":
        target = str(tmp_path / "copy.kdx")
        _core._inject_fault("slow_write", 0, -1)
        fn = lambda: idx.save(target)
    try:
        stall, took, ticks, _ = gil_stall(fn, min_seconds=0.05, enough=0.25)
    finally:
        _core._inject_fault("none")
    if call == "get_vectors":
        o.close()
    assert stall < 0.25, (
        "%s: the ticker was stopped for %.0f%% of the %.3f s call (%d ticks): GIL held?"
        % (call, 100 * stall, took, ticks))


# ------------------------------------------------------------- processes


CHILD = textwrap.dedent("""
    import sys
    import warnings
    import numpy as np
    import knndirect as kd
    path, backend, out = sys.argv[1:4]
    queries = np.load(out + ".q.npy")
    warnings.simplefilter("ignore", RuntimeWarning)
    index = kd.open(path, io_backend=backend)
    results = [index.search(queries, 10) for _ in range(5)]
    for D, I in results[1:]:
        assert (I == results[0][1]).all()
    np.save(out + ".I.npy", results[0][1])
    np.save(out + ".D.npy", results[0][0])
    index.close()
""")


def test_several_processes_share_one_index_file(big, tmp_path):
    """Four processes (four I/O backends) open and search one file at the same
    time as this one: all get the same answers, and the file is unchanged."""
    idx, x, path = big
    queries = x[10000:10050]
    with open(path, "rb") as f:
        before = f.read()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    outs = []
    procs = []
    for n, backend in enumerate(("auto", "threads", "pread", "mmap")):
        out = str(tmp_path / ("p%d" % n))
        np.save(out + ".q.npy", queries)
        outs.append(out)
        procs.append(subprocess.Popen([sys.executable, "-c", CHILD, path, backend, out],
                                      env=env, stderr=subprocess.PIPE))
    o = open_quiet(path, "auto")
    mine = [o.search(queries, 10) for _ in range(5)]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err.decode()[-2000:]
    for out in outs:
        I = np.load(out + ".I.npy")
        D = np.load(out + ".D.npy")
        assert np.array_equal(I, mine[0][1])
        np.testing.assert_allclose(D, mine[0][0], rtol=1e-6)
    o.close()
    with open(path, "rb") as f:
        assert f.read() == before
