"""_core.merge: several indexes (segments) written as one index file.

The merged file must hold exactly the live rows of its inputs (ids, float32
bytes, search codes), open and verify like any index file, answer exact
searches exactly, and keep graph recall at a fresh build's level, also when
the largest input (whose graph is reused) lost 30% of its rows and when its
build codes have only 4 bits a dimension. A merge is all or nothing: a
cancelled or failed one leaves no file behind.
"""
import filecmp
import os

import numpy as np
import pytest

import knndirect as kd
from knndirect import _container, _core

from conftest import METRICS, assert_exact_match, brute_force, gil_stall, recall_at_k

DIM = 64
NQ = 500


def data(n, dim=DIM, seed=5):
    x = kd.datasets.clustered(n + NQ, dim, seed=seed)
    return np.ascontiguousarray(x[:n]), np.ascontiguousarray(x[n:])


def segment(first, x, ids, **kw):
    """A new in-memory segment that encodes like `first`."""
    s = kd.Index(x.shape[1], first.metric, **kw)
    s._core.adopt_quantizer(first._core)
    s.add(x, ids)
    return s


def reopened(index, path):
    index.save(path)
    index.close()
    return kd.open(path)


def ids_section(path):
    return np.frombuffer(_container.read_section(path, "ids"), dtype=np.int64)


def codes_section(path, n):
    raw = np.frombuffer(_container.read_section(path, "codes"), dtype=np.uint8)
    return raw.reshape(n, -1) if n else raw


def lists_of(path, name, width):
    """The neighbour lists of a graph section (the used part of each)."""
    raw = np.frombuffer(_container.read_section(path, name), dtype=np.uint32)
    return [row[1:1 + row[0]].tolist() for row in raw.reshape(-1, 1 + width)]


def recall(index, queries, truth, **kw):
    return recall_at_k(index.search(queries, 10, **kw)[1], truth)


# Graph recall with a narrow beam and a deep rerank: where a weak graph
# shows (the default beam hides most of it) and the noise of 1-bit
# estimates does not (a shallow shortlist would measure mostly that).
NARROW = dict(ef=8, oversample=20)


class Scenario:
    """Four segments of one collection, merged: A (the largest; saved,
    reopened, 30% removed), B (in memory, 10% removed), C (saved, reopened)
    and D (in memory, every row removed). Inputs are given as B, A, C, D."""

    def __init__(self, metric, tmp, memory_budget=0):
        x, self.q = data(20000)
        ids = 1000 + 3 * np.arange(20000, dtype=np.int64)   # not row numbers
        rng = np.random.default_rng(7)
        a = kd.Index(DIM, metric)
        a.add(x[:11000], ids[:11000])
        b = segment(a, x[11000:16000], ids[11000:16000])
        c = segment(a, x[16000:19800], ids[16000:19800])
        d = segment(a, x[19800:], ids[19800:])
        a = reopened(a, tmp / "a.kdx")
        c = reopened(c, tmp / "c.kdx")
        gone_a = rng.choice(ids[:11000], 3300, replace=False)
        gone_b = rng.choice(ids[11000:16000], 500, replace=False)
        a.remove(gone_a)
        b.remove(gone_b)
        d.remove(ids[19800:])
        gone = np.concatenate([gone_a, gone_b, ids[19800:]])
        keep = ~np.isin(ids, gone)
        self.x, self.ids = x[keep], ids[keep]
        self.rows = {"a": keep[:11000].sum(), "b": keep[11000:16000].sum(), "c": 3800}
        # Each input's live ids in its row order (an add inserts the vectors
        # it held out for its calibration last).
        self.order = np.concatenate([i._core.live_ids() for i in (a, b, c)])
        self.inputs = {"a": a, "b": b, "c": c, "d": d}
        self.calls = []
        self.path = tmp / "merged.kdx"
        self.report = _core.merge(str(self.path), [b._core, a._core, c._core, d._core],
                                  memory_budget=memory_budget, seed=3,
                                  progress=lambda done, total: self.calls.append((done, total)))
        self.out = kd.open(self.path)
        self.truth = brute_force(self.x, self.q, 10, metric, ids=self.ids)[1]
        self.metric = metric

    def fresh(self):
        f = kd.Index(DIM, self.metric)
        f.add(self.x, self.ids)
        return f


@pytest.fixture(scope="module", params=METRICS)
def merged(request, tmp_path_factory):
    return Scenario(request.param, tmp_path_factory.mktemp("merge-" + request.param))


def test_report(merged):
    r, rows = merged.report, merged.rows
    total = rows["a"] + rows["b"] + rows["c"]
    assert r["base"] == 1                       # A, given second, has the most live rows
    assert r["rows_written"] == total == len(merged.out)
    assert r["rows_reused"] == rows["a"]
    assert r["rows_inserted"] == rows["b"] + rows["c"]
    assert 0 < r["nodes_repaired"] <= rows["a"]
    assert r["build_code_bits"] == 8
    assert r["codes_reencoded"] == 0            # every segment shares A's quantizer
    for key in ("fit", "encode", "repair", "insert", "write", "total"):
        assert r[key + "_seconds"] >= 0
    # progress: from 0 to 4 units a row, never backwards
    done = [d for d, _ in merged.calls]
    assert {t for _, t in merged.calls} == {4 * total}
    assert done[0] == 0 and done[-1] == 4 * total and done == sorted(done)


def test_rows_and_vectors(merged):
    """Exactly the live rows, in order: A's, then B's, then C's."""
    out, ids = merged.out, merged.ids
    assert np.array_equal(np.sort(merged.order), np.sort(ids))
    assert np.array_equal(ids_section(merged.path), merged.order)
    assert len(np.unique(ids_section(merged.path))) == len(ids)
    assert out.get_vectors(ids).tobytes() == merged.x.tobytes()
    removed = np.setdiff1d(1000 + 3 * np.arange(20000), ids)
    assert not out._core.contains(removed).any()
    assert out._core.contains(ids).all()
    assert out.verify()
    loaded = kd.load(merged.path)                # every checksum, vectors included
    assert len(loaded) == len(ids)
    assert loaded.get_vectors(ids[::97]).tobytes() == merged.x[::97].tobytes()


def test_codes_copied(merged):
    """Search codes of every row are those of its segment."""
    n = len(merged.ids)
    codes = codes_section(merged.path, n)
    a_path = merged.path.parent / "a.kdx"
    a_ids = ids_section(a_path)
    a_codes = codes_section(a_path, len(a_ids))
    live_a = np.isin(a_ids, merged.ids)
    assert np.array_equal(codes[:merged.rows["a"]], a_codes[live_a])


def test_exact_search(merged):
    D, I = merged.out.search(merged.q, 10, exact=True)
    assert_exact_match(D, I, merged.x, merged.q, merged.metric, ids=merged.ids)


def test_graph_recall_like_fresh_build(merged):
    fresh = merged.fresh()
    got = recall(merged.out, merged.q, merged.truth)
    want = recall(fresh, merged.q, merged.truth)
    narrow = recall(merged.out, merged.q, merged.truth, **NARROW)
    narrow_fresh = recall(fresh, merged.q, merged.truth, **NARROW)
    assert got >= 0.95
    assert got >= want - 0.01, (got, want)
    assert narrow >= narrow_fresh - 0.02, (narrow, narrow_fresh)


def test_repair_keeps_the_graph_of_a_shrunken_base(tmp_path):
    """40% of a single input removed, 8-bit codes (estimates close enough
    that the graph limits a narrow search): the repaired graph searches as
    well as the input did through its tombstones, and as a fresh build
    (measured: 0.953-0.961 against 0.955-0.961 and 0.940; without the repair
    0.87, with lists cut to their diverse core 0.905)."""
    x, q = data(12000, seed=30)
    a = kd.Index(DIM, quantization="8bit")
    a.add(x)
    gone = np.random.default_rng(0).choice(12000, 4800, replace=False)
    a.remove(gone)
    live = np.setdiff1d(np.arange(12000), gone)
    path = tmp_path / "out.kdx"
    r = _core.merge(str(path), [a._core])
    assert r["nodes_repaired"] > 0.9 * len(live)
    out = kd.open(path)
    fresh = kd.Index(DIM, quantization="8bit")
    fresh.add(x[live], live)
    truth = brute_force(x[live], q, 10, "l2", ids=live)[1]
    narrow = dict(ef=10, oversample=1)
    got = recall(out, q, truth, **narrow)
    assert got >= recall(a, q, truth, **narrow) - 0.015
    assert got >= recall(fresh, q, truth, **narrow) - 0.01


def test_thin_lists_are_reconnected(tmp_path):
    """90% of the base removed: some level-0 lists stay under m/2 after the
    repair and are searched for again from the entry; the graph still
    searches as well as a fresh build (measured: 0.993 against 0.987)."""
    x, q = data(10000, dim=32, seed=3)
    a = kd.Index(32, quantization="8bit")
    a.add(x)
    live = np.sort(np.random.default_rng(1).choice(10000, 1000, replace=False))
    a.remove(np.setdiff1d(np.arange(10000), live))
    path = tmp_path / "out.kdx"
    r = _core.merge(str(path), [a._core])
    assert r["nodes_reconnected"] > 0
    fresh = kd.Index(32, quantization="8bit")
    fresh.add(x[live], live)
    truth = brute_force(x[live], q, 10, "l2", ids=live)[1]
    narrow = dict(ef=10, oversample=1)
    assert recall(kd.open(path), q, truth, **narrow) >= recall(fresh, q, truth, **narrow) - 0.02


def test_four_bit_build_codes(tmp_path):
    """A budget under one byte a dimension gives 4-bit build codes; the
    graph is still on a par with a fresh build (measured, 64 dims: within
    0.01 at the default search and the narrow one alike)."""
    s = Scenario("l2", tmp_path, memory_budget=1000)
    assert s.report["build_code_bits"] == 4
    fresh = s.fresh()
    got = recall(s.out, s.q, s.truth)
    assert got >= 0.95
    assert got >= recall(fresh, s.q, s.truth) - 0.01
    assert recall(s.out, s.q, s.truth, **NARROW) >= recall(fresh, s.q, s.truth, **NARROW) - 0.02
    # a row's 8-bit code is insertion's: DIM rounded up to 16 bytes, then
    # two 4-byte terms; a 4-bit one: DIM / 2 bytes padded to 8, its centre
    # (2) and its decoded norm (4)
    assert _core.merge_row_bytes(8, DIM) == DIM + 8 == _core.build_code_row_bytes(DIM)
    assert _core.merge_row_bytes(8, 40) == 48 + 8
    assert _core.merge_row_bytes(4, DIM) == DIM // 2 + 6
    s2 = _core.merge(str(tmp_path / "eight.kdx"), [s.inputs["a"]._core],
                     memory_budget=len(s.inputs["a"]) * _core.merge_row_bytes(8, DIM))
    assert s2["build_code_bits"] == 8


@pytest.mark.parametrize("bits_budget", [0, 1000], ids=["8bit", "4bit"])
@pytest.mark.parametrize("metric", METRICS)
def test_beam_over_search_codes_past_the_cache(metric, bits_budget, cache_bytes, tmp_path):
    """Past 1.2 times the cache, a merge's insertion takes the 1-bit beam as a
    build does, each node prepared from its decoded build code (the vectors
    are not in memory): the graph differs from the one over build codes
    alone and searches as well."""
    x, q = data(9000, seed=41)
    ids = np.arange(9000, dtype=np.int64)
    a = kd.Index(DIM, metric, seed=2)
    a.add(x[:5000], ids[:5000])
    b = segment(a, x[5000:], ids[5000:])
    truth = brute_force(x, q, 10, metric)[1]
    got, files = {}, {}
    for name, size in (("beam", 1), ("build codes", 1 << 40)):
        cache_bytes(size)
        path = tmp_path / (name + ".kdx")
        r = _core.merge(str(path), [a._core, b._core], memory_budget=bits_budget, seed=3)
        assert r["rows_inserted"] == 4000
        assert r["build_code_bits"] == (4 if bits_budget else 8)
        out = kd.open(path)
        got[name] = (recall(out, q, truth), recall(out, q, truth, **NARROW))
        out.close()
        files[name] = _container.read_section(path, "level0")
    assert files["beam"] != files["build codes"]
    assert got["beam"][0] >= 0.95
    assert got["beam"][0] >= got["build codes"][0] - 0.01, got
    assert got["beam"][1] >= got["build codes"][1] - 0.02, got


@pytest.mark.parametrize("rows", ["spread", "clustered"])
def test_merge_takes_the_1bit_beam_where_centres_explain_little(rows, beam_rule, tmp_path):
    """A merge inserts rows that their centres explain little of (Gaussian,
    384 dimensions) with the 1-bit beam, far below the cache, as a build
    does, and clustered rows with the build codes' beam; forcing either
    beam shows which one it took."""
    if rows == "spread":
        x = np.random.default_rng(42).standard_normal((4000, 384)).astype(np.float32)
    else:
        x = kd.datasets.clustered(4000, 384, seed=43)
    ids = np.arange(4000, dtype=np.int64)
    # 3,000 rows fit 46 centres, enough for the clusters (39, from 2,500, are not)
    a = kd.Index(384, "l2", seed=2)
    a.add(x[:3000], ids[:3000])
    b = segment(a, x[3000:], ids[3000:])
    files = {}
    for rule in (0, 1, -1):
        beam_rule(rule)
        path = tmp_path / f"rule{rule}.kdx"
        r = _core.merge(str(path), [a._core, b._core], seed=3, threads=1)
        assert r["rows_inserted"] == 1000
        files[rule] = _container.read_section(path, "level0")
    took = 1 if rows == "spread" else -1
    assert files[0] == files[took] != files[-took]


def own_quantizers(metric):
    """6,000 vectors in two indexes, each with a quantizer of its own: a
    holds ids 0..3999, e the rest."""
    x, q = data(6000, seed=9)
    ids = np.arange(6000, dtype=np.int64)
    a = kd.Index(DIM, metric)
    a.add(x[:4000], ids[:4000])
    e = kd.Index(DIM, metric, seed=17)
    e.add(x[4000:], ids[4000:])
    assert not e._core.same_quantizer(a._core)
    return x, q, ids, a, e


def codes_by_id(path, n):
    """Row orders differ (each add inserts its calibration queries last)."""
    return codes_section(path, n)[np.argsort(ids_section(path))]


def assert_searches_its_rows(path, x, q, metric):
    out = kd.open(path)
    assert recall(out, q, brute_force(x, q, 10, metric)[1]) >= 0.95
    D, I = out.search(q, 10, exact=True)
    assert_exact_match(D, I, x, q, metric)
    return out


@pytest.mark.parametrize("metric", ["l2", "cosine"])   # cosine: encoded at unit length
def test_quantizer_mismatch_reencodes(metric, tmp_path):
    """A segment with a quantizer of its own: its codes are encoded anew with
    the base's, exactly as an index adopting the base's quantizer encodes."""
    x, q, ids, a, e = own_quantizers(metric)
    path = tmp_path / "out.kdx"
    r = _core.merge(str(path), [e._core, a._core])
    assert r["base"] == 1 and r["codes_reencoded"] == 2000
    segment(a, x[4000:], ids[4000:]).save(tmp_path / "twin.kdx")
    a.save(tmp_path / "a.kdx")
    assert np.array_equal(codes_section(path, 6000)[:4000],
                          codes_section(tmp_path / "a.kdx", 4000))
    assert np.array_equal(codes_by_id(path, 6000)[4000:],
                          codes_by_id(tmp_path / "twin.kdx", 2000))
    assert_searches_its_rows(path, x, q, metric)


@pytest.mark.parametrize("metric", ["l2", "cosine"])
def test_a_filled_index_adopting_a_quantizer_encodes_its_rows_anew(metric, tmp_path):
    """adopt_quantizer on an index that holds rows (a collection's write
    buffer when its flush refits the quantizer): each row is encoded as an
    index that adopted the quantizer before its adds encodes it, and the
    graph stands; the table, measured on the old codes, is dropped. An
    index opened from disk refuses."""
    x, q, ids, a, e = own_quantizers(metric)
    before, after, twin = (tmp_path / f"{n}.kdx" for n in ("before", "after", "twin"))
    a.save(before)
    assert a._core.calibration()
    a._adopt_quantizer(e)
    assert a._core.same_quantizer(e._core) and a.info()["centres"] == e.info()["centres"]
    assert a._core.calibration() == b"" and a._cal is None
    a.save(after)
    segment(e, x[:4000], ids[:4000]).save(twin)
    assert not np.array_equal(codes_by_id(before, 4000), codes_by_id(after, 4000))
    assert np.array_equal(codes_by_id(after, 4000), codes_by_id(twin, 4000))
    for name, width in (("level0", 32), ("upper", 16)):
        assert lists_of(before, name, width) == lists_of(after, name, width), name
    # Recall per read is the twin's (same codes, another graph of the rows).
    truth = brute_force(x[:4000], q, 10, metric)[1]
    got = [recall(kd.open(p), q, truth, ef=32, oversample=4) for p in (after, twin)]
    assert got[0] >= got[1] - 0.02, got
    D, I = kd.open(after).search(q, 10, exact=True)
    assert_exact_match(D, I, x[:4000], q, metric)
    with pytest.raises(ValueError, match="writable index"):
        kd.open(after)._core.adopt_quantizer(e._core)


@pytest.mark.parametrize("metric", ["l2", "cosine"])
def test_the_callers_quantizer_encodes_every_row(metric, tmp_path):
    """quantizer=: the output takes that quantizer, and every row of an
    input that encodes otherwise, the base's included, is encoded anew with
    it, exactly as an index adopting it encodes; the base's graph is kept."""
    x, q, ids, a, e = own_quantizers(metric)
    fine = kd.Index(DIM, metric, seed=23)
    fine._core.train(np.ascontiguousarray(x[::2]))
    assert fine.info()["centres"] == 46 and a.info()["centres"] == 62
    path = tmp_path / "out.kdx"
    r = _core.merge(str(path), [e._core, a._core], quantizer=fine._core)
    assert r["base"] == 1 and r["rows_reused"] == 4000 and r["codes_reencoded"] == 6000
    segment(fine, x, ids).save(tmp_path / "twin.kdx")
    assert np.array_equal(codes_by_id(path, 6000), codes_by_id(tmp_path / "twin.kdx", 6000))
    out = assert_searches_its_rows(path, x, q, metric)
    assert out._core.same_quantizer(fine._core) and out.info()["centres"] == 46
    # An input's own quantizer as the caller's: as without one.
    again = _core.merge(str(tmp_path / "again.kdx"), [e._core, a._core], quantizer=a._core,
                        threads=1)
    assert again["codes_reencoded"] == 2000
    _core.merge(str(tmp_path / "plain.kdx"), [e._core, a._core], threads=1)
    assert filecmp.cmp(tmp_path / "again.kdx", tmp_path / "plain.kdx", shallow=False)


def test_single_input_without_removals_keeps_its_graph(tmp_path):
    x, q = data(3000)
    a = kd.Index(DIM)
    a.add(x)
    r = _core.merge(str(tmp_path / "out.kdx"), [a._core])
    assert (r["rows_reused"], r["rows_inserted"], r["nodes_repaired"]) == (3000, 0, 0)
    a.save(tmp_path / "a.kdx")
    for name in ("levels", "codes", "ids", "vectors"):
        assert (_container.read_section(tmp_path / "out.kdx", name)
                == _container.read_section(tmp_path / "a.kdx", name)), name
    for name, width in (("level0", 32), ("upper", 16)):
        lists = [lists_of(tmp_path / f, name, width) for f in ("a.kdx", "out.kdx")]
        assert lists[0] == lists[1], name
    meta = [_container.read_metadata(tmp_path / f) for f in ("a.kdx", "out.kdx")]
    assert meta[0].pop("calib_bytes") > 0 and meta[1].pop("calib_bytes") == 0
    assert meta[0] == meta[1]


def test_inserted_levels_follow_ids(tmp_path):
    """An inserted row's level is drawn from its id, not its row number: a
    collection's merges append new rows at the same row numbers round after
    round, and levels drawn from those repeated one pattern (after 50 rounds
    of 2%, 430 of 8000 nodes above level 0 where 500 were due)."""
    x, _ = data(3000, dim=16)
    a = kd.Index(16)
    a.add(x[:2000])
    b = segment(a, x[2000:], np.arange(2000, 3000))
    levels = []
    for gone in (np.zeros(0, np.int64), np.arange(0, 2000, 2)):
        a.remove(gone)                            # b's rows: from row 2000, then from row 1000
        path = tmp_path / ("out%d.kdx" % len(gone))
        r = _core.merge(str(path), [a._core, b._core], seed=9)
        assert r["rows_inserted"] == 1000
        lv = np.frombuffer(_container.read_section(path, "levels"), dtype=np.uint8)
        levels.append(lv[ids_section(path) >= 2000])
    assert np.array_equal(levels[0], levels[1])
    assert 0.03 < np.mean(levels[0] > 0) < 0.1   # 1/16 due


@pytest.mark.parametrize("dim", [1, 17, 4100])
@pytest.mark.parametrize("budget", [0, 1])
def test_odd_dims(dim, budget, tmp_path):
    """Build codes padded to 8 bytes (8 and 4 bits, an odd dim), and a code
    too long for the oracle's stack buffer."""
    n = 400 if dim > 1000 else 1500
    x = kd.datasets.clustered(n, dim, seed=dim)
    a = kd.Index(dim, "cosine" if dim > 1 else "l2", m=8)
    a.add(x[:n // 2])
    b = segment(a, x[n // 2:], np.arange(n // 2, n), m=8)
    a.remove(np.arange(0, n // 2, 3))
    live = np.setdiff1d(np.arange(n), np.arange(0, n // 2, 3))
    path = tmp_path / "out.kdx"
    r = _core.merge(str(path), [a._core, b._core], memory_budget=budget)
    assert r["build_code_bits"] == (4 if budget else 8)
    out = kd.open(path)
    assert out.get_vectors(live).tobytes() == x[live].tobytes()
    q = x[live[::7]]
    truth = brute_force(x[live], q, 10, out.metric, ids=live)[1]
    assert recall(out, q, truth) >= 0.9


def test_kernels_match_the_reference():
    """The build-code distance loops (scalar, and AVX2 and AVX-512 where the
    CPU has them) against the same sums in double precision; the widths
    cover an AVX-512 loop's 8-byte tail (dims 9, 100)."""
    for bits in (4, 8):
        for metric in range(3):
            for dim in (1, 7, 8, 9, 31, 64, 100, 768, 5000):
                assert _core._merge_kernel_gap(bits, dim, metric, dim) < 1e-4, (bits, metric, dim)


def test_nothing_live_gives_an_empty_index(tmp_path):
    x, q = data(500)
    a = kd.Index(DIM, "cosine")
    a.add(x)
    b = segment(a, x[:10], np.arange(1000, 1010))
    a.remove(np.arange(500))
    b.remove(np.arange(1000, 1010))
    path = tmp_path / "empty.kdx"
    r = _core.merge(str(path), [a._core, b._core])
    assert r["rows_written"] == 0 and r["build_code_bits"] == 0
    for index in (kd.open(path), kd.load(path)):
        assert len(index) == 0 and index.metric == "cosine"
        D, I = index.search(q[:3], 5)
        assert (I == -1).all()
        assert index.verify()
    again = kd.Index(DIM, "cosine")              # its quantizer is the base's
    again._core.adopt_quantizer(kd.open(path)._core)
    assert again._core.same_quantizer(a._core)


# ------------------------------------------------------------------ errors


def _pair(**kw):
    x, _ = data(300)
    a = kd.Index(DIM)
    a.add(x)
    b = kd.Index(kw.pop("dim", DIM), **kw)
    b.add(kd.datasets.clustered(200, b.dim, seed=1), np.arange(1000, 1200))
    return a, b


@pytest.mark.parametrize("kw, word", [
    (dict(dim=32), "dim"),
    (dict(metric="ip"), "l2 and ip"),
    (dict(quantization="4bit"), "quantization"),
    (dict(m=8), "m=16 and m=8"),
])
def test_incompatible_inputs(kw, word, tmp_path):
    a, b = _pair(**kw)
    path = tmp_path / "out.kdx"
    with pytest.raises(ValueError, match=word):
        _core.merge(str(path), [a._core, b._core])
    assert os.listdir(tmp_path) == []


def test_bad_arguments(tmp_path):
    x, _ = data(300)
    a = kd.Index(DIM)
    a.add(x)
    b = segment(a, x[:5], np.arange(5))          # ids 0..4 live in both
    path = str(tmp_path / "out.kdx")
    with pytest.raises(ValueError, match="live in more than one"):
        _core.merge(path, [a._core, b._core])
    b.remove(np.arange(5))                        # no longer live: fine
    assert _core.merge(path, [a._core, b._core])["rows_written"] == 300
    os.unlink(path)
    with pytest.raises(ValueError, match="same index twice"):
        _core.merge(path, [a._core, a._core])
    with pytest.raises(ValueError, match="at least one"):
        _core.merge(path, [])
    with pytest.raises(TypeError):
        _core.merge(path, [a._core, "b"])
    with pytest.raises(TypeError):
        _core.merge(path, a._core)
    with pytest.raises(TypeError):
        _core.merge(path, [a._core], progress=5)
    c = kd.Index(DIM)
    c.add(x[:10], np.arange(5000, 5010))
    c.close()
    with pytest.raises(ValueError, match="closed"):
        _core.merge(path, [a._core, c._core])
    with pytest.raises(ValueError, match="closed"):
        _core.merge(path, [a._core], quantizer=c._core)
    with pytest.raises(TypeError, match="quantizer must be"):
        _core.merge(path, [a._core], quantizer=a)
    with pytest.raises(ValueError, match="not trained"):
        _core.merge(path, [a._core], quantizer=kd.Index(DIM)._core)
    for other in (kd.Index(32), kd.Index(DIM, "ip"), kd.Index(DIM, quantization="4bit")):
        other._core.train(kd.datasets.clustered(500, other.dim, seed=3))
        with pytest.raises(ValueError, match="quantizer .* does not fit its inputs"):
            _core.merge(path, [a._core], quantizer=other._core)
    assert os.listdir(tmp_path) == []
    a.search(x[:2], 3)                            # inputs are left usable
    a.remove([7])


@pytest.fixture(scope="module")
def cancel_inputs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cancel")
    x, _ = data(12000, seed=2)
    a = kd.Index(DIM)
    a.add(x[:9000])
    b = segment(a, x[9000:], np.arange(9000, 12000))
    a = reopened(a, tmp / "a.kdx")
    a.remove(np.arange(0, 9000, 4))
    return [a._core, b._core], 4 * (len(a) + len(b))


@pytest.mark.parametrize("at", [0.0, 0.3, 0.6, 0.8, 1.0])
def test_cancel_leaves_nothing(at, cancel_inputs, tmp_path):
    """progress returning False at any point (fit, encode, graph, write,
    the very end): an exception, and no file, temporary or final."""
    inputs, units = cancel_inputs
    seen = []

    def progress(done, total):
        seen.append(done)
        return done < at * total or (at == 1.0 and done < total)

    with pytest.raises(RuntimeError, match="cancelled"):
        _core.merge(str(tmp_path / "out.kdx"), inputs, progress=progress)
    assert os.listdir(tmp_path) == []
    assert seen[-1] >= at * units


def test_progress_exception_propagates(cancel_inputs, tmp_path):
    inputs, _ = cancel_inputs

    def progress(done, total):
        if done > total // 2:
            raise KeyError("stop here")

    with pytest.raises(KeyError, match="stop here"):
        _core.merge(str(tmp_path / "out.kdx"), inputs, progress=progress)
    assert os.listdir(tmp_path) == []


def test_cancel_keeps_an_existing_file(cancel_inputs, tmp_path):
    inputs, _ = cancel_inputs
    path = tmp_path / "out.kdx"
    path.write_bytes(b"previous")
    with pytest.raises(RuntimeError):
        _core.merge(str(path), inputs, progress=lambda d, t: d < t // 2)
    assert path.read_bytes() == b"previous"
    assert os.listdir(tmp_path) == ["out.kdx"]


def test_gil_released(cancel_inputs, tmp_path):
    inputs, _ = cancel_inputs
    target = str(tmp_path / "out.kdx")
    stall, took, ticks, _ = gil_stall(lambda: _core.merge(target, inputs, threads=1),
                                      min_seconds=0.05, enough=0.25)
    assert stall < 0.25, "the ticker was stopped for %.0f%% of the %.3f s merge" % (
        100 * stall, took)


# ------------------------------------------------------------ many rounds


def test_recall_does_not_rot(tmp_path):
    """Ten rounds of: 2% of the merged segment removed, a 2% segment added,
    the two merged. The graph reused ten times over stays as good as a
    fresh build over the same rows."""
    n, dim, step = 10000, 32, 200
    x, q = data(n + 10 * step, dim=dim, seed=21)
    ids = np.arange(len(x), dtype=np.int64)
    rng = np.random.default_rng(4)
    current = kd.Index(dim)
    current.add(x[:n], ids[:n])
    live = ids[:n]
    for r in range(10):
        gone = rng.choice(live, step, replace=False)
        current.remove(gone)
        live = np.setdiff1d(live, gone)
        new = ids[n + r * step: n + (r + 1) * step]
        seg = segment(current, x[new], new)
        path = tmp_path / ("round%d.kdx" % r)
        rep = _core.merge(str(path), [current._core, seg._core], seed=r)
        assert rep["rows_reused"] == len(live) and rep["rows_inserted"] == step
        current = kd.open(path)
        live = np.concatenate([live, new])
    assert len(current) == len(live) == n
    truth = brute_force(x[live], q, 10, "l2", ids=live)[1]
    fresh = kd.Index(dim)
    fresh.add(x[live], live)
    for kw in ({}, NARROW):
        got, want = recall(current, q, truth, **kw), recall(fresh, q, truth, **kw)
        assert got >= want - 0.01, (kw, got, want)
