"""Damaged, truncated and foreign files raise ValueError (or OSError), never
crash and never give garbage: truncation at every section boundary and one
byte either side, 200 random byte flips over every checksummed region, and
structural damage that carries valid checksums (caught by the range checks)."""
import io
import struct
import time

import numpy as np
import pytest

import knndirect as kd
from conftest import build, open_quiet, split
from knndirect._container import (BLOCK, HEADER_BYTES, METADATA_OFFSETS, SECTION_IDS,
                                  TAIL_BYTES, fix_checksums, read_layout)

ERRORS = (ValueError, OSError)
VECTORS = SECTION_IDS["vectors"]


def table(blob):
    """[(id, offset, length)] from the file's section table, and the table's
    offset (knndirect._container reads them)."""
    layout = read_layout(blob)
    return [(s.id, s.offset, s.length) for s in layout], layout.table_offset


@pytest.fixture(scope="module")
def small():
    base, queries = split(300, 5, 32, seed=9100)
    idx = build(base, "l2", m=6, ef_construction=40)
    idx.remove([4, 5, 6])
    blob = idx.to_bytes()
    expected = idx.search(queries, 5)
    idx.close()
    return blob, queries, expected


def _all_fail(data, path):
    """Every way in refuses the damaged data."""
    with pytest.raises(ValueError):
        kd.load(data)
    with pytest.raises(ValueError):
        kd.load(io.BytesIO(data))
    path.write_bytes(data)
    with pytest.raises(ValueError):
        kd.load(path)
    with pytest.raises(ERRORS):
        kd.open(path)


def cut_points(blob):
    secs, toff = table(blob)
    tail = len(blob) - TAIL_BYTES
    pts = {0, 1, 7, 8, 9, HEADER_BYTES - 1, HEADER_BYTES, HEADER_BYTES + 1, BLOCK - 1, BLOCK,
           BLOCK + 1, toff - 1, toff, toff + 1, tail - 1, tail, tail + 1, len(blob) - 1}
    for _, off, length in secs:
        end = off + length
        padded = (end + BLOCK - 1) // BLOCK * BLOCK
        for p in (off, end, padded, off + length // 2):
            pts.update((p - 1, p, p + 1))
    return sorted(p for p in pts if 0 <= p < len(blob))


def test_truncated_at_every_section_boundary(small, tmp_path):
    blob = small[0]
    cuts = cut_points(blob)
    assert len(cuts) > 50
    t0 = time.perf_counter()
    for cut in cuts:
        _all_fail(blob[:cut], tmp_path / "cut.kdx")
    assert time.perf_counter() - t0 < 20


def test_extended_file_is_refused(small, tmp_path):
    blob = small[0]
    for extra in (b"\0", b"\0" * BLOCK, blob[-100:]):
        with pytest.raises(ValueError):
            kd.load(blob + extra)
        p = tmp_path / "long.kdx"
        p.write_bytes(blob + extra)
        with pytest.raises(ERRORS):
            kd.open(p)


def flip_regions(blob):
    """Checksummed byte ranges: (name, start, end)."""
    secs, toff = table(blob)
    regions = [("header", 0, HEADER_BYTES), ("table", toff, len(blob))]
    for sid, off, length in secs:
        if length:
            regions.append(("vectors" if sid == VECTORS else "section%d" % sid, off,
                            off + length))
    return regions


def test_random_byte_flips(small, tmp_path):
    blob, queries, expected = small
    rng = np.random.default_rng(9101)
    regions = flip_regions(blob)
    p = tmp_path / "flip.kdx"
    counts = {}
    t0 = time.perf_counter()
    for trial in range(200):
        # A third of the flips in the vectors, the rest over every other region.
        if trial % 3 == 0:
            name, lo, hi = next(r for r in regions if r[0] == "vectors")
        else:
            others = [r for r in regions if r[0] != "vectors"]
            name, lo, hi = others[rng.integers(len(others))]
        pos = int(rng.integers(lo, hi))
        bad = bytearray(blob)
        bad[pos] ^= int(rng.integers(1, 256))
        bad = bytes(bad)
        counts[name] = counts.get(name, 0) + 1
        with pytest.raises(ValueError):
            kd.load(bad)
        p.write_bytes(bad)
        if name == "vectors":
            # Vectors are checked lazily: open works, searches run, verify() fails.
            o = open_quiet(p, "threads", preload=())
            try:
                D, I = o.search(queries, 5)
                assert I.shape == (5, 5)
                with pytest.raises(ValueError, match="vectors"):
                    o.verify()
            finally:
                o.close()
        else:
            with pytest.raises(ERRORS):
                kd.open(p)
    assert counts.get("vectors", 0) >= 60 and len(counts) >= 8, counts
    assert time.perf_counter() - t0 < 20


def test_flips_in_padding_are_harmless(small, tmp_path):
    """Padding between sections carries no data: a damaged pad byte either
    is reported or changes nothing."""
    blob, queries, expected = small
    secs, toff = table(blob)
    pads = [(HEADER_BYTES, BLOCK)]
    for _, off, length in secs:
        end = off + length
        padded = (end + BLOCK - 1) // BLOCK * BLOCK
        if padded > end:
            pads.append((end, padded))
    rng = np.random.default_rng(9102)
    p = tmp_path / "pad.kdx"
    for lo, hi in pads:
        bad = bytearray(blob)
        bad[int(rng.integers(lo, hi))] ^= 0x5A
        p.write_bytes(bytes(bad))
        for opener in (lambda: kd.load(bytes(bad)), lambda: open_quiet(p, "threads")):
            try:
                o = opener()
            except ValueError:
                continue
            D, I = o.search(queries, 5)
            np.testing.assert_array_equal(I, expected[1])
            o.close()


# ------------------------------------------------ damage with valid checksums

def rewrite(blob, section, fn):
    """The file with a section's bytes (by name or id) passed through fn (same
    length) and every checksum fixed: only the structure is wrong."""
    s = read_layout(blob)[section]
    b = bytearray(blob)
    data = bytearray(b[s.offset:s.end])
    fn(data)
    b[s.offset:s.end] = data
    return bytes(fix_checksums(b))


def test_rewrite_helper_keeps_a_valid_file(small):
    blob = small[0]
    same = rewrite(blob, "level0", lambda d: None)
    assert same == blob


def _meta(field, fmt, value):
    """Set one field of the metadata section's struct kd_meta."""
    return lambda d: struct.pack_into(fmt, d, METADATA_OFFSETS[field], value)


STRUCTURAL = {
    "neighbour out of range": ("level0", lambda d: struct.pack_into("<I", d, 4, 300 + 5)),
    "list too long": ("level0", lambda d: struct.pack_into("<I", d, 0, 1000)),
    "level above max": ("levels", lambda d: d.__setitem__(0, 15)),
    "duplicate id": ("ids", lambda d: d.__setitem__(slice(8, 16), d[0:8])),
    "tombstone count": ("tombstones", lambda d: d.__setitem__(0, 1 - d[0] if d[0] <= 1 else 0)),
    "meta dim": ("metadata", _meta("dim", "<I", 33)),
    "meta count": ("metadata", _meta("count", "<Q", 301)),
    "meta huge count": ("metadata", _meta("count", "<Q", 2**31)),
    "meta entry": ("metadata", _meta("entry", "<I", 300)),
    "meta max level": ("metadata", _meta("max_level", "<i", 99)),
    "meta stride": ("metadata", _meta("record_stride", "<I", 64)),
}


@pytest.mark.parametrize("what", sorted(STRUCTURAL))
def test_structural_damage_with_valid_checksums(small, tmp_path, what):
    section, fn = STRUCTURAL[what]
    bad = rewrite(small[0], section, fn)
    assert bad != small[0]
    _all_fail(bad, tmp_path / "structure.kdx")


# ------------------------------------------------------------ foreign files

def test_foreign_files(tmp_path):
    rng = np.random.default_rng(9103)
    samples = [b"", b"K", b"KNNDIRCT", b"KNNDIRCT" + b"\0" * 100, b"\x89PNG\r\n\x1a\n" * 600,
               b"\0" * (1 << 20), rng.integers(0, 256, 70000, dtype=np.uint8).tobytes(),
               b"this is not an index\n" * 1000]
    p = tmp_path / "foreign.kdx"
    for data in samples:
        with pytest.raises(ValueError):
            kd.load(data)
        with pytest.raises(ValueError):
            kd.load(io.BytesIO(data))
        p.write_bytes(data)
        with pytest.raises(ValueError):
            kd.load(p)
        with pytest.raises(ERRORS):
            kd.open(p)


def test_directory_is_refused(tmp_path):
    with pytest.raises(OSError):
        kd.load(tmp_path)
    with pytest.raises(OSError):
        kd.open(tmp_path)
