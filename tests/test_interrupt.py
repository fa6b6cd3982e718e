"""Progress and cancel during Index.add: the progress callable, cancel by
returning False, and Ctrl-C (a real SIGINT, or KeyboardInterrupt raised from
the progress callable) interrupting a long add cleanly: the index keeps the
whole chunks already added, and stays usable for search and later adds."""
import os
import signal
import threading

import numpy as np
import pytest

import knndirect as kd
from knndirect import _index
from knndirect.datasets import clustered

DIM = 16


@pytest.fixture(scope="module")
def data():
    return clustered(60_000, DIM, seed=9)


def _check_usable(index, data, added):
    """len is `added`, those vectors are searchable with their default ids,
    and adding the rest completes the index."""
    n = len(data)
    assert len(index) == added
    if added:
        _, I = index.search(data[:added][::max(1, added // 20)], 1, exact=True)
        np.testing.assert_array_equal(I[:, 0], np.arange(0, added, max(1, added // 20)))
        D, I = index.search(data[0], 5)
        assert I[0] == 0
    index.add(data[added:])
    assert len(index) == n
    _, I = index.search(data[[added, n - 1]], 1, exact=True)
    np.testing.assert_array_equal(I[:, 0], [added, n - 1])
    _, I = index.search(data[n - 1], 10)
    assert n - 1 in I


def test_progress_callable_sees_every_chunk(data):
    calls = []
    index = kd.Index(DIM, m=8, ef_construction=32)
    index.add(data[:5000], progress=lambda done, total: calls.append((done, total)))
    assert calls[-1] == (5000, 5000)
    assert [c[0] for c in calls] == sorted(c[0] for c in calls)
    assert all(t == 5000 for _, t in calls) and len(calls) >= 2
    assert len(index) == 5000


def test_progress_returning_false_cancels_after_whole_chunks(data):
    seen = []

    def progress(done, total):
        seen.append(done)
        return len(seen) < 3

    index = kd.Index(DIM, m=8, ef_construction=32)
    index.add(data[:20_000], progress=progress)
    assert len(seen) == 3
    assert len(index) == seen[-1] < 20_000
    _check_usable(index, data[:20_000], len(index))


def test_keyboard_interrupt_from_progress_leaves_index_usable(data):
    seen = []

    def progress(done, total):
        seen.append(done)
        if len(seen) == 2:
            raise KeyboardInterrupt
        return True

    index = kd.Index(DIM, m=8, ef_construction=32)
    with pytest.raises(KeyboardInterrupt):
        index.add(data[:20_000], progress=progress)
    chunk = seen[0]
    assert len(index) == 2 * chunk
    _check_usable(index, data[:20_000], len(index))


def test_sigint_during_long_add_leaves_index_usable(data, monkeypatch):
    """A real SIGINT while the core builds (GIL released, worker threads
    running): KeyboardInterrupt surfaces between chunks (of ADD_CHUNK rows
    here: at this dimension a chunk of CHUNK_BYTES would hold them all)."""
    monkeypatch.setattr(_index, "CHUNK_BYTES", 0)
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("SIGINT is delivered to the main thread only")
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        pytest.skip("SIGINT handler replaced by the test runner")
    # The signal must land while the add runs: on a loaded machine the timer
    # thread can wake late, so a try whose add finished first is repeated
    # with an earlier signal (each try still needs a real mid-add interrupt).
    for delay in (0.5, 0.2, 0.05):
        index = kd.Index(DIM, m=8, ef_construction=64)
        timer = threading.Timer(delay, os.kill, (os.getpid(), signal.SIGINT))
        timer.start()
        try:
            with pytest.raises(KeyboardInterrupt):
                index.add(data)
                # The add finished before the signal: wait for it here.
                threading.Event().wait(5)
        finally:
            timer.cancel()
        added = len(index)
        assert added % _index.ADD_CHUNK == 0 or added == len(data)
        if added < len(data):
            break
    assert added < len(data), "every add finished before its interrupt; use more data"
    _check_usable(index, data, added)
