"""info(), stats(), attributes, and the on-disk vector layout."""
import os

import numpy as np
import pytest

import knndirect as kd
from conftest import METRICS, build, clustered, open_quiet, split

INFO_KEYS = ("dim", "metric", "count", "quantization", "m", "path", "storage",
             "io_backend", "direct_io", "record_size", "alignment",
             "resident_bytes", "fallbacks")
STATS_KEYS = ("queries", "read_ops", "read_bytes", "rerank_vectors", "io_wait_seconds")


@pytest.mark.parametrize("metric", METRICS)
def test_attributes(metric):
    base = clustered(321, 40, seed=11000)
    idx = kd.Index(40, metric, m=12, ef_construction=80)
    assert len(idx) == 0
    assert idx.dim == 40
    assert idx.metric == metric
    idx.add(base)
    assert len(idx) == 321
    info = idx.info()
    for key in INFO_KEYS:
        assert key in info, key
    assert info["dim"] == 40
    assert info["metric"] == metric
    assert info["count"] == 321
    assert info["quantization"] == "1bit"
    assert info["m"] == 12
    assert info["path"] is None
    assert info["storage"] == "memory"
    assert info["io_backend"] == "memory"
    assert isinstance(info["direct_io"], bool)
    assert isinstance(info["fallbacks"], list)
    assert isinstance(info["resident_bytes"], int)
    # the in-memory index holds at least the raw vectors
    assert info["resident_bytes"] >= 321 * 40 * 4
    idx.remove([0, 1])
    assert len(idx) == 319 and idx.info()["count"] == 319
    idx.close()


def test_default_parameters_in_info():
    idx = kd.Index(8)
    info = idx.info()
    assert idx.metric == "l2" and info["metric"] == "l2"
    assert info["m"] == 16
    assert info["quantization"] == "1bit"
    assert info["count"] == 0
    idx.close()


def test_stats_keys_and_types():
    base, queries = split(500, 7, 16, seed=11001)
    idx = build(base, "l2")
    s = idx.stats()
    for key in STATS_KEYS:
        assert key in s, key
    for key in ("queries", "read_ops", "read_bytes", "rerank_vectors"):
        assert isinstance(s[key], int), key
    assert isinstance(s["io_wait_seconds"], float)
    idx.stats(reset=True)
    idx.search(queries, 5)
    idx.search(queries[0], 5)
    assert idx.stats()["queries"] == 8
    idx.search(queries, 5, exact=True)
    assert idx.stats()["queries"] == 15
    idx.close()


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    out = {}
    d = tmp_path_factory.mktemp("layout")
    for dim in (100, 128, 768, 1024):
        base = clustered(400, dim, seed=11002 + dim)
        idx = build(base, "l2")
        p = d / ("l%d.kdx" % dim)
        idx.save(p)
        res_mem = idx.info()["resident_bytes"]
        idx.close()
        out[dim] = (base, p, res_mem)
    return out


@pytest.mark.parametrize("dim", [100, 128, 768, 1024])
def test_opened_info(files, dim):
    base, p, _ = files[dim]
    o = open_quiet(p, "threads")
    try:
        info = o.info()
        for key in INFO_KEYS:
            assert key in info, key
        assert info["dim"] == dim and o.dim == dim
        assert info["count"] == 400 and len(o) == 400
        assert info["storage"] == "disk"
        assert info["io_backend"] == "threads"
        assert info["path"] == str(p)
        assert info["direct_io"] is True
        assert info["fallbacks"] == []
        rs, al = info["record_size"], info["alignment"]
        assert rs >= dim * 4
        assert al >= 512 and al & (al - 1) == 0, "alignment %r is not a power of two" % al
        assert rs % al == 0 or al % rs == 0
        if dim >= 128:
            assert rs % 512 == 0
        if dim * 4 <= 4096:
            assert 4096 % rs == 0, "record_size %d lets a record straddle 4 KiB" % rs
        if dim == 128:
            assert rs == 512
        if dim == 768:
            assert rs == 4096
        assert os.path.getsize(p) >= 400 * rs
    finally:
        o.close()


@pytest.mark.parametrize("dim", [100, 128, 768])
def test_vectors_do_not_straddle_4k_blocks(files, dim):
    """Find stored vectors in the file: each lies within one 4 KiB block, and
    all sit at the same offset within a fixed-stride record."""
    base, p, _ = files[dim]
    blob = p.read_bytes()
    o = open_quiet(p, "threads")
    rs = o.info()["record_size"]
    o.close()
    offsets = []
    for i in range(0, 400, 37):
        off = blob.find(base[i].tobytes())
        assert off >= 0, "vector %d is not stored verbatim in the file" % i
        offsets.append(off)
        L = dim * 4
        assert off // 4096 == (off + L - 1) // 4096, \
            "vector %d at offset %d straddles a 4 KiB boundary" % (i, off)
    assert len({o % rs for o in offsets}) == 1, "records do not share one stride"


def test_opened_index_is_smaller_in_ram(files):
    base, p, res_mem = files[768]
    o = open_quiet(p, "threads", preload=())
    try:
        res_disk = o.info()["resident_bytes"]
        assert isinstance(res_disk, int) and res_disk > 0
        # the vectors (400 * 3 KiB) stay on disk
        assert res_disk < res_mem - 400 * 768 * 4 // 2, (res_disk, res_mem)
    finally:
        o.close()


def test_file_holds_at_least_the_raw_vectors(files):
    for base, p, _ in files.values():
        assert os.path.getsize(p) >= base.nbytes


@pytest.mark.parametrize("quantization", ["1bit", "4bit", "8bit"])
def test_quantization_round_trip(quantization, tmp_path):
    base, queries = split(800, 10, 64, seed=11003)
    idx = build(base, "ip", quantization=quantization, m=8)
    p = tmp_path / "q.kdx"
    idx.save(p)
    exp = idx.search(queries, 5)
    for other in (kd.load(p), open_quiet(p)):
        assert other.info()["quantization"] == quantization
        assert other.info()["m"] == 8
        np.testing.assert_array_equal(other.search(queries, 5)[1], exp[1])
        other.close()
    idx.close()
