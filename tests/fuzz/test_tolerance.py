"""The tolerance policy: bounds per dtype, NaN never passes, LSE rules for empty rows."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from attngen.check import tolerance
from attngen.ir.nodes import DType

RNG = np.random.default_rng(0)


def _ref(shape=(2, 4, 64, 32)) -> np.ndarray:
    return RNG.standard_normal(shape)


@pytest.mark.parametrize("dt", [DType.FP32, DType.FP16, DType.BF16])
def test_relative_l2_bound_is_enforced(dt: DType) -> None:
    ref = _ref()
    noise = RNG.standard_normal(ref.shape)
    noise *= np.linalg.norm(ref) / np.linalg.norm(noise)
    bound = tolerance.POLICY[dt].rel_l2
    assert tolerance.check(ref + 0.5 * bound * noise, ref, dt).ok
    rep = tolerance.check(ref + 2.0 * bound * noise, ref, dt)
    assert not rep.ok and "relative L2" in rep.summary()


@pytest.mark.parametrize("dt", [DType.FP32, DType.FP16, DType.BF16])
def test_one_element_far_off_fails_max_abs(dt: DType) -> None:
    ref = _ref()
    out = ref.copy()
    out[1, 2, 3, 4] += 3 * tolerance.POLICY[dt].max_abs * np.abs(ref).max()
    rep = tolerance.check(out, ref, dt)
    assert not rep.ok
    assert rep.worst_index == (1, 2, 3, 4)
    assert "max abs" in rep.summary()


def test_a_single_nan_never_passes() -> None:
    ref = _ref()
    out = ref.copy()
    out[0, 0, 0, 0] = np.nan
    rep = tolerance.check(out, ref, "bf16")
    assert not rep.ok and rep.n_nan == 1 and "NaN" in rep.summary()
    rep = tolerance.check(ref, np.where(ref > 3, np.nan, ref), DType.FP32)
    assert not rep.ok  # NaN in the reference is a failure too


def test_all_zero_reference_demands_zeros() -> None:
    ref = np.zeros((3, 5))
    assert tolerance.check(np.zeros((3, 5)), ref, "fp16").ok
    out = np.zeros((3, 5))
    out[1, 1] = 1e-30
    assert not tolerance.check(out, ref, "fp16").ok


def test_infinities_must_match() -> None:
    ref = _ref((4, 4))
    out = ref.copy()
    out[2, 2] = np.inf
    assert not tolerance.check(out, ref, "fp32").ok


def test_shape_mismatch_fails() -> None:
    rep = tolerance.check(np.zeros((2, 3)), np.zeros((3, 2)), "fp32")
    assert not rep.ok and "shape" in rep.summary()


def test_bf16_arrays_are_accepted() -> None:
    ref = _ref((8, 16))
    out = ref.astype(ml_dtypes.bfloat16)
    assert tolerance.check(out, ref, DType.BF16).ok
    assert not tolerance.check(out, ref, DType.FP32).ok  # bf16 rounding is far beyond fp32's bound


def test_lse_minus_inf_rows_must_match_exactly() -> None:
    ref = RNG.standard_normal((2, 3, 5)).astype(np.float32) + 4
    ref[0, 1, 2] = -np.inf
    good = ref.copy()
    assert tolerance.check_lse(good, ref, "bf16").ok
    bad = ref.copy()
    bad[0, 1, 2] = 0.0  # a finite value where the row is empty
    rep = tolerance.check_lse(bad, ref, "bf16")
    assert not rep.ok and "fully masked" in rep.summary()
    bad2 = ref.copy()
    bad2[1, 0, 0] = -np.inf  # -inf where the reference is finite
    assert not tolerance.check_lse(bad2, ref, "bf16").ok
    off = ref.copy()
    off[1, 1, 1] += 0.01
    assert not tolerance.check_lse(off, ref, "fp32").ok
    near = ref.copy()
    near[1, 1, 1] += 1e-6
    assert tolerance.check_lse(near, ref, "fp32").ok


def test_assert_close_raises_with_a_readable_summary() -> None:
    ref = _ref((4, 8))
    with pytest.raises(AssertionError, match=r"O \[fp16\]: MISMATCH rel_l2="):
        tolerance.assert_close(ref * 1.1, ref, "fp16", "O")
    assert tolerance.assert_close(ref, ref, "fp16").ok
    with pytest.raises(AssertionError, match="LSE"):
        tolerance.assert_close(np.full((2, 2), -np.inf), np.zeros((2, 2)), "fp16", "LSE")


def test_score_error_widens_bounds_for_large_inputs() -> None:
    q = RNG.standard_normal((1, 1, 16, 64))
    k = RNG.standard_normal((1, 1, 16, 64))
    small = tolerance.score_error(q, k, 1 / 8)
    large = tolerance.score_error(30 * q, 30 * k, 1 / 8)
    assert 0 < small < 1e-5 and math.isclose(large / small, 900, rel_tol=1e-9)
    r0, a0 = tolerance.bounds("fp32")
    r1, a1 = tolerance.bounds("fp32", large)
    assert r1 > r0 and a1 > a0
    with pytest.raises(ValueError):
        tolerance.tolerance_for(DType.I32)
