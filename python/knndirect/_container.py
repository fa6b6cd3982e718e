"""The index container, read from Python: header, section table and tail.

An index file (csrc/format.h) is little-endian:

    [header: magic "KNNDIRCT", version u32, block size u32, zeros, CRC-32C u32]
        64 bytes, padded to the first 4 KiB block
    [section][pad to 4 KiB] ... one per section, in the order they were written
    [section table: 32 bytes an entry: id u32, reserved u32, offset u64,
        length u64, CRC-32C u32, reserved u32]
    [tail, 32 bytes: table offset u64, count u32, table CRC-32C u32,
        version u32, reserved u32, magic "KNNDEND1"]

This module is for tests, benchmarks and tools (the engine has its own reader
in C): it finds the sections and checks checksums, with the same rules as
kd_container_parse, and raises CorruptIndexError (a ValueError) on anything
that is not a whole, well-formed container (a plain ValueError for a format
version it does not know, as the engine does). Reading the layout of a path
reads only its header, table and tail, with read-ahead off: the sections
stay out of the page cache.

    layout = read_layout("index.kdx")          # or bytes, or any buffer
    off, length = layout["vectors"].offset, layout["vectors"].length
    off, length = section_range("index.kdx", "vectors")
    verify_sections("index.kdx")               # ValueError naming a bad section

Standard library and numpy only.
"""
from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from typing import Dict, Iterator, Optional, Tuple, Union

import numpy as np

from ._core import CorruptIndexError

__all__ = [
    "BLOCK", "HEADER_BYTES", "TAIL_BYTES", "ENTRY_BYTES", "MAGIC", "TAIL_MAGIC",
    "HEADER_CRC_AT", "ENTRY_CRC_AT", "TAIL_CRC_AT", "FORMAT_VERSION", "MIN_FORMAT_VERSION",
    "PLAIN_FORMAT_VERSION",
    "MAX_SECTIONS", "SECTION_IDS", "SECTION_NAMES", "SECTION_TITLES", "METADATA_FIELDS",
    "METADATA_OFFSETS", "Header", "Tail", "Section", "Layout", "crc32c", "read_layout",
    "section_range", "read_section", "section_crc", "verify_sections", "read_metadata",
    "fix_checksums", "append_calibration",
]

BLOCK = 4096
HEADER_BYTES = 64
TAIL_BYTES = 32
ENTRY_BYTES = 32
MAGIC = b"KNNDIRCT"
TAIL_MAGIC = b"KNNDEND1"
# Where the checksums sit: in the header, in a table entry, in the tail.
HEADER_CRC_AT = HEADER_BYTES - 4
ENTRY_CRC_AT = 24
TAIL_CRC_AT = 12
FORMAT_VERSION = 5          # the newest version this reader knows
PLAIN_FORMAT_VERSION = 2    # what a file with scalar codes is written as
NARROW_FORMAT_VERSION = 4   # 1-bit codes of dim rounded up to 64 bits
WIDE_FORMAT_VERSION = 5     # 1-bit codes of 256 dims or fewer, padded to 512 bits
MIN_FORMAT_VERSION = 1
MAX_SECTIONS = 16

_HEADER = struct.Struct("<8sII")            # magic, version, block size
_ENTRY = struct.Struct("<IIQQII")           # id, reserved, offset, length, crc, reserved
_TAIL = struct.Struct("<QIIII8s")           # table offset, count, table crc, version, 0, magic

# Section ids (enum kd_section_id), with short names for lookups and the
# engine's own names for messages.
SECTION_IDS = {"metadata": 1, "ids": 2, "tombstones": 3, "codes": 4, "levels": 5,
               "level0": 6, "upper": 7, "vectors": 8, "calibration": 9, "refinements": 10}
SECTION_NAMES = {v: k for k, v in SECTION_IDS.items()}
SECTION_TITLES = {1: "metadata", 2: "ids", 3: "tombstones", 4: "codes", 5: "graph levels",
                  6: "graph level 0", 7: "graph upper levels", 8: "vectors", 9: "calibration",
                  10: "refinements"}

# struct kd_meta, the start of the metadata section (centres, rotation signs
# and scalar-quantizer ranges follow it).
METADATA_FIELDS = ("dim", "metric", "quantization", "m", "m0", "ef_construction", "pdim",
                   "code_size", "record_stride", "record_bytes", "entry", "max_level",
                   "count", "live", "seed", "ncentres", "calib_bytes")
_META_CODES = "IIIIIIIIIIIiQQQII"
_META = struct.Struct("<" + _META_CODES)
METADATA_OFFSETS = {f: struct.calcsize("<" + _META_CODES[:i])
                    for i, f in enumerate(METADATA_FIELDS)}


# ---------------------------------------------------------------- CRC-32C

def _make_table():
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_TABLE = _make_table()
_NP_TABLE = np.array(_TABLE, dtype=np.uint32)
_LANES = 1024               # independent streams of the vectorized path
_VECTOR_FROM = 1 << 16      # below this many bytes, the plain loop


def _raw(reg, data):
    """The CRC register after `data`, without the pre- and post-inversion."""
    t = _TABLE
    for b in data:
        reg = t[(reg ^ b) & 0xFF] ^ (reg >> 8)
    return reg


def _apply(mat, vec):
    """A 32x32 GF(2) matrix (32 column words) times a 32-bit vector."""
    out, i = 0, 0
    while vec:
        if vec & 1:
            out ^= mat[i]
        vec >>= 1
        i += 1
    return out


def _zeros_operator(n):
    """The matrix that advances a register over n zero bytes."""
    one = [_raw(1 << j, b"\0") for j in range(32)]      # one zero byte
    result = [1 << j for j in range(32)]                # identity
    while n:
        if n & 1:
            result = [_apply(one, c) for c in result]
        n >>= 1
        if n:
            one = [_apply(one, c) for c in one]
    return result


def _raw_lanes(data, reg):
    """_raw over a long buffer: _LANES equal chunks advanced side by side with
    numpy (each from a zero register), then chained. CRC is linear:
    raw(r, A + B) = zeros(|B|) r ^ raw(0, B)."""
    arr = np.frombuffer(data, dtype=np.uint8)
    chunk = len(arr) // _LANES
    lanes = arr[:chunk * _LANES].reshape(_LANES, chunk)
    regs = np.zeros(_LANES, dtype=np.uint32)
    for j in range(chunk):
        regs = _NP_TABLE[(regs ^ lanes[:, j]) & 0xFF] ^ (regs >> np.uint32(8))
    shift = _zeros_operator(chunk)
    for r in regs.tolist():
        reg = _apply(shift, reg) ^ r
    return _raw(reg, arr[chunk * _LANES:].tobytes())


def crc32c(data, crc=0):
    """CRC-32C (Castagnoli) of bytes or any buffer, as the engine computes it;
    `crc` continues an earlier value (crc32c(b, crc32c(a)) == crc32c(a + b))."""
    mv = memoryview(data).cast("B")
    reg = crc ^ 0xFFFFFFFF
    if len(mv) >= _VECTOR_FROM:
        reg = _raw_lanes(mv, reg)
    else:
        reg = _raw(reg, mv.tobytes())
    return reg ^ 0xFFFFFFFF


# ---------------------------------------------------------------- layout

@dataclass(frozen=True)
class Header:
    version: int
    block: int
    crc: int


@dataclass(frozen=True)
class Tail:
    table_offset: int
    count: int
    table_crc: int
    version: int


@dataclass(frozen=True)
class Section:
    id: int
    name: str               # short name ("vectors", "level0", ...) or "section<id>"
    offset: int
    length: int
    crc: int                # as stored in the table
    index: int              # position in the table

    @property
    def end(self):
        return self.offset + self.length

    @property
    def padded_end(self):
        """End of the section's last block."""
        return -(-self.end // BLOCK) * BLOCK

    @property
    def title(self):
        return SECTION_TITLES.get(self.id, "unknown")


@dataclass(frozen=True)
class Layout:
    size: int
    header: Header
    tail: Tail
    sections: Tuple[Section, ...]

    @property
    def version(self):
        return self.header.version

    @property
    def table_offset(self):
        return self.tail.table_offset

    def entry_offset(self, key):
        """File offset of a section's table entry (its CRC is at +24)."""
        return self.tail.table_offset + ENTRY_BYTES * self[key].index

    @property
    def by_name(self) -> Dict[str, Section]:
        return {s.name: s for s in self.sections}

    def __getitem__(self, key):
        s = self.get(key)
        if s is None:
            raise KeyError(f"no section {key!r} in the index (it has "
                           f"{', '.join(s.name for s in self.sections)})")
        return s

    def get(self, key, default=None) -> Optional[Section]:
        sid = key if isinstance(key, int) else SECTION_IDS.get(key)
        for s in self.sections:
            if s.id == sid or (sid is None and s.name == key):
                return s
        return default

    def __contains__(self, key):
        return self.get(key) is not None

    def __iter__(self) -> Iterator[Section]:
        return iter(self.sections)

    def __len__(self):
        return len(self.sections)


Source = Union[str, "os.PathLike[str]", bytes, bytearray, memoryview]


class _Reader:
    """Positional reads from a path, a binary file object or a buffer."""

    def __init__(self, src):
        self.f = self.buf = None
        self.own = False
        if isinstance(src, (str, os.PathLike)):
            self.f = open(src, "rb", buffering=0)
            self.own = True
            try:   # read-ahead off: reading the layout pulls no section into the cache
                os.posix_fadvise(self.f.fileno(), 0, 0, os.POSIX_FADV_RANDOM)
            except (AttributeError, OSError):
                pass
            self.size = os.fstat(self.f.fileno()).st_size
        elif hasattr(src, "read") and hasattr(src, "seek"):
            self.f = src
            self.size = src.seek(0, os.SEEK_END)
        else:
            try:
                self.buf = memoryview(src).cast("B")
            except TypeError:
                raise TypeError("expected a path, a binary file or a bytes-like object, got "
                                f"{type(src).__name__}") from None
            self.size = len(self.buf)

    def read(self, offset, n):
        if self.buf is not None:
            return self.buf[offset:offset + n]
        self.f.seek(offset)
        out = bytearray()
        while len(out) < n:
            piece = self.f.read(min(n - len(out), 8 << 20))
            if not piece:
                break
            out += piece
        return memoryview(bytes(out))

    def chunks(self, offset, n, size=8 << 20):
        for at in range(offset, offset + n, size):
            yield self.read(at, min(size, offset + n - at))

    def close(self):
        if self.own:
            self.f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _fail(msg):
    raise CorruptIndexError(msg)


def _parse(r: _Reader) -> Layout:
    size = r.size
    head = bytes(r.read(0, HEADER_BYTES))
    if len(head) < 8 or head[:8] != MAGIC:
        _fail("not a knndirect index (bad magic number)")
    if len(head) < HEADER_BYTES:
        _fail(f"index data is truncated ({size} bytes)")
    _, version, block = _HEADER.unpack_from(head)
    hcrc = struct.unpack_from("<I", head, HEADER_CRC_AT)[0]
    if crc32c(head[:HEADER_CRC_AT]) != hcrc:
        _fail("index header is corrupted (checksum mismatch)")
    if version > FORMAT_VERSION:
        raise ValueError(f"index format version {version} is newer than this reader knows "
                         f"(version {FORMAT_VERSION})")
    if version < MIN_FORMAT_VERSION:
        raise ValueError(f"index format version {version} is not supported (this reader "
                         f"knows versions {MIN_FORMAT_VERSION} to {FORMAT_VERSION})")
    if block != BLOCK:
        _fail(f"index header is corrupted (block size {block})")
    if size < BLOCK + TAIL_BYTES:
        _fail(f"index file is truncated ({size} bytes)")
    toff, n, tcrc, tversion, reserved, tmagic = _TAIL.unpack(bytes(r.read(size - TAIL_BYTES,
                                                                          TAIL_BYTES)))
    if tmagic != TAIL_MAGIC:
        _fail("index file is truncated or corrupted (no footer)")
    if tversion != version or reserved != 0:
        _fail(f"index footer is corrupted (version {tversion}, header says {version})")
    if n == 0 or n > MAX_SECTIONS:
        _fail("index footer is corrupted (bad section table)")
    if toff < BLOCK or toff % BLOCK or toff + n * ENTRY_BYTES != size - TAIL_BYTES:
        _fail("index footer is corrupted (bad section table)")
    table = bytes(r.read(toff, n * ENTRY_BYTES))
    if crc32c(table) != tcrc:
        _fail("index footer is corrupted (checksum mismatch)")
    sections, end, seen = [], BLOCK, set()
    for i in range(n):
        sid, _, off, length, crc, _ = _ENTRY.unpack_from(table, ENTRY_BYTES * i)
        # Sections follow each other in order, each on blocks of its own.
        if off % BLOCK or off < end or off > toff or length > toff - off:
            _fail(f"index section {sid} lies outside the file")
        if sid in seen:
            _fail(f"index section {sid} appears twice")
        seen.add(sid)
        end = -(-(off + length) // BLOCK) * BLOCK
        sections.append(Section(sid, SECTION_NAMES.get(sid, f"section{sid}"), off, length,
                                crc, i))
    return Layout(size, Header(version, block, hcrc), Tail(toff, n, tcrc, tversion),
                  tuple(sections))


def read_layout(src: Source, *, verify: bool = False) -> Layout:
    """Header, tail and section table of an index: a path, a binary file
    object (seekable) or bytes / any buffer. The header's and the table's
    checksums are always checked; with verify=True every section's too.
    ValueError when the data is not a whole, well-formed index."""
    with _Reader(src) as r:
        layout = _parse(r)
        if verify:
            _verify(r, layout, None)
    return layout


def section_range(src: Source, name) -> Tuple[int, int]:
    """(offset, length) of one section, by short name or id."""
    s = read_layout(src)[name]
    return s.offset, s.length


def read_section(src: Source, name) -> bytes:
    """One section's bytes (not checked against its CRC)."""
    with _Reader(src) as r:
        s = _parse(r)[name]
        return bytes(r.read(s.offset, s.length))


def section_crc(src: Source, name) -> int:
    """The CRC-32C of a section's bytes as they are now."""
    with _Reader(src) as r:
        s = _parse(r)[name]
        return _crc_of(r, s)


def _crc_of(r, s):
    crc = 0
    for piece in r.chunks(s.offset, s.length):
        crc = crc32c(piece, crc)
    return crc


def _verify(r, layout, names):
    for s in layout.sections:
        if names is not None and s.name not in names and s.id not in names:
            continue
        if _crc_of(r, s) != s.crc:
            _fail(f"index section {s.id} ({s.title}) is corrupted (checksum mismatch)")


def verify_sections(src: Source, names=None) -> Layout:
    """Check the stored CRC of every section (or of those named) against its
    bytes; ValueError naming the first that differs. Returns the layout."""
    with _Reader(src) as r:
        layout = _parse(r)
        _verify(r, layout, None if names is None else set(names))
    return layout


def read_metadata(src: Source) -> Dict[str, int]:
    """The fixed part of the metadata section (struct kd_meta), by field."""
    with _Reader(src) as r:
        s = _parse(r)["metadata"]
        if s.length < _META.size:
            _fail("index metadata is missing or short")
        return dict(zip(METADATA_FIELDS, _META.unpack(bytes(r.read(s.offset, _META.size)))))


def fix_checksums(buf: bytearray) -> bytearray:
    """Recompute, in place, every checksum of a container whose bytes were
    changed on purpose (tests that damage the structure, not the checksums):
    each section's CRC in the table, the table's in the tail, the header's.
    The table is found through the tail without checking anything else; a
    section that lies outside buf keeps its stored CRC. Returns buf."""
    size = len(buf)
    tail = size - TAIL_BYTES
    toff, n = struct.unpack_from("<QI", buf, tail)
    n = min(n, max(0, (tail - toff) // ENTRY_BYTES)) if toff <= tail else 0
    for i in range(n):
        at = toff + ENTRY_BYTES * i
        _, _, off, length, _, _ = _ENTRY.unpack_from(buf, at)
        if off + length <= size:
            struct.pack_into("<I", buf, at + ENTRY_CRC_AT, crc32c(buf[off:off + length]))
    if toff <= tail:
        struct.pack_into("<I", buf, tail + TAIL_CRC_AT, crc32c(buf[toff:tail]))
    struct.pack_into("<I", buf, HEADER_CRC_AT, crc32c(buf[:HEADER_CRC_AT]))
    return buf


def append_calibration(path, data: bytes) -> None:
    """Give an index file (format 2, without one) the calibration section:
    in place, changing only the metadata's calib_bytes and the file's end
    (the new section, the table, the tail) and their checksums, then fsync.
    Not atomic: only for a file nothing reads yet (a merge's output before
    the collection takes it), which a crash leaves as a detectably damaged
    file outside every commit."""
    layout = read_layout(path)
    if layout.version < 2 or "calibration" in layout or not data:
        raise ValueError(f"{path}: cannot take a calibration section (format "
                         f"{layout.version}, {'has one' if 'calibration' in layout else 'none'})")
    meta = layout["metadata"]
    at = layout.table_offset
    padded = -(-len(data) // BLOCK) * BLOCK
    field = struct.pack("<I", len(data))
    with open(path, "r+b") as f:
        f.seek(meta.offset)
        head = bytearray(f.read(meta.length))
        head[METADATA_OFFSETS["calib_bytes"]:METADATA_OFFSETS["calib_bytes"] + 4] = field
        entries = [(s.id, s.offset, s.length, crc32c(head) if s.id == SECTION_IDS["metadata"]
                    else s.crc) for s in layout]
        entries.append((SECTION_IDS["calibration"], at, len(data), crc32c(data)))
        table = b"".join(_ENTRY.pack(sid, 0, off, length, crc, 0)
                         for sid, off, length, crc in entries)
        tail = _TAIL.pack(at + padded, len(entries), crc32c(table), layout.version, 0,
                          TAIL_MAGIC)
        f.seek(meta.offset + METADATA_OFFSETS["calib_bytes"])
        f.write(field)
        f.seek(at)
        f.write(bytes(data) + bytes(padded - len(data)) + table + tail)
        f.truncate()
        f.flush()
        os.fsync(f.fileno())
