"""The quantized forward kernel (backends/cuda/fwd/_mma_q8.cu.j2) on the host emulator: the
rendered CUDA compiled with g++, mma.sync m16n8k32 emulated by the PTX ISA's 8-bit fragment
layouts (tests/codegen/_fwd_emu.py), against the quantized NumPy reference (attngen.check.quant)
at the bound docs/QUANT.md states (P quantized against the running vs the final row max)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _fwd_emu as emu  # noqa: E402

from attngen.check import quant_accuracy, reference  # noqa: E402
from attngen.ir.nodes import QuantOperand  # noqa: E402
from attngen.lang import frontend  # noqa: E402
from attngen.plan.schedule import Arch  # noqa: E402

pytestmark = pytest.mark.skipif(emu.available() is not None, reason=str(emu.available()))

SPECS = """
attention fp8_pv {
  dtype fp8_e4m3 out bf16
  head_dim 64
  heads 4 kv 2
  layout bshd
  mask causal
  quant q fp8_e4m3 input per head
  quant k fp8_e4m3 input per head
  quant v fp8_e4m3 input per head
  quant p fp8_e4m3 static(448.0)
}
attention fp8_pv128 {
  dtype fp8_e4m3 out bf16
  head_dim 128
  heads 2 kv 1
  layout bhsd
  output lse
  quant q fp8_e4m3 input per head
  quant k fp8_e4m3 input per head
  quant v fp8_e4m3 input per tensor
  quant p fp8_e4m3 static(448.0)
}
attention fp8_vdeq {
  dtype fp8_e4m3 out bf16
  head_dim 64
  heads 2
  kind cross
  layout bhsd
  output lse
  quant q fp8_e4m3 input per tensor
  quant k fp8_e4m3 input per tensor
  quant v fp8_e4m3 input per tensor
}
attention fp8_qk {
  dtype bf16 q fp8_e5m2 k fp8_e4m3
  head_dim 64
  heads 2
  layout bhsd
  mask causal
  quant q fp8_e5m2 input per head
  quant k fp8_e4m3 input per head
}
attention fp8_pv_e5m2 {
  dtype fp16 q fp8_e4m3 k fp8_e4m3 v fp8_e5m2
  head_dim 64
  heads 2
  kind cross
  layout bshd
  mask kv <= q + 5
  score s * 0.5
  quant q fp8_e4m3 input per tensor
  quant k fp8_e4m3 input per tensor
  quant v fp8_e5m2 input per head
  quant p fp8_e5m2 static(57344.0)
}
"""
SPECS += """
attention sage_tok {
  dtype bf16
  head_dim 64
  heads 4 kv 2
  layout bshd
  mask causal
  quant q i8 amax per token
  quant k i8 amax per token
}
attention sage_blk {
  dtype fp16
  head_dim 128
  heads 2
  kind cross
  layout bhsd
  output lse
  quant q i8 amax per block(64)
  quant k i8 amax per block(32)
}
attention sage_smooth {
  dtype bf16
  head_dim 64
  heads 4 kv 2
  layout bshd
  mask causal
  quant q i8 amax per token
  quant k i8 amax per block(32) smooth mean
}
attention preln_int8 {
  dtype bf16
  head_dim 64
  heads 4
  kind cross
  layout bshd
  norm q layernorm(1e-5) scope token
  residual
  quant q i8 amax per token
  quant k i8 amax per token
}
"""
VARIANTS = {v.name: v for v in frontend.loads(SPECS, "quant_fwd.attn").variants}
# u_p and δ_p·c of docs/QUANT.md ("What a flash kernel does differently")
P_TERMS = {"fp8_e4m3": (2.0 ** -4, 2.0 ** -10), "fp8_e5m2": (2.0 ** -3, 2.0 ** -17)}


def _bound(v, vd: np.ndarray, lk: int) -> float:
    """docs/QUANT.md's bound of |O_kernel - O_ref| from P's quantization against the running max."""
    qp = v.quant(QuantOperand.P)
    if qp is None:
        return 0.0
    u, d = P_TERMS[qp.dtype.value]
    return 2.0 * float(np.abs(vd).max()) * (u + d / qp.static * lk)


@pytest.mark.parametrize("name, arch, shape", [
    ("fp8_pv", Arch.SM89, (1, 77, 77)),
    ("fp8_pv128", Arch.SM89, (1, 40, 40)),  # the 128x32 tile, two row tiles a warp
    ("fp8_pv128", Arch.SM90A, (1, 40, 40)),  # the FP8 wgmma engine (plan.quant_fwd.wgmma_q8)
    ("fp8_vdeq", Arch.SM90A, (2, 33, 70)),
    ("fp8_qk", Arch.SM89, (1, 70, 70)),
    ("fp8_pv_e5m2", Arch.SM89, (1, 45, 96)),
    ("sage_tok", Arch.SM80, (1, 77, 77)),  # INT8 Q·Kᵀ, the prep kernels' workspaces
    ("sage_blk", Arch.SM90A, (2, 70, 45)),
    ("preln_int8", Arch.SM89, (2, 50, 70)),
    ("sage_smooth", Arch.SM89, (2, 70, 70)),  # K smoothing: the mean prep kernel, then k's  # the pre-norm fused into q's quantization, residual
])
@pytest.mark.parametrize("outliers", [False, True], ids=["plain", "outliers"])
def test_kernel_matches_quantized_reference(name, arch, shape, outliers, tmp_path):
    from attngen.check.quant import dense_operands
    from attngen.check import reference_eval as E
    from attngen.cuda.render import render_with_plan

    v = VARIANTS[name]
    B, Lq, Lk = shape
    call = quant_accuracy.quantized_call(v, quant_accuracy.inputs(v, B, Lq, Lk, seed=3, outliers=outliers))
    rest = {n: a for n, a in call.items() if n not in ("q", "k", "v")}
    o_ref, lse_ref = reference.attention(v, call["q"], call["k"], call["v"], rest)
    src, kp = render_with_plan(v, arch)
    o, lse = emu.run(src, kp, v, call, workdir=str(tmp_path))
    o_ref = np.asarray(o_ref, np.float64)
    assert np.isfinite(o).all()
    vd = dense_operands(v, call["q"], call["k"], call["v"], E.prepare_tensors(v, rest))[2]
    # fp32 accumulation, P (or unquantized P in the output's type) and the output's rounding:
    # a few units of the output type's roundoff of max|O|, plus P's quantization bound.
    tol = 4 * 2.0 ** -8 * float(np.abs(o_ref).max()) + _bound(v, vd, Lk)
    err = np.abs(o - o_ref).max()
    assert err <= tol, (err, tol)
    if v.quant(QuantOperand.P) is None:  # P in the output's type: the full-precision kernel's roundings only
        assert quant_accuracy.error(o, o_ref).rel_l2 < 5e-3
    if v.lse:
        assert np.allclose(lse, lse_ref, rtol=1e-4, atol=1e-4)


def test_scale_layouts_in_source():
    """Per-head descales are read at (b, kv head) through the scale input's strides; per tensor at [0]."""
    from attngen.cuda.render import render

    src = render(VARIANTS["fp8_pv"], Arch.SM89)
    assert "p.in_q_scale[(long long)b * p.in_q_scale_s0 + (long long)hk * p.in_q_scale_s1]" in src
    assert "m16n8k32.row.col.f32.e4m3.e4m3.f32" in src
    assert "p.in_k_scale[0]" in render(VARIANTS["fp8_vdeq"], Arch.SM89)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on the PATH")
@pytest.mark.parametrize("name, arch", [("fp8_pv128", Arch.SM89), ("fp8_pv", Arch.SM90A), ("fp8_pv128", Arch.SM90A), ("sage_blk", Arch.SM80),
                                        ("preln_int8", Arch.SM89), ("sage_smooth", Arch.SM90A)])
def test_nvcc_compiles_without_spills(name, arch, tmp_path):
    """nvcc (-Xptxas -v) takes the whole source, launcher included, and no kernel of it spills
    (the tiles of plan.quant_fwd.quant_tile; sm_90a's FP8 P·V at D128 runs on the wgmma engine)."""
    from attngen.cuda.render import render

    src = tmp_path / "k.cu"
    src.write_text(render(VARIANTS[name], arch))
    from attngen.cuda.compile import _gencode

    r = subprocess.run(["nvcc", _gencode(arch), "-O3", "-c", "-Xptxas", "-v", str(src), "-o", str(tmp_path / "k.o")],
                       capture_output=True, text=True, check=False, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    spills = re.findall(r"(\d+) bytes spill stores", r.stderr)
    assert spills and all(s == "0" for s in spills), r.stderr[-3000:]
