"""Format durability: index files written by earlier format versions keep
opening, with the same answers.

tests/data/golden_v<N>_*.kdx were written by format version N (see
tests/data/make_golden.py, which must only ever ADD files, with a version
bump). Every later build must read them: open, load from a path, bytes and a
file object, then search them exactly and through the graph with a full
beam (an answer independent of search heuristics), and get the stored
vectors back bit for bit. A file newer than this build reads is refused
with a message naming both versions."""
import glob
import io
import os
import struct

import numpy as np
import pytest

import knndirect as kd
from knndirect import _container
from conftest import recall_at_k, open_quiet

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
GOLDEN = sorted(glob.glob(os.path.join(DATA, "golden_v*_*.kdx")))
K = 10


def test_golden_files_present():
    assert GOLDEN, "tests/data holds no golden index file"
    assert any(os.path.basename(p).startswith("golden_v1_") for p in GOLDEN), \
        "the version 1 golden files must stay"


def _expected(path):
    with np.load(path[:-4] + ".npz") as z:
        return {k: z[k] for k in z.files}


def _file_version(path):
    with open(path, "rb") as f:
        head = f.read(16)
    assert head[:8] == b"KNNDIRCT"
    return struct.unpack_from("<I", head, 8)[0]


def _openers(path):
    blob = open(path, "rb").read()
    return {
        "open": lambda: open_quiet(path, "threads"),
        "open_pread": lambda: open_quiet(path, "pread", preload=()),
        "open_mmap": lambda: open_quiet(path, "mmap", preload=("graph", "codes", "ids",
                                                                "vectors")),
        "load_path": lambda: kd.load(path),
        "load_bytes": lambda: kd.load(blob),
        "load_file": lambda: kd.load(io.BytesIO(blob)),
    }


CASES = [(p, how) for p in GOLDEN for how in
         ("open", "open_pread", "open_mmap", "load_path", "load_bytes", "load_file")]


@pytest.mark.parametrize("path,how", CASES,
                         ids=["%s-%s" % (os.path.basename(p)[:-4], h) for p, h in CASES])
def test_golden_answers(path, how):
    e = _expected(path)
    version = _file_version(path)
    assert version == int(e["version"])
    f = kd.features()
    assert f["min_format_version"] <= version <= f["format_version"]
    n, dim, m, seed, k = (int(v) for v in e["params"])
    index = _openers(path)[how]()
    try:
        info = index.info()
        assert info["dim"] == dim and index.dim == dim
        assert info["metric"] == str(e["metric"]) and index.metric == str(e["metric"])
        assert info["quantization"] == str(e["quantization"])
        assert info["m"] == m and info["seed"] == seed
        assert info["slots"] == n
        assert len(index) == n - len(e["removed"])
        q = e["queries"]
        D, I = index.search(q, K, exact=True)
        np.testing.assert_array_equal(I, e["exact_I"])
        np.testing.assert_allclose(D, e["exact_D"], rtol=1e-5, atol=1e-5)
        live = len(index)
        D, I = index.search(q, K, ef=live, oversample=live / K)
        np.testing.assert_array_equal(I, e["full_I"])
        np.testing.assert_allclose(D, e["full_D"], rtol=1e-5, atol=1e-5)
        # The calibration comes back as it was written (format 2 on).
        stored = e["calibration"].tobytes() if "calibration" in e else b""
        assert index._core.calibration() == stored
        assert (info["calibration"] is None) == (stored == b"")
        # Default search, through the stored graph and codes: at these sizes
        # (300 and 500 vectors, no calibration, so ef 64 and a shortlist 5 to
        # 20 times k; the top-k distances of each query well separated:
        # make_golden.py) the reranked shortlist holds the whole exact top-k,
        # so the answer is the exact one, order included. A damaged graph or
        # code section would lose neighbours. A calibrated index's default
        # aims at 0.95 instead.
        D, I = index.search(q, K)
        if not stored:
            np.testing.assert_array_equal(I, e["exact_I"])
            np.testing.assert_allclose(D, e["exact_D"], rtol=1e-5, atol=1e-5)
        else:
            assert recall_at_k(I, e["exact_I"]) >= 0.9
        removed = set(e["removed"].tolist())
        assert not removed & set(I.ravel().tolist())
        # Stored vectors come back bit for bit (cosine included).
        keep = np.array([i for i in e["ids"].tolist() if i not in removed])
        V = index.get_vectors(keep)
        rows = np.searchsorted(e["ids"], keep)
        assert np.ascontiguousarray(V).tobytes() == e["base"][rows].tobytes()
        with pytest.raises(KeyError):
            index.get_vectors(e["removed"][:1])
        assert index.verify() is True
    finally:
        index.close()


@pytest.mark.parametrize("path", GOLDEN, ids=[os.path.basename(p)[:-4] for p in GOLDEN])
def test_golden_resaved_by_this_build(path, tmp_path):
    """Loading an old file and saving it writes the current format for what
    it holds (4 for 1-bit codes, whose tails format 4 shortened, refined or
    not, and 5 for those format 5 padded: a file's codes keep their width;
    the plain version for scalar codes), with the same answers: through the
    codes too, converted from an older tail."""
    e = _expected(path)
    index = kd.load(path)
    one_bit = index.info()["quantization"].startswith("1bit")
    out = tmp_path / "resaved.kdx"
    index.save(out)
    index.close()
    want = (max(_file_version(path), _container.NARROW_FORMAT_VERSION) if one_bit
            else _container.PLAIN_FORMAT_VERSION)
    assert _file_version(out) == want
    assert _container.read_metadata(out)["pdim"] == _container.read_metadata(path)["pdim"]
    for again in (kd.load(out), open_quiet(out, "threads")):
        D, I = again.search(e["queries"], K, exact=True)
        np.testing.assert_array_equal(I, e["exact_I"])
        live = len(again)
        D, I = again.search(e["queries"], K, ef=live, oversample=live / K)
        np.testing.assert_array_equal(I, e["full_I"])
        again.close()


OLD_TAILED = [p for p in GOLDEN if _file_version(p) < 4 and "_1bit" in os.path.basename(p)]


@pytest.mark.parametrize("path", OLD_TAILED, ids=[os.path.basename(p)[:-4] for p in OLD_TAILED])
def test_older_code_tails_convert_byte_for_byte(path, tmp_path):
    """Formats 1 to 3 stored a 1-bit code's tail as scale, |o-c|^2, <o-c, c>,
    shift (floats), ones, centre (u16): 20 bytes. Format 4 keeps only the
    correction the metric uses (|o-c|^2 for l2). Loading and saving such a
    file converts every code to exactly that, and opening it in place serves
    the same codes (the same estimates, so the same ranking)."""
    meta = _container.read_metadata(path)
    n, bits = meta["count"], meta["pdim"] // 8
    old = np.frombuffer(_container.read_section(path, "codes"), np.uint8).reshape(n, -1)
    assert old.shape[1] == meta["code_size"] == bits + 20
    corr = bits + 4 if meta["metric"] == 0 else bits + 8  # enum kd_metric: 0 is l2
    want = np.concatenate([old[:, :bits + 4], old[:, corr:corr + 4], old[:, bits + 12:]], axis=1)
    index = kd.load(path)
    out = tmp_path / "resaved.kdx"
    index.save(out)
    assert _container.read_metadata(out)["code_size"] == bits + 16
    got = np.frombuffer(_container.read_section(out, "codes"), np.uint8).reshape(n, -1)
    np.testing.assert_array_equal(got, want)
    q = _expected(path)["queries"]
    opened = open_quiet(path, "threads")
    try:
        for ef in (10, 40):
            D0, I0 = index.search(q, K, ef=ef, oversample=1, rerank=False)
            D1, I1 = opened.search(q, K, ef=ef, oversample=1, rerank=False)
            np.testing.assert_array_equal(I0, I1)
            np.testing.assert_array_equal(D0, D1)
    finally:
        opened.close()
        index.close()


# ------------------------------------------------------------------ versions

def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def with_version(blob, version):
    """The file with its header (and tail) claiming another format version,
    checksums fixed, so only the version is wrong."""
    b = bytearray(blob)
    struct.pack_into("<I", b, 8, version)
    struct.pack_into("<I", b, 60, crc32c(bytes(b[:60])))
    struct.pack_into("<I", b, len(b) - 16, version)
    return bytes(b)


def test_crc32c_helper_matches_the_file():
    blob = open(GOLDEN[0], "rb").read()
    assert struct.unpack_from("<I", blob, 60)[0] == crc32c(blob[:60])


@pytest.mark.parametrize("delta", [1, 7])
def test_newer_version_is_refused_naming_both(tmp_path, delta):
    current = kd.features()["format_version"]
    newer = current + delta
    bad = with_version(open(GOLDEN[0], "rb").read(), newer)
    p = tmp_path / "newer.kdx"
    p.write_bytes(bad)
    for attempt in (lambda: kd.open(p), lambda: kd.load(p), lambda: kd.load(bad),
                    lambda: kd.load(io.BytesIO(bad))):
        with pytest.raises(ValueError) as ei:
            attempt()
        msg = str(ei.value)
        assert "version %d" % newer in msg and "version %d" % current in msg, msg
        assert "newer" in msg


def test_older_unsupported_version_is_refused(tmp_path):
    bad = with_version(open(GOLDEN[0], "rb").read(), 0)
    p = tmp_path / "old.kdx"
    p.write_bytes(bad)
    for attempt in (lambda: kd.open(p), lambda: kd.load(bad)):
        with pytest.raises(ValueError, match="version 0"):
            attempt()
