"""Save / load / open round trips: every way of getting an index back gives
the same search results as the index that was saved."""
import io
import os
import pickle

import numpy as np
import pytest

import knndirect as kd
from conftest import (BACKENDS, METRICS, assert_exact_match,
                      assert_same_results, build, open_quiet, same_bytes,
                      split)

N, NQ, D_, K = 4000, 50, 128, 10


@pytest.fixture(scope="module")
def data():
    return split(N, NQ, D_, seed=3000)


@pytest.fixture(scope="module", params=METRICS)
def saved(request, data, tmp_path_factory):
    metric = request.param
    base, queries = data
    index = build(base, metric)
    path = tmp_path_factory.mktemp("rt") / ("idx_%s.kdx" % metric)
    index.save(path)
    expected = index.search(queries, K)
    yield metric, index, path, expected
    index.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_open_matches_memory(saved, data, backend):
    metric, index, path, expected = saved
    base, queries = data
    opened = open_quiet(path, backend)
    try:
        info = opened.info()
        if backend != "auto":
            assert info["io_backend"] == backend
        else:
            assert info["io_backend"] in ("io_uring", "threads")
        assert info["storage"] == "disk"
        assert len(opened) == N and opened.dim == D_ and opened.metric == metric
        got = opened.search(queries, K)
        assert_same_results(got, expected)
        # single queries too
        for i in (0, 7, 49):
            d1, i1 = opened.search(queries[i], K)
            np.testing.assert_array_equal(i1, expected[1][i])
    finally:
        opened.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_open_buffered_matches_memory(saved, data, backend):
    metric, index, path, expected = saved
    base, queries = data
    opened = open_quiet(path, backend, direct_io=False)
    try:
        assert opened.info()["direct_io"] is False
        assert_same_results(opened.search(queries, K), expected)
    finally:
        opened.close()


@pytest.mark.parametrize("preload", [(), ("graph",), ("codes",), ("graph", "codes")])
def test_open_preload_options(saved, data, preload):
    metric, index, path, expected = saved
    base, queries = data
    opened = open_quiet(path, preload=preload)
    try:
        assert_same_results(opened.search(queries, K), expected)
    finally:
        opened.close()


def test_open_pathlike_and_str(saved, data):
    metric, index, path, expected = saved
    base, queries = data
    for p in (path, str(path)):
        opened = open_quiet(p)
        try:
            assert opened.info()["path"] == str(path)
            assert_same_results(opened.search(queries, K), expected)
        finally:
            opened.close()


def _identical(a, b):
    np.testing.assert_array_equal(a[1], b[1])
    np.testing.assert_array_equal(a[0], b[0])


def test_load_path(saved, data):
    metric, index, path, expected = saved
    base, queries = data
    for p in (path, str(path)):
        loaded = kd.load(p)
        assert loaded.info()["storage"] == "memory"
        assert loaded.info()["io_backend"] == "memory"
        assert len(loaded) == N and loaded.dim == D_ and loaded.metric == metric
        _identical(loaded.search(queries, K), expected)
        loaded.close()


def test_load_bytes(saved, data):
    metric, index, path, expected = saved
    base, queries = data
    blob = index.to_bytes()
    assert isinstance(blob, bytes)
    assert len(blob) == os.path.getsize(path)
    loaded = kd.load(blob)
    _identical(loaded.search(queries, K), expected)
    loaded.close()


def test_save_bytesio_load_bytesio(saved, data):
    metric, index, path, expected = saved
    base, queries = data
    buf = io.BytesIO()
    index.save(buf)
    assert buf.tell() > 0
    buf.seek(0)
    loaded = kd.load(buf)
    _identical(loaded.search(queries, K), expected)
    loaded.close()
    # also from the bytes of the buffer
    loaded = kd.load(buf.getvalue())
    _identical(loaded.search(queries, K), expected)
    loaded.close()


def test_save_to_open_file_object(saved, data, tmp_path):
    metric, index, path, expected = saved
    base, queries = data
    p = tmp_path / "via_fileobj.kdx"
    with open(p, "wb") as f:
        index.save(f)
    with open(p, "rb") as f:
        loaded = kd.load(f)
    _identical(loaded.search(queries, K), expected)
    loaded.close()
    opened = open_quiet(p)
    assert_same_results(opened.search(queries, K), expected)
    opened.close()


class _WriteOnly:
    """A non-seekable writer: only .write()."""

    def __init__(self):
        self.chunks = []

    def write(self, b):
        self.chunks.append(bytes(b))
        return len(b)


def test_save_to_non_seekable_writer(saved, data):
    metric, index, path, expected = saved
    base, queries = data
    w = _WriteOnly()
    index.save(w)
    blob = b"".join(w.chunks)
    assert len(blob) > N * D_ * 4
    loaded = kd.load(blob)
    _identical(loaded.search(queries, K), expected)
    loaded.close()


def test_pickle_round_trip(saved, data):
    metric, index, path, expected = saved
    base, queries = data
    clone = pickle.loads(pickle.dumps(index))
    assert len(clone) == N and clone.dim == D_ and clone.metric == metric
    _identical(clone.search(queries, K), expected)
    assert same_bytes(clone.get_vectors(np.arange(0, N, 37)), base[::37])
    clone.close()


def test_round_trip_preserves_info(saved):
    metric, index, path, expected = saved
    a = index.info()
    for other in (kd.load(path), open_quiet(path)):
        b = other.info()
        for key in ("dim", "metric", "count", "quantization", "m"):
            assert b[key] == a[key], key
        other.close()


def test_round_trip_exact_search(saved, data):
    metric, index, path, expected = saved
    base, queries = data
    loaded = kd.load(path)
    D, I = loaded.search(queries, K, exact=True)
    assert_exact_match(D, I, base, queries, metric)
    loaded.close()


def test_custom_ids_survive_round_trip(tmp_path):
    base, queries = split(500, 10, 64, seed=31)
    ids = (np.arange(500, dtype=np.int64) * 7919 + 2 ** 40)[::-1].copy()
    idx = build(base, "l2", ids=ids)
    p = tmp_path / "ids.kdx"
    idx.save(p)
    exp = idx.search(queries, 5)
    assert set(np.unique(exp[1]).tolist()) <= set(ids.tolist())
    for other in (kd.load(p), kd.load(idx.to_bytes()), open_quiet(p)):
        assert_same_results(other.search(queries, 5), exp)
        assert same_bytes(other.get_vectors(ids[[3, 0, 499]]), base[[3, 0, 499]])
        other.close()
    idx.close()


def test_loaded_index_accepts_more_vectors(tmp_path):
    base, queries = split(600, 5, 32, seed=32)
    idx = build(base[:500], "l2")
    loaded = kd.load(idx.to_bytes())
    loaded.add(base[500:])
    assert len(loaded) == 600
    assert same_bytes(loaded.get_vectors(np.arange(500, 600)), base[500:])
    D, I = loaded.search(queries, 10, exact=True)
    assert_exact_match(D, I, base, queries, "l2")
    idx.close()
    loaded.close()


def test_empty_index_round_trip(tmp_path):
    idx = kd.Index(16, "cosine")
    p = tmp_path / "empty.kdx"
    idx.save(p)
    q = np.ones(16, np.float32)
    for other in (kd.load(p), kd.load(idx.to_bytes())):
        assert len(other) == 0
        assert other.dim == 16 and other.metric == "cosine"
        D, I = other.search(q, 3)
        assert (I == -1).all() and (D == -np.inf).all()
        other.close()
    idx.close()


# ------------------------------------------------------------------ atomic save

def test_save_leaves_no_temp_files(tmp_path):
    base, _ = split(300, 1, 32, seed=33)
    idx = build(base, "l2")
    target = tmp_path / "atomic.kdx"
    idx.save(target)
    assert sorted(os.listdir(tmp_path)) == ["atomic.kdx"]
    # overwrite an existing index: still exactly one file, and the new content
    idx.add(base[:10] + 1.0)
    idx.save(str(target))
    assert sorted(os.listdir(tmp_path)) == ["atomic.kdx"]
    again = kd.load(target)
    assert len(again) == 310
    again.close()
    idx.close()


def test_save_into_missing_directory_fails_cleanly(tmp_path):
    base, _ = split(50, 1, 8, seed=34)
    idx = build(base, "l2")
    with pytest.raises(OSError):
        idx.save(tmp_path / "no" / "such" / "dir" / "x.kdx")
    assert os.listdir(tmp_path) == []
    idx.close()


# ------------------------------------------------------------ damaged inputs

@pytest.fixture(scope="module")
def small_blob():
    base, _ = split(300, 1, 128, seed=35)
    idx = build(base, "l2")
    blob = idx.to_bytes()
    idx.close()
    return blob


@pytest.mark.parametrize("frac", [0.0, 0.001, 0.25, 0.5, 0.9, 0.999])
def test_load_truncated_bytes(small_blob, frac):
    cut = int(len(small_blob) * frac)
    if frac > 0:
        cut = max(cut, 1)
    with pytest.raises(ValueError):
        kd.load(small_blob[:cut])


def test_load_one_byte_short(small_blob):
    with pytest.raises(ValueError):
        kd.load(small_blob[:-1])


def test_load_random_bytes():
    rng = np.random.default_rng(36)
    for size in (0, 16, 4096, 100000):
        with pytest.raises(ValueError):
            kd.load(rng.integers(0, 256, size=size, dtype=np.uint8).tobytes())


def test_load_text_file(tmp_path):
    p = tmp_path / "notes.txt"
    p.write_text("this is not an index\n" * 500)
    with pytest.raises(ValueError):
        kd.load(p)
    with pytest.raises((ValueError, OSError)):
        kd.open(p)


@pytest.mark.parametrize("frac", [0.1, 0.5, 0.99])
def test_open_truncated_file(small_blob, tmp_path, frac):
    p = tmp_path / "trunc.kdx"
    p.write_bytes(small_blob[: int(len(small_blob) * frac)])
    with pytest.raises((ValueError, OSError)):
        kd.open(p)


def test_open_missing_file(tmp_path):
    with pytest.raises(OSError):
        kd.open(tmp_path / "missing.kdx")
    with pytest.raises(OSError):
        kd.load(tmp_path / "missing.kdx")


def test_corrupted_footer_detected(small_blob, tmp_path):
    """Flipping every byte of the last 64 bytes (footer: section table and
    checksums) must be detected."""
    bad = bytearray(small_blob)
    for i in range(len(bad) - 64, len(bad)):
        bad[i] ^= 0xFF
    with pytest.raises(ValueError):
        kd.load(bytes(bad))
    p = tmp_path / "bad.kdx"
    p.write_bytes(bytes(bad))
    with pytest.raises((ValueError, OSError)):
        kd.open(p)


def test_corrupted_header_detected(small_blob):
    bad = bytearray(small_blob)
    for i in range(0, 64):
        bad[i] ^= 0xFF
    with pytest.raises(ValueError):
        kd.load(bytes(bad))


def _verify_fails(make):
    """True when building the index raises ValueError, or its verify()
    reports the damage (False or ValueError)."""
    try:
        idx = make()
    except ValueError:
        return True
    try:
        return idx.verify() is False
    except ValueError:
        return True
    finally:
        idx.close()


def test_verify_detects_damaged_vector(tmp_path):
    base, _ = split(300, 1, 128, seed=37)
    idx = build(base, "l2")
    assert idx.verify() is True
    blob = bytearray(idx.to_bytes())
    idx.close()
    off = bytes(blob).find(base[5].tobytes())
    assert off >= 0
    blob[off + 17] ^= 0x40  # one bit of one stored float
    p = tmp_path / "dmg.kdx"
    p.write_bytes(bytes(blob))
    good = tmp_path / "good.kdx"
    idx = build(base, "l2")
    idx.save(good)
    idx.close()
    for opener in (kd.load, open_quiet):
        g = opener(good)
        assert g.verify() is True
        g.close()
    assert _verify_fails(lambda: kd.load(bytes(blob)))
    assert _verify_fails(lambda: open_quiet(p))
