"""Faults in the I/O layer, injected through the test-only hook
knndirect._core._inject_fault (csrc/common.h): vector reads that fail with EIO,
come back short or hit a premature end of file, and writes of a save that fail
with ENOSPC or EIO. Each must raise OSError naming the file, and the index must
answer the next query correctly once the fault is gone. A save that fails or is
killed leaves the target either the old index or the new one, never torn.

Real faults are covered beside these: a real ENOSPC on a tiny tmpfs and a
child killed mid-save in test_storage_atomic.py, a file truncated under an
open index in tests/c/test_vecio.c (test_vecio_native.py)."""
import errno
import glob
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import knndirect as kd
from knndirect import _core
from conftest import assert_same_results, has_io_uring, open_quiet, split

DIM, N, K = 48, 3000, 5
DISK_BACKENDS = ("io_uring", "threads", "pread")


def _clear():
    """Disarm the hook; returns how many faults it injected."""
    return _core._inject_fault("none")[0]


@pytest.fixture(autouse=True)
def _no_fault_left():
    _core._inject_fault("none")
    yield
    _core._inject_fault("none")


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    base, queries = split(N, 16, DIM, seed=7100)
    path = str(tmp_path_factory.mktemp("faults") / "index.kdx")
    idx = kd.Index(DIM, "l2", m=8, ef_construction=40)
    idx.add(base)
    idx.save(path)
    idx.close()
    return path, base, queries


@pytest.fixture(scope="module")
def saved_large(tmp_path_factory):
    """An index whose vector section (18 MB) is streamed in several reads:
    the exact scan (3 to 18 reads by backend), verify and the save of an
    opened index (5 reads of 4 MiB each). On `saved` (0.8 MB) each of these
    is a single read, and a fault after the first could never fire."""
    base, queries = split(1100, 16, 4096, seed=7101)
    path = str(tmp_path_factory.mktemp("faults_large") / "index.kdx")
    idx = kd.Index(4096, "l2", m=4, ef_construction=8)
    idx.add(base)
    idx.save(path)
    idx.close()
    return path, base, queries


# The calls that stream the whole vector section rather than read records.
STREAMING = ("exact", "save", "verify")


def _open(path, backend, **kw):
    if backend == "io_uring" and not has_io_uring():
        pytest.skip("io_uring is not available here")
    return open_quiet(path, backend, **kw)


# Every call that reads vectors from the file, and what it needs.
def _search(o, q):
    return o.search(q, K)


def _search_one_by_one(o, q):
    return [o.search(v, K) for v in q]


def _exact(o, q):
    return o.search(q, K, exact=True)


def _filtered(o, q):
    return o.search(q, K, filter=np.arange(0, len(o), 7))


def _get_vectors(o, q):
    return o.get_vectors(np.arange(0, len(o), 3))


def _verify(o, q):
    return o.verify()


def _save_copy(o, q):
    o.save(o.info()["path"] + ".copy")


CALLS = {"search": _search, "single": _search_one_by_one, "exact": _exact,
         "filter": _filtered, "get_vectors": _get_vectors, "verify": _verify,
         "save": _save_copy}


def _reference(o, queries):
    return o.search(queries, K), o.get_vectors(np.arange(0, len(o), 3)).copy()


def _still_works(o, queries, ref):
    assert_same_results(o.search(queries, K), ref[0])
    assert np.array_equal(o.get_vectors(np.arange(0, len(o), 3)), ref[1])
    assert o.verify() is True


@pytest.mark.parametrize("backend", DISK_BACKENDS)
@pytest.mark.parametrize("kind", ["eio", "eof"])
@pytest.mark.parametrize("call", sorted(CALLS))
def test_read_fault_raises_oserror_naming_the_file(request, backend, kind, call):
    """A fault at the first read, the third and (streams) the last: each
    fires (the hook counts it) and raises OSError naming the file, and the
    index works again once the fault is gone."""
    path, base, queries = request.getfixturevalue(
        "saved_large" if call in STREAMING else "saved")
    o = _open(path, backend)
    try:
        ref = _reference(o, queries)
        # How many reads the call makes: armed far past them, nothing fires.
        _core._inject_fault(kind, 10 ** 9, 1)
        CALLS[call](o, queries)
        fired, seen = _core._inject_fault("none")
        assert fired == 0
        assert seen >= 3, "%s reads only %d times: a fault after 2 cannot fire" % (call, seen)
        afters = (0, 2, seen - 1) if call in STREAMING else (0, 2)
        for after in afters:
            _core._inject_fault(kind, after, 1)
            with pytest.raises(OSError) as ei:
                CALLS[call](o, queries)
            fired = _clear()
            assert fired == 1, "after=%d of %d reads: %d faults fired" % (after, seen, fired)
            assert ei.value.errno == errno.EIO, ei.value
            assert path in str(ei.value), "the message must name the file: %s" % ei.value
            _still_works(o, queries, ref)
    finally:
        o.close()
        for p in glob.glob(path + ".copy*"):
            os.unlink(p)


@pytest.mark.parametrize("backend", DISK_BACKENDS)
def test_short_reads_under_o_direct(saved, backend):
    """Under O_DIRECT a read that stops inside the aligned block cannot be
    resumed there: when the record's own bytes did arrive the read counts,
    otherwise it is an OSError naming the file. Never a half-filled vector."""
    path, base, queries = saved
    o = _open(path, backend)
    try:
        if not o.info()["direct_io"]:
            pytest.skip("O_DIRECT is not available for %s" % path)
        ref = _reference(o, queries)
        for after in range(0, 40, 3):   # one short read: right results, or an error
            _core._inject_fault("short", after, 1)
            try:
                got = o.search(queries, K)
            except OSError as e:
                assert e.errno == errno.EIO and path in str(e), e
            else:
                assert_same_results(got, ref[0])
        _core._inject_fault("short", 0, -1)   # every read short: some record is cut
        with pytest.raises(OSError) as ei:
            o.search(queries, K)
        assert ei.value.errno == errno.EIO and path in str(ei.value)
        _clear()
        _still_works(o, queries, ref)
    finally:
        o.close()


@pytest.mark.parametrize("backend", DISK_BACKENDS)
def test_short_reads_buffered_are_retried(saved, backend, monkeypatch):
    """Buffered reads that come back short are completed by further reads:
    the results are exactly those of a fault-free run."""
    monkeypatch.setenv("KNNDIRECT_DISABLE_DIRECT_IO", "1")
    path, base, queries = saved
    o = _open(path, backend)
    try:
        assert not o.info()["direct_io"]
        ref = _reference(o, queries)
        expected_vectors = base[::3]
        _core._inject_fault("short", 0, -1)   # every read returns half
        got = o.search(queries, K)
        vectors = o.get_vectors(np.arange(0, N, 3))
        try:
            exact = o.search(queries, K, exact=True)
        except OSError as e:
            # The io_uring stream of an exact scan does not resume a short
            # piece: it fails, naming the file.
            assert backend == "io_uring" and e.errno == errno.EIO and path in str(e), e
            exact = None
        assert _clear() > 0
        assert_same_results(got, ref[0])
        assert np.array_equal(vectors, expected_vectors)
        if exact is not None:
            assert_same_results(exact, o.search(queries, K, exact=True))
    finally:
        o.close()


@pytest.mark.parametrize("backend", DISK_BACKENDS)
def test_faults_under_concurrent_searches(saved, backend):
    """Four threads search while every read fails, then while none does: each
    failing call raises OSError naming the file, nothing crashes, and every
    later result is right."""
    path, base, queries = saved
    o = _open(path, backend)
    try:
        ref = o.search(queries, K)
        errors, wrong = [], []
        phase = {"faulty": True}
        stop = threading.Event()

        def worker(seed):
            rng = np.random.default_rng(seed)
            while not stop.is_set():
                faulty = phase["faulty"]
                rows = rng.integers(0, len(queries), size=4)
                try:
                    D, I = o.search(queries[rows], K)
                except OSError as e:
                    if not faulty:
                        wrong.append("error after the fault was cleared: %s" % e)
                    elif path not in str(e):
                        wrong.append("message without the path: %s" % e)
                    errors.append(e)
                    continue
                if not np.array_equal(I, ref[1][rows]):
                    wrong.append("wrong result")

        threads = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
        _core._inject_fault("eio", 0, -1)
        for t in threads:
            t.start()
        time.sleep(0.5)
        phase["faulty"] = False
        _core._inject_fault("none")
        time.sleep(0.5)
        stop.set()
        for t in threads:
            t.join()
        assert errors, "no search saw the fault"
        assert not wrong, wrong[:3]
        assert_same_results(o.search(queries, K), ref)
    finally:
        o.close()


# ------------------------------------------------------------------ saves


def _two_indexes(tmp_path):
    base, queries = split(4000, 8, 192, seed=7200)   # the new one: a ~3 MB file
    old = kd.Index(192, "l2", m=4, ef_construction=16)
    old.add(base[:700])
    new = kd.Index(192, "l2", m=4, ef_construction=16)
    new.add(base)
    return old, new, queries


@pytest.mark.parametrize("kind,code", [("enospc", errno.ENOSPC), ("write_eio", errno.EIO)])
def test_failed_write_leaves_the_old_index(tmp_path, kind, code):
    old, new, queries = _two_indexes(tmp_path)
    target = tmp_path / "index.kdx"
    old.save(target)
    before = target.read_bytes()
    expected = old.search(queries, K)
    # Count the writes of this save (armed, never firing), then fail the
    # first one, one in the middle and the last one.
    _core._inject_fault(kind, 0, 0)
    new.save(tmp_path / "probe.kdx")
    writes = _core._inject_fault("none")[1]
    os.unlink(tmp_path / "probe.kdx")
    assert writes >= 2, "a save of this size takes several writes"
    for after in sorted({0, writes // 2, writes - 1}):
        _core._inject_fault(kind, after, 1)
        with pytest.raises(OSError) as ei:
            new.save(target)
        assert _clear() == 1
        assert ei.value.errno == code, ei.value
        assert "index.kdx" in str(ei.value)
        assert sorted(os.listdir(tmp_path)) == ["index.kdx"], "a temporary file was left"
        assert target.read_bytes() == before
        got = kd.load(target)
        assert_same_results(got.search(queries, K), expected)
        got.close()
    # And once the disk has room again, the save goes through.
    new.save(target)
    got = kd.load(target)
    assert len(got) == len(new)
    got.close()
    old.close()
    new.close()


def test_failed_write_to_a_new_path_leaves_nothing(tmp_path):
    old, new, queries = _two_indexes(tmp_path)
    _core._inject_fault("enospc", 1, 1)
    with pytest.raises(OSError) as ei:
        new.save(tmp_path / "fresh.kdx")
    assert ei.value.errno == errno.ENOSPC
    assert os.listdir(tmp_path) == []
    old.close()
    new.close()


def test_replacing_the_file_under_an_open_index(tmp_path, saved):
    """An atomic save over the path of an index that is open (the usual way
    to publish a rebuilt index) leaves the open one reading its own file."""
    path, base, queries = saved
    target = str(tmp_path / "live.kdx")
    a = kd.load(path)
    a.save(target)
    for backend in DISK_BACKENDS + ("mmap",):
        o = _open(target, backend)
        ref = o.search(queries, K)
        b = kd.Index(DIM, "ip", m=4, ef_construction=10)
        b.add(base[:100] * 2)
        b.save(target)
        b.close()
        assert_same_results(o.search(queries, K), ref)
        assert o.verify() is True
        o.close()
        a.save(target)
    a.close()


SAVER = textwrap.dedent("""
    import sys
    import numpy as np
    import knndirect as kd
    target = sys.argv[1]
    rng = np.random.default_rng(7300)
    x = rng.standard_normal((6000, 96), dtype=np.float32)
    a = kd.Index(96, "l2", m=4, ef_construction=8)
    a.add(x[:2000])
    b = kd.Index(96, "l2", m=4, ef_construction=8)
    b.add(x)
    a.save(target)
    print("ready", flush=True)
    while True:
        b.save(target)
        a.save(target)
""")


def test_kill_at_random_moments_never_tears_the_target(tmp_path):
    """A child saves two indexes over one path in a loop; SIGKILL at random
    moments, half of them while a save is writing (its temporary file exists;
    at least those four must leave it behind). Every time, the target is one
    of the two, whole (every checksum verified), never a mix or a prefix."""
    target = tmp_path / "index.kdx"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    rng = np.random.default_rng(7301)
    seen = set()
    mid_write = 0   # kills that left a temporary file: the save was under way
    for i in range(8):
        child = subprocess.Popen([sys.executable, "-c", SAVER, str(target)],
                                 stdout=subprocess.PIPE, env=env)
        try:
            assert child.stdout.readline().strip() == b"ready"
            time.sleep(float(rng.uniform(0.0, 0.3)))
            if i % 2:
                # Every other kill waits for a save to be writing its
                # temporary file (at a random point of the loop otherwise,
                # the kill often lands between two saves).
                deadline = time.monotonic() + 30
                while not glob.glob(str(target) + ".tmp-*"):
                    assert time.monotonic() < deadline, "no save seen under way"
                    time.sleep(0.0002)
            child.send_signal(signal.SIGKILL)
            child.wait(30)
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
            child.stdout.close()
        leftovers = glob.glob(str(target) + ".tmp-*")
        assert len(leftovers) <= 1, leftovers
        mid_write += bool(leftovers)
        got = kd.load(target)
        assert len(got) in (2000, 6000), len(got)
        seen.add(len(got))
        got.close()
        o = open_quiet(target, "threads")
        assert o.verify() is True
        o.close()
        for p in leftovers:
            os.unlink(p)
    # What this test is about: kills that land while the target's
    # replacement is being written (the temporary file is left behind).
    assert mid_write >= 4, "only %d of 8 kills landed while a save was writing" % mid_write
    assert sorted(os.listdir(tmp_path)) == ["index.kdx"]
