"""knndirect.CorruptIndexError: a truncated, damaged or foreign index file
raises it, whichever way it is read (kd.open of a path; kd.load of a path,
bytes, a seekable file object or a stream of unknown length) or when
Index.verify() finds it; a bad argument raises a plain ValueError that is not
one. CorruptIndexError is a ValueError, so code that caught ValueError for a
damaged file keeps working.

The offsets of the container's parts come from knndirect._container, the
one Python reader of the layout (csrc/format.h)."""
import io
import os
import pickle
import struct

import numpy as np
import pytest

import knndirect as kd
from conftest import build, open_quiet, split, with_version
from knndirect import _container as container

BLOCK = container.BLOCK
HEADER = container.HEADER_BYTES
TAIL = container.TAIL_BYTES
ENTRY = container.ENTRY_BYTES
CorruptIndexError = kd.CorruptIndexError
SECTION_NAMES = container.SECTION_TITLES
crc32c = container.crc32c


def table(blob):
    """([(id, offset, length)], table offset) of a well-formed file."""
    layout = container.read_layout(blob)
    return [(s.id, s.offset, s.length) for s in layout], layout.table_offset


def with_table(blob, fn):
    """The file with its section table entries passed through fn (a list of
    [id, reserved, offset, length, crc, reserved2] lists) and the table's
    checksum fixed: only the table's content is wrong."""
    secs, toff = table(blob)
    rows = [list(struct.unpack_from("<IIQQII", blob, toff + ENTRY * i))
            for i in range(len(secs))]
    fn(rows)
    b = bytearray(blob)
    for i, row in enumerate(rows):
        struct.pack_into("<IIQQII", b, toff + ENTRY * i, *row)
    struct.pack_into("<I", b, len(b) - 20, crc32c(bytes(b[toff:toff + ENTRY * len(rows)])))
    return bytes(b)


def with_section(blob, sid, fn):
    """The file with section sid's bytes passed through fn (same length) and
    every checksum fixed: only the structure is wrong."""
    off, length = section(blob, sid)
    data = bytearray(blob[off:off + length])
    fn(data)
    b = bytearray(blob)
    b[off:off + length] = data
    crc = crc32c(bytes(data))

    def fix(rows):
        next(r for r in rows if r[0] == sid)[4] = crc
    return with_table(bytes(b), fix)


def section(blob, sid):
    secs, _ = table(blob)
    return next((off, length) for s, off, length in secs if s == sid)


@pytest.fixture(scope="module")
def small():
    base, queries = split(300, 5, 32, seed=9300)
    idx = build(base, "l2", m=6, ef_construction=40)
    idx.remove([4, 5, 6])
    blob = idx.to_bytes()
    idx.close()
    secs, _ = table(blob)
    # Every section holds data, and the vectors span several blocks.
    assert all(length > 0 for _, _, length in secs) and len(secs) == 8
    assert section(blob, 8)[1] > 4 * BLOCK
    return blob, queries


class Stream:
    """A binary stream of unknown length (no seek, no readinto): the loader
    cannot tell its size in advance and meets the end as it reads."""

    def __init__(self, data):
        self._f = io.BytesIO(data)

    def read(self, n=-1):
        return self._f.read(min(n, 1000) if n is not None and n >= 0 else n)


def _load_file(path):
    with open(path, "rb") as f:
        return kd.load(f)


def ways(data, path):
    """(name, callable, names the path) for every way in; each raises."""
    path.write_bytes(data)
    return [
        ("open", lambda: open_quiet(path), True),
        ("load(path)", lambda: kd.load(path), True),
        ("load(str)", lambda: kd.load(str(path)), True),
        ("load(bytes)", lambda: kd.load(data), False),
        ("load(memoryview)", lambda: kd.load(memoryview(bytearray(data))), False),
        ("load(BytesIO)", lambda: kd.load(io.BytesIO(data)), False),
        ("load(file)", lambda: _load_file(path), False),
        ("load(stream)", lambda: kd.load(Stream(data)), False),
    ]


class NotCorrupt(AssertionError):
    pass


def corrupt(fn, what=""):
    """fn() raises exactly CorruptIndexError; returns its message."""
    try:
        r = fn()
    except CorruptIndexError as e:
        assert type(e) is CorruptIndexError and isinstance(e, ValueError)
        msg = str(e)
        assert msg and "\n" not in msg, what
        return msg
    except Exception as e:   # noqa: BLE001 - report what was raised instead
        raise NotCorrupt(f"{what}: {type(e).__name__}: {e} (expected CorruptIndexError)") from e
    r.close()
    raise NotCorrupt(f"{what}: the damaged data was accepted")


def problems(data, path, words, what=""):
    """What goes wrong when every way in is tried: each must raise
    CorruptIndexError with one of `words` in its message (and the path, where
    there is one)."""
    out = []
    for name, fn, named in ways(data, path):
        try:
            msg = corrupt(fn, f"{what} {name}")
        except NotCorrupt as e:
            out.append(str(e))
            continue
        # The words must come from the message itself, not from the path
        # it names (a test's tmp_path may contain them).
        low = msg.replace(str(path), "<path>").lower() if path else msg.lower()
        if not any(w in low for w in words):
            out.append(f"{what} {name}: {msg!r} lacks any of {words}")
        elif named and str(path) not in msg:
            out.append(f"{what} {name}: {msg!r} does not name the file")
    return out


def all_corrupt(data, path, words, what=""):
    bad = problems(data, path, words, what)
    assert not bad, "\n".join(bad)


def bad_argument(fn):
    """fn() raises a plain ValueError (not CorruptIndexError); its message."""
    with pytest.raises(ValueError) as ei:
        fn()
    assert not isinstance(ei.value, CorruptIndexError), repr(ei.value)
    return str(ei.value)


# ------------------------------------------------------------- the type

def test_exported_from_the_package():
    assert "CorruptIndexError" in kd.__all__
    assert kd.CorruptIndexError is kd._core.CorruptIndexError
    assert issubclass(kd.CorruptIndexError, ValueError)
    assert not issubclass(ValueError, kd.CorruptIndexError)
    assert kd.CorruptIndexError.__module__ == "knndirect"
    assert kd.CorruptIndexError.__name__ == "CorruptIndexError"
    assert kd.CorruptIndexError.__qualname__ == "CorruptIndexError"
    doc = kd.CorruptIndexError.__doc__
    assert doc and "ValueError" in doc
    from knndirect import CorruptIndexError as again   # noqa: F401
    assert again is kd.CorruptIndexError


def test_pickles_and_round_trips():
    with pytest.raises(CorruptIndexError) as ei:
        kd.load(b"this is not an index")
    e = ei.value
    for proto in range(pickle.HIGHEST_PROTOCOL + 1):
        back = pickle.loads(pickle.dumps(e, protocol=proto))
        assert type(back) is kd.CorruptIndexError
        assert back.args == e.args and str(back) == str(e)
    made = kd.CorruptIndexError("made by hand", 7)
    back = pickle.loads(pickle.dumps(made))
    assert type(back) is kd.CorruptIndexError and back.args == ("made by hand", 7)
    assert pickle.loads(pickle.dumps(kd.CorruptIndexError)) is kd.CorruptIndexError


def test_caught_as_value_error():
    with pytest.raises(ValueError):
        kd.load(b"\0" * 100)
    try:
        kd.load(b"\0" * 100)
    except ValueError as e:
        assert type(e) is kd.CorruptIndexError


# ------------------------------------------------------------- truncation

def cut_points(blob):
    """Every 4 KiB boundary, inside the header, every section (start, middle,
    last byte), the padding, the table and the tail."""
    secs, toff = table(blob)
    pts = set(range(0, len(blob), BLOCK))
    pts.update({1, 5, 7, 8, 9, 32, 63, 64, 65, 1000, BLOCK - 1, BLOCK + 1,
                toff + 1, toff + ENTRY * 3 + 5, toff + ENTRY * len(secs) - 1,
                len(blob) - TAIL, len(blob) - TAIL + 1, len(blob) - 16, len(blob) - 1})
    for _, off, length in secs:
        pts.update({off + 1, off + length // 2 + 3, off + length - 1, off + length + 1})
    return sorted(p for p in pts if 0 <= p < len(blob))


def test_truncated_everywhere(small, tmp_path):
    blob = small[0]
    cuts = cut_points(blob)
    assert len(cuts) > 50
    for cut in cuts:
        words = ("truncated",) if cut >= 8 else ("truncated", "not a knndirect index")
        all_corrupt(blob[:cut], tmp_path / "cut.kdx", words, f"cut at {cut}:")


def test_truncated_stream_names_the_section(small):
    """Read as a stream of unknown length, the data ends inside a section:
    the message says which one and where."""
    blob = small[0]
    for sid, off, length in table(blob)[0]:
        cut = off + length // 2 + 1
        msg = corrupt(lambda: kd.load(Stream(blob[:cut])), f"section {sid}")
        assert "truncated" in msg and SECTION_NAMES[sid] in msg, msg
        assert str(cut) in msg, msg


def test_truncated_header_says_where(small):
    blob = small[0]
    for cut in (3, 8, 40, 63):
        msg = corrupt(lambda: kd.load(blob[:cut]), f"cut {cut}")
        assert "truncated" in msg and "header" in msg and str(cut) in msg, msg


def test_data_after_the_end(small, tmp_path):
    """More data after the tail: whole sources (a path, bytes) refuse it; a
    file object is a stream that may go on, and is left just past the index."""
    blob = small[0]
    p = tmp_path / "long.kdx"
    for extra in (b"\0", b"x" * BLOCK, blob[-100:]):
        msg = corrupt(lambda: kd.load(blob + extra), "load(bytes)")
        assert "after the end" in msg, msg
        p.write_bytes(blob + extra)
        msg = corrupt(lambda: kd.load(p), "load(path)")
        assert "after the end" in msg and str(p) in msg, msg
        msg = corrupt(lambda: open_quiet(p), "open")
        assert str(p) in msg and ("footer" in msg or "corrupt" in msg), msg
        f = io.BytesIO(blob + extra)
        kd.load(f).close()
        assert f.tell() == len(blob)


# ------------------------------------------------------------- bit flips

def flipped(blob, pos, mask):
    b = bytearray(blob)
    b[pos] ^= mask
    return bytes(b)


def flip_points(blob):
    """(region, section id or None, byte offset) over every checksummed part."""
    secs, toff = table(blob)
    pts = [("header", None, p) for p in (0, 7, 8, 12, 20, HEADER - 4, HEADER - 1)]
    for sid, off, length in secs:
        for p in sorted({off, off + 1, off + length // 3, off + length // 2, off + length - 1}):
            pts.append((SECTION_NAMES[sid], sid, p))
    for i in range(len(secs)):
        for field in (0, 8, 16, 24):   # id, offset, length, checksum
            pts.append(("table", None, toff + ENTRY * i + field))
    tail = len(blob) - TAIL
    pts += [("tail", None, tail + f) for f in (0, 3, 8, 12, 16, 20, 24, 31)]
    return pts


FLIP_WORDS = ("corrupt", "not a knndirect index", "truncated", "inconsistent")
FLIP_REGIONS = ["header", "metadata", "ids", "tombstones", "codes", "graph levels",
                "graph level 0", "graph upper levels", "table", "tail"]


@pytest.mark.parametrize("region", FLIP_REGIONS)
def test_bit_flips_refused_at_open_and_load(small, tmp_path, region):
    """A flipped bit (low or high) at the edges and in the middle of every
    part but the vectors: open and every load refuse the file."""
    blob = small[0]
    pts = [(pos, mask) for r, _, pos in flip_points(blob) if r == region for mask in (1, 0x80)]
    assert len(pts) >= 10
    bad = []
    for pos, mask in pts:
        bad += problems(flipped(blob, pos, mask), tmp_path / "flip.kdx", FLIP_WORDS,
                        f"{region} byte {pos} ^ {mask:#x}:")
    assert not bad, f"{len(bad)} of {len(pts) * 8} attempts:\n" + "\n".join(bad)


def test_checksum_mismatch_names_the_section(small, tmp_path):
    """A flip that breaks nothing but the checksum (a code; the last bytes of
    the metadata, in the quantizer's ranges) is reported with the section's
    name and, where there is one, the path."""
    blob = small[0]
    p = tmp_path / "named.kdx"
    for sid in (1, 4):
        off, length = section(blob, sid)
        bad = flipped(blob, off + length - 1, 0x01)
        p.write_bytes(bad)
        for name, fn, named in (("open", lambda: open_quiet(p), True),
                                ("load(path)", lambda: kd.load(p), True),
                                ("load(bytes)", lambda: kd.load(bad), False)):
            msg = corrupt(fn, name)
            assert "checksum" in msg and SECTION_NAMES[sid] in msg, (name, msg)
            if named:
                assert str(p) in msg, (name, msg)


def test_header_and_tail_messages(small):
    blob = small[0]
    msg = corrupt(lambda: kd.load(flipped(blob, 0, 0x20)))
    assert "not a knndirect index" in msg and "magic" in msg, msg
    msg = corrupt(lambda: kd.load(flipped(blob, 20, 0x01)))
    assert "header" in msg and "checksum" in msg, msg
    msg = corrupt(lambda: kd.load(flipped(blob, len(blob) - 1, 0x01)))
    assert "footer" in msg or "truncated" in msg, msg
    _, toff = table(blob)
    msg = corrupt(lambda: kd.load(flipped(blob, toff + 9, 0x01)))
    assert "footer" in msg or "section table" in msg, msg


def test_vector_flips_found_by_verify(small, tmp_path):
    """Vectors are read lazily by an opened index: open works, verify() finds
    the damage and names the section and the file; every load refuses it."""
    blob, queries = small
    off, length = section(blob, 8)
    p = tmp_path / "vec.kdx"
    for pos in (off, off + 1, off + length // 2, off + length - 1):
        bad = flipped(blob, pos, 0x10)
        for name, fn, _ in ways(bad, p)[1:]:
            corrupt(fn, f"vectors byte {pos} {name}")
        o = open_quiet(p, preload=())
        try:
            D, I = o.search(queries, 5)
            assert I.shape == (5, 5)
            with pytest.raises(CorruptIndexError) as ei:
                o.verify()
            assert type(ei.value) is CorruptIndexError
            msg = str(ei.value)
            assert "vectors" in msg and "checksum" in msg and str(p) in msg, msg
        finally:
            o.close()


def _damage_in_place(path, pos, mask):
    fd = os.open(path, os.O_RDWR)
    try:
        b = os.pread(fd, 1, pos)
        os.pwrite(fd, bytes([b[0] ^ mask]), pos)
    finally:
        os.close(fd)


@pytest.mark.parametrize("sid", [1, 2, 3, 4, 5, 6, 7])
def test_verify_finds_damage_after_open(small, tmp_path, sid):
    """The file is damaged while an index has it open: verify() reports the
    section by name, with the path."""
    blob = small[0]
    p = tmp_path / "live.kdx"
    p.write_bytes(blob)
    o = open_quiet(p)
    try:
        assert o.verify() is True
        off, length = section(blob, sid)
        _damage_in_place(p, off + length - 1, 0x04)
        with pytest.raises(CorruptIndexError) as ei:
            o.verify()
        msg = str(ei.value)
        assert SECTION_NAMES[sid] in msg and "checksum" in msg and str(p) in msg, msg
    finally:
        o.close()


def test_verify_finds_a_damaged_table_after_open(small, tmp_path):
    blob = small[0]
    _, toff = table(blob)
    p = tmp_path / "live.kdx"
    p.write_bytes(blob)
    o = open_quiet(p)
    try:
        _damage_in_place(p, toff + 2 * ENTRY + 8, 0x01)
        with pytest.raises(CorruptIndexError) as ei:
            o.verify()
        assert "footer" in str(ei.value) and str(p) in str(ei.value)
    finally:
        o.close()


def test_loaded_index_verifies(small):
    idx = kd.load(small[0])
    try:
        assert idx.verify() is True
    finally:
        idx.close()


# ------------------------------------------- damage with valid checksums

def _swap_first_two(rows):
    rows[0], rows[1] = rows[1], rows[0]


TABLE_DAMAGE = {
    "offset off the block grid": lambda rows: rows[2].__setitem__(2, rows[2][2] + 8),
    "section past the table": lambda rows: rows[7].__setitem__(3, rows[7][3] + 10 * BLOCK),
    "section twice": lambda rows: rows[3].__setitem__(0, 2),
    "sections out of order": _swap_first_two,
    "reserved field set": lambda rows: rows[4].__setitem__(1, 1),
}


@pytest.mark.parametrize("name", sorted(TABLE_DAMAGE))
def test_inconsistent_section_table(small, tmp_path, name):
    """A section table that checks out but describes another file."""
    bad = with_table(small[0], TABLE_DAMAGE[name])
    all_corrupt(bad, tmp_path / "table.kdx", ("corrupt", "section", "truncated"), name + ":")


def test_tail_pointing_elsewhere(small, tmp_path):
    blob = small[0]
    b = bytearray(blob)
    struct.pack_into("<Q", b, len(b) - TAIL, table(blob)[1] - BLOCK)
    all_corrupt(bytes(b), tmp_path / "tail.kdx", ("footer",), "table offset:")
    b = bytearray(blob)
    header_version = struct.unpack_from("<I", blob, 8)[0]
    struct.pack_into("<I", b, len(b) - 16, header_version + 1)  # unlike the header's
    all_corrupt(bytes(b), tmp_path / "tail.kdx", ("footer",), "tail version:")


# The structure behind valid checksums, checked by the index itself (these
# need csrc/index.c to report -KD_ECORRUPT from its structure checks).
def duplicate_live_id(ids_section):
    """The id of one live row written over another's (rows lie in centre
    order, so which rows hold the removed ids 4, 5 and 6 is looked up)."""
    ids = np.frombuffer(bytes(ids_section[:8 * 300]), "<i8")
    a, b = (int(r) for r in np.flatnonzero(~np.isin(ids, [4, 5, 6]))[:2])
    ids_section[8 * b:8 * b + 8] = ids_section[8 * a:8 * a + 8]


STRUCTURE = {
    "metadata: dim": (1, lambda d: struct.pack_into("<I", d, 0, 33)),
    "ids: duplicate": (2, lambda d: duplicate_live_id(d)),
    "graph levels: above max": (5, lambda d: d.__setitem__(0, 15)),
    "graph level 0: list too long": (6, lambda d: struct.pack_into("<I", d, 0, 1000)),
    "graph level 0: neighbour out of range": (6, lambda d: struct.pack_into("<I", d, 4, 305)),
}


@pytest.mark.parametrize("name", sorted(STRUCTURE))
def test_structure_behind_valid_checksums(small, tmp_path, name):
    sid, fn = STRUCTURE[name]
    bad = with_section(small[0], sid, fn)
    all_corrupt(bad, tmp_path / "structure.kdx", ("corrupt", "inconsistent"), name + ":")


def test_section_helpers_keep_a_valid_file(small):
    blob = small[0]
    assert with_section(blob, 6, lambda d: None) == blob
    assert with_table(blob, lambda rows: None) == blob
    assert with_version(blob, struct.unpack_from("<I", blob, 8)[0]) == blob


# ------------------------------------------------------------- foreign files

def _foreign():
    rng = np.random.default_rng(9301)
    files = {"empty": b""}
    for n in (1, 7, 8, 63, 64, 100, BLOCK - 1, BLOCK, BLOCK + TAIL, 3 * BLOCK + 17, 70000):
        data = bytearray(rng.integers(0, 256, n, dtype=np.uint8).tobytes())
        if data[:1] == b"K":
            data[0] = 0
        files[f"random {n}"] = bytes(data)
    tail = rng.integers(0, 256, 6000, dtype=np.uint8).tobytes()
    files["png"] = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR" + tail
    files["zip"] = b"PK\x03\x04\x14\0\0\0\x08\0" + tail
    files["text"] = ("knndirect is a library for nearest neighbours.\n" * 200).encode()
    files["zeros"] = b"\0" * (2 * BLOCK + TAIL)
    files["npy"] = b"\x93NUMPY\x01\0v\0" + tail
    return files


FOREIGN = _foreign()


@pytest.mark.parametrize("name", sorted(FOREIGN))
def test_foreign_file(name, tmp_path):
    data = FOREIGN[name]
    words = ("not a knndirect index",)
    all_corrupt(data, tmp_path / "foreign.kdx", words, name + ":")


def test_own_magic_then_garbage(tmp_path):
    """Our magic number, then no valid header: damage, not a foreign file."""
    rng = np.random.default_rng(9302)
    data = b"KNNDIRCT" + rng.integers(0, 256, 3 * BLOCK, dtype=np.uint8).tobytes()
    all_corrupt(data, tmp_path / "magic.kdx", ("corrupt", "truncated"), "magic + garbage:")


# ------------------------------------------------------------- not damage

def test_bad_arguments_are_plain_value_errors(small, tmp_path):
    blob, queries = small
    bad_argument(lambda: kd.Index(0))
    bad_argument(lambda: kd.Index(8, metric="nope"))
    bad_argument(lambda: kd.Index(8, m=300))          # refused by the core
    bad_argument(lambda: kd.Index(8, quantization="7bit"))
    p = tmp_path / "good.kdx"
    p.write_bytes(blob)
    bad_argument(lambda: kd.open(p, io_backend="bogus"))
    bad_argument(lambda: kd.open(p, preload=("nothing",)))


    class Text:
        """A file object that hands back str: refused by the core as misuse."""

        def read(self, n=-1):
            return "text, not bytes"

    msg = bad_argument(lambda: kd.load(Text()))
    assert "binary" in msg, msg
    for idx in (kd.load(blob), open_quiet(p)):
        try:
            bad_argument(lambda: idx.search(np.zeros((1, 5), np.float32), 3))
            bad_argument(lambda: idx.search(queries, 0))
            bad_argument(lambda: idx.search(np.full((1, 32), np.nan, np.float32), 3))
        finally:
            idx.close()
    bad_argument(lambda: idx.search(queries, 3))      # closed


def test_open_of_a_pipe_is_a_bad_argument(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    msg = bad_argument(lambda: kd.open(fifo))
    assert "regular file" in msg


def test_newer_version_is_not_damage(small, tmp_path):
    """A file from a newer knndirect is intact: a plain ValueError naming the
    versions, not CorruptIndexError."""
    current = kd.features()["format_version"]
    bad = with_version(small[0], current + 1)
    p = tmp_path / "newer.kdx"
    p.write_bytes(bad)
    for fn in (lambda: kd.open(p), lambda: kd.load(p), lambda: kd.load(bad),
               lambda: kd.load(io.BytesIO(bad))):
        msg = bad_argument(fn)
        assert "newer" in msg and "version %d" % (current + 1) in msg, msg


def test_io_errors_stay_os_errors(tmp_path):
    missing = tmp_path / "missing.kdx"
    for fn in (lambda: kd.open(missing), lambda: kd.load(missing)):
        with pytest.raises(FileNotFoundError):
            fn()
    with pytest.raises(IsADirectoryError):
        kd.load(tmp_path)

    class Failing(io.RawIOBase):
        def readable(self):
            return True

        def readinto(self, b):
            raise OSError(5, "the disk is gone")

    with pytest.raises(OSError) as ei:
        kd.load(Failing())
    assert not isinstance(ei.value, ValueError)


def test_intact_file_still_loads(small, tmp_path):
    blob, queries = small
    p = tmp_path / "good.kdx"
    p.write_bytes(blob)
    want = kd.load(blob).search(queries, 5)
    for _, fn, _ in ways(blob, p):
        idx = fn()
        try:
            D, I = idx.search(queries, 5)
            np.testing.assert_array_equal(I, want[1])
            if idx.info()["storage"] == "disk":
                assert idx.verify() is True
        finally:
            idx.close()
