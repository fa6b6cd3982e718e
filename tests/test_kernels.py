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


PANEL_ROWS, PANEL_QUERIES = 32, 12


def panel_operands(d, nq, seed):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((nq, d)).astype(np.float32),
            rng.standard_normal((PANEL_ROWS, d)).astype(np.float32))


@pytest.mark.parametrize("d", DIMS)
def test_scalar_panels_match_float64(d):
    q, x = panel_operands(d, 3, 600 + d)
    dots = np.array(_core._kernel("scalar", "panel_dot", q.tobytes(), x.tobytes()))
    norms = np.array(_core._kernel("scalar", "panel_norms", b"", x.tobytes()))
    q64, x64 = q.astype(np.float64), x.astype(np.float64)
    np.testing.assert_allclose(dots, (q64 @ x64.T).ravel(), rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(norms, (x64 ** 2).sum(1), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("d", DIMS)
@pytest.mark.parametrize("nq", [1, 5, PANEL_QUERIES])
def test_panel_kernels_bit_identical_to_scalar(variant, d, nq):
    """Exact search packs rows into panels (the variant's own transpose) and
    sums each pair in order, one FMA a term: every variant gives the scalar
    reference's bits, so results do not depend on the CPU, the batch or a
    row's place in a panel."""
    if not available(variant):
        pytest.skip(f"this CPU lacks {variant}")
    q, x = panel_operands(d, nq, 700 + d + nq)
    assert (_core._kernel(variant, "panel_dot", q.tobytes(), x.tobytes())
            == _core._kernel("scalar", "panel_dot", q.tobytes(), x.tobytes()))
    assert (_core._kernel(variant, "panel_norms", b"", x.tobytes())
            == _core._kernel("scalar", "panel_norms", b"", x.tobytes()))
    # Each query's sums are the same alone as in the batch.
    alone = _core._kernel(variant, "panel_dot", q[-1].tobytes(), x.tobytes())
    assert alone == _core._kernel(variant, "panel_dot", q.tobytes(), x.tobytes())[-PANEL_ROWS:]


def test_panel_operands_checked():
    x = np.zeros((PANEL_ROWS, 4), np.float32).tobytes()
    with pytest.raises(ValueError, match="panel takes 32 rows and 1 to 12 queries"):
        _core._kernel("scalar", "panel_dot", np.zeros((13, 4), np.float32).tobytes(), x)
    with pytest.raises(ValueError, match="panel takes"):
        _core._kernel("scalar", "panel_dot", np.zeros(4, np.float32).tobytes(), x[:-16])
    with pytest.raises(ValueError, match="unknown kernel"):
        _core._kernel("scalar", "panel_l2sq", np.zeros(4, np.float32).tobytes(), x)


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
