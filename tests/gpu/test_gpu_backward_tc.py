"""The tensor-core (mma.sync) backward engine on the GPU against the float64 reference backward, at
the head dims it serves (64, 128, and 32 / 96 that come free) and at shapes that exercise every
path of its tile walk: whole tiles (the unmasked fast path), partial tiles, Lq != Lk, odd lengths,
one row, GQA groups, causal, window, document masks, softcap, fully masked rows; both dQ modes.
The comparison and tolerance policy are test_gpu_backward's (`_check`)."""

from __future__ import annotations

import pytest
from gpu_helpers import BACKWARD_SHAPES, backward_case, variant_of
from test_gpu_backward import _check

from attngen.check import fuzz
from attngen.plan.bwd import BwdEngine

SPECS = {
    "tc_bf16_d128_dense": "dtype bf16; head_dim 128; heads 2",
    "tc_bf16_d128_causal_gqa": "dtype bf16; head_dim 128; heads 8 kv 2; mask causal",
    "tc_fp16_d64_cross_causal": "dtype fp16; head_dim 64; heads 4 kv 1; kind cross; mask causal",
    "tc_bf16_d64_window_softcap": "dtype bf16; head_dim 64; heads 4 kv 2; layout bshd; mask window(100, 7); score softcap(30.0)",
    "tc_fp16_d128_padding_causal": "dtype fp16; head_dim 128; heads 2; mask padding && causal",
    "tc_bf16_d64_document": ("dtype bf16; head_dim 64; heads 2; kind cross; input qd: i32[B, Lq] sorted; input kd: i32[B, Lk] sorted; "
                             "mask document(qd, kd)"),
    "tc_fp16_d32_alibi": "dtype fp16; head_dim 32; heads 4; mask causal; score alibi",
    "tc_fp16_d64_padding": "dtype fp16; head_dim 64; heads 2; mask padding",
    "tc_bf16_d96_custom": "dtype bf16; head_dim 96; heads 2; score tanh(s / 4.0) * 4.0",
}
SHAPES = BACKWARD_SHAPES


@pytest.fixture(autouse=True)
def _mma_engine(monkeypatch):
    # These tests are the mma.sync engine's: on sm_90a, where the wgmma engine is the default at
    # head dims 64 / 128 (tests/gpu/test_gpu_backward_wgmma.py), keep the plans on mma.sync.
    from attngen.plan import bwd as plan_bwd

    monkeypatch.setattr(plan_bwd, "wgmma_fits", lambda v, arch: "kept on mma.sync by the test")


def _variant(name: str):
    return variant_of(f"attention {name} {{ {SPECS[name]} }}")


def _case(v, B, Lq, Lk, seed):
    return backward_case(SPECS[v.name], B, Lq, Lk, seed)


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(SPECS))
def test_tc_backward_matches_reference(name):
    import cupy

    from attngen.plan.schedule import Arch
    from attngen.runtime.bwd import compile_backward
    from gpu_helpers import kernel_for

    v = _variant(name)
    arch = kernel_for(v).plan.arch
    if arch not in (Arch.SM80, Arch.SM86, Arch.SM89, Arch.SM90, Arch.SM90A, Arch.SM100, Arch.SM120):
        pytest.skip(f"the tensor-core backward needs sm_80+, this device compiles for {arch.value}")
    assert compile_backward(v, arch).plan.engine == BwdEngine.MMA, cupy.cuda.Device().compute_capability
    for i, (B, Lq, Lk) in enumerate(SHAPES):
        for det in (False, True):
            _check(v, _case(v, B, Lq, Lk, 101 * i + det), det)


@pytest.mark.gpu
def test_tc_backward_long_sequence_causal():
    # Many key and query tiles per CTA (the double-buffered walk) and a GQA group of 4.
    v = _variant("tc_bf16_d128_causal_gqa")
    _check(v, fuzz.Case(B=1, Lq=2048, Lk=2048, dist="normal", seed=7), False)


@pytest.mark.gpu
def test_tc_backward_refuses_misaligned_rows():
    from attngen.runtime.bwd import backward
    from gpu_helpers import kernel_for

    v = _variant("tc_bf16_d64_window_softcap")
    arrays = fuzz.case_inputs(v, fuzz.Case(B=1, Lq=40, Lk=40, seed=3))
    q, k, vv = (fuzz.to_device(arrays[n]) for n in ("q", "k", "v"))
    o, lse = kernel_for(variant_of(f"attention lse_{v.name} {{ {SPECS[v.name]}; output lse }}"))(q, k, vv)

    # dO with a head stride of 68 elements (bshd): not 16-byte rows. Arrays are torch tensors where
    # torch has CUDA (fuzz.to_device), else CuPy.
    if type(o).__module__.startswith("torch"):
        import torch

        wide = torch.ones(tuple(o.shape[:-1]) + (o.shape[-1] + 4,), dtype=o.dtype, device=o.device)
    else:
        import cupy

        wide = cupy.ones(o.shape[:-1] + (o.shape[-1] + 4,), dtype=o.dtype)
    dO = wide[..., : o.shape[-1]]
    with pytest.raises(ValueError, match="multiple of 8 elements"):
        backward(kernel_for(v), q, k, vv, dO, o=o, lse=lse)
    aligned = dO.contiguous() if hasattr(dO, "contiguous") else dO.copy()
    backward(kernel_for(v), q, k, vv, aligned, o=o, lse=lse)  # the same values, aligned: accepted
