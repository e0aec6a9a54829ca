"""The generated backward kernels, run on the CPU under an emulation of the CUDA execution model
(tests/backward/_host_emu.py), against the float64 reference backward: masks with skipped tiles,
score derivatives, GQA sums, fully masked rows, residual, the deterministic dQ kernel, every dtype,
odd lengths and Lq != Lk, several tiles per axis; layout varlen (empty, one-row, keyless and
queryless sequences, both engines), the token-scope q norm and the o post-norm with their
dgamma/dbeta."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "reference"))
import _host_emu  # noqa: E402
import _irb as T  # noqa: E402

from attngen.check import reference, workload  # noqa: E402
from attngen.cuda import render_bwd  # noqa: E402
from attngen.ir.nodes import AttnKind, DType, Layout, Norm, NormKind, NormScope, NormTarget, SizeSym  # noqa: E402
from attngen.plan.schedule import Arch  # noqa: E402

pytestmark = pytest.mark.skipif(_host_emu.available() is not None, reason=f"no host emulation: {_host_emu.available()}")

TOL = {DType.FP32: 2e-4, DType.FP16: 8e-3, DType.BF16: 3e-2}


def _run(v, B, Lq, Lk, seed=0, deterministic=False, edit=None):
    rng = np.random.default_rng(seed)
    arrays = workload.make_inputs(v, B, Lq, Lk, rng)
    if edit:
        edit(arrays)
    rest = {n: a for n, a in arrays.items() if n not in ("q", "k", "v")}
    o, lse = reference.attention(v, arrays["q"], arrays["k"], arrays["v"], rest)
    dO = rng.normal(size=o.shape).astype(o.dtype)
    want = reference.attention_backward(v, arrays["q"], arrays["k"], arrays["v"], rest, dO.astype(np.float64))
    src, bp = render_bwd.render_with_plan(v, Arch.SM80, deterministic=deterministic)
    got = _host_emu.run(src, bp, v, arrays, lse, dO, o)
    for n in ("dq", "dk", "dv"):
        scale = max(1e-6, float(np.abs(want[n]).max()))
        err = float(np.abs(got[n] - want[n]).max())
        assert err <= TOL[v.dtype] * scale, f"{n}: max error {err:.3g} vs max |ref| {scale:.3g}"
        assert np.all(np.isfinite(got[n]))
    return got, want, bp



def _run_norm_weights(v, B, Lq, Lk, seed, *, deterministic=False, src_edit=None):
    """`_run` for variants with learnable norm weights: weights 1 + 0.3 N(0, 1) (never the identity),
    q shifted by 0.5 (a mean the layernorm removes), every gradient including the weights' compared
    with the float64 reference. `src_edit(src)` may rewrite the rendered source (forcing a path);
    returns the source as rendered, the plan and the weights' names."""
    from attngen.plan import bwd as plan_bwd

    rng = np.random.default_rng(seed)
    arrays = workload.make_inputs(v, B, Lq, Lk, rng)
    wrt = plan_bwd.norm_params(v)
    for n in wrt:
        arrays[n] = (1 + 0.3 * rng.normal(size=arrays[n].shape)).astype(np.float32)
    arrays["q"] = (arrays["q"] + 0.5).astype(arrays["q"].dtype)
    rest = {n: a for n, a in arrays.items() if n not in ("q", "k", "v")}
    o, lse = reference.attention(v, arrays["q"], arrays["k"], arrays["v"], rest)
    dO = rng.normal(size=o.shape).astype(o.dtype)
    want = reference.attention_backward(v, arrays["q"], arrays["k"], arrays["v"], rest, dO.astype(np.float64), wrt=wrt)
    src, bp = render_bwd.render_with_plan(v, Arch.SM80, deterministic=deterministic)
    got = _host_emu.run(src_edit(src) if src_edit else src, bp, v, arrays, lse, dO, o, wrt=wrt)
    for n in ("dq", "dk", "dv", *wrt):
        assert np.all(np.isfinite(got[n]))
        scale = float(np.abs(want[n]).max())
        err = float(np.abs(got[n] - want[n]).max())
        assert scale > 0 and err <= TOL[v.dtype] * scale, f"{n}: max error {err:.3g} vs max |ref| {scale:.3g}"
    return src, bp, wrt, arrays

def test_fp32_causal_softcap_gqa_cross_odd_lengths():
    v = T.variant(T.causal(), (T.softcap(4.0),), D=16, heads=4, kv_heads=2, kind=AttnKind.CROSS, scale=0.4)
    got, want, bp = _run(v, 2, 37, 150)
    assert bp.backward.block_n < 150  # several key tiles, some skipped by the causal classification


@pytest.mark.parametrize("deterministic", [False, True])
def test_bf16_alibi_window_bshd(deterministic):
    v = T.variant(T.window(40, 3), (T.alibi(heads=4),), D=16, heads=4, kv_heads=1, dtype=DType.BF16, layout=Layout.BSHD)
    _run(v, 1, 141, 141, seed=1, deterministic=deterministic)


def test_fp16_rel_bias_padding_fully_masked_rows():
    v = T.variant(T.padding(), (T.rel_bias("rt", 8),), D=16, heads=2, dtype=DType.FP16,
                  inputs=(T.decl("rt", DType.FP32, SizeSym.H, 17),))

    def edit(a):
        a["q_lens"] = np.array([0, 70], dtype=np.int32)  # batch 0: every query row fully masked
        a["kv_lens"] = np.array([100, 33], dtype=np.int32)

    got, want, _ = _run(v, 2, 100, 100, seed=2, edit=edit)
    assert not np.any(got["dq"][0]) and not np.any(got["dk"][0]) and not np.any(got["dv"][0])
    assert np.any(got["dq"][1])


def test_fp32_document_bias_tanh_expression_deterministic():
    v = T.variant(T.document("doc"), (T.bias("bb", 3), T.mul(T.call("tanh", T.s), T.cf(3.0))), D=16, heads=2, kv_heads=2,
                  inputs=(T.decl("doc", DType.I32, SizeSym.B, SizeSym.LK, sorted=True),
                          T.decl("bb", DType.FP32, SizeSym.H, SizeSym.LQ, SizeSym.LK)))
    _run(v, 1, 90, 90, seed=3, deterministic=True)


def test_fp16_residual_block_sparse():
    v = T.variant(T.block_sparse("blk", 2, 32, 32), (), D=16, heads=2, dtype=DType.FP16, residual=True,
                  inputs=(T.decl("blk", DType.U8, "QB", "KB"),))
    _run(v, 1, 96, 96, seed=4)


def test_deterministic_matches_atomic_mode():
    v = T.variant(T.causal(), (T.softcap(5.0),), D=16, heads=2, kv_heads=1)
    a, _, _ = _run(v, 1, 130, 130, seed=5, deterministic=True)
    b, _, _ = _run(v, 1, 130, 130, seed=5, deterministic=False)
    np.testing.assert_array_equal(a["dk"], b["dk"])  # same dK/dV kernel
    np.testing.assert_allclose(a["dq"], b["dq"], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("deterministic", [False, True])
def test_score_input_gradients(deterministic):
    # bias at rank 3 (summed over the batch), alibi slopes (summed over q, kv) and a rel_bias table
    # (clipped distances collect sums), under a causal mask with GQA, against the reference's.
    v = T.variant(T.causal(), (T.bias("bb", 3), T.alibi(slopes="sl"), T.rel_bias("rt", 5), T.softcap(6.0)),
                  D=16, heads=4, kv_heads=2, dtype=DType.FP16,
                  inputs=(T.decl("bb", DType.FP32, SizeSym.H, SizeSym.LQ, SizeSym.LK), T.decl("sl", DType.FP32, SizeSym.H),
                          T.decl("rt", DType.FP32, SizeSym.H, 11)))
    rng = np.random.default_rng(9)
    B, L = 2, 70
    arrays = workload.make_inputs(v, B, L, L, rng)
    arrays["sl"] = rng.uniform(0.01, 0.1, size=4).astype(np.float32)
    rest = {n: a for n, a in arrays.items() if n not in ("q", "k", "v")}
    o, lse = reference.attention(v, arrays["q"], arrays["k"], arrays["v"], rest)
    dO = rng.normal(size=o.shape).astype(o.dtype)
    wrt = ("bb", "sl", "rt")
    want = reference.attention_backward(v, arrays["q"], arrays["k"], arrays["v"], rest, dO.astype(np.float64), wrt=wrt)
    src, bp = render_bwd.render_with_plan(v, Arch.SM80, deterministic=deterministic)
    got = _host_emu.run(src, bp, v, arrays, lse, dO, o, wrt=wrt)
    for n in ("dq", "dk", "dv", *wrt):
        scale = float(np.abs(want[n]).max())
        assert scale > 0
        err = float(np.abs(got[n] - want[n]).max())
        assert err <= TOL[v.dtype] * scale, f"{n}: max error {err:.3g} vs max |ref| {scale:.3g}"
    # The upper triangle of the bias is masked: its gradient is exactly zero.
    assert not np.any(got["bb"][:, np.triu_indices(L, 1)[0], np.triu_indices(L, 1)[1]])


@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("qkind,kkind", [(NormKind.RMSNORM, NormKind.RMSNORM), (NormKind.LAYERNORM, NormKind.LAYERNORM)])
def test_head_scope_qk_norms_with_weight_gradients(qkind, kkind, deterministic):
    v = T.variant(T.causal(), (T.softcap(8.0),), D=16, heads=4, kv_heads=2, dtype=DType.BF16, residual=True,
                  norms=(Norm(NormTarget.Q, qkind, NormScope.HEAD, 1e-5), Norm(NormTarget.K, kkind, NormScope.HEAD, 1e-6)))
    rng = np.random.default_rng(12)
    arrays = workload.make_inputs(v, 2, 75, 75, rng)
    from attngen.plan import bwd as plan_bwd

    wrt = plan_bwd.norm_params(v)
    assert len(wrt) == (4 if qkind == NormKind.LAYERNORM else 2)
    for n in wrt:
        arrays[n] = (1 + 0.3 * rng.normal(size=arrays[n].shape)).astype(np.float32)
    rest = {n: a for n, a in arrays.items() if n not in ("q", "k", "v")}
    o, lse = reference.attention(v, arrays["q"], arrays["k"], arrays["v"], rest)
    dO = rng.normal(size=o.shape).astype(o.dtype)
    want = reference.attention_backward(v, arrays["q"], arrays["k"], arrays["v"], rest, dO.astype(np.float64), wrt=wrt)
    src, bp = render_bwd.render_with_plan(v, Arch.SM80, deterministic=deterministic)
    got = _host_emu.run(src, bp, v, arrays, lse, dO, o, wrt=wrt)
    for n in ("dq", "dk", "dv", *wrt):
        scale = float(np.abs(want[n]).max())
        err = float(np.abs(got[n] - want[n]).max())
        assert scale > 0 and err <= TOL[v.dtype] * scale, f"{n}: max error {err:.3g} vs max |ref| {scale:.3g}"


# ---- layout varlen: packed [total, H, D] rows split by cu_seqlens; each sequence on its own.

def _run_varlen(v, seq_q, seq_k=None, seed=0, deterministic=False, wrt_norms=False):
    from attngen.plan import bwd as plan_bwd

    rng = np.random.default_rng(seed)
    seq_k = seq_q if seq_k is None else seq_k
    arrays = workload.make_inputs(v, len(seq_q), sum(seq_q), sum(seq_k), rng)
    cu_q, cu_k = v.cu_seqlens_names
    arrays[cu_q] = workload.cu_seqlens_of(seq_q)
    arrays[cu_k] = workload.cu_seqlens_of(seq_k)
    wrt = plan_bwd.norm_params(v) if wrt_norms else ()
    for n in wrt:
        arrays[n] = (1 + 0.3 * rng.normal(size=arrays[n].shape)).astype(np.float32)
    rest = {n: a for n, a in arrays.items() if n not in ("q", "k", "v")}
    o, lse = reference.attention(v, arrays["q"], arrays["k"], arrays["v"], rest)
    assert lse.shape == (v.heads, sum(seq_q))
    dO = rng.normal(size=o.shape).astype(o.dtype)
    want = reference.attention_backward(v, arrays["q"], arrays["k"], arrays["v"], rest, dO.astype(np.float64), wrt=wrt)
    src, bp = render_bwd.render_with_plan(v, Arch.SM80, deterministic=deterministic)
    assert bp.backward.varlen
    got = _host_emu.run(src, bp, v, arrays, lse, dO, o, wrt=wrt)
    for n in ("dq", "dk", "dv", *wrt):
        assert np.all(np.isfinite(got[n])), f"{n}: not every element written"
        # (A floor from dv's magnitude: with one key per sequence dq and dk cancel to 0 exactly in
        # the reference, and to fp32 roundoff of delta in the kernels.)
        scale = max(1e-6, float(np.abs(want[n]).max()), 1e-2 * float(np.abs(want["dv"]).max()))
        err = float(np.abs(got[n] - want[n]).max())
        assert err <= TOL[v.dtype] * scale, f"{n}: max error {err:.3g} vs max |ref| {scale:.3g}"
    return got, want, bp


@pytest.mark.parametrize("deterministic", [False, True])
def test_varlen_fp32_causal_gqa_empty_and_one_row_sequences(deterministic):
    # FFMA engine: odd lengths, an empty sequence, a one-row one, several tiles in the longest.
    v = T.variant(T.causal(), (T.softcap(4.0),), D=16, heads=4, kv_heads=2, layout=Layout.VARLEN, scale=0.4)
    got, want, bp = _run_varlen(v, [37, 0, 1, 70, 5], seed=20, deterministic=deterministic)
    assert bp.engine.value == "ffma" and bp.backward.block_n < 70
    # Each sequence on its own: the gradient of a one-row sequence's only key is that row's alone.
    assert np.any(got["dv"][37]) and np.any(got["dq"][38:108])


@pytest.mark.parametrize("deterministic", [False, True])
def test_varlen_bf16_tensor_cores_window_gqa(deterministic):
    v = T.variant(T.window(24, 2), (), D=16, heads=4, kv_heads=1, dtype=DType.BF16, layout=Layout.VARLEN)
    got, want, bp = _run_varlen(v, [1, 90, 0, 33, 130], seed=21, deterministic=deterministic)
    assert bp.engine.value == "mma" and bp.backward.tc_block_n < 130  # several key tiles of one sequence


def test_varlen_cross_keyless_and_queryless_sequences_with_norms_and_residual():
    # kind cross: q and k split differently; sequence 1 has queries but no keys (its rows see
    # nothing: dq is the residual's dO alone), sequence 2 keys but no queries (dk = dv = 0). (The
    # language refuses fused norms with `layout varlen` today; the IR-level variant checks that a
    # sequence's view moves the norm workspaces too.)
    v = T.variant(T.TRUE, (), D=16, heads=2, kv_heads=2, dtype=DType.FP16, layout=Layout.VARLEN, kind=AttnKind.CROSS,
                  residual=True, norms=(Norm(NormTarget.Q, NormKind.LAYERNORM, NormScope.HEAD, 1e-5),
                                        Norm(NormTarget.K, NormKind.RMSNORM, NormScope.HEAD, 1e-6)))
    got, want, _ = _run_varlen(v, [20, 7, 0, 41], [33, 0, 9, 70], seed=22, wrt_norms=True)
    assert not np.any(got["dk"][33:42]) and not np.any(got["dv"][33:42])


# ---- token-scope q norm (pre-LN block): statistics over each token's H*D row, dgamma/dbeta [H*D].

@pytest.mark.parametrize("dtype,kind,deterministic", [(DType.FP32, NormKind.LAYERNORM, False), (DType.BF16, NormKind.LAYERNORM, True),
                                                      (DType.FP16, NormKind.RMSNORM, False)])
def test_token_scope_q_norm_with_weight_gradients(dtype, kind, deterministic):
    v = T.variant(T.causal(), (T.softcap(6.0),), D=16, heads=4, kv_heads=2, dtype=dtype, layout=Layout.BSHD, kind=AttnKind.CROSS,
                  residual=True, norms=(Norm(NormTarget.Q, kind, NormScope.TOKEN, 1e-5),))
    src, bp, wrt, arrays = _run_norm_weights(v, 2, 67, 90, seed=40, deterministic=deterministic)
    assert all(arrays[n].shape == (4 * 16,) for n in wrt)
    assert bp.backward.q_norm_token and "ag_tok_norm_bwd" in src


# ---- the o post-norm: the training forward saves O' (before the norm and the residual); the pre
# kernel maps dY to dO' (and dgamma/dbeta) before delta = rowsum(dO' * O').

@pytest.mark.parametrize("dtype,kind,residual,layout,deterministic", [
    (DType.FP32, NormKind.LAYERNORM, True, Layout.BHSD, False),
    (DType.BF16, NormKind.RMSNORM, False, Layout.BSHD, True),
    (DType.FP16, NormKind.LAYERNORM, True, Layout.VARLEN, False),  # (IR level: the language refuses norms with varlen today)
])
def test_o_post_norm_with_weight_gradients(dtype, kind, residual, layout, deterministic):
    from attngen.plan import bwd as plan_bwd

    v = T.variant(T.causal(), (T.softcap(6.0),), D=16, heads=4, kv_heads=2, dtype=dtype, layout=layout, residual=residual,
                  norms=(Norm(NormTarget.O, kind, NormScope.HEAD, 1e-5),))
    rng = np.random.default_rng(50)
    arrays = workload.make_inputs(v, 3, 70, 70, rng)
    if layout == Layout.VARLEN:
        arrays["cu_seqlens"] = workload.cu_seqlens_of([33, 0, 37])
    wrt = plan_bwd.norm_params(v)
    assert wrt == (("o_norm_weight", "o_norm_bias") if kind == NormKind.LAYERNORM else ("o_norm_weight",))
    for n in wrt:
        arrays[n] = (1 + 0.3 * rng.normal(size=arrays[n].shape)).astype(np.float32)
    rest = {n: a for n, a in arrays.items() if n not in ("q", "k", "v")}
    y, _ = reference.attention(v, arrays["q"], arrays["k"], arrays["v"], rest)
    o_pre, lse = _host_emu.pre_norm_forward(v, arrays)
    dY = rng.normal(size=y.shape).astype(y.dtype)
    want = reference.attention_backward(v, arrays["q"], arrays["k"], arrays["v"], rest, dY.astype(np.float64), wrt=wrt)
    src, bp = render_bwd.render_with_plan(v, Arch.SM80, deterministic=deterministic)
    assert bp.backward.o_norm and "ag_onorm_bwd" in src
    got = _host_emu.run(src, bp, v, arrays, lse, dY, o_pre, wrt=wrt)
    for n in ("dq", "dk", "dv", *wrt):
        assert np.all(np.isfinite(got[n]))
        scale = float(np.abs(want[n]).max())
        err = float(np.abs(got[n] - want[n]).max())
        assert scale > 0 and err <= TOL[v.dtype] * scale, f"{n}: max error {err:.3g} vs max |ref| {scale:.3g}"


@pytest.mark.parametrize("dtype", [DType.FP32, DType.BF16])  # FFMA, tensor cores (sm_80)
def test_varlen_random_splits(dtype):
    # Random packings: the slot search must give every key tile of every sequence to exactly one
    # CTA (dk, dv NaN-poisoned: every row written once, right), whatever the lengths.
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    v = T.variant(T.causal(), (), D=16, heads=2, kv_heads=1, dtype=dtype, layout=Layout.VARLEN)
    seen: list[list[int]] = []

    @settings(max_examples=4, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(st.lists(st.one_of(st.sampled_from([0, 1, 63, 64, 65]), st.integers(0, 140)), min_size=1, max_size=5), st.booleans())
    def check(lens, det):
        if sum(lens) == 0:
            lens = lens[:-1] + [1]
        seen.append(lens)
        _run_varlen(v, lens, seed=sum(lens), deterministic=det)

    check()
    assert len(seen) >= 3, seen  # several packings ran


# ---- the per-row kernels' 16-byte vector paths (fp16/bf16): the pre kernel's delta and dQ zeroing,
# the token norm's prep and finish with a token's H*D row (a multiple of 256) in registers; and the
# scalar loops the same kernels fall back to where a row is not 16-byte aligned.

@pytest.mark.parametrize("dtype,kind,scalar", [(DType.BF16, NormKind.LAYERNORM, False), (DType.BF16, NormKind.LAYERNORM, True),
                                               (DType.FP16, NormKind.RMSNORM, False)])
def test_token_scope_q_norm_vector_paths(dtype, kind, scalar):
    v = T.variant(T.causal(), (), D=16, heads=16, kv_heads=4, dtype=dtype, layout=Layout.BSHD, kind=AttnKind.CROSS,
                  residual=True, norms=(Norm(NormTarget.Q, kind, NormScope.TOKEN, 1e-5),))

    def force_scalar(src):  # as for rows that are not 16-byte aligned: every per-row kernel takes its scalar loop
        src = src.replace("const bool vec = ag_tok_vec_ok(", "const bool vec = false && ag_tok_vec_ok(")
        src = src.replace("if (ag_rows16(p.o, ", "if (false && ag_rows16(p.o, ")
        assert src.count("false && ag_") == 3
        return src

    src, bp, wrt, _ = _run_norm_weights(v, 2, 37, 45, seed=41, src_edit=force_scalar if scalar else None)
    assert "ag_tok_norm_bwd_vec" in src and "ag_tok_norm_vec" in src and "constexpr int LANES = 2;" in src  # 16 * 16 = 256: one vector a lane; D 16: 2 lanes a row
    # dgamma (and dbeta) in a shared-memory slice a warp: plain adds, no float atomics (compare-and-swap loops)
    assert bp.backward.tok_vecs == 1 and bp.backward.tok_grad_slices and bp.kernel("ag_bwd_finish").smem.bytes == 4 * 8 * len(wrt) * 256


@pytest.mark.parametrize("scalar", [False, True])
def test_head_scope_norms_vector_paths(scalar):
    # q layernorm and k RMSNorm (head scope) with weights, GQA, a residual: the prep and finish
    # kernels take 16 rows of D = 16 a warp (2 lanes a row), q and k rows in one warp.
    v = T.variant(T.causal(), (T.softcap(6.0),), D=16, heads=4, kv_heads=2, dtype=DType.BF16, layout=Layout.BSHD, kind=AttnKind.CROSS,
                  residual=True, norms=(Norm(NormTarget.Q, NormKind.LAYERNORM, NormScope.HEAD, 1e-5),
                                        Norm(NormTarget.K, NormKind.RMSNORM, NormScope.HEAD, 1e-6)))

    def force_scalar(src):  # as for rows that are not 16-byte aligned: the pre, prep and finish kernels take their scalar loops
        assert src.count("if (ag_rows16(") == 3
        return src.replace("if (ag_rows16(", "if (false && ag_rows16(")

    src, _, _, _ = _run_norm_weights(v, 2, 41, 53, seed=42, src_edit=force_scalar if scalar else None)
    assert "constexpr int ROW_LANES = 2;" in src and "ag_row_stats_vec" in src


def test_token_norm_vector_path_plan():
    # H*D = 2048: 8 vectors a lane; its dgamma/dbeta slices (8 warps x 2 x 2048 floats, 128 KiB)
    # fit sm_90a's shared memory but not sm_86's, where the token norm keeps its scalar loops.
    from attngen.plan import bwd as plan_bwd

    v = T.variant(T.TRUE, (), D=64, heads=32, dtype=DType.BF16, layout=Layout.BSHD, kind=AttnKind.CROSS, residual=True,
                  norms=(Norm(NormTarget.Q, NormKind.LAYERNORM, NormScope.TOKEN, 1e-5),))
    big = plan_bwd.plan(v, Arch.SM90A)
    assert (big.backward.tok_vecs, big.backward.tok_grad_slices, big.kernel("ag_bwd_finish").smem.bytes) == (8, True, 4 * 8 * 2 * 2048)
    small = plan_bwd.plan(v, Arch.SM86)
    assert (small.backward.tok_vecs, small.backward.tok_grad_slices, small.kernel("ag_bwd_finish").smem.bytes) == (0, False, 4 * 2 * 2048)
    assert "ag_tok_norm_bwd_vec" not in render_bwd.render(v, Arch.SM86)
    assert plan_bwd.tok_vecs(T.variant(T.TRUE, (), D=16, heads=4, dtype=DType.BF16, layout=Layout.BSHD,
                                       norms=(Norm(NormTarget.Q, NormKind.LAYERNORM, NormScope.TOKEN, 1e-5),))) == 0  # 64: not 256


def test_token_q_norm_vector_path_with_k_norm():
    # The finish kernel's q sums in a slice a warp and the k norm's sums after them (head scope,
    # its scalar rows): dgamma/dbeta of both against the reference.
    v = T.variant(T.causal(), (), D=16, heads=16, kv_heads=8, dtype=DType.BF16, layout=Layout.BSHD, residual=True,
                  norms=(Norm(NormTarget.Q, NormKind.LAYERNORM, NormScope.TOKEN, 1e-5), Norm(NormTarget.K, NormKind.RMSNORM, NormScope.HEAD, 1e-6)))
    _, bp, wrt, _ = _run_norm_weights(v, 2, 45, 45, seed=5)
    assert wrt == ("q_norm_weight", "q_norm_bias", "k_norm_weight")
    assert bp.backward.tok_vecs == 1 and bp.backward.tok_grad_slices
