"""knndirect._container, the Python reader of the index container, against
files the engine writes: the layout it finds, the checksums it computes, and
the ValueError it raises on damaged, truncated and foreign data."""
import io
import struct

import numpy as np
import pytest

import knndirect as kd
from conftest import evict_page_cache
from knndirect import _container as C

BLOCK = 4096
ENGINE_SECTIONS = ["metadata", "ids", "tombstones", "codes", "levels", "level0", "upper",
                   "vectors"]


def _index(dim, n, quant, metric="l2", remove=()):
    rng = np.random.default_rng(dim * 1000 + n)
    idx = kd.Index(dim, metric, m=6, ef_construction=32, quantization=quant)
    if n:
        idx.add(rng.standard_normal((n, dim)).astype(np.float32))
    if remove:
        idx.remove(list(remove))
    return idx


# dims on either side of the record-size steps: 16 B records, powers of two
# below 4 KiB, whole blocks above it.
CASES = [(1, 5, "1bit", "l2"), (7, 40, "4bit", "ip"), (100, 300, "8bit", "cosine"),
         (1024, 20, "1bit", "l2"), (1100, 12, "4bit", "l2"), (16, 0, "1bit", "l2"),
         (200, 50, "1bit+4bit", "cosine"), (384, 30, "1bit", "ip")]


@pytest.fixture(scope="module", params=CASES, ids=lambda c: "d%d-n%d-%s" % c[:3])
def saved(request, tmp_path_factory):
    dim, n, quant, metric = request.param
    idx = _index(dim, n, quant, metric, remove=range(min(3, n)))
    path = tmp_path_factory.mktemp("container") / "i.kdx"
    idx.save(path)
    info = idx.info()
    idx.close()
    return path, path.read_bytes(), info, n


def test_crc32c_known_values():
    assert C.crc32c(b"") == 0
    assert C.crc32c(b"123456789") == 0xE3069283
    assert C.crc32c(b"\0" * 32) == 0x8A9136AA
    rng = np.random.default_rng(5)
    data = rng.integers(0, 256, 200_003, dtype=np.uint8).tobytes()   # the vectorized path
    whole = C.crc32c(data)
    assert C.crc32c(data[77:], C.crc32c(data[:77])) == whole
    assert C.crc32c(memoryview(data)) == whole == C.crc32c(bytearray(data))
    assert C._raw(0xFFFFFFFF, data) ^ 0xFFFFFFFF == whole


def test_layout_of_engine_files(saved):
    path, blob, info, n = saved
    refined = info["quantization"] == "1bit+4bit"
    one_bit = info["quantization"].startswith("1bit")
    names = ENGINE_SECTIONS + ["refinements"] * refined
    for src in (path, str(path), blob, bytearray(blob), memoryview(blob), io.BytesIO(blob)):
        layout = C.read_layout(src)
        assert layout.size == len(blob)
        wide = one_bit and not refined and info["dim"] <= 256  # padded to 512 bits
        assert layout.version == (C.WIDE_FORMAT_VERSION if wide else C.NARROW_FORMAT_VERSION
                                  if one_bit else C.PLAIN_FORMAT_VERSION)
        assert [s.name for s in layout] == names
        assert layout.tail.count == len(layout) == len(names)
    end = BLOCK
    for s in layout:
        assert s.offset % BLOCK == 0 and s.offset >= end, s
        end = s.padded_end
        assert s.name == C.SECTION_NAMES[s.id] and layout[s.id] is s and layout[s.name] is s
    assert end == layout.table_offset
    assert layout.table_offset + 32 * len(layout) + 32 == len(blob)
    # the engine's ids
    assert {s.name: s.id for s in layout} == {
        name: sid for name, sid in C.SECTION_IDS.items() if name in names}


def test_vector_section_holds_count_records(saved):
    path, blob, info, n = saved
    off, length = C.section_range(path, "vectors")
    assert (off, length) == C.section_range(blob, C.SECTION_IDS["vectors"])
    assert length == n * info["record_size"]
    meta = C.read_metadata(path)
    assert meta["count"] == n and meta["dim"] == info["dim"]
    assert meta["record_stride"] == info["record_size"]
    raw = C.read_section(blob, "metadata")
    for field, off in C.METADATA_OFFSETS.items():
        fmt = "<Q" if field in ("count", "live", "seed") else "<i" if field == "max_level" \
            else "<I"
        assert struct.unpack_from(fmt, raw, off)[0] == meta[field], field
    assert C.read_layout(blob)["ids"].length == 8 * n
    assert C.read_layout(blob)["tombstones"].length == n


def test_stored_checksums_match(saved):
    path, blob, info, n = saved
    layout = C.verify_sections(path)
    assert C.read_layout(blob, verify=True) == layout
    for s in layout:
        assert C.section_crc(blob, s.name) == s.crc == C.crc32c(blob[s.offset:s.end])
        assert C.read_section(path, s.name) == blob[s.offset:s.end]
    assert C.crc32c(blob[:60]) == layout.header.crc
    assert C.crc32c(blob[layout.table_offset:-32]) == layout.tail.table_crc


@pytest.fixture(scope="module")
def blob():
    idx = _index(24, 200, "4bit", remove=[1, 2])
    data = idx.to_bytes()
    idx.close()
    return data


@pytest.mark.parametrize("name", ENGINE_SECTIONS)
def test_a_damaged_byte_fails_its_section_check(blob, name, tmp_path):
    layout = C.read_layout(blob)
    s = layout[name]
    bad = bytearray(blob)
    bad[s.offset + s.length // 2] ^= 0x41
    # the layout still reads (the table is intact); the section's check fails
    assert C.read_layout(bytes(bad)) == layout
    assert C.section_crc(bytes(bad), name) != s.crc
    with pytest.raises(ValueError, match=r"section %d \(.*\) is corrupted" % s.id):
        C.verify_sections(bytes(bad))
    with pytest.raises(ValueError, match="corrupted"):
        C.read_layout(bytes(bad), verify=True)
    p = tmp_path / "bad.kdx"
    p.write_bytes(bad)
    with pytest.raises(ValueError, match="corrupted"):
        C.verify_sections(p)
    # only the named ones are checked
    others = [n for n in ENGINE_SECTIONS if n != name]
    assert C.verify_sections(p, others) == layout
    # and the engine agrees
    with pytest.raises(ValueError):
        kd.load(bytes(bad))


@pytest.mark.parametrize("where", ["header", "table", "tail"])
def test_damaged_header_table_or_tail(blob, where):
    layout = C.read_layout(blob)
    pos = {"header": 9, "table": layout.table_offset + 5, "tail": len(blob) - 30}[where]
    bad = bytearray(blob)
    bad[pos] ^= 0x10
    with pytest.raises(ValueError, match="corrupted|truncated"):
        C.read_layout(bytes(bad))


def test_truncated_files(blob):
    layout = C.read_layout(blob)
    cuts = {0, 1, 8, 63, 64, 4095, 4096, layout.table_offset, len(blob) - 32, len(blob) - 1}
    for s in layout:
        cuts.update((s.offset, s.offset + 1, s.end, s.padded_end - 1))
    for cut in sorted(c for c in cuts if c < len(blob)):
        with pytest.raises(ValueError, match="truncated|corrupted|magic"):
            C.read_layout(blob[:cut])


def test_extended_file(blob):
    with pytest.raises(ValueError, match="truncated|corrupted"):
        C.read_layout(blob + b"\0" * 7)


def test_foreign_files(tmp_path):
    rng = np.random.default_rng(11)
    samples = [b"", b"K", b"\x89PNG\r\n\x1a\n" * 600, b"\0" * 70000,
               rng.integers(0, 256, 9000, dtype=np.uint8).tobytes(),
               b"this is not an index\n" * 500]
    for data in samples:
        with pytest.raises(ValueError, match="not a knndirect index"):
            C.read_layout(data)
        p = tmp_path / "foreign"
        p.write_bytes(data)
        with pytest.raises(ValueError, match="not a knndirect index"):
            C.section_range(p, "vectors")
    with pytest.raises(TypeError):
        C.read_layout(12345)


def _refresh(b, layout):
    """Recompute every checksum in place."""
    C.fix_checksums(b)


def test_fix_checksums(blob):
    # an intact file is left as it is
    assert C.fix_checksums(bytearray(blob)) == bytearray(blob)
    # a changed metadata byte: its section's CRC and the table's are redone
    layout = C.read_layout(blob)
    b = bytearray(blob)
    b[layout["metadata"].offset + 30] ^= 0xFF
    with pytest.raises(ValueError, match="metadata"):
        C.verify_sections(bytes(b))
    fixed = bytes(C.fix_checksums(b))
    new = C.verify_sections(fixed)
    assert new["metadata"].crc != layout["metadata"].crc
    assert [s.crc for s in new if s.name != "metadata"] == \
        [s.crc for s in layout if s.name != "metadata"]
    assert fixed[:layout.table_offset] == bytes(b[:layout.table_offset])


def test_structural_errors_with_valid_checksums(blob):
    layout = C.read_layout(blob)
    # a newer format version, header and tail agreeing
    b = bytearray(blob)
    struct.pack_into("<I", b, 8, C.FORMAT_VERSION + 1)
    struct.pack_into("<I", b, len(b) - 16, C.FORMAT_VERSION + 1)
    _refresh(b, layout)
    with pytest.raises(ValueError, match="newer"):
        C.read_layout(bytes(b))
    # header and tail disagree on the version
    b = bytearray(blob)
    struct.pack_into("<I", b, len(b) - 16, C.FORMAT_VERSION + 1)
    with pytest.raises(ValueError, match="footer is corrupted"):
        C.read_layout(bytes(b))
    # a section off its block
    b = bytearray(blob)
    struct.pack_into("<Q", b, layout.entry_offset("codes") + 8, layout["codes"].offset + 8)
    _refresh(b, layout)
    with pytest.raises(ValueError, match="outside the file"):
        C.read_layout(bytes(b))
    # a section twice
    b = bytearray(blob)
    struct.pack_into("<I", b, layout.entry_offset("codes"), C.SECTION_IDS["ids"])
    _refresh(b, layout)
    with pytest.raises(ValueError, match="appears twice"):
        C.read_layout(bytes(b))


def test_missing_section_is_a_key_error(blob):
    layout = C.read_layout(blob)
    with pytest.raises(KeyError, match="no section"):
        layout["nonsense"]
    assert layout.get(99) is None and "vectors" in layout and 8 in layout


def test_layout_of_a_path_leaves_sections_uncached(tmp_path):
    """Reading a path's layout reads the header, table and tail only."""
    pytest.importorskip("ctypes")
    import ctypes
    import os
    idx = _index(256, 2000, "1bit")
    p = tmp_path / "cold.kdx"
    idx.save(p)
    idx.close()
    evict_page_cache(p)
    layout = C.read_layout(p)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    size = layout.size
    page = os.sysconf("SC_PAGE_SIZE")
    fd = os.open(p, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, 1, 1, fd, 0)
        vec = (ctypes.c_ubyte * ((size + page - 1) // page))()
        assert libc.mincore(addr, size, vec) == 0
        libc.munmap(addr, size)
    finally:
        os.close(fd)
    res = np.frombuffer(bytes(vec), np.uint8) & 1
    v = layout["vectors"]
    if res[:1].sum() == 0:
        pytest.skip("this filesystem keeps nothing in the page cache")
    assert res[v.offset // page:(v.end - 1) // page].sum() == 0
