"""I/O backends of kd.open: selection, fallbacks and their reporting."""
import os
import shutil
import uuid
import warnings

import numpy as np
import pytest

import knndirect as kd
from conftest import (BACKENDS, assert_same_results, build, has_io_uring,
                      open_backend, open_quiet, same_bytes, split)

N, NQ, D_, K = 3000, 30, 128, 10


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    base, queries = split(N, NQ, D_, seed=6000)
    index = build(base, "cosine")
    path = tmp_path_factory.mktemp("io") / "io.kdx"
    index.save(path)
    expected = index.search(queries, K)
    exact = index.search(queries, K, exact=True)
    index.close()
    return base, queries, path, expected, exact


def _check_results(idx, saved):
    base, queries, path, expected, exact = saved
    assert_same_results(idx.search(queries, K), expected)
    assert_same_results(idx.search(queries, K, exact=True), exact, rtol=1e-4)
    ids = np.random.default_rng(0).permutation(N)[:257]
    assert same_bytes(idx.get_vectors(ids), base[ids])


@pytest.mark.parametrize("backend", ["io_uring", "threads", "pread", "mmap"])
def test_explicit_backend_is_used(saved, backend):
    idx = open_backend(saved[2], backend)
    try:
        info = idx.info()
        assert info["io_backend"] == backend
        assert info["storage"] == "disk"
        if backend != "mmap":
            assert info["direct_io"] is True
        _check_results(idx, saved)
    finally:
        idx.close()


def test_io_uring_backend_without_fallbacks(saved):
    if not has_io_uring():
        pytest.skip("io_uring is not available here (kd.features()['io_uring'] is False)")
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no fallback warning
        idx = kd.open(saved[2], io_backend="io_uring")
    try:
        info = idx.info()
        assert info["io_backend"] == "io_uring"
        assert "no_io_uring" not in info["fallbacks"]
        assert "no_direct_io" not in info["fallbacks"]
    finally:
        idx.close()


def test_auto_prefers_io_uring(saved):
    if not has_io_uring():
        pytest.skip("io_uring is not available here (kd.features()['io_uring'] is False)")
    idx = kd.open(saved[2])
    try:
        assert idx.info()["io_backend"] == "io_uring"
        assert idx.info()["fallbacks"] == []
        _check_results(idx, saved)
    finally:
        idx.close()


def test_auto_falls_back_when_io_uring_disabled(saved, monkeypatch):
    monkeypatch.setenv("KNNDIRECT_DISABLE_IO_URING", "1")
    with pytest.warns(RuntimeWarning):
        idx = kd.open(saved[2], io_backend="auto")
    try:
        info = idx.info()
        assert info["io_backend"] == "threads"
        assert "no_io_uring" in info["fallbacks"]
        assert info["direct_io"] is True
        _check_results(idx, saved)
    finally:
        idx.close()


def test_forced_io_uring_unavailable_raises(saved, monkeypatch):
    monkeypatch.setenv("KNNDIRECT_DISABLE_IO_URING", "1")
    with pytest.raises(OSError):
        kd.open(saved[2], io_backend="io_uring")


def test_threads_backend_unaffected_by_disabled_io_uring(saved, monkeypatch):
    monkeypatch.setenv("KNNDIRECT_DISABLE_IO_URING", "1")
    idx = kd.open(saved[2], io_backend="threads")
    try:
        assert idx.info()["io_backend"] == "threads"
        _check_results(idx, saved)
    finally:
        idx.close()


@pytest.mark.parametrize("bad", ["uring", "", "AIO", "direct"])
def test_unknown_backend_rejected(saved, bad):
    with pytest.raises(ValueError):
        kd.open(saved[2], io_backend=bad)


@pytest.mark.parametrize("depth", [0, -1])
def test_bad_io_depth_rejected(saved, depth):
    with pytest.raises(ValueError):
        kd.open(saved[2], io_depth=depth)


def test_unknown_preload_section_rejected(saved):
    with pytest.raises(ValueError):
        kd.open(saved[2], preload=("graph", "nonsense"))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("depth", [1, 2, 7])
def test_tiny_io_depth_still_correct(saved, backend, depth):
    idx = open_quiet(saved[2], backend, io_depth=depth)
    try:
        _check_results(idx, saved)
    finally:
        idx.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_buffered_mode(saved, backend):
    idx = open_quiet(saved[2], backend, direct_io=False)
    try:
        assert idx.info()["direct_io"] is False
        _check_results(idx, saved)
    finally:
        idx.close()


@pytest.fixture
def shm_copy(saved):
    if not os.path.isdir("/dev/shm"):
        pytest.skip("/dev/shm does not exist on this machine")
    d = os.path.join("/dev/shm", "kdtest-" + uuid.uuid4().hex)
    try:
        os.mkdir(d)
    except OSError as e:
        pytest.skip("cannot write to /dev/shm: %s" % e)
    p = os.path.join(d, "io.kdx")
    shutil.copyfile(saved[2], p)
    yield p
    shutil.rmtree(d, ignore_errors=True)


@pytest.mark.parametrize("backend", ["auto", "threads", "pread"])
def test_tmpfs_falls_back_to_buffered(saved, shm_copy, backend):
    with pytest.warns(RuntimeWarning):
        idx = kd.open(shm_copy, io_backend=backend, direct_io=True)
    try:
        info = idx.info()
        assert info["direct_io"] is False
        assert "no_direct_io" in info["fallbacks"]
        _check_results(idx, saved)
    finally:
        idx.close()


def test_tmpfs_io_uring_falls_back_to_buffered(saved, shm_copy):
    if not has_io_uring():
        pytest.skip("io_uring is not available here (kd.features()['io_uring'] is False)")
    with pytest.warns(RuntimeWarning):
        idx = kd.open(shm_copy, io_backend="io_uring", direct_io=True)
    try:
        assert idx.info()["direct_io"] is False
        assert idx.info()["io_backend"] == "io_uring"
        _check_results(idx, saved)
    finally:
        idx.close()


@pytest.mark.parametrize("backend", ["auto", "threads"])
def test_forced_direct_io_refusal_falls_back(saved, monkeypatch, backend):
    """The test-only switch makes the O_DIRECT open fail as on a filesystem
    without it: reads go buffered, with a warning and a note in info()."""
    monkeypatch.setenv("KNNDIRECT_DISABLE_DIRECT_IO", "1")
    with pytest.warns(RuntimeWarning, match="O_DIRECT"):
        idx = kd.open(saved[2], io_backend=backend, direct_io=True)
    try:
        info = idx.info()
        assert info["direct_io"] is False
        assert "no_direct_io" in info["fallbacks"]
        _check_results(idx, saved)
    finally:
        idx.close()


def test_tmpfs_buffered_requested_no_warning(saved, shm_copy):
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        idx = kd.open(shm_copy, io_backend="threads", direct_io=False)
    try:
        assert idx.info()["direct_io"] is False
        assert "no_direct_io" not in idx.info()["fallbacks"]
        _check_results(idx, saved)
    finally:
        idx.close()


def test_features_report(features):
    for key in ("io_uring", "avx2", "simd"):
        assert key in features
    assert isinstance(features["io_uring"], bool)
    assert isinstance(features["avx2"], bool)
    assert isinstance(features["simd"], str) and features["simd"]
    if not features["avx2"]:
        assert features["simd"] != "avx2"


def test_open_threads_argument(saved):
    for t in (1, 2):
        idx = open_quiet(saved[2], "threads", threads=t)
        try:
            _check_results(idx, saved)
        finally:
            idx.close()


def test_many_opens_do_not_leak(saved):
    """Open and close repeatedly: file descriptors / rings are released."""
    fd_dir = "/proc/self/fd"
    if not os.path.isdir(fd_dir):
        pytest.skip("no /proc/self/fd")
    before = len(os.listdir(fd_dir))
    for _ in range(40):
        idx = open_quiet(saved[2], "auto")
        idx.search(saved[1][:2], K)
        idx.close()
    after = len(os.listdir(fd_dir))
    assert after <= before + 2, "fds: %d before, %d after 40 open/close" % (before, after)


@pytest.mark.parametrize("backend", ["auto", "threads", "pread", "mmap"])
def test_io_wait_is_counted(saved, backend):
    """Every backend reports the time searches spent waiting for vectors,
    including the synchronous ones that read before the wait would begin."""
    idx = open_quiet(saved[2], backend)
    try:
        idx.stats(reset=True)
        idx.search(saved[1], K)
        st = idx.stats()
        assert st["read_ops"] > 0
        assert st["io_wait_seconds"] > 0
    finally:
        idx.close()
