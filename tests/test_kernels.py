"""SIMD distance kernels against the scalar reference, on odd dims."""
import numpy as np
import pytest

import knndirect as kd
from knndirect import _core

DIMS = [1, 3, 8, 17, 100, 769]
VARIANTS = ["avx2", "avx512"]


def available(name):
    feats = kd.features()
    return {"avx2": feats["avx2"], "avx512": feats["avx512"], "scalar": True}[name]


def operands(d, seed):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(4 * d).astype(np.float32),
            rng.standard_normal(d).astype(np.float32))


@pytest.mark.parametrize("d", DIMS)
def test_scalar_reference_matches_float64(d):
    a, b = operands(d, d)
    q = a[:d]
    assert _core._kernel("scalar", "dot", q.tobytes(), b.tobytes()) == pytest.approx(
        float(np.dot(q.astype(np.float64), b)), rel=1e-5, abs=1e-5)
    assert _core._kernel("scalar", "l2sq", q.tobytes(), b.tobytes()) == pytest.approx(
        float(((q.astype(np.float64) - b) ** 2).sum()), rel=1e-5, abs=1e-5)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("d", DIMS)
def test_pair_kernels_match_scalar(variant, d):
    if not available(variant):
        pytest.skip(f"this CPU lacks {variant}")
    a, b = operands(d, 100 + d)
    q = a[:d].tobytes()
    for which in ("dot", "l2sq"):
        ref = _core._kernel("scalar", which, q, b.tobytes())
        got = _core._kernel(variant, which, q, b.tobytes())
        assert got == pytest.approx(ref, rel=1e-5, abs=1e-5), which


@pytest.mark.parametrize("variant", ["scalar"] + VARIANTS)
@pytest.mark.parametrize("d", DIMS)
def test_block_kernels_match_pairs(variant, d):
    if not available(variant):
        pytest.skip(f"this CPU lacks {variant}")
    a, b = operands(d, 200 + d)
    qs = a.reshape(4, d)
    dots = _core._kernel(variant, "dot4", a.tobytes(), b.tobytes())
    l2s = _core._kernel(variant, "l2sq4", a.tobytes(), b.tobytes())
    for j in range(4):
        dot = _core._kernel("scalar", "dot", qs[j].tobytes(), b.tobytes())
        l2sq = _core._kernel("scalar", "l2sq", qs[j].tobytes(), b.tobytes())
        assert dots[j] == pytest.approx(dot, rel=1e-5, abs=1e-5)
        assert l2s[j] == pytest.approx(l2sq, rel=1e-5, abs=1e-5)
    assert dots[4] == pytest.approx(_core._kernel("scalar", "dot", b.tobytes(), b.tobytes()),
                                    rel=1e-5, abs=1e-5)


@pytest.mark.parametrize("variant", ["scalar"] + VARIANTS)
@pytest.mark.parametrize("d", DIMS)
def test_tile_kernels_equal_four_block_calls(variant, d):
    """Exact search scores four rows at a time: each sum equals, to the bit,
    the block kernel's for that row (same variant), so results do not depend
    on where a row falls in a tile."""
    if not available(variant):
        pytest.skip(f"this CPU lacks {variant}")
    a, _ = operands(d, 300 + d)
    rows, _ = operands(d, 400 + d)
    x = rows.reshape(4, d)
    dots = _core._kernel(variant, "dot4x4", a.tobytes(), rows.tobytes())
    l2s = _core._kernel(variant, "l2sq4x4", a.tobytes(), rows.tobytes())
    for r in range(4):
        one = _core._kernel(variant, "dot4", a.tobytes(), x[r].tobytes())
        assert dots[4 * r:4 * r + 4] == one[:4] and dots[16 + r] == one[4]
        assert l2s[4 * r:4 * r + 4] == _core._kernel(variant, "l2sq4", a.tobytes(),
                                                     x[r].tobytes())[:4]


def test_kernel_in_use_is_reported():
    feats = kd.features()
    expected = "avx512" if feats["avx512"] else ("avx2" if feats["avx2"] else "scalar")
    assert feats["simd"] == expected


def test_unknown_or_unavailable_kernel_raises():
    with pytest.raises(ValueError):
        _core._kernel("nope", "dot", b"\0" * 4, b"\0" * 4)
    with pytest.raises(ValueError):
        _core._kernel("scalar", "dot", b"\0" * 8, b"\0" * 4)


FWHT_SIZES = [1, 2, 4, 8, 16, 64, 256, 1024, 4096]


@pytest.mark.parametrize("n", FWHT_SIZES)
def test_fwht_reference_is_orthonormal_hadamard(n):
    x = np.random.default_rng(n).standard_normal(n).astype(np.float32)
    got = np.frombuffer(_core._kernel("scalar", "fwht", x.tobytes(), b""), np.float32)
    h = np.ones((1, 1))
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    np.testing.assert_allclose(got, h @ x.astype(np.float64) / np.sqrt(n), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("n", FWHT_SIZES)
def test_fwht_variants_bit_identical_to_scalar(variant, n):
    # Codes written on one CPU are decoded by queries rotated on another.
    if not available(variant):
        pytest.skip(f"this CPU lacks {variant}")
    x = (np.random.default_rng(500 + n).standard_normal(n) * 1e3).astype(np.float32).tobytes()
    assert _core._kernel(variant, "fwht", x, b"") == _core._kernel("scalar", "fwht", x, b"")


def test_fwht_refuses_other_lengths():
    for n in (0, 3, 12):
        with pytest.raises(ValueError, match="power of two"):
            _core._kernel("scalar", "fwht", np.zeros(n, np.float32).tobytes(), b"")
