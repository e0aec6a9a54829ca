"""The wgmma (sm_90a) dK/dV engine, run on the CPU under the host emulation (tests/backward/
_host_emu.py: wgmma with its shared-memory descriptors and 128-byte swizzle, the register A
operand, the dQ bulk reductions) against the float64 reference backward: causal, window and
score-modified masks with partial and skipped tiles, GQA sums, odd lengths, Lq != Lk, head dims 64
and 128 (and Dv != D), score-input and pre-norm gradients, the deterministic dQ kernel beside it."""

from __future__ import annotations

import sys
from pathlib import Path

import shutil

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "reference"))
import _host_emu  # noqa: E402
import _irb as T  # noqa: E402

from attngen.check import reference, workload  # noqa: E402
from attngen.cuda import compile as compile_cuda, render_bwd  # noqa: E402
from attngen.ir.nodes import AttnKind, DType, Layout, Norm, NormKind, NormScope, NormTarget, SizeSym  # noqa: E402
from attngen.plan import bwd as plan_bwd  # noqa: E402
from attngen.plan.bwd import BwdEngine  # noqa: E402
from attngen.plan.schedule import Arch  # noqa: E402

emu = pytest.mark.skipif(_host_emu.available() is not None, reason=f"no host emulation: {_host_emu.available()}")

TOL = {DType.FP16: 8e-3, DType.BF16: 3e-2}


def _run(v, B, Lq, Lk, seed=0, deterministic=False, wrt=(), edit=None):
    rng = np.random.default_rng(seed)
    arrays = workload.make_inputs(v, B, Lq, Lk, rng)
    if edit:
        edit(arrays, rng)
    rest = {n: a for n, a in arrays.items() if n not in ("q", "k", "v")}
    o, lse = reference.attention(v, arrays["q"], arrays["k"], arrays["v"], rest)
    dO = rng.normal(size=o.shape).astype(o.dtype)
    want = reference.attention_backward(v, arrays["q"], arrays["k"], arrays["v"], rest, dO.astype(np.float64), wrt=wrt)
    src, bp = render_bwd.render_with_plan(v, Arch.SM90A, deterministic=deterministic)
    assert bp.engine == BwdEngine.WGMMA, bp.backward.engine_reason
    got = _host_emu.run(src, bp, v, arrays, lse, dO, o, wrt=wrt)
    for n in ("dq", "dk", "dv", *wrt):
        scale = float(np.abs(want[n]).max())
        assert scale > 0
        err = float(np.abs(got[n] - want[n]).max())
        assert err <= TOL[v.dtype] * scale, f"{n}: max error {err:.3g} vs max |ref| {scale:.3g}"
        assert np.all(np.isfinite(got[n]))
    return got, want, bp


def test_engine_choice_plan_and_explain():
    bf = T.variant(T.causal(), (), D=128, heads=2, dtype=DType.BF16)
    h64 = T.variant(T.causal(), (), D=64, heads=2, dtype=DType.FP16)
    assert plan_bwd.choose_engine(bf, Arch.SM90A)[0] == BwdEngine.WGMMA
    assert plan_bwd.choose_engine(h64, Arch.SM90A)[0] == BwdEngine.WGMMA
    # Elsewhere the mma.sync / FFMA choices stand: other archs, other head dims, fp32, Dv != 64 / 128.
    assert plan_bwd.choose_engine(bf, Arch.SM80)[0] == BwdEngine.MMA
    assert plan_bwd.choose_engine(bf, Arch.SM90)[0] == BwdEngine.MMA
    assert plan_bwd.choose_engine(T.variant(T.causal(), (), D=32, heads=2, dtype=DType.BF16), Arch.SM90A)[0] == BwdEngine.MMA
    assert plan_bwd.choose_engine(T.variant(T.causal(), (), D=128, Dv=96, heads=2, dtype=DType.BF16), Arch.SM90A)[0] == BwdEngine.MMA
    assert plan_bwd.choose_engine(T.variant(T.causal(), (), D=128, heads=2), Arch.SM90A)[0] == BwdEngine.FFMA
    assert "value head dim 96" in plan_bwd.wgmma_fits(T.variant(T.causal(), (), D=128, Dv=96, heads=2, dtype=DType.BF16), Arch.SM90A)
    assert "varlen" in plan_bwd.wgmma_fits(T.variant(T.causal(), (), D=128, heads=2, dtype=DType.BF16, layout=Layout.VARLEN), Arch.SM90A)
    # Asking: the mma.sync engine on sm_90a is available; wgmma where it cannot run is refused, said why.
    assert plan_bwd.plan(bf, Arch.SM90A, engine=BwdEngine.MMA).engine == BwdEngine.MMA
    with pytest.raises(ValueError, match="wgmma backward engine cannot run it: sm_80 has no wgmma"):
        plan_bwd.plan(bf, Arch.SM80, engine=BwdEngine.WGMMA)
    with pytest.raises(ValueError, match="the mma backward engine cannot run it on sm_90a"):
        plan_bwd.plan(T.variant(T.causal(), (), D=128, heads=2), Arch.SM90A, engine=BwdEngine.MMA)
    bp = plan_bwd.plan(bf, Arch.SM90A)
    k = bp.kernel("ag_bwd_dkdv")
    # 64-query steps; dQ from a third warpgroup (384 threads) out of two staged fp32 dQ tiles (rows
    # padded by 8 words), each with a 16-byte header. The deterministic kernel keeps 256 threads and
    # no dQ buffers.
    assert (bp.backward.tc_block_m, bp.backward.tc_block_n, k.threads) == (64, 128, 384)
    assert bp.backward.wg_dq == plan_bwd.wg_dq_mode(128, 128) == plan_bwd.WgDq.WG_BULK and plan_bwd.wg_dq_mode(64, 64) == plan_bwd.WgDq.WG_BULK
    assert plan_bwd.plan(bf, Arch.SM90A, deterministic=True).backward.wg_dq is None and plan_bwd.plan(bf, Arch.SM80).backward.wg_dq is None
    # (+ 24: the TMA copies' mbarriers, plan_bwd.WG_LOADS)
    assert k.smem.bytes == plan_bwd.wg_smem_bytes(128, 128, tma=True) == 148480 + 2 * (64 * 136 * 4 + 16) + 24 and k.smem.bytes <= Arch.SM90A.smem_budget
    assert plan_bwd.plan(bf, Arch.SM90A, deterministic=True).kernel("ag_bwd_dkdv").threads == 256
    assert plan_bwd.plan(bf, Arch.SM90A, deterministic=True).kernel("ag_bwd_dkdv").smem.bytes == plan_bwd.wg_smem_bytes(128, 128, True, tma=True) == 148480 + 24
    # D64 = Dv: steps of 128 queries (two sub-steps of 64), dQ split by rows (N = 64), one CTA an SM
    # (registers: 232-255 a thread); elsewhere 64 queries.
    h64_bp = plan_bwd.plan(h64, Arch.SM90A)
    assert h64_bp.backward.tc_block_m == 128 and plan_bwd.wg_dq_cols(64, 128) == 64 and plan_bwd.wg_dq_cols(128, 64) == 64
    # ... dQ staged (8 warps x 16 rows x (64 + 8) fp32 words) and added by bulk reductions, a row a lane.
    staging = 2 * (128 * 72 * 4 + 16)
    assert h64_bp.kernel("ag_bwd_dkdv").smem.bytes == plan_bwd.wg_smem_bytes(64, 64, tma=True) == 2 * (6 * 128 * 64 + 128 * 128) + 16 * 128 + staging + 24
    assert plan_bwd.plan(T.variant(T.causal(), (), D=64, Dv=128, heads=2, dtype=DType.BF16), Arch.SM90A).backward.tc_block_m == 64
    h64_src = render_bwd.render(h64, Arch.SM90A)
    assert "constexpr int WG_BLOCK_M = 128;" in h64_src and "constexpr int WG_SUB = WG_BLOCK_M / WG_SUB_M;" in h64_src
    assert "m64n64k16.f32.f16.f16" in h64_src and "m64n32k16" not in h64_src
    assert "ag_bulk_reduce_add(p.ws_dq" in h64_src and "ag_red_add2(row" not in h64_src
    assert bp.launch_grid(bp.kernel("ag_bwd_dkdv"), 2, 100, 130) == (2, 2, 2)
    text = "\n".join(plan_bwd.describe(bf, Arch.SM90A))
    assert "wgmma engine (warpgroup MMA, bf16 inputs, fp32 accumulators" in text and "tile 64 queries x 128 keys" in text
    src = render_bwd.render(bf, Arch.SM90A)
    assert "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16" in src and "ag_wg_step<false>" in src
    assert "ag_wg_dq_adder(p, ag_smem, tid - WG_THREADS)" in src and "ag_red_add2(row" not in src and "ag_bulk_reduce_add(p.ws_dq + (row0 + r) * D" in src
    assert "__launch_bounds__(384, 1)" in src and "setmaxnreg.dec.sync.aligned.u32" in src
    assert "mma.sync" not in src
    det = render_bwd.render(bf, Arch.SM90A, deterministic=True)
    assert "ag_bwd_dq(p)" in det and "ag_bulk_reduce_add(p.ws_dq" not in det and "SDQ_BYTES = 0;" in det
    # The sm_80 rendering and the forward are untouched by the engine.
    assert "wgmma" not in render_bwd.render(bf, Arch.SM80)
    assert plan_bwd.plan(bf, Arch.SM90A, engine=BwdEngine.MMA).engine == BwdEngine.MMA
    assert plan_bwd.plan(bf, Arch.SM90A, engine=BwdEngine.WGMMA).engine == BwdEngine.WGMMA


@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on the PATH")
def test_nvcc_sm90a_without_spills():
    # The plain variants the benchmarks time must not spill (D128: 255 registers a thread, both dQ
    # modes); score mods and Dv != D compile too.
    plain = [T.variant(T.causal(), (), D=d, heads=4, kv_heads=2, dtype=DType.BF16, name=f"p{d}") for d in (64, 128)]
    others = [T.variant(T.window(100, 0), (T.softcap(30.0),), D=128, Dv=64, heads=2, dtype=DType.FP16, name="w")]
    # The pre-LN block (token-scope q norm + residual) and the o post-norm read workspaces (ws_q, ws_do).
    plain += [T.variant(T.TRUE, (), D=64, heads=16, dtype=DType.BF16, kind=AttnKind.CROSS, layout=Layout.BSHD, residual=True,
                        norms=(Norm(NormTarget.Q, NormKind.LAYERNORM, NormScope.TOKEN, 1e-5),), name="preln"),
              T.variant(T.causal(), (), D=128, heads=4, kv_heads=2, dtype=DType.BF16, layout=Layout.BSHD,
                        norms=(Norm(NormTarget.O, NormKind.RMSNORM, NormScope.HEAD, 1e-5),), name="onorm")]
    for det in (False, True):
        for v in plain + others:
            res = {r.kernel: r for r in compile_cuda.resources(render_bwd.render(v, Arch.SM90A, deterministic=det), Arch.SM90A)}
            r = next(r for name, r in res.items() if name.endswith("_bwd_dkdv"))
            assert r.registers <= 255
            if v in plain:
                assert r.spill_stores == 0 and r.spill_loads == 0, f"{v.name} det={det}: {r}"
            else:
                assert r.spill_stores <= 64, f"{v.name} det={det}: {r}"


@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on the PATH")
def test_nvcc_sm90a_wgmma_never_serialised():
    # ptxas serialises or fences the asynchronous products when registers run short (C7512, or an
    # injected warpgroup.arrive / wait: C7519, C7517): the dQ-warpgroup kernel must not. It launches
    # at 384 x 168 registers (setmaxnreg moves them), unspilled.
    for d in (64, 128):
        v = T.variant(T.causal(), (), D=d, heads=4, kv_heads=2, dtype=DType.BF16, name=f"p{d}")
        src = render_bwd.render(v, Arch.SM90A)
        _, log = compile_cuda.nvcc(src, Arch.SM90A, "cubin", extra=("-Xptxas", "-v"))
        assert not any(c in log for c in ("C7512", "C7517", "C7519")), log
        res = {r.kernel: r for r in compile_cuda.resources(src, Arch.SM90A)}
        r = next(r for name, r in res.items() if name.endswith("_bwd_dkdv"))
        assert r.spill_stores == 0 and r.spill_loads == 0, r
        assert r.registers == 168


def test_prefetch_point_by_mask():
    # WgPrefetch: the next step's loads go under the dQ product, except for masks that read tensors
    # (their indices and the next step's would be live across the products at once: ptxas spills).
    from attngen.lang import frontend

    doc = frontend.load(Path(__file__).parent / "regressions" / "document_prefetch_spill.attn").get()
    win = T.variant(T.window(100, 0), (), D=128, heads=2, dtype=DType.BF16, name="w")
    assert plan_bwd.plan(doc, Arch.SM90A).backward.wg_prefetch == plan_bwd.WgPrefetch.TOP
    assert plan_bwd.plan(win, Arch.SM90A).backward.wg_prefetch == plan_bwd.WgPrefetch.UNDER_DQ
    assert plan_bwd.plan(win, Arch.SM80).backward.wg_prefetch is None
    top, under = render_bwd.render(doc, Arch.SM90A), render_bwd.render(win, Arch.SM90A)
    assert "    prefetch();\n    auto step_prefetch = []() {};" in top and "auto& step_prefetch = prefetch;" not in top
    assert "auto& step_prefetch = prefetch;" in under and "auto step_prefetch = []() {};" not in under
    # Either way the step calls its prefetch exactly once.
    for src in (top, under):
        assert src.count("    prefetch();\n") == 1 + (src is top)


@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on the PATH")
def test_nvcc_document_mask_prefetch_spill():
    # Regression (regressions/document_prefetch_spill.attn): 72 bytes of spill stores under UNDER_DQ.
    from attngen.lang import frontend

    v = frontend.load(Path(__file__).parent / "regressions" / "document_prefetch_spill.attn").get()
    res = {r.kernel: r for r in compile_cuda.resources(render_bwd.render(v, Arch.SM90A), Arch.SM90A)}
    r = next(r for name, r in res.items() if name.endswith("_bwd_dkdv"))
    assert r.spill_stores <= 32, r


def test_setmaxnreg_counts_fit_the_launch_allocation():
    # setmaxnreg.inc waits for registers that decrements freed: the dQ-warpgroup modes' counts must
    # fit what a 384-thread CTA is launched with (168 a thread), or the consumers wait forever.
    assert plan_bwd.wg_launch_regs(384) == 168 and plan_bwd.wg_launch_regs(256) == 256
    assert plan_bwd.WG_DQ_REGS * plan_bwd.WG_DQ_THREADS + plan_bwd.WG_CONSUMER_REGS * plan_bwd.WG_THREADS <= 168 * 384
    src = render_bwd.render(T.variant(T.causal(), (), D=128, heads=2, dtype=DType.BF16), Arch.SM90A)
    assert "constexpr int WG_LAUNCH_REGS = 65536 / WG_CTA_THREADS / 8 * 8;" in src and "<= WG_LAUNCH_REGS * WG_CTA_THREADS" in src


@emu
def test_bf16_causal_softcap_gqa_odd_lengths_d64():
    # 2 key tiles (128 + 22 keys), 3 query tiles of 64 (the last partial), two heads a kv head;
    # the causal classification skips tiles, the diagonal ones take the per-element mask.
    v = T.variant(T.causal(), (T.softcap(5.0),), D=64, heads=4, kv_heads=2, dtype=DType.BF16)
    _run(v, 1, 150, 150, seed=1)


@emu
def test_fp16_window_alibi_cross_bshd_d128():
    v = T.variant(T.window(50, 7), (T.alibi(heads=2),), D=128, heads=2, kv_heads=1, dtype=DType.FP16,
                  kind=AttnKind.CROSS, layout=Layout.BSHD, scale=0.1)
    _run(v, 1, 70, 140, seed=2)


@emu
def test_fp16_dense_dv_differs_two_batches():
    v = T.variant(scores=(), D=128, Dv=64, heads=2, kv_heads=2, dtype=DType.FP16, kind=AttnKind.CROSS)
    _run(v, 2, 65, 129, seed=3)


@emu
@pytest.mark.parametrize("deterministic", [False, True])
def test_score_input_gradients_padding_fully_masked_rows(deterministic):
    v = T.variant(T.padding(), (T.bias("bb", 3), T.rel_bias("rt", 6)), D=64, heads=2, dtype=DType.BF16, kind=AttnKind.CROSS,
                  inputs=(T.decl("bb", DType.FP32, SizeSym.H, SizeSym.LQ, SizeSym.LK), T.decl("rt", DType.FP32, SizeSym.H, 13)))

    def edit(a, rng):
        a["q_lens"] = np.array([0, 70], dtype=np.int32)  # batch 0: every query row fully masked
        a["kv_lens"] = np.array([100, 131], dtype=np.int32)

    got, _, _ = _run(v, 2, 100, 131, seed=4, deterministic=deterministic, wrt=("bb", "rt"), edit=edit)
    assert not np.any(got["dq"][0]) and not np.any(got["dk"][0]) and not np.any(got["dv"][0])


@emu
def test_qk_norms_residual():
    v = T.variant(T.causal(), (), D=64, heads=2, kv_heads=1, dtype=DType.BF16, residual=True,
                  norms=(Norm(NormTarget.Q, NormKind.LAYERNORM, NormScope.HEAD, 1e-5), Norm(NormTarget.K, NormKind.RMSNORM, NormScope.HEAD, 1e-6)))
    # (A k layernorm's bias has a gradient of exactly 0 in exact arithmetic -- it shifts each query
    # row's scores by a constant -- so its rounding noise has no scale to compare with.)

    def edit(a, rng):
        for n in plan_bwd.norm_params(v):
            a[n] = (1 + 0.3 * rng.normal(size=a[n].shape)).astype(np.float32)

    _run(v, 1, 80, 80, seed=5, wrt=plan_bwd.norm_params(v), edit=edit)


def test_dq_warpgroup_reaches_plan_render_and_explain():
    # The atomic dQ mode (a third warpgroup adding bulk row reductions): the plan, the kernel text
    # and the plan's kernel description agree.
    bf = T.variant(T.causal(), (), D=128, heads=2, dtype=DType.BF16)
    bp = plan_bwd.plan(bf, Arch.SM90A)
    assert bp.backward.wg_dq == plan_bwd.WgDq.WG_BULK and list(plan_bwd.WgDq) == [plan_bwd.WgDq.WG_BULK]
    assert bp.kernel("ag_bwd_dkdv").threads == plan_bwd.wg_threads(128, 128) == 384
    assert "bulk fp32 reductions (cp.reduce.async.bulk, a row each) from a third warpgroup" in bp.kernel("ag_bwd_dkdv").doc
    header = render_bwd.render(bf, Arch.SM90A).split("// Arguments, in order")[0]
    assert "dQ: fp32 bulk reductions into ws_dq (cp.reduce.async.bulk, a row each) from a third warpgroup" in header
    assert "384 threads" in header


@emu
def test_bf16_dense_d64_whole_and_partial_128_query_steps():
    # D64: steps of 128 queries as two sub-steps. Queries 0-255 are whole steps over whole key
    # tiles (the unmasked step, no score modifications: the two-pass softmax gradient); the third
    # step has 44 rows, so its second sub-step lies wholly past Lq (its 44-row last tile adds only
    # the valid rows; the emulation reads a bulk source at the issuer's next wait, so a buffer
    # rewritten before that wait adds wrong values).
    v = T.variant(scores=(), D=64, heads=2, kv_heads=1, dtype=DType.BF16, kind=AttnKind.CROSS)
    _, _, bp = _run(v, 1, 300, 256, seed=6)
    assert bp.backward.tc_block_m == 128 and bp.backward.wg_dq == plan_bwd.WgDq.WG_BULK


@emu
def test_dq_warpgroup_d128_causal_odd_lengths():
    # D128 (64-query steps, the warpgroups split dQ by columns): causal with a partial last query
    # tile (rows past Lq are never added), two heads a kv head. A third warpgroup (setmaxnreg)
    # takes the steps' tiles, staged row-major with padded rows, from two shared-memory buffers and
    # adds them by a bulk reduction a row; the consumers meet at a named barrier of their own.
    v = T.variant(T.causal(), (), D=128, heads=4, kv_heads=2, dtype=DType.BF16)
    _, _, bp = _run(v, 1, 200, 200, seed=8)
    src = render_bwd.render(v, Arch.SM90A)
    assert "ag_red_add2(row" not in src
    k = bp.kernel("ag_bwd_dkdv")
    assert k.threads == 384 and k.min_blocks == 1 and "__launch_bounds__(384, 1)" in src
    assert "ag_wg_dq_adder(p, ag_smem, tid - WG_THREADS)" in src and "ag_nbar_sync(CONS_BAR, WG_THREADS)" in src
    assert "  __syncthreads();" not in src.split("__device__ __forceinline__ void ag_bwd_dkdv")[1].split("\n}\n")[0]
    assert "ag_bulk_reduce_add(p.ws_dq + (row0 + r) * D" in src and "ag_red_add4(" not in src.split("void ag_wg_dq_adder")[1].split("\n}\n")[0]
    assert k.smem.bytes == plan_bwd.wg_smem_bytes(128, 128, tma=True) == 148480 + 2 * (64 * 136 * 4 + 16) + 24 <= Arch.SM90A.smem_budget


# ---- the token-scope q norm (pre-LN block) and the o post-norm on the wgmma engine: it reads the
# prep kernel's ws_q ([B, H, Lq, D] for a token-scope norm too) and the pre kernel's dO' (ws_do).

@emu
@pytest.mark.parametrize("kind,deterministic", [(NormKind.LAYERNORM, False), (NormKind.RMSNORM, False), (NormKind.LAYERNORM, True)])
def test_token_scope_q_norm_residual_cross(kind, deterministic):
    v = T.variant(T.TRUE, (), D=64, heads=4, kv_heads=4, dtype=DType.BF16, kind=AttnKind.CROSS, layout=Layout.BSHD,
                  residual=True, norms=(Norm(NormTarget.Q, kind, NormScope.TOKEN, 1e-5),))
    wrt = plan_bwd.norm_params(v)

    def edit(a, rng):
        assert all(a[n].shape == (4 * 64,) for n in wrt)
        for n in wrt:
            a[n] = (1 + 0.3 * rng.normal(size=a[n].shape)).astype(np.float32)
        a["q"] = (a["q"] + 0.5).astype(a["q"].dtype)  # a mean the layernorm removes

    got, want, bp = _run(v, 2, 70, 131, seed=6, deterministic=deterministic, wrt=wrt, edit=edit)
    assert bp.backward.q_norm_token and bp.backward.tok_vecs == 1  # H*D = 256: the prep and finish kernels' vector paths


@emu
@pytest.mark.parametrize("kind,residual", [(NormKind.LAYERNORM, True), (NormKind.RMSNORM, False)])
def test_o_post_norm(kind, residual):
    v = T.variant(T.causal(), (), D=64, heads=2, kv_heads=1, dtype=DType.FP16, layout=Layout.BSHD, residual=residual,
                  norms=(Norm(NormTarget.O, kind, NormScope.HEAD, 1e-5),))
    rng = np.random.default_rng(7)
    arrays = workload.make_inputs(v, 2, 90, 90, rng)
    wrt = plan_bwd.norm_params(v)
    for n in wrt:
        arrays[n] = (1 + 0.3 * rng.normal(size=arrays[n].shape)).astype(np.float32)
    rest = {n: a for n, a in arrays.items() if n not in ("q", "k", "v")}
    y, _ = reference.attention(v, arrays["q"], arrays["k"], arrays["v"], rest)
    o_pre, lse = _host_emu.pre_norm_forward(v, arrays)
    dY = rng.normal(size=y.shape).astype(y.dtype)
    want = reference.attention_backward(v, arrays["q"], arrays["k"], arrays["v"], rest, dY.astype(np.float64), wrt=wrt)
    src, bp = render_bwd.render_with_plan(v, Arch.SM90A)
    # dO' from ws_do: the TMA descriptor's tensor (the default), or the cp.async copies' base
    assert bp.engine == BwdEngine.WGMMA and bp.backward.o_norm
    assert ("tm_do: ws_do" in src if bp.backward.wg_loads == plan_bwd.WgmmaLoads.TMA else "ag_wg_load<WG_BLOCK_M, DV>(sdo, ag_do_base(p, b, h)" in src)
    got = _host_emu.run(src, bp, v, arrays, lse, dY, o_pre, wrt=wrt)
    for n in ("dq", "dk", "dv", *wrt):
        assert np.all(np.isfinite(got[n]))
        scale = float(np.abs(want[n]).max())
        err = float(np.abs(got[n] - want[n]).max())
        assert scale > 0 and err <= TOL[v.dtype] * scale, f"{n}: max error {err:.3g} vs max |ref| {scale:.3g}"


@emu
def test_long_walk_document_causal_gqa_several_classification_rounds():
    # Regression (regressions/document_causal_long_walk.attn, its header says why): 72 (head,
    # query tile) pairs a key tile, walked from a rotated start in three classification rounds.
    from attngen.lang import frontend

    v = frontend.load(Path(__file__).parent / "regressions" / "document_causal_long_walk.attn").get()
    got, want, bp = _run(v, 1, 1100, 1100, seed=6)
    assert bp.engine == BwdEngine.WGMMA


@pytest.mark.parametrize("example", ["packed_documents", "paligemma_prefix_lm"])
def test_examples_whose_step_hoists_mask_lookups_match_the_reference(example):
    # The dK/dV step's visibility word with the mask's lookups read once per query (shuffled) and
    # once per key (emit.split_by_axis): documents (a query and a key lookup) and the prefix-LM
    # mask (a key lookup, `kv < plen[b]`), at odd lengths over several tiles.
    from attngen.lang import frontend

    v = frontend.load(Path(__file__).resolve().parents[2] / "examples" / f"{example}.attn").get()
    src = render_bwd.render(v, Arch.SM90A)
    assert "__shfl_sync" in src or "c0[ki]" in src
    _run(v, 2, 300, 300, seed=3)


# Masks that read tensors, split by axis at head dim 64 (128-query steps, the tests inside the
# products: `vis_inline`), against the per-element form: documents (rows and keys), a prefix-LM
# (`kv < plen[b]` per key) and padding (rows and keys), the documents once with a score mod (the
# elementwise pass that waits for both products); dK and dV bit for bit, dQ to its fp32 sums'
# order (the dQ warpgroup's reductions race each other in the emulation too).
SPLIT_D64 = {
    "documents": (lambda: T.and_(T.document("doc"), T.causal()), (), (T.decl("doc", DType.I32, SizeSym.B, SizeSym.LK, sorted=True),)),
    "documents_softcap": (lambda: T.and_(T.document("doc"), T.causal()), (T.softcap(5.0),),
                          (T.decl("doc", DType.I32, SizeSym.B, SizeSym.LK, sorted=True),)),
    "prefix_lm": (lambda: T.or_(T.causal(), T.prefix(T.load("plen", T.b))), (), (T.decl("plen", DType.I32, SizeSym.B),)),
    "padding": (lambda: T.padding(), (), ()),
}


@emu
@pytest.mark.parametrize("name", sorted(SPLIT_D64))
def test_split_mask_inside_the_products_gives_the_same_bits(name, monkeypatch):
    mask, scores, inputs = SPLIT_D64[name]
    v = T.variant(mask(), scores, D=64, heads=2, dtype=DType.BF16, inputs=inputs)
    src, bp = render_bwd.render_with_plan(v, Arch.SM90A)
    assert bp.backward.tc_block_m > plan_bwd.WG_SUB_M  # the vis_inline path
    assert "(emit.split_by_axis)" in src
    got, _, _ = _run(v, 2, 200, 200, seed=9)
    monkeypatch.setattr(render_bwd, "_bwd_split_ctx", lambda *a: None)
    assert "(emit.split_by_axis)" not in render_bwd.render(v, Arch.SM90A)
    plain, _, _ = _run(v, 2, 200, 200, seed=9)
    assert np.array_equal(got["dk"], plain["dk"]) and np.array_equal(got["dv"], plain["dv"])
    assert float(np.abs(got["dq"] - plain["dq"]).max()) <= 1e-5 * float(np.abs(plain["dq"]).max())
