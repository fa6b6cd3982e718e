"""Limits and clear errors: dimensions at and beyond the bounds, k = 0 and k
far beyond the index, empty indexes through every call and backend, ids at
the int64 bounds, 32-bit arguments that must not wrap, read-only and
non-regular targets, directories where files are expected.

Offsets of 2^31 and more rows and beyond 4 GiB are read through the batch
reader in tests/c/stress_index.c (bigfile, run by
test_hardening_sanitizers.py); the offset arithmetic of csrc/ is 64-bit
throughout (rows are uint64_t in vecio, slot numbers are cast to size_t
before any multiplication)."""
import errno
import os
import subprocess

import numpy as np
import pytest

import knndirect as kd
from conftest import open_quiet

INT64_MIN, INT64_MAX = int(np.iinfo(np.int64).min), int(np.iinfo(np.int64).max)
BACKENDS = ("auto", "threads", "pread", "mmap")


# ------------------------------------------------------------ dimensions


@pytest.mark.parametrize("dim", [0, -1, (1 << 20) + 1, 2**31, 2**32, 2**32 + 16, 2**64 + 8])
def test_dim_out_of_range_is_refused(dim):
    with pytest.raises(ValueError) as ei:
        kd.Index(dim)
    assert "dim" in str(ei.value)


@pytest.mark.parametrize("name,value", [("m", 2**32 + 16), ("m", 1), ("m", 257),
                                        ("ef_construction", 2**32 + 200), ("ef_construction", 0)])
def test_graph_parameters_out_of_range_are_refused(name, value):
    with pytest.raises(ValueError) as ei:
        kd.Index(8, **{name: value})
    assert name.split("_")[0] in str(ei.value)


def test_largest_dim_works():
    dim = 1 << 20
    idx = kd.Index(dim, "ip", m=2, ef_construction=2)
    x = np.zeros((3, dim), np.float32)
    x[0, 0], x[1, dim - 1], x[2, dim // 2] = 1, 2, 3
    idx.add(x)
    D, I = idx.search(x[1], 3)
    assert I[0] == 1 and D[0] == 4
    assert np.array_equal(idx.get_vectors([2]), x[2:3])
    again = kd.load(idx.to_bytes())
    assert np.array_equal(again.search(x[1], 3)[1], I)
    again.close()
    idx.close()


def test_dim_one():
    idx = kd.Index(1, "l2")
    x = np.arange(50, dtype=np.float32)[:, None]
    idx.add(x)
    D, I = idx.search(np.array([10.2]), 3)
    assert I.tolist() == [10, 11, 9]
    idx.close()


# ------------------------------------------------------------------- k


@pytest.mark.parametrize("k", [0, -1])
def test_k_below_one_is_refused(k):
    idx = kd.Index(4)
    idx.add(np.eye(4, dtype=np.float32))
    with pytest.raises(ValueError) as ei:
        idx.search(np.zeros(4), k)
    assert "k" in str(ei.value)
    idx.close()


@pytest.mark.parametrize("exact", [False, True])
def test_k_far_beyond_the_index_pads(exact):
    idx = kd.Index(4)
    idx.add(np.eye(4, dtype=np.float32))
    D, I = idx.search(np.zeros((2, 4)), 100000, exact=exact)
    assert D.shape == I.shape == (2, 100000)
    assert (I[:, 4:] == -1).all() and np.isinf(D[:, 4:]).all()
    assert sorted(I[0, :4].tolist()) == [0, 1, 2, 3]
    idx.close()


@pytest.mark.parametrize("k", [2**40, 2**60])
def test_k_too_large_to_allocate_is_a_clear_error(k):
    """The (n, k) result itself cannot be allocated: MemoryError (or NumPy's
    ValueError for a size beyond any address space), and the index goes on."""
    idx = kd.Index(4)
    idx.add(np.eye(4, dtype=np.float32))
    with pytest.raises((MemoryError, ValueError)) as ei:
        idx.search(np.zeros(4), k)
    assert str(ei.value)
    assert idx.search(np.zeros(4), 2)[1].shape == (2,)
    idx.close()


@pytest.mark.parametrize("kw", [{"ef": 2**62}, {"ef": 10**8}, {"oversample": 1e300},
                                {"threads": 2**32 - 1}])
def test_huge_search_knobs_are_bounded(kw):
    x = np.random.default_rng(0).standard_normal((300, 8)).astype(np.float32)
    idx = kd.Index(8)
    idx.add(x)
    D, I = idx.search(x[:3], 5, **kw)
    assert (I[:, 0] == np.arange(3)).all()
    idx.close()


@pytest.mark.parametrize("call", ["search", "add", "open"])
def test_32_bit_arguments_do_not_wrap(call, tmp_path):
    idx = kd.Index(4)
    idx.add(np.eye(4, dtype=np.float32))
    with pytest.raises(ValueError) as ei:
        if call == "search":
            idx.search(np.zeros(4), 2, threads=2**32 + 1)
        elif call == "add":
            idx.add(np.ones((1, 4)), threads=2**32 + 1)
        else:
            idx.save(tmp_path / "x.kdx")
            kd.open(tmp_path / "x.kdx", io_depth=2**32 + 1)
    assert "at most" in str(ei.value)
    idx.close()


# --------------------------------------------------------------- empty


@pytest.fixture
def empty_file(tmp_path):
    path = tmp_path / "empty.kdx"
    idx = kd.Index(8, "cosine")
    idx.save(path)
    idx.close()
    return path


def _empty_checks(idx):
    assert len(idx) == 0
    for kw in ({}, {"exact": True}, {"rerank": False}, {"filter": [1, 2]}, {"filter": []}):
        D, I = idx.search(np.ones(8), 3, **kw)
        assert (I == -1).all() and (D == -np.inf).all()
        D, I = idx.search(np.ones((0, 8)), 3, **kw)
        assert D.shape == (0, 3)
    assert idx.get_vectors([]).shape == (0, 8)
    with pytest.raises(KeyError):
        idx.get_vectors([0])
    with pytest.raises(KeyError):
        idx.remove([0])
    idx.remove([])
    assert idx.verify() is True
    assert idx.info()["count"] == 0


def test_empty_index_everywhere(empty_file):
    idx = kd.Index(8, "cosine")
    _empty_checks(idx)
    idx.add(np.zeros((0, 8)))
    _empty_checks(idx)
    for source in (idx.to_bytes(), empty_file):
        loaded = kd.load(source)
        _empty_checks(loaded)
        loaded.close()
    for backend in BACKENDS:
        o = open_quiet(empty_file, backend)
        _empty_checks(o)
        o.save(str(empty_file) + ".copy")
        o.close()
    copy = kd.load(str(empty_file) + ".copy")
    _empty_checks(copy)
    # An empty index becomes a normal one.
    copy.add(np.eye(8, dtype=np.float32))
    assert copy.search(np.eye(8)[3], 1)[1][0] == 3
    copy.close()
    idx.close()


def test_everything_removed(tmp_path):
    idx = kd.Index(8)
    idx.add(np.eye(8, dtype=np.float32))
    idx.remove(np.arange(8))
    _search = idx.search(np.ones(8), 3)
    assert (_search[1] == -1).all() and (_search[0] == np.inf).all()
    idx.save(tmp_path / "gone.kdx")
    for backend in BACKENDS:
        o = open_quiet(tmp_path / "gone.kdx", backend)
        D, I = o.search(np.ones((2, 8)), 4)
        assert (I == -1).all()
        assert (o.search(np.ones(8), 4, exact=True)[1] == -1).all()
        o.close()
    idx.close()


# -------------------------------------------------------------- ids


IDS = np.array([INT64_MIN, INT64_MAX, -1, 0, INT64_MIN + 1, INT64_MAX - 1], dtype=np.int64)


def test_ids_at_the_int64_bounds(tmp_path):
    x = np.eye(6, dtype=np.float32) * 3
    idx = kd.Index(6)
    idx.add(x, IDS)
    path = tmp_path / "bounds.kdx"
    idx.save(path)
    indexes = [idx, kd.load(path)] + [open_quiet(path, b) for b in BACKENDS]
    for index in indexes:
        D, I = index.search(x, 1)
        assert np.array_equal(I[:, 0], IDS)
        assert np.array_equal(index.search(x, 1, exact=True)[1][:, 0], IDS)
        assert np.array_equal(index.get_vectors(IDS[::-1]), x[::-1])
        D, I = index.search(x[0], 6, filter=IDS[[1, 2]])
        assert set(I[:2].tolist()) == {INT64_MAX, -1} and (I[2:] == -1).all()
        assert np.isinf(D[2:]).all(), "padding is told by the distance when -1 is an id"
    for index in indexes:
        index.remove([INT64_MIN, INT64_MAX])
        D, I = index.search(x[:2], 6)
        assert INT64_MIN not in I and INT64_MAX not in I
        index.close()
    fresh = kd.Index(6)
    fresh.add(x[:2], [INT64_MAX, INT64_MIN])
    with pytest.raises(ValueError):
        fresh.add(x[:1], [INT64_MAX])
    fresh.close()


@pytest.mark.parametrize("bad", [[2**63], [-(2**63) - 1], np.array([2**64 - 1], np.uint64)])
def test_ids_beyond_int64_are_refused(bad):
    idx = kd.Index(2)
    with pytest.raises((ValueError, TypeError, OverflowError)) as ei:
        idx.add(np.ones((1, 2)), bad)
    assert str(ei.value)
    assert len(idx) == 0
    idx.close()


# ------------------------------------------------------------- paths


@pytest.fixture
def small():
    idx = kd.Index(4)
    idx.add(np.eye(4, dtype=np.float32))
    yield idx
    idx.close()


def test_directories_where_files_are_expected(small, tmp_path):
    for call in (lambda: small.save(tmp_path), lambda: kd.load(tmp_path),
                 lambda: kd.open(tmp_path)):
        with pytest.raises(IsADirectoryError) as ei:
            call()
        assert str(tmp_path) in str(ei.value)
    assert os.listdir(tmp_path) == []


def test_missing_and_malformed_paths(small, tmp_path):
    with pytest.raises(FileNotFoundError):
        kd.open(tmp_path / "nope.kdx")
    with pytest.raises(FileNotFoundError):
        kd.load(tmp_path / "nope.kdx")
    (tmp_path / "file").write_bytes(b"x")
    with pytest.raises(NotADirectoryError):
        small.save(tmp_path / "file" / "x.kdx")
    with pytest.raises(OSError) as ei:
        small.save(tmp_path / ("n" * 300))
    assert ei.value.errno == errno.ENAMETOOLONG
    for name in ("empty", "text"):
        p = tmp_path / name
        p.write_bytes(b"" if name == "empty" else b"hello\n" * 2000)
        for call in (kd.load, kd.open):
            with pytest.raises(ValueError) as ei:
                call(p)
            assert str(p) in str(ei.value) or "knndirect" in str(ei.value)


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full")
def test_a_device_is_never_replaced(small):
    """Saving to a path that names a device (or a pipe, a socket) is refused:
    the atomic rename would replace the device node with a regular file."""
    st = os.stat("/dev/full")
    with pytest.raises(ValueError) as ei:
        small.save("/dev/full")
    assert "regular file" in str(ei.value)
    assert os.stat("/dev/full").st_rdev == st.st_rdev
    # A device written through a file object works as for any stream.
    with open("/dev/null", "wb") as f:
        small.save(f)


def test_a_fifo_is_never_replaced_nor_waited_on(small, tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(ValueError):
        small.save(fifo)
    assert os.path.exists(fifo) and not os.path.isfile(fifo)
    assert sorted(os.listdir(tmp_path)) == ["pipe"]
    # open maps a file: a FIFO is refused at once, not waited on for a writer.
    for path in (fifo, "/dev/null"):
        with pytest.raises(ValueError) as ei:
            kd.open(path)
        assert "regular file" in str(ei.value)


@pytest.fixture
def read_only_dir(tmp_path):
    """A directory this process cannot write in: a read-only tmpfs when root
    (permission bits do not stop root), mode 0555 otherwise."""
    d = tmp_path / "ro"
    d.mkdir()
    if os.geteuid() == 0:
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1M", "tmpfs", str(d)],
                           capture_output=True, text=True)
        if r.returncode != 0:
            pytest.skip("cannot mount a read-only tmpfs: %s" % r.stderr.strip())
        try:
            yield d
        finally:
            subprocess.run(["umount", "-l", str(d)], capture_output=True)
    else:
        d.chmod(0o555)
        try:
            yield d
        finally:
            d.chmod(0o755)


def test_save_into_a_read_only_directory(small, read_only_dir):
    with pytest.raises(OSError) as ei:
        small.save(read_only_dir / "x.kdx")
    assert ei.value.errno in (errno.EROFS, errno.EACCES, errno.EPERM)
    assert str(read_only_dir) in str(ei.value)
    assert os.listdir(read_only_dir) == []
    # The index is untouched and still saves elsewhere.
    assert len(small) == 4


def test_open_from_a_read_only_directory(small, tmp_path):
    """Searching needs no write access to the file or its directory."""
    path = tmp_path / "ro.kdx"
    small.save(path)
    os.chmod(path, 0o444)
    os.chmod(tmp_path, 0o555)
    try:
        for backend in BACKENDS:
            o = open_quiet(path, backend)
            assert o.search(np.eye(4)[2], 1)[1][0] == 2
            assert o.verify() is True
            o.close()
        assert len(kd.load(path)) == 4
    finally:
        os.chmod(tmp_path, 0o755)
