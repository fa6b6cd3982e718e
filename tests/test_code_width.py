"""1-bit codes of 512 bits from 256 dimensions down: a plain 1-bit index of
256 dimensions or fewer pads each vector with zeros to 512 before the
rotation and the signs (format 5). Files of format 4 and before keep their narrower codes, and a
file whose width disagrees with its version is refused."""
import numpy as np
import pytest

import knndirect as kd
from knndirect import _container

from conftest import brute_force, split, with_version

K = 10
GOLDEN_NARROW = "tests/data/golden_v4_l2_1bit.kdx"


def _saved(index, tmp_path, name="i.kdx"):
    path = tmp_path / name
    index.save(path)
    return path, _container.read_metadata(path), _container.read_layout(path).version


@pytest.mark.parametrize("dim, quantization, pdim, version", [
    (24, "1bit", 512, 5), (100, "1bit", 512, 5), (256, "1bit", 512, 5),
    (257, "1bit", 320, 4), (384, "1bit", 384, 4), (520, "1bit", 576, 4),
    (100, "1bit+4bit", 128, 4), (100, "4bit", 128, 2),
])
def test_width_and_version(dim, quantization, pdim, version, tmp_path):
    x, _ = split(300, 1, dim, seed=dim)
    index = kd.Index(dim, "l2", quantization=quantization)
    index.add(x, threads=1)
    _, meta, got = _saved(index, tmp_path)
    assert (meta["pdim"], got) == (pdim, version)
    if quantization == "1bit":
        assert index.info()["code_size"] == meta["code_size"] == pdim // 8 + 16


def test_wider_codes_estimate_closer():
    """The same vectors as a format 4 file of 64-bit codes: built again, the
    512-bit codes err about sqrt(8) times less (at least twice less here)."""
    e = np.load(GOLDEN_NARROW.replace(".kdx", ".npz"))
    base = e["base"].astype(np.float32)
    queries = base[:100] + np.float32(0.05) * np.random.default_rng(3).standard_normal(
        (100, base.shape[1]), dtype=np.float32)
    narrow = kd.load(GOLDEN_NARROW)
    removed = set(e["removed"].tolist())
    keep = np.array([i for i, v in enumerate(e["ids"].tolist()) if v not in removed])
    wide = kd.Index(base.shape[1], "l2", m=8, seed=1)
    wide.add(base[keep], ids=e["ids"][keep], threads=1)
    by_id = dict(zip(e["ids"].tolist(), base))
    full = np.stack([by_id[i] for i in sorted(by_id)])
    order = {v: j for j, v in enumerate(sorted(by_id))}

    def error(index):
        D, I = index.search(queries, 50, ef=200, oversample=1, rerank=False)
        rows = np.vectorize(order.get)(I)
        exact = ((full[rows] - queries[:, None, :]) ** 2).sum(-1)
        return float(np.median(np.abs(D - exact) / exact))
    assert _container.read_metadata(GOLDEN_NARROW)["pdim"] == 64
    assert error(wide) * 2 < error(narrow), (error(wide), error(narrow))
    narrow.close()
    wide.close()


def test_wide_codes_recall_and_round_trip(tmp_path):
    base, queries = split(3000, 100, 96, seed=5)
    _, truth = brute_force(base, queries, K, "cosine")
    index = kd.Index(96, "cosine", seed=2)
    index.add(base, threads=2)
    D0, I0 = index.search(queries, K, ef=64, oversample=1, rerank=False)
    path, meta, version = _saved(index, tmp_path)
    assert (meta["pdim"], version) == (512, 5)
    for again in (kd.load(path), kd.open(path)):
        D1, I1 = again.search(queries, K, ef=64, oversample=1, rerank=False)
        np.testing.assert_array_equal(I0, I1)
        np.testing.assert_array_equal(D0, D1)
        again.close()
    got = np.mean([len(set(a) & set(t)) / K for a, t in zip(index.search(queries, K)[1], truth)])
    assert got >= 0.95, got


def test_a_width_unlike_the_version_is_refused(tmp_path):
    """Format 4 read 64-bit codes for 24 dims, format 5 reads 512: a file
    claiming the other version is inconsistent, not misread."""
    x, _ = split(300, 1, 24, seed=8)
    index = kd.Index(24, "l2")
    index.add(x, threads=1)
    wide = index.to_bytes()
    with open(GOLDEN_NARROW, "rb") as f:
        narrow = f.read()
    for blob, version in ((wide, 4), (narrow, 5)):
        with pytest.raises(kd.CorruptIndexError, match="metadata"):
            kd.load(with_version(blob, version))
    assert kd.load(with_version(narrow, 4)).info()["code_size"] == 64 // 8 + 16
