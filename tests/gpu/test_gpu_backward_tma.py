"""The wgmma backward's TMA copies (plan_bwd.WG_LOADS) on the GPU: the dK/dV kernel copying K, V
and each step's Q and dO by TMA computes the same dK and dV, bit for bit, as the one copying them
by cp.async (both run the same products in the same order; dQ goes through fp32 atomics in
either, so only its tolerance is checked), and matches the float64 reference, on specs whose
copies read the caller's tensors (bhsd and bshd, GQA, strided views) and the workspaces of the
q/k pre-norms and the o post-norm (ws_q, ws_k, ws_do). Skipped on devices without sm_90a."""

from __future__ import annotations

import numpy as np
import pytest
from gpu_helpers import backward_case, kernel_for, variant_of
from test_gpu_backward import _check

from attngen.check import fuzz
from attngen.plan import bwd as plan_bwd
from attngen.plan.bwd import BwdEngine
from attngen.plan.schedule import Arch, WgmmaLoads

SPECS = {
    "tma_bf16_d128_causal_gqa": "dtype bf16; head_dim 128; heads 8 kv 2; mask causal",
    "tma_bf16_d64_dense_bshd": "dtype bf16; head_dim 64; heads 4 kv 2; layout bshd",
    "tma_fp16_d128_cross_window": "dtype fp16; head_dim 128; heads 2; kind cross; layout bshd; mask window(100, 7)",
    "tma_bf16_d64_qk_norm": "dtype bf16; head_dim 64; heads 4 kv 2; mask causal; norm q rmsnorm(1e-6) scope head; norm k layernorm(1e-5)",
    "tma_bf16_d128_o_norm_residual": "dtype bf16; head_dim 128; heads 2; mask causal; norm o rmsnorm(1e-6); residual",
    "tma_bf16_d64_preln": "dtype bf16; head_dim 64; heads 4; kind cross; layout bshd; norm q layernorm(1e-5) scope token; residual",
}
SHAPES = [(2, 333, 333), (1, 1, 1), (1, 257, 129), (3, 64, 64), (1, 1000, 517)]


@pytest.fixture(autouse=True)
def _restore_loads():
    yield
    plan_bwd.WG_LOADS = WgmmaLoads.TMA


def _grads(v, arrays, dO, loads: WgmmaLoads):
    from attngen.runtime.bwd import backward, compile_backward

    plan_bwd.WG_LOADS = loads
    kern = kernel_for(v)
    assert compile_backward(v, kern.plan.arch).plan.backward.wg_loads == loads
    q, k, vv, rest = fuzz.split_inputs(arrays)
    dev = {n: fuzz.to_device(a) for n, a in rest.items()}
    out = backward(kern, fuzz.to_device(q), fuzz.to_device(k), fuzz.to_device(vv), fuzz.to_device(dO), **dev)
    fuzz.synchronize()
    return [fuzz.to_host(x, v.dtype) for x in out]


def _sm90a(v):
    arch = kernel_for(v).plan.arch
    if arch != Arch.SM90A:
        pytest.skip(f"the wgmma backward needs sm_90a, this device compiles for {arch.value}")


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(SPECS))
def test_tma_copies_equal_cp_async_and_reference(name):
    from attngen.check import reference
    from attngen.ir import abi

    v = variant_of(f"attention {name} {{ {SPECS[name]} }}")
    _sm90a(v)
    for i, (B, Lq, Lk) in enumerate(SHAPES):
        case = backward_case(SPECS[name], B, Lq, Lk, 31 * i + 5)
        arrays = fuzz.case_inputs(v, case)
        dO = np.random.default_rng(case.seed + 1).normal(size=abi.o_shape(v, case.B, case.Lq)).astype(reference.dtype_of(v.dtype))
        tma = _grads(v, arrays, dO, WgmmaLoads.TMA)
        cpa = _grads(v, arrays, dO, WgmmaLoads.CP_ASYNC)
        where = f"{name} {case.describe()}"
        for n, a, b in zip(("dk", "dv"), tma[1:], cpa[1:]):
            assert a.tobytes() == b.tobytes(), f"{where}: {n} differs between the TMA and the cp.async kernel"
        dq_t, dq_c = (x.astype(np.float64) for x in (tma[0], cpa[0]))
        assert np.all(np.isfinite(dq_t)), f"{where}: dq holds NaN/Inf under TMA"
        assert np.abs(dq_t - dq_c).max() <= 1e-2 * max(np.abs(dq_c).max(), 1e-6), f"{where}: dq of the two kernels apart"
        plan_bwd.WG_LOADS = WgmmaLoads.TMA
        _check(v, case, False)  # the TMA kernel against the float64 reference (the suite's policy)


@pytest.mark.gpu
def test_tma_copies_of_strided_views():
    """q, k, v as views into one packed [B, L, 3, H, D] projection (bshd: row stride 3 H D) and a
    dO view with a padded row: the descriptors take the views' strides; the gradients equal the
    cp.async kernel's on the same views and the contiguous copies' reference."""
    import cupy as cp

    from attngen.check import reference
    from attngen.runtime.bwd import backward

    v = variant_of("attention tma_views { dtype bf16; head_dim 64; heads 4; layout bshd; mask causal }")
    _sm90a(v)
    B, L, H, D = 2, 300, 4, 64
    rng = np.random.default_rng(3)
    et = reference.dtype_of(v.dtype)
    qkv = rng.normal(size=(B, L, 3, H, D)).astype(et)
    dO_pad = rng.normal(size=(B, L, H, D + 8)).astype(et)
    dev_qkv, dev_do = fuzz.to_device(qkv), fuzz.to_device(dO_pad)
    q, k, vv = (dev_qkv[:, :, i] for i in range(3))
    dO = dev_do[..., :D]
    kern = kernel_for(v)
    got = {}
    for loads in (WgmmaLoads.TMA, WgmmaLoads.CP_ASYNC):
        plan_bwd.WG_LOADS = loads
        got[loads] = [fuzz.to_host(x, v.dtype) for x in backward(kern, q, k, vv, dO)]
        cp.cuda.runtime.deviceSynchronize()
    for n, a, b in zip(("dq", "dk", "dv"), got[WgmmaLoads.TMA], got[WgmmaLoads.CP_ASYNC]):
        if n != "dq":
            assert a.tobytes() == b.tobytes(), f"strided views: {n} differs between TMA and cp.async"
    want = reference.attention_backward(v, qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], {}, dO_pad[..., :D].astype(np.float64))
    for n, a in zip(("dq", "dk", "dv"), got[WgmmaLoads.TMA]):
        a = a.astype(np.float64)
        assert np.abs(a - want[n]).max() <= 2e-2 * np.abs(want[n]).max() + 1e-3, f"strided views: {n} off the reference"


@pytest.mark.gpu
def test_tma_is_the_default_and_plan_names_it():
    v = variant_of("attention tma_default { dtype bf16; head_dim 128; heads 2; mask causal }")
    _sm90a(v)
    from attngen.runtime.bwd import compile_backward

    bk = compile_backward(v, Arch.SM90A)
    assert bk.plan.engine == BwdEngine.WGMMA and bk.plan.backward.wg_loads == WgmmaLoads.TMA
    assert "cp.async.bulk.tensor.4d" in bk.source and "__grid_constant__" in bk.source
