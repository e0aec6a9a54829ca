"""The CPU kernel's fp16/bf16 conversions, bit for bit against NumPy / ml_dtypes: with one key,
attention returns V exactly, so O = round(V + x) (`residual`) is one fp32 sum rounded to the
element type, over every fp16/bf16 bit pattern and sums that land on subnormals, ties and overflow."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from attngen.lang.frontend import loads

SPEC = "attention conv {{\n  dtype {dtype}\n  head_dim 256\n  heads 1\n  kind cross\n  residual\n}}\n"


@pytest.mark.parametrize("dtype,np_dtype,bits", [("fp16", np.float16, np.uint16), ("bf16", ml_dtypes.bfloat16, np.uint16)])
def test_round_trip_and_rounding_of_sums(dtype, np_dtype, bits, cpu_kernel):
    k = cpu_kernel(loads(SPEC.format(dtype=dtype)).get())
    every = np.arange(65536, dtype=np.uint32).astype(bits).view(np_dtype)
    finite = every[np.isfinite(every.astype(np.float32))]
    rng = np.random.default_rng(0)
    for x in (np.zeros_like(finite), rng.permutation(finite)):  # V itself, then V + x
        n = finite.size // 256 * 256
        v = finite[:n].reshape(-1, 1, 1, 256)
        q = x[:n].reshape(-1, 1, 1, 256)
        kk = np.zeros((v.shape[0], 1, 1, 256), dtype=np_dtype)
        o = k(q, kk, v)
        with np.errstate(over="ignore"):  # bf16 sums past fp32's range are inf, in both
            want = (v.astype(np.float32) + q.astype(np.float32)).astype(np_dtype)
        got_bits, want_bits = np.asarray(o).view(bits), want.view(bits)
        # -0 + 0 is +0 in both; NaN never arises from finite inputs.
        bad = np.nonzero(got_bits != want_bits)
        assert bad[0].size == 0, (f"{bad[0].size} mismatches, first: v={v[bad][0]!r} x={q[bad][0]!r} "
                                  f"got {o[bad][0]!r} want {want[bad][0]!r}")
