"""Notebook display: repr and _repr_html_ show dim, metric, count,
quantization, backend and resident memory; stats() and info() are dicts."""
import json
import warnings

import numpy as np

import knndirect as kd
from knndirect.datasets import clustered


def _index(n=500, dim=12):
    index = kd.Index(dim, "cosine", quantization="4bit")
    index.add(clustered(n, dim, seed=1))
    return index


def test_repr_shows_the_essentials():
    r = repr(_index())
    for part in ("dim=12", "metric='cosine'", "count=500", "quantization='4bit'",
                 "backend='memory'", "resident="):
        assert part in r, part


def test_html_repr_shows_the_essentials():
    h = _index()._repr_html_()
    assert h.startswith("<") and "<table>" in h
    for part in ("dim", "12", "metric", "cosine", "count", "500", "quantization", "4bit",
                 "backend", "memory", "resident memory", "KiB"):
        assert part in h, part


def test_html_repr_of_opened_index_and_closed(tmp_path):
    index = _index()
    index.save(tmp_path / "a.kdx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        opened = kd.open(tmp_path / "a.kdx")
    h = opened._repr_html_()
    assert "a.kdx" in h and "O_DIRECT" in h and opened.info()["io_backend"] in h
    opened.close()
    assert "closed" in opened._repr_html_() and "closed" in repr(opened)


def test_html_repr_escapes_the_path(tmp_path):
    d = tmp_path / "<b>&"
    d.mkdir()
    _index().save(d / "x.kdx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        with kd.open(d / "x.kdx") as opened:
            h = opened._repr_html_()
    assert "<b>&" not in h and "&lt;b&gt;&amp;" in h


def test_stats_and_info_are_plain_dicts():
    index = _index()
    index.search(np.zeros(12, dtype=np.float32) + 1, 3)
    st = index.stats()
    assert type(st) is dict and st["queries"] == 1
    assert set(st) >= {"queries", "read_ops", "read_bytes", "rerank_vectors",
                       "io_wait_seconds"}
    info = index.info()
    assert type(info) is dict
    json.dumps(info)
    json.dumps(st)
    assert index.stats(reset=True)["queries"] == 1 and index.stats()["queries"] == 0
