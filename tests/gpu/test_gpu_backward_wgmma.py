"""The wgmma (sm_90a) backward engine on the GPU against the float64 reference backward, at the
head dims it serves (64, 128) and at shapes that exercise every path of its tile walk: whole tiles
(the unmasked fast path), partial tiles, Lq != Lk, odd lengths, one row, GQA groups, causal,
window, document masks, softcap and custom scores, q/k pre-norms, fully masked rows; both dQ
modes. The comparison and tolerance policy are test_gpu_backward's (`_check`). Skipped on devices
that do not compile for sm_90a."""

from __future__ import annotations

import pytest
from gpu_helpers import BACKWARD_SHAPES, backward_case, variant_of
from test_gpu_backward import _check

from attngen.check import fuzz
from attngen.plan.bwd import BwdEngine

SPECS = {
    "wg_bf16_d128_dense": "dtype bf16; head_dim 128; heads 2",
    "wg_bf16_d128_causal_gqa": "dtype bf16; head_dim 128; heads 8 kv 2; mask causal",
    "wg_bf16_d64_dense": "dtype bf16; head_dim 64; heads 4 kv 2",
    "wg_fp16_d64_cross_causal": "dtype fp16; head_dim 64; heads 4 kv 1; kind cross; mask causal",
    "wg_bf16_d64_window_softcap": "dtype bf16; head_dim 64; heads 4 kv 2; layout bshd; mask window(100, 7); score softcap(30.0)",
    "wg_fp16_d128_padding_causal": "dtype fp16; head_dim 128; heads 2; mask padding && causal",
    # D64 steps (128 queries) test visibility inside the products, with the lookups read per query
    # and per key once the products land
    "wg_bf16_d64_document": ("dtype bf16; head_dim 64; heads 2; kind cross; input qd: i32[B, Lq] sorted; input kd: i32[B, Lk] sorted; "
                             "mask document(qd, kd)"),
    "wg_fp16_d64_padding_causal": "dtype fp16; head_dim 64; heads 2; mask padding && causal",
    # D128 steps test visibility before the products, with the mask's lookups read per query and
    # per key (emit.split_by_axis)
    "wg_bf16_d128_document_causal": "dtype bf16; head_dim 128; heads 4 kv 2; input doc: i32[B, Lk] sorted; mask document(doc) && causal",
    "wg_fp16_d64_alibi": "dtype fp16; head_dim 64; heads 4; mask causal; score alibi",
    "wg_bf16_d128_custom": "dtype bf16; head_dim 128; heads 2; score tanh(s / 4.0) * 4.0",
    "wg_bf16_d128_qk_rmsnorm": "dtype bf16; head_dim 128; heads 4 kv 2; mask causal; norm q rmsnorm(1e-6) scope head; norm k rmsnorm(1e-6) scope head",
}
SHAPES = BACKWARD_SHAPES


def _variant(name: str):
    return variant_of(f"attention {name} {{ {SPECS[name]} }}")


def _case(v, B, Lq, Lk, seed):
    return backward_case(SPECS[v.name], B, Lq, Lk, seed)


def _require_sm90a(v):
    from attngen.plan.schedule import Arch
    from attngen.runtime.bwd import compile_backward
    from gpu_helpers import kernel_for

    arch = kernel_for(v).plan.arch
    if arch != Arch.SM90A:
        pytest.skip(f"the wgmma backward needs sm_90a, this device compiles for {arch.value}")
    assert compile_backward(v, arch).plan.engine == BwdEngine.WGMMA


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(SPECS))
def test_wgmma_backward_matches_reference(name):
    v = _variant(name)
    _require_sm90a(v)
    for i, (B, Lq, Lk) in enumerate(SHAPES):
        for det in (False, True):
            _check(v, _case(v, B, Lq, Lk, 101 * i + det), det)


@pytest.mark.gpu
def test_wgmma_backward_long_sequence_causal():
    # Many key and query tiles per CTA (the double-buffered walk) and a GQA group of 4.
    v = _variant("wg_bf16_d128_causal_gqa")
    _require_sm90a(v)
    _check(v, fuzz.Case(B=1, Lq=2048, Lk=2048, dist="normal", seed=7), False)
