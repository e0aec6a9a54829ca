"""The sm_90a FP8 forward on the wgmma engine (backends/cuda/fwd/_wgmma.cu.j2 with _wgmma_q8.cu.j2:
m64nNk32 e4m3/e5m2 wgmma, P from registers, V^T from the prep kernel) run on the CPU through
`_fwd_emu`, whose k32 wgmma follows the PTX ISA's 8-bit fragment layouts, against the quantized
NumPy reference (attngen.check.quant) at the bound of tests/codegen/test_quant_fwd_emu.py; and
which specs the plan sends to it."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _fwd_emu as emu  # noqa: E402
from test_quant_fwd_emu import _bound  # noqa: E402

from attngen.check import quant_accuracy, reference  # noqa: E402
from attngen.cuda.render import render_with_plan  # noqa: E402
from attngen.ir.nodes import QuantOperand  # noqa: E402
from attngen.lang import frontend  # noqa: E402
from attngen.plan import quant_fwd  # noqa: E402
from attngen.plan.schedule import Arch, Engine  # noqa: E402

pytestmark = pytest.mark.skipif(emu.available() is not None, reason=str(emu.available()))

_QKV = """
  quant q fp8_e4m3 input per head
  quant k fp8_e4m3 input per head
  quant v {vt} input {vg}
  quant p {pt} static({c})
"""


def _spec(name: str, body: str, vt: str = "fp8_e4m3", vg: str = "per head", pt: str = "fp8_e4m3", c: str = "448.0", d: int = 128):
    return frontend.loads(f"attention {name} {{\n  head_dim {d}\n{body}\n" + _QKV.format(vt=vt, vg=vg, pt=pt, c=c) + "}",
                          f"{name}.attn").get()


# (spec, (B, Lq, Lk)): lengths that are no multiple of the 128 x 128 tile, several work tiles a CTA
CASES = {
    "dense": (_spec("dense", "  dtype fp8_e4m3 out bf16\n  heads 2\n  kind cross\n  layout bhsd\n  output lse", vg="per tensor"), (1, 200, 300)),
    "causal_gqa_bshd": (_spec("causal_gqa_bshd", "  dtype fp8_e4m3 out bf16\n  heads 4 kv 2\n  layout bshd\n  mask causal"),
                        (2, 150, 150)),
    # a tile hint's stage count: two slots, the ring's tightest wrap
    "causal_stages2": (_spec("causal_stages2", "  dtype fp8_e4m3 out bf16\n  heads 2\n  layout bhsd\n  mask causal\n"
                             "  tile block_m 128 block_n 128 warps 8 stages 2"), (1, 390, 390)),
    # a mask that reads a tensor (visibility bits while S is in flight), a sink, the NaN check
    "documents_sink": (_spec("documents_sink", "  dtype fp8_e4m3 out bf16\n  heads 2\n  layout bhsd\n"
                             "  input doc: i32[B, Lk] sorted\n  mask document(doc) && causal\n  input sinks: fp32[H]\n"
                             "  sink sinks\n  nan_check\n  output lse"), (2, 260, 260)),
    # head dim 64: Q and K rows in the 64-byte swizzle, V^T of 64 channels
    "d64_causal_gqa": (_spec("d64_causal_gqa", "  dtype fp8_e4m3 out bf16\n  heads 4 kv 1\n  layout bshd\n  mask causal\n"
                             "  output lse", d=64), (1, 300, 300)),
    "d64_e5m2_cross": (_spec("d64_e5m2_cross", "  dtype fp16 q fp8_e4m3 k fp8_e4m3 v fp8_e5m2\n  heads 2\n  kind cross\n"
                             "  layout bhsd", vt="fp8_e5m2", vg="per tensor", pt="fp8_e5m2", c="57344.0", d=64), (2, 70, 333)),
    "window_fp16": (_spec("window_fp16", "  dtype fp8_e4m3 out fp16\n  heads 2\n  layout bhsd\n  mask causal && window(100, 0)\n"
                          "  output lse"), (1, 330, 330)),
    "e5m2_cross_score": (_spec("e5m2_cross_score", "  dtype fp16 q fp8_e4m3 k fp8_e4m3 v fp8_e5m2\n  heads 2\n  kind cross\n"
                               "  layout bshd\n  mask kv <= q + 40\n  score s * 0.5", vt="fp8_e5m2", pt="fp8_e5m2", c="57344.0"),
                         (1, 140, 260)),
}


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("outliers", [False, True], ids=["plain", "outliers"])
def test_wgmma_fp8_kernel_matches_quantized_reference(name, outliers, tmp_path):
    from attngen.check import reference_eval as E
    from attngen.check.quant import dense_operands

    v, (B, Lq, Lk) = CASES[name]
    src, kp = render_with_plan(v, Arch.SM90A)
    assert kp.engine == Engine.WGMMA and "k32.f32.e" in src and [k.prep.func for k in kp.kernels[:-1]] == ["ag_prep_vt"]
    assert "cp.async.bulk.shared::cluster.global" in src and not kp.attention.tma  # V^T by bulk copies, Q and K by cp.async
    call = quant_accuracy.quantized_call(v, quant_accuracy.inputs(v, B, Lq, Lk, seed=3, outliers=outliers))
    rest = {n: a for n, a in call.items() if n not in ("q", "k", "v")}
    o_ref, lse_ref = reference.attention(v, call["q"], call["k"], call["v"], rest)
    o, lse = emu.run(src, kp, v, call, workdir=str(tmp_path), timeout=600)
    o_ref = np.asarray(o_ref, np.float64)
    assert np.isfinite(o).all()
    vd = dense_operands(v, call["q"], call["k"], call["v"], E.prepare_tensors(v, rest))[2]
    tol = 4 * 2.0 ** -8 * float(np.abs(o_ref).max()) + _bound(v, vd, Lk)
    err = np.abs(o - o_ref).max()
    assert err <= tol, (name, err, tol)
    # The bound above is P's worst case; the kernel's error runs far below it (e4m3 P: 0.001-0.018
    # here; e5m2 P, three mantissa bits fewer: up to 0.036), at or below the mma.sync kernel's at
    # these inputs (key tiles of 128 move the running max less).
    e5m2 = v.quant(QuantOperand.P).dtype.value == "fp8_e5m2"
    assert quant_accuracy.error(o, o_ref).rel_l2 < (0.06 if e5m2 else 0.03)
    if v.lse:
        assert np.allclose(lse, lse_ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name, shape", [("dense", (1, 1, 1)), ("dense", (2, 3, 129)), ("d64_e5m2_cross", (1, 129, 1))])
def test_edge_lengths(name, shape, tmp_path):
    # one query and one key, a query tile of three rows against a key tile and one key past it,
    # a single key under 129 queries (every row normalised by one probability)
    v, _ = CASES[name]
    B, Lq, Lk = shape
    call = quant_accuracy.quantized_call(v, quant_accuracy.inputs(v, B, Lq, Lk, seed=3))
    rest = {n: a for n, a in call.items() if n not in ("q", "k", "v")}
    o_ref, lse_ref = reference.attention(v, call["q"], call["k"], call["v"], rest)
    src, kp = render_with_plan(v, Arch.SM90A)
    o, lse = emu.run(src, kp, v, call, workdir=str(tmp_path), timeout=600)
    assert quant_accuracy.error(o, np.asarray(o_ref, np.float64)).rel_l2 < 0.03
    if v.lse:
        assert np.allclose(lse, lse_ref, rtol=1e-4, atol=1e-4)


def test_a_wrong_v_permutation_fails(tmp_path):
    # The emulation is the layouts' witness: V^T written with another permutation of the keys within
    # each 32 must give wrong outputs, or the test above proves nothing about the fragments.
    v, (B, Lq, Lk) = CASES["dense"]
    src, kp = render_with_plan(v, Arch.SM90A)
    line = "        const int k0 = 16 * (q >> 2) + 2 * (q & 3);"
    assert line in src
    call = quant_accuracy.quantized_call(v, quant_accuracy.inputs(v, B, 130, 130, seed=3))
    rest = {n: a for n, a in call.items() if n not in ("q", "k", "v")}
    o_ref, _ = reference.attention(v, call["q"], call["k"], call["v"], rest)
    o, _ = emu.run(src.replace(line, "        const int k0 = 16 * (q >> 2) + 2 * ((q + 1) & 3);"), kp, v, call, workdir=str(tmp_path), timeout=600)
    assert np.abs(o - np.asarray(o_ref, np.float64)).max() > 0.05


def test_routing():
    """FP8 Q·Kᵀ + FP8 P·V at head dims 64 and 128 runs on wgmma on sm_90a only; sm_89, other head
    dims and a tile hint of another shape keep mma.sync."""
    v = CASES["dense"][0]
    assert quant_fwd.wgmma_q8(v, Arch.SM90A) and not quant_fwd.wgmma_q8(v, Arch.SM89)
    _, kp89 = render_with_plan(v, Arch.SM89)
    assert kp89.engine == Engine.MMA_SYNC and not kp89.preps
    d96 = frontend.loads("attention d96 { dtype fp8_e4m3 out bf16\n head_dim 96\n heads 2\n" + _QKV.format(
        vt="fp8_e4m3", vg="per head", pt="fp8_e4m3", c="448.0") + "}").get()
    assert render_with_plan(d96, Arch.SM90A)[1].engine == Engine.MMA_SYNC
    hinted = _spec("hinted", "  dtype fp8_e4m3 out bf16\n  heads 2\n  tile block_m 128 block_n 32 warps 4")
    assert render_with_plan(hinted, Arch.SM90A)[1].engine == Engine.MMA_SYNC
    staged = _spec("staged", "  dtype fp8_e4m3 out bf16\n  heads 2\n  tile block_m 128 block_n 128 warps 8 stages 4")
    kp = render_with_plan(staged, Arch.SM90A)[1]
    assert kp.engine == Engine.WGMMA and kp.tile.stages == 4
    example = frontend.loads((Path(__file__).resolve().parents[2] / "examples/quant/fp8_prefill.attn").read_text()).get()
    _, kp = render_with_plan(example, Arch.SM90A)
    assert kp.engine == Engine.WGMMA and kp.preps[0].workspace_shape(2, 100, 200) == (2, 8, 256, 128)
