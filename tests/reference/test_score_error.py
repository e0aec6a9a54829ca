"""reference.score_error covers what the kernel legitimately does differently from the reference:
normalised q/k computed in fp32 (not float64) before both round them to the spec dtype."""

from __future__ import annotations

import numpy as np
import pytest

from attngen.check import reference
from attngen.lang.frontend import loads
from attngen.ir.nodes import NormKind
from attngen.check.reference import round_to


def _fp32_layernorm(x: np.ndarray, eps: float) -> np.ndarray:
    x = x.astype(np.float32)
    mu = x.mean(axis=-1, keepdims=True, dtype=np.float32)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True, dtype=np.float32)
    return ((x - mu) / np.sqrt(var + np.float32(eps))).astype(np.float64)


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_bound_covers_fp32_normalisation_flips(dtype: str) -> None:
    v = loads(f"attention t {{ dtype {dtype}; head_dim 64; heads 1; norm k layernorm(1e-5) affine false; output lse }}").variants[0]
    rng = np.random.default_rng(5)
    q = round_to(rng.standard_normal((1, 1, 256, 64)), v.dtype)
    k = round_to(rng.standard_normal((1, 1, 2048, 64)), v.dtype)
    exact = round_to(reference._normalise(k[0, 0], NormKind.LAYERNORM, 1e-5, None, None), v.dtype)
    kernel_like = round_to(_fp32_layernorm(k[0, 0], 1e-5), v.dtype)
    flips = int((exact != kernel_like).sum())
    assert flips > 0, "the inputs should contain at least one rounding flip for the test to mean anything"
    s_exact = q[0, 0] @ exact.T * v.effective_scale
    s_kernel = q[0, 0] @ kernel_like.T * v.effective_scale
    worst = float(np.abs(s_exact - s_kernel).max())
    bound = reference.score_error(v, q, k, {})
    assert worst <= bound, (worst, bound, flips)
    # ... and the bound is not vacuous: well under the scores' own spread.
    assert bound < 0.05 * float(np.abs(s_exact).max())


def test_no_norm_keeps_the_accumulation_estimate() -> None:
    v = loads("attention t { dtype bf16; head_dim 64; heads 1 }").variants[0]
    rng = np.random.default_rng(1)
    q = rng.standard_normal((1, 1, 8, 64))
    k = rng.standard_normal((1, 1, 8, 64))
    from attngen.check import tolerance

    assert reference.score_error(v, q, k, {}) == tolerance.score_error(q, k, v.effective_scale)
