"""The backward kernels on the GPU against the float64 reference backward (attngen.check.reference_bwd).

Hypothesis draws the spec (fp32/fp16/bf16; causal, window, padding, document, block-sparse masks;
softcap, alibi, bias, rel_bias and custom score expressions; GQA and MQA; residual), the shapes
(odd lengths, Lq != Lk for cross attention, tile boundaries), padding lengths that leave whole rows
or whole batches masked, and the dQ mode (fp32 atomics or deterministic). dq, dk and dv are
compared with the reference on the same rounded inputs; rows with nothing visible must give
exactly zero."""

from __future__ import annotations

import numpy as np
import pytest
from gpu_helpers import examples, kernel_for, variant_of
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attngen.ir import abi
from attngen.check import fuzz, reference
from attngen.runtime.bwd import backward
from attngen.ir.nodes import AttnKind, DType

SPECS = {
    "fp32_causal_softcap_gqa": "dtype fp32; head_dim 64; heads 4 kv 2; mask causal; score softcap(5.0)",
    "fp16_padding_mqa_cross": "dtype fp16; head_dim 64; heads 4 kv 1; kind cross; mask padding",
    "bf16_window_alibi_bshd": "dtype bf16; head_dim 128; heads 2; layout bshd; mask window(50, 5); score alibi",
    "bf16_bias_gqa": "dtype bf16; head_dim 64; heads 4 kv 2; input bb: fp32[H, Lq, Lk]; mask causal; score bias(bb)",
    "fp16_rel_bias": "dtype fp16; head_dim 128; heads 2; input rel: fp32[H, 33]; score rel_bias(rel, 16)",
    "fp32_document_cross": "dtype fp32; head_dim 32; heads 2; kind cross; input qd: i32[B, Lq] sorted; input kd: i32[B, Lk] sorted; mask document(qd, kd)",
    "bf16_custom_scores": "dtype bf16; head_dim 64; heads 2; score tanh(s) * 3.0; score min(s, 2.0)",
    "fp16_residual_causal_bshd": "dtype fp16; head_dim 64; heads 2; layout bshd; residual; mask causal",
    "bf16_gqa4_local_softcap": "dtype bf16; head_dim 128; heads 8 kv 2; mask causal && window(100, 0); score softcap(30.0)",
    "fp32_block_sparse": "dtype fp32; head_dim 128; heads 2; input blk: u8[B, H, QB, KB]; mask block_sparse(blk, 64, 64)",
    "fp16_padding_softcap_gqa": "dtype fp16; head_dim 128; heads 4 kv 2; mask padding && causal; score softcap(20.0)",
    "bf16_qk_rmsnorm_gqa": "dtype bf16; head_dim 128; heads 8 kv 2; mask causal; norm q rmsnorm(1e-6) scope head; norm k rmsnorm(1e-6) scope head",
    "fp16_qk_layernorm_residual": ("dtype fp16; head_dim 64; heads 2; layout bshd; residual; mask window(30, 0); "
                                   "norm q layernorm(1e-5); norm k layernorm(1e-5) affine false"),
    "fp16_learnable": ("dtype fp16; head_dim 64; heads 4 kv 2; input bb: fp32[H, Lq, Lk]; input sl: fp32[H]; "
                       "input rel: fp32[H, 17]; mask causal; score bias(bb); score alibi(sl); score rel_bias(rel, 8); "
                       "score softcap(10.0)"),
}

# Max error over the largest reference magnitude: fp32 sums in every engine; half-precision
# inputs, O (which enters delta = rowsum(dO * O)) and the rounded gradients dominate otherwise.
TOL = {DType.FP32: 2e-3, DType.FP16: 1.5e-2, DType.BF16: 4e-2}

LENGTHS = st.one_of(st.sampled_from([1, 2, 17, 63, 64, 65, 127, 128, 129, 255]), st.integers(1, 300))


def _variant(name: str):
    return variant_of(f"attention b_{name} {{ {SPECS[name]} }}")


def _case(v, B, Lq, Lk, seed, empty):
    if v.kind == AttnKind.SELF:
        Lk = Lq
    q_lens = kv_lens = None
    if "padding" in SPECS[v.name[2:]]:
        # Some batches with no queries or no keys at all (every row fully masked), some partial.
        q_lens = tuple(0 if (empty and b == 0) else max(1, Lq - 3 * b) for b in range(B))
        kv_lens = tuple(0 if (empty and b == 1) else max(1, Lk - 5 * b) for b in range(B))
    return fuzz.Case(B=B, Lq=Lq, Lk=Lk, dist="normal", seed=seed, q_lens=q_lens, kv_lens=kv_lens)


def _grads(v, arrays, dO, deterministic):
    q, k, vv, rest = fuzz.split_inputs(arrays)
    kern = kernel_for(v)
    dev = {n: fuzz.to_device(a) for n, a in rest.items()}
    dq, dk, dv = backward(kern, fuzz.to_device(q), fuzz.to_device(k), fuzz.to_device(vv), fuzz.to_device(dO),
                               deterministic=deterministic, **dev)
    fuzz.synchronize()
    return {n: fuzz.to_host(x, v.dtype).astype(np.float64) for n, x in (("dq", dq), ("dk", dk), ("dv", dv))}


def _check(v, case, deterministic):
    arrays = fuzz.case_inputs(v, case)
    q, k, vv, rest = fuzz.split_inputs(arrays)
    rng = np.random.default_rng(case.seed + 1)
    o_shape = abi.o_shape(v, case.B, case.Lq)
    dO = rng.normal(size=o_shape).astype(reference.dtype_of(v.dtype))
    want = reference.attention_backward(v, q, k, vv, rest, dO.astype(np.float64))
    got = _grads(v, arrays, dO, deterministic)
    # An absolute floor for gradients that cancel to ~0 (one key: dS = P (dO.v - dO.O) = 0 exactly):
    # the kernel's delta = rowsum(dO * O) reads O rounded to the dtype (with a residual, O - x
    # after rounding O = O' + x), so dS carries |dO| |O| ulp sqrt(Dv), times scale |q|, |k| in
    # dk, dq; plus fp32 roundoff of the same products.
    m = {n: float(np.abs(np.asarray(a, dtype=np.float64)).max()) for n, a in (("q", q), ("k", k), ("v", vv))}
    o_max = m["v"] + (m["q"] if v.residual else 0.0)
    ulp = {DType.FP32: 2.0**-24, DType.FP16: 2.0**-11, DType.BF16: 2.0**-8}[v.dtype]
    atol = (1e-5 + 2 * ulp * np.sqrt(v.value_head_dim)) * float(np.abs(dO.astype(np.float64)).max()) * (1 + o_max) * (
        1 + v.effective_scale * (m["q"] + m["k"]))
    for n in ("dq", "dk", "dv"):
        assert got[n].shape == want[n].shape, n
        assert np.all(np.isfinite(got[n])), f"{v.name} {case.describe()}: {n} holds NaN/Inf"
        scale = float(np.abs(want[n]).max())
        err = float(np.abs(got[n] - want[n]).max())
        assert err <= TOL[v.dtype] * scale + atol, (
            f"{v.name} {case.describe()} deterministic={deterministic}: {n} max error {err:.4g} > "
            f"{TOL[v.dtype]} x max |ref| {scale:.4g} + {atol:.3g}")
    if case.q_lens is not None:
        for b, n in enumerate(case.q_lens):
            if n == 0:  # no query of this batch sees anything: exactly zero, never NaN
                assert not np.any(got["dq"][b]) and not np.any(got["dk"][b]) and not np.any(got["dv"][b])


@pytest.mark.gpu
@settings(max_examples=examples(0.5, 20), deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.sampled_from(sorted(SPECS)), st.integers(1, 3), LENGTHS, LENGTHS, st.integers(0, 2**31 - 1), st.booleans(), st.booleans())
def test_backward_matches_reference(name, B, Lq, Lk, seed, deterministic, empty):
    v = _variant(name)
    _check(v, _case(v, B, Lq, Lk, seed, empty), deterministic)


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(SPECS))
def test_backward_every_spec_at_fixed_shapes(name):
    v = _variant(name)
    for i, (B, Lq, Lk) in enumerate([(2, 77, 130), (1, 128, 64), (1, 1, 1)]):
        for det in (False, True):
            _check(v, _case(v, B, Lq, Lk, 31 * i + det, empty=True), det)


@pytest.mark.gpu
def test_deterministic_dq_is_bitwise_reproducible():
    v = _variant("bf16_gqa4_local_softcap")
    arrays = fuzz.case_inputs(v, fuzz.Case(B=2, Lq=333, Lk=333, seed=5))
    dO = np.random.default_rng(6).normal(size=arrays["q"].shape).astype(reference.dtype_of(v.dtype))
    a = _grads(v, arrays, dO, True)
    b = _grads(v, arrays, dO, True)
    for n in ("dq", "dk", "dv"):
        np.testing.assert_array_equal(a[n], b[n])


@pytest.mark.gpu
def test_backward_refuses_bad_arguments_before_launch():
    from attngen.runtime import kernel as runtime

    v = _variant("fp32_causal_softcap_gqa")
    arrays = fuzz.case_inputs(v, fuzz.Case(B=1, Lq=16, Lk=16, seed=1))
    q, k, vv = (fuzz.to_device(arrays[n]) for n in ("q", "k", "v"))
    kern = kernel_for(v)
    with pytest.raises(ValueError, match="dO: expected the output's shape"):
        backward(kern, q, k, vv, fuzz.to_device(np.zeros((1, 4, 15, 64), np.float32)))
    with pytest.raises(ValueError, match="dO: expected dtype"):
        backward(kern, q, k, vv, fuzz.to_device(np.zeros((1, 4, 16, 64), np.float16)))
    with pytest.raises(ValueError, match="o, lse"):
        backward(kern, q, k, vv, fuzz.to_device(np.zeros((1, 4, 16, 64), np.float32)), o=q)
    paged = runtime.compile(variant_of("attention b_paged { dtype fp16; head_dim 64; heads 2; kind cross; kv_cache paged(16) }"))
    with pytest.raises(ValueError, match="not a training workload"):
        backward(paged, q, k, vv, q)


@pytest.mark.gpu
@pytest.mark.parametrize("deterministic", [False, True])
def test_score_input_gradients(deterministic):
    """Gradients of bias (rank 3: summed over the batch), alibi slopes and a rel_bias table."""
    v = _variant("fp16_learnable")
    arrays = fuzz.case_inputs(v, fuzz.Case(B=2, Lq=97, Lk=97, seed=3))
    q, k, vv, rest = fuzz.split_inputs(arrays)
    dO = np.random.default_rng(4).normal(size=q.shape[:3] + (v.value_head_dim,)).astype(reference.dtype_of(v.dtype))
    wrt = ("bb", "sl", "rel")
    want = reference.attention_backward(v, q, k, vv, rest, dO.astype(np.float64), wrt=wrt)
    dev = {n: fuzz.to_device(a) for n, a in rest.items()}
    dq, dk, dv, g = backward(kernel_for(v), fuzz.to_device(q), fuzz.to_device(k), fuzz.to_device(vv), fuzz.to_device(dO),
                                           deterministic=deterministic, wrt=wrt, **dev)
    fuzz.synchronize()
    got = {"dq": fuzz.to_host(dq, v.dtype), "dk": fuzz.to_host(dk, v.dtype), "dv": fuzz.to_host(dv, v.dtype)}
    got.update({n: fuzz.to_host(g[n]) for n in wrt})
    for n, x in got.items():
        x = x.astype(np.float64)
        scale = float(np.abs(want[n]).max())
        assert scale > 0 and x.shape == want[n].shape
        err = float(np.abs(x - want[n]).max())
        assert err <= TOL[v.dtype] * scale, f"{n}: max error {err:.4g} > {TOL[v.dtype]} x {scale:.4g}"
    with pytest.raises(ValueError, match="wrt: expected names of score inputs"):
        backward(kernel_for(v), fuzz.to_device(q), fuzz.to_device(k), fuzz.to_device(vv), fuzz.to_device(dO), wrt=("q",), **dev)


@pytest.mark.gpu
@pytest.mark.parametrize("deterministic", [False, True])
def test_norm_weight_gradients(deterministic):
    """dgamma/dbeta of a head-scope layernorm q pre-norm (with a residual and an affine-free k norm)."""
    from attngen.plan import bwd as plan_bwd

    v = _variant("fp16_qk_layernorm_residual")
    arrays = fuzz.case_inputs(v, fuzz.Case(B=2, Lq=100, Lk=100, seed=8))
    rng = np.random.default_rng(9)
    wrt = plan_bwd.norm_params(v)
    assert wrt == ("q_norm_weight", "q_norm_bias")
    for n in wrt:
        arrays[n] = (1 + 0.3 * rng.normal(size=arrays[n].shape)).astype(np.float32)
    q, k, vv, rest = fuzz.split_inputs(arrays)
    dO = rng.normal(size=abi.o_shape(v, 2, 100)).astype(reference.dtype_of(v.dtype))
    want = reference.attention_backward(v, q, k, vv, rest, dO.astype(np.float64), wrt=wrt)
    dev = {n: fuzz.to_device(a) for n, a in rest.items()}
    dq, dk, dv, g = backward(kernel_for(v), fuzz.to_device(q), fuzz.to_device(k), fuzz.to_device(vv), fuzz.to_device(dO),
                             deterministic=deterministic, wrt=wrt, **dev)
    fuzz.synchronize()
    got = {"dq": fuzz.to_host(dq, v.dtype), "dk": fuzz.to_host(dk, v.dtype), "dv": fuzz.to_host(dv, v.dtype)}
    got.update({n: fuzz.to_host(g[n]) for n in wrt})
    for n, x in got.items():
        scale = float(np.abs(want[n]).max())
        err = float(np.abs(x.astype(np.float64) - want[n]).max())
        assert scale > 0 and err <= TOL[v.dtype] * scale, f"{n}: max error {err:.4g} > {TOL[v.dtype]} x {scale:.4g}"
