"""The tensor-core (mma.sync) backward engine: which variants the plan gives it, what explain says,
and its kernels run on the CPU (tests/backward/_host_emu.py, whose emulated ldmatrix / mma.sync
follow the PTX fragment layouts) against the float64 reference backward: full tiles (the unmasked
fast path), partial tiles, Lq != Lk, odd lengths, GQA, causal, window, document, softcap, fully
masked rows, pre-norms, residual, score-input gradients and the deterministic dQ mode."""

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
from attngen.plan import bwd as plan_bwd  # noqa: E402
from attngen.plan.bwd import BwdEngine  # noqa: E402
from attngen.plan.schedule import Arch  # noqa: E402

# Max error over the largest reference magnitude. P and dS enter the MMAs rounded to the element
# type (as in FlashAttention-2), so half precision allows a little more than the FFMA engine.
TOL = {DType.FP16: 1e-2, DType.BF16: 4e-2, DType.FP32: 2e-4}


def test_engine_choice_and_explain(monkeypatch):
    # sm_90a's default at head dims 64 / 128 is the wgmma engine (tests/backward/test_bwd_wgmma_emu.py);
    # this is the mma.sync engine's choice wherever wgmma is not the default.
    monkeypatch.setattr(plan_bwd, "wgmma_fits", lambda v, arch: "kept on mma.sync by the test")
    bf = T.variant(T.causal(), (), D=128, heads=2, dtype=DType.BF16)
    assert plan_bwd.choose_engine(bf, Arch.SM90A)[0] == BwdEngine.MMA
    assert plan_bwd.choose_engine(bf, Arch.SM80)[0] == BwdEngine.MMA
    fp32 = T.variant(T.causal(), (), D=128, heads=2)
    eng, why = plan_bwd.choose_engine(fp32, Arch.SM90A)
    assert eng == BwdEngine.FFMA and "fp32" in why
    h75 = T.variant(T.causal(), (), D=64, heads=2, dtype=DType.FP16)
    eng, why = plan_bwd.choose_engine(h75, Arch.SM75)
    assert eng == BwdEngine.FFMA and "sm_75" in why
    odd = T.variant(T.causal(), (), D=8, heads=2, dtype=DType.FP16)
    eng, why = plan_bwd.choose_engine(odd, Arch.SM90A)
    assert eng == BwdEngine.FFMA and "head_dim 8" in why
    bp = plan_bwd.plan(bf, Arch.SM90A)
    k = bp.kernel("ag_bwd_dkdv")
    assert bp.engine == BwdEngine.MMA and bp.backward.tc_block_n == 128 and k.threads == 256 and k.smem.bytes == plan_bwd.tc_smem_bytes(128, 128, 128)
    assert bp.backward.tc_rotate and not plan_bwd.plan(fp32, Arch.SM90A).backward.tc_rotate  # the rotated walk: tensor-core engines only
    assert k.smem.bytes <= Arch.SM90A.smem_budget
    assert bp.launch_grid(bp.kernel("ag_bwd_dkdv"), 2, 100, 130) == (2, 2, 2)
    # 16-wide heads would give each of 8 warps half a 16-column dQ block: 64-key tiles (4 warps).
    assert plan_bwd.plan(T.variant(T.causal(), (), D=16, heads=2, dtype=DType.FP16), Arch.SM80).backward.tc_block_n == 64
    # sm_86's 100 KB of shared memory: the D64 kernel fits, the D128 one does not (FFMA, said why).
    assert plan_bwd.plan(T.variant(T.causal(), (), D=64, heads=2, dtype=DType.BF16), Arch.SM86).backward.tc_block_n == 128
    eng, why = plan_bwd.choose_engine(bf, Arch.SM86)
    assert eng == BwdEngine.FFMA and "shared memory" in why
    text = "\n".join(plan_bwd.describe(bf, Arch.SM90A))
    assert "tensor-core engine (mma.sync m16n8k16, bf16 inputs, fp32 accumulators" in text and "dQ by an FFMA kernel" in text
    text = "\n".join(plan_bwd.describe(odd, Arch.SM90A))
    assert "FFMA engine (fp32 products), tile" in text and "not tensor cores: head_dim 8" in text
    src = render_bwd.render(bf, Arch.SM90A)
    assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in src and "ag_tc_step<false>" in src
    assert "mma.sync" not in render_bwd.render(fp32, Arch.SM90A)


pytestmark_emu = pytest.mark.skipif(_host_emu.available() is not None, reason=f"no host emulation: {_host_emu.available()}")


def _run(v, B, Lq, Lk, *, seed=0, deterministic=False, edit=None, wrt=(), arch=Arch.SM80, engine=BwdEngine.MMA):
    rng = np.random.default_rng(seed)
    arrays = workload.make_inputs(v, B, Lq, Lk, rng)
    if edit:
        edit(arrays, rng)
    rest = {n: a for n, a in arrays.items() if n not in ("q", "k", "v")}
    o, lse = reference.attention(v, arrays["q"], arrays["k"], arrays["v"], rest)
    dO = rng.normal(size=o.shape).astype(o.dtype)
    want = reference.attention_backward(v, arrays["q"], arrays["k"], arrays["v"], rest, dO.astype(np.float64), wrt=wrt)
    src, bp = render_bwd.render_with_plan(v, arch, deterministic=deterministic)
    assert bp.engine == engine
    got = _host_emu.run(src, bp, v, arrays, lse, dO, o, wrt=wrt)
    for n in ("dq", "dk", "dv", *wrt):
        assert np.all(np.isfinite(got[n])), f"{n} holds NaN/Inf"
        scale = max(1e-6, float(np.abs(want[n]).max()))
        err = float(np.abs(got[n] - want[n]).max())
        assert err <= TOL[v.dtype] * scale, f"{n}: max error {err:.3g} vs max |ref| {scale:.3g}"
    return got, want


@pytestmark_emu
def test_d128_dense_full_tiles_fast_path():
    # 128 x 128 with 64-row tiles: every tile whole and fully visible (the unmasked path).
    v = T.variant(T.TRUE, (), D=128, heads=2, kv_heads=1, dtype=DType.BF16)
    _run(v, 1, 128, 128, seed=1)


@pytestmark_emu
def test_d64_cross_odd_lengths_gqa_causal_softcap():
    v = T.variant(T.causal(), (T.softcap(3.0),), D=64, heads=4, kv_heads=2, kind=AttnKind.CROSS, dtype=DType.FP16, scale=0.3)
    _run(v, 2, 77, 141, seed=2)


@pytestmark_emu
@pytest.mark.parametrize("deterministic", [False, True])
def test_window_alibi_bshd_both_dq_modes(deterministic):
    v = T.variant(T.window(40, 3), (T.alibi(heads=4),), D=32, heads=4, kv_heads=1, dtype=DType.BF16, layout=Layout.BSHD)
    _run(v, 1, 141, 141, seed=3, deterministic=deterministic)


@pytestmark_emu
def test_document_mask_custom_expression():
    v = T.variant(T.document("doc"), (T.mul(T.call("tanh", T.s), T.cf(3.0)),), D=16, heads=2, dtype=DType.FP16,
                  inputs=(T.decl("doc", DType.I32, SizeSym.B, SizeSym.LK, sorted=True),))
    _run(v, 2, 150, 150, seed=4)


@pytestmark_emu
def test_fully_masked_rows_give_zero():
    v = T.variant(T.and_(T.padding(), T.causal()), (T.softcap(20.0),), D=32, heads=2, dtype=DType.FP16)

    def edit(a, rng):
        a["q_lens"] = np.array([0, 90], dtype=np.int32)  # batch 0: every query row fully masked
        a["kv_lens"] = np.array([120, 41], dtype=np.int32)  # batch 1: rows past key 41 see 41 keys

    got, _ = _run(v, 2, 120, 120, seed=5, edit=edit)
    assert not np.any(got["dq"][0]) and not np.any(got["dk"][0]) and not np.any(got["dv"][0])
    assert not np.any(got["dq"][1, :, 90:]) and not np.any(got["dk"][1, :, 41:])
    assert np.any(got["dq"][1])


@pytestmark_emu
def test_norms_residual_and_score_input_gradients(monkeypatch):
    # Against the reference, and against the FFMA engine on the same inputs: the k layernorm's bias
    # gradient is a sum of dK' over every key row in which the terms nearly cancel, so bf16
    # inputs leave it ~10% off the float64 reference on either engine; the tensor-core engine must
    # be no worse there than the exact-product one.
    v = T.variant(T.causal(), (T.bias("bb", 3), T.softcap(8.0)), D=32, heads=4, kv_heads=2, dtype=DType.BF16, residual=True,
                  norms=(Norm(NormTarget.Q, NormKind.RMSNORM, NormScope.HEAD, 1e-5), Norm(NormTarget.K, NormKind.LAYERNORM, NormScope.HEAD, 1e-6)),
                  inputs=(T.decl("bb", DType.FP32, SizeSym.H, SizeSym.LQ, SizeSym.LK),))
    wrt = ("bb", *plan_bwd.norm_params(v))
    rng = np.random.default_rng(6)
    arrays = workload.make_inputs(v, 2, 70, 70, rng)
    for n in plan_bwd.norm_params(v):
        arrays[n] = (1 + 0.3 * rng.normal(size=arrays[n].shape)).astype(np.float32)
    rest = {n: a for n, a in arrays.items() if n not in ("q", "k", "v")}
    o, lse = reference.attention(v, arrays["q"], arrays["k"], arrays["v"], rest)
    dO = rng.normal(size=o.shape).astype(o.dtype)
    want = reference.attention_backward(v, arrays["q"], arrays["k"], arrays["v"], rest, dO.astype(np.float64), wrt=wrt)
    src, bp = render_bwd.render_with_plan(v, Arch.SM80)
    assert bp.engine == BwdEngine.MMA
    tc = _host_emu.run(src, bp, v, arrays, lse, dO, o, wrt=wrt)
    monkeypatch.setattr(plan_bwd, "TC_BLOCK_N_CHOICES", ())  # no tensor-core tile: the FFMA engine
    src, bp = render_bwd.render_with_plan(v, Arch.SM80)
    assert bp.engine == BwdEngine.FFMA
    ffma = _host_emu.run(src, bp, v, arrays, lse, dO, o, wrt=wrt)
    for n in ("dq", "dk", "dv", *wrt):
        assert np.all(np.isfinite(tc[n])), n
        scale = float(np.abs(want[n]).max())
        err, err_ffma = (float(np.abs(g[n] - want[n]).max()) for g in (tc, ffma))
        assert err <= max(TOL[v.dtype] * scale, 1.25 * err_ffma), f"{n}: max error {err:.3g} (FFMA {err_ffma:.3g}) vs max |ref| {scale:.3g}"
        if n != "k_norm_bias":
            assert err <= TOL[v.dtype] * scale, f"{n}: max error {err:.3g} vs max |ref| {scale:.3g}"


@pytestmark_emu
def test_half_precision_on_sm75_stays_ffma():
    v = T.variant(T.causal(), (T.softcap(4.0),), D=16, heads=2, dtype=DType.FP16)
    _run(v, 1, 70, 70, seed=7, arch=Arch.SM75, engine=BwdEngine.FFMA)


@pytestmark_emu
def test_long_walk_window_gqa_several_classification_rounds():
    # 4 heads a kv head and 17 query tiles: 68 pairs a key tile in three rounds of 32, the window
    # leaving most of each round invisible.
    v = T.variant(T.window(90, 0), (), D=32, heads=4, kv_heads=1, dtype=DType.FP16)
    _run(v, 1, 1050, 1050, seed=7)


# Masks that read tensors, split by axis in the dK/dV step (emit.split_by_axis: lookups once per
# query, shuffled, and once per key): documents (both axes), a prefix-LM (a per-batch length, the
# whole `kv < plen[b]` per key) and padding (per-batch lengths, rows and keys), each against the
# per-element form it replaced.
SPLIT_MASKS = {
    "documents": lambda: (T.and_(T.document("doc"), T.causal()), (T.decl("doc", DType.I32, SizeSym.B, SizeSym.LK, sorted=True),)),
    "prefix_lm": lambda: (T.or_(T.causal(), T.prefix(T.load("plen", T.b))), (T.decl("plen", DType.I32, SizeSym.B),)),
    "padding": lambda: (T.padding(), ()),
}


@pytestmark_emu
@pytest.mark.parametrize("name", sorted(SPLIT_MASKS))
def test_split_mask_gives_the_same_bits(name, monkeypatch):
    mask, inputs = SPLIT_MASKS[name]()
    v = T.variant(mask, (), D=64, heads=2, dtype=DType.FP16, inputs=inputs)
    src = render_bwd.render(v, Arch.SM80, deterministic=True)
    assert "as the wgmma engine's step (emit.split_by_axis)" in src and "ag_mask(p, b, h, qi + p.q_offset" not in src
    got, _ = _run(v, 2, 150, 150, seed=8, deterministic=True)
    monkeypatch.setattr(render_bwd, "_bwd_split_ctx", lambda *a: None)
    assert "ag_mask(p, b, h, qi + p.q_offset" in render_bwd.render(v, Arch.SM80, deterministic=True)
    plain, _ = _run(v, 2, 150, 150, seed=8, deterministic=True)
    for n in ("dq", "dk", "dv"):
        assert np.array_equal(got[n], plain[n]), n


def test_split_mask_stays_off_above_head_dim_64():
    # Its tiles hold 255 registers there and ptxas spilled more with the split (results/mma_split_ptxas.txt).
    mask, inputs = SPLIT_MASKS["documents"]()
    v = T.variant(mask, (), D=128, heads=2, dtype=DType.BF16, inputs=inputs)
    src, bp = render_bwd.render_with_plan(v, Arch.SM80)
    assert bp.engine == BwdEngine.MMA and "ag_mask(p, b, h, qi + p.q_offset" in src and "emit.split_by_axis" not in src
