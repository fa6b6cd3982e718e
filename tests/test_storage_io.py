"""The storage interface from Python: save to any writer, load from any
reader, in large chunks with the GIL released in between, sequentially (pipes
and sockets work), with exceptions of the file object passed through."""
import io
import mmap
import os
import pickle
import socket
import threading

import numpy as np
import pytest

import knndirect as kd
from conftest import assert_same_results, build, gil_stall, open_quiet, split

CHUNK = 8 << 20


@pytest.fixture(scope="module")
def small():
    base, queries = split(2000, 20, 100, seed=9200)   # dim 100: padded records
    idx = build(base, "cosine")
    idx.remove([3, 4])
    blob = idx.to_bytes()
    expected = idx.search(queries, 10)
    yield idx, blob, queries, expected
    idx.close()


@pytest.fixture(scope="module")
def big():
    """An index whose vector section is larger than one 8 MiB chunk."""
    rng = np.random.default_rng(9201)
    x = rng.standard_normal((2400, 2048), dtype=np.float32)
    idx = kd.Index(2048, "ip", m=4, ef_construction=8)
    idx.add(x)
    blob = idx.to_bytes()
    assert len(blob) > 2 * CHUNK
    q = x[:3] + 0.01
    expected = idx.search(q, 5)
    yield idx, blob, q, expected
    idx.close()


# --------------------------------------------------------------- writers

class NoneWriter:
    """write() returns None, as many hand-written sinks do."""

    def __init__(self):
        self.parts = []

    def write(self, b):
        self.parts.append(bytes(b))

    def value(self):
        return b"".join(self.parts)


class ShortWriter(NoneWriter):
    """A raw stream that takes at most 1000 bytes per call."""

    def write(self, b):
        self.parts.append(bytes(b[:1000]))
        return min(len(b), 1000)


def _pipe_target(save):
    r, w = os.pipe()
    out = []
    t = threading.Thread(target=lambda: out.append(os.fdopen(r, "rb").read()))
    t.start()
    with os.fdopen(w, "wb") as f:
        save(f)
    t.join()
    return out[0]


def _write_with(kind, idx, tmp_path):
    p = tmp_path / ("w_%s.kdx" % kind)
    if kind == "str":
        idx.save(str(p))
    elif kind == "pathlib":
        idx.save(p)
    elif kind == "buffered":
        with open(p, "wb") as f:
            idx.save(f)
    elif kind == "raw":
        with open(p, "wb", buffering=0) as f:
            idx.save(f)
    elif kind == "bytesio":
        b = io.BytesIO()
        idx.save(b)
        return b.getvalue()
    elif kind == "none_writer":
        w = NoneWriter()
        idx.save(w)
        return w.value()
    elif kind == "short_writer":
        w = ShortWriter()
        idx.save(w)
        return w.value()
    elif kind == "pipe":
        return _pipe_target(idx.save)
    elif kind == "socket":
        a, b = socket.socketpair()
        out = []
        t = threading.Thread(target=lambda: out.append(b.makefile("rb").read()))
        t.start()
        with a.makefile("wb") as f:
            idx.save(f)
        a.close()
        t.join()
        b.close()
        return out[0]
    return p.read_bytes()


WRITERS = ["str", "pathlib", "buffered", "raw", "bytesio", "none_writer", "short_writer",
           "pipe", "socket"]


@pytest.mark.parametrize("kind", WRITERS)
def test_every_writer_writes_the_same_bytes(small, tmp_path, kind):
    idx, blob, _, _ = small
    assert _write_with(kind, idx, tmp_path) == blob


def test_opened_index_saves_the_same_bytes(small, tmp_path):
    """Saving an opened index reads its vectors back from disk: the file it
    writes is byte for byte the one it came from (padding included)."""
    idx, blob, queries, expected = small
    p = tmp_path / "orig.kdx"
    p.write_bytes(blob)
    for backend in ("threads", "pread", "mmap"):
        o = open_quiet(p, backend)
        assert o.to_bytes() == blob
        o.close()


# --------------------------------------------------------------- readers

class ReadOnly:
    """Only read(), a few hundred bytes at a time."""

    def __init__(self, data):
        self.data, self.pos = data, 0

    def read(self, n=-1):
        n = min(n if n >= 0 else len(self.data), 777)
        out = self.data[self.pos:self.pos + n]
        self.pos += len(out)
        return out


class Trickle(io.RawIOBase):
    """readinto() that fills at most 1000 bytes per call."""

    def __init__(self, data):
        self.data, self.pos = data, 0

    def readable(self):
        return True

    def readinto(self, b):
        n = min(len(b), 1000, len(self.data) - self.pos)
        b[:n] = self.data[self.pos:self.pos + n]
        self.pos += n
        return n


def _load_with(kind, blob, tmp_path):
    p = tmp_path / "r.kdx"
    p.write_bytes(blob)
    if kind == "str":
        return kd.load(str(p)), "path"
    if kind == "pathlib":
        return kd.load(p), "path"
    if kind == "bytes":
        return kd.load(blob), "bytes"
    if kind == "bytearray":
        return kd.load(bytearray(blob)), "bytes"
    if kind == "memoryview":
        return kd.load(memoryview(blob)), "bytes"
    if kind == "numpy":
        return kd.load(np.frombuffer(blob, dtype=np.uint8)), "bytes"
    if kind == "mmap":
        with open(p, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            return kd.load(m), "bytes"
    if kind == "buffered":
        with open(p, "rb") as f:
            return kd.load(f), "file"
    if kind == "raw":
        with open(p, "rb", buffering=0) as f:
            return kd.load(f), "file"
    if kind == "bytesio":
        return kd.load(io.BytesIO(blob)), "file"
    if kind == "read_only":
        return kd.load(ReadOnly(blob)), "file"
    if kind == "trickle":
        return kd.load(Trickle(blob)), "file"
    if kind == "pipe":
        r, w = os.pipe()
        t = threading.Thread(target=lambda: (os.write(w, blob), os.close(w)))
        t.start()
        with os.fdopen(r, "rb") as f:
            got = kd.load(f)
        t.join()
        return got, "file"
    if kind == "socket":
        a, b = socket.socketpair()
        t = threading.Thread(target=lambda: (a.sendall(blob), a.close()))
        t.start()
        with b.makefile("rb") as f:
            got = kd.load(f)
        t.join()
        b.close()
        return got, "file"
    raise AssertionError(kind)


READERS = ["str", "pathlib", "bytes", "bytearray", "memoryview", "numpy", "mmap", "buffered",
           "raw", "bytesio", "read_only", "trickle", "pipe", "socket"]


@pytest.mark.parametrize("kind", READERS)
def test_every_reader_loads_the_index(small, tmp_path, kind):
    idx, blob, queries, expected = small
    got, source = _load_with(kind, blob, tmp_path)
    try:
        info = got.info()
        assert info["source"] == source
        assert info["storage"] == "memory" and info["io_backend"] == "memory"
        assert len(got) == len(idx)
        assert_same_results(got.search(queries, 10), expected)
        assert got.verify() is True
        # Loaded indexes are complete in memory: they take more vectors.
        got.add(queries[:2], [10 ** 9, 10 ** 9 + 1])
        assert len(got) == len(idx) + 2
    finally:
        got.close()


def test_source_and_preload_in_info(small, tmp_path):
    idx, blob, _, _ = small
    assert idx.info()["source"] == "new" and idx.info()["preload"] == []
    p = tmp_path / "s.kdx"
    p.write_bytes(blob)
    o = open_quiet(p, "threads", preload=("graph", "ids"))
    assert o.info()["source"] == "path" and o.info()["storage"] == "disk"
    assert o.info()["preload"] == ["graph", "ids"]
    o.close()
    assert pickle.loads(pickle.dumps(idx)).info()["source"] == "bytes"


def test_stream_is_left_after_the_index(small):
    idx, blob, queries, expected = small
    s = io.BytesIO(b"head" + blob + blob + b"tail")
    s.seek(4)
    a = kd.load(s)
    assert s.tell() == 4 + len(blob)
    b = kd.load(s)
    assert s.read() == b"tail"
    for got in (a, b):
        assert_same_results(got.search(queries, 10), expected)
        got.close()


def test_pipe_holding_more_than_the_index(small):
    idx, blob, queries, expected = small
    r, w = os.pipe()
    t = threading.Thread(target=lambda: (os.write(w, blob + b"after"), os.close(w)))
    t.start()
    with os.fdopen(r, "rb", buffering=0) as f:
        got = kd.load(f)
        rest = f.read()
    t.join()
    assert rest == b"after"
    got.close()


@pytest.mark.parametrize("protocol", range(2, pickle.HIGHEST_PROTOCOL + 1))
def test_pickle(small, protocol):
    idx, blob, queries, expected = small
    got = pickle.loads(pickle.dumps(idx, protocol=protocol))
    assert_same_results(got.search(queries, 10), expected)
    got.close()


# ------------------------------------------------------- chunks and the GIL

class Recorder:
    def __init__(self, data=None):
        self.data, self.pos, self.sizes, self.parts = data, 0, [], []

    def write(self, b):
        self.sizes.append(len(b))
        self.parts.append(bytes(b))
        return len(b)

    def readinto(self, b):
        self.sizes.append(len(b))
        n = min(len(b), len(self.data) - self.pos)
        b[:n] = self.data[self.pos:self.pos + n]
        self.pos += n
        return n


def test_chunks_are_large_and_bounded(big):
    idx, blob, q, expected = big
    w = Recorder()
    idx.save(w)
    assert b"".join(w.parts) == blob
    assert max(w.sizes) <= CHUNK
    # Small writes are gathered: a handful of calls per MiB at most.
    assert len(w.sizes) <= len(blob) / (256 << 10), len(w.sizes)
    r = Recorder(blob)
    got = kd.load(r)
    assert max(r.sizes) <= CHUNK
    assert len(r.sizes) <= len(blob) / (256 << 10), len(r.sizes)
    assert_same_results(got.search(q, 5), expected)
    got.close()


@pytest.fixture(scope="module")
def huge():
    """An index of about 135 MB (24 vectors of 2**20 floats: a few graph
    edges, cheap to build), whose load and save take long enough (about
    150 ms and more on a busy 2-core machine) to tell a released GIL from a
    held one."""
    n, d = 24, 1 << 20
    x = np.empty((n, d), dtype=np.float32)
    x[:] = np.random.default_rng(9202).random(d, dtype=np.float32)
    x += np.arange(n, dtype=np.float32)[:, None]
    idx = kd.Index(d, "l2", m=4, ef_construction=8, quantization="8bit")
    idx.add(x)
    blob = idx.to_bytes()
    assert len(blob) > 10 * CHUNK
    q = x[[3, 11]] + 0.25
    expected = idx.search(q, 4, exact=True)
    del x
    yield idx, blob, q, expected
    idx.close()


# Largest share of a call's run during which another thread could not run: a
# call that releases the GIL leaves only scheduling hiccups (a few ms); one
# that holds it scores about 1.
MAX_STALL = 0.25


@pytest.mark.parametrize("how", ["path", "bytes", "file"])
def test_gil_released_while_loading(huge, tmp_path, how):
    """Another thread keeps running all through a load: the core's work runs
    with the GIL released. The file object is a BytesIO, whose readinto() is
    C code: the GIL taken for each 8 MiB chunk is given back right after, and
    no Python bytecode runs during the load that could hand the GIL over by
    itself."""
    idx, blob, q, expected = huge
    p = tmp_path / "gil.kdx"
    p.write_bytes(blob)
    src = {"path": lambda: p, "bytes": lambda: blob, "file": lambda: io.BytesIO(blob)}[how]
    got = kd.load(src())
    assert_same_results(got.search(q, 4, exact=True), expected)
    got.close()
    loaded = []   # closed after the measure: freeing 90 MB is not the load's work
    try:
        stall, took, ticks, _ = gil_stall(lambda: loaded.append(kd.load(src())),
                                          min_seconds=0.05, enough=MAX_STALL)
    finally:
        for got in loaded:
            got.close()
    assert stall < MAX_STALL, (
        "load from %s: another thread was stopped for %.0f%% of the %.3f s load "
        "(%d ticks): the GIL is held" % (how, 100 * stall, took, ticks))


@pytest.mark.parametrize("how", ["path", "file"])
def test_gil_released_while_saving(huge, tmp_path, how):
    """Another thread keeps running all through a save to a path and to a
    BytesIO (its write() is C code: the GIL is taken per 8 MiB chunk only).
    (Not to_bytes(): it copies the finished file into a bytes object with
    the GIL held, about a third of its run.)"""
    idx, blob = huge[0], huge[1]
    target = tmp_path / "gil_save.kdx"
    sink = io.BytesIO()

    def to_file():
        sink.seek(0)
        sink.truncate()
        idx.save(sink)

    fn = {"path": lambda: idx.save(target), "file": to_file}[how]
    stall, took, ticks, _ = gil_stall(fn, min_seconds=0.05, enough=MAX_STALL)
    if how == "path":
        assert target.read_bytes() == blob
    else:
        assert sink.getvalue() == blob
    assert stall < MAX_STALL, (
        "save to %s: another thread was stopped for %.0f%% of the %.3f s save "
        "(%d ticks): the GIL is held" % (how, 100 * stall, took, ticks))


# ----------------------------------------------------- failures pass through

class FailingWriter:
    def __init__(self, after):
        self.after, self.written = after, 0

    def write(self, b):
        if self.written + len(b) > self.after:
            raise BrokenPipeError("the other end went away")
        self.written += len(b)
        return len(b)


def test_writer_exception_passes_through(small):
    idx, blob, queries, expected = small
    for after in (0, 5000, len(blob) // 2, len(blob) - 10):
        with pytest.raises(BrokenPipeError, match="other end"):
            idx.save(FailingWriter(after))
    assert_same_results(idx.search(queries, 10), expected)


class FailingReader(io.RawIOBase):
    def __init__(self, data, after):
        self.data, self.after, self.pos = data, after, 0

    def readable(self):
        return True

    def readinto(self, b):
        if self.pos >= self.after:
            raise ConnectionResetError("peer reset")
        n = min(len(b), self.after - self.pos)
        b[:n] = self.data[self.pos:self.pos + n]
        self.pos += n
        return n


def test_reader_exception_passes_through(small):
    blob = small[1]
    for after in (0, 10, 5000, len(blob) // 2, len(blob) - 1):
        with pytest.raises(ConnectionResetError):
            kd.load(FailingReader(blob, after))


def test_keeping_the_buffer_is_harmless(small):
    """A sink that keeps the memoryview it was given finds it released."""
    idx, blob = small[0], small[1]

    class Keeper:
        views = []

        def write(self, b):
            self.views.append(b)
            return len(b)

    k = Keeper()
    idx.save(k)
    with pytest.raises(ValueError):
        bytes(k.views[0])

    class KeepIn:
        views, pos = [], 0

        def readinto(self, b):
            self.views.append(b)
            n = min(len(b), len(blob) - self.pos)
            b[:n] = blob[self.pos:self.pos + n]
            self.pos += n
            return n

    r = KeepIn()
    kd.load(r).close()
    with pytest.raises(ValueError):
        r.views[0][0]


def test_bad_file_objects(small, tmp_path):
    idx, blob = small[0], small[1]

    class NonBlocking:
        def readinto(self, b):
            return None

    with pytest.raises(OSError):
        kd.load(NonBlocking())

    class TooMuch:
        def read(self, n):
            return b"\0" * (n + 1)

    with pytest.raises(OSError):
        kd.load(TooMuch())

    class Text:
        def read(self, n):
            return "text"

    with pytest.raises(ValueError, match="binary"):
        kd.load(Text())
    p = tmp_path / "t.kdx"
    p.write_bytes(blob)
    with open(p, "r") as f, pytest.raises(TypeError, match="binary"):
        kd.load(f)
    with open(tmp_path / "t.txt", "w") as f, pytest.raises(TypeError):
        idx.save(f)
    for bad in (42, None, object()):
        with pytest.raises(TypeError):
            kd.load(bad)
        with pytest.raises(TypeError):
            idx.save(bad)


def test_save_over_the_file_it_was_opened_from(small, tmp_path):
    idx, blob, queries, expected = small
    p = tmp_path / "self.kdx"
    p.write_bytes(blob)
    o = open_quiet(p, "threads")
    o.remove([10, 11])
    o.save(p)                       # the mapping keeps the old file alive
    assert_same_results(o.search(queries, 10), o.search(queries, 10))
    assert o.verify() is True
    o.close()
    again = kd.load(p)
    assert len(again) == len(idx) - 2
    again.close()
    assert sorted(os.listdir(tmp_path)) == ["self.kdx"]


def test_save_keeps_the_permission_bits(small, tmp_path):
    idx = small[0]
    p = tmp_path / "mode.kdx"
    idx.save(p)
    os.chmod(p, 0o600)
    idx.save(p)
    assert os.stat(p).st_mode & 0o777 == 0o600
