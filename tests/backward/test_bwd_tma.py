"""The wgmma backward's TMA copies (plan_bwd.WG_LOADS) on the CPU: the plan's choice and the
descriptors it lists, the rendered kernel and launcher, ptxas (no spills), and the host emulation
(tests/backward/_host_emu.py models the copy engine: 128-byte swizzle, zero fill past the rows,
mbarriers that count bytes) against the cp.async kernel and the float64 reference."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "reference"))
import _host_emu  # noqa: E402
import _irb as T  # noqa: E402

from attngen.check import reference, workload  # noqa: E402
from attngen.cuda import compile as compile_cuda, render_bwd  # noqa: E402
from attngen.ir.nodes import AttnKind, DType, Layout, Norm, NormKind, NormScope, NormTarget  # noqa: E402
from attngen.plan import bwd as plan_bwd  # noqa: E402
from attngen.plan.schedule import Arch, WgmmaLoads  # noqa: E402

emu = pytest.mark.skipif(_host_emu.available() is not None, reason=f"no host emulation: {_host_emu.available()}")
nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on the PATH")


@pytest.fixture(autouse=True)
def _restore_loads():
    yield
    plan_bwd.WG_LOADS = WgmmaLoads.TMA


def _force_loads(loads: str | WgmmaLoads) -> None:
    """The wgmma kernel's copies for the plans made after the call (the fixture restores TMA)."""
    plan_bwd.WG_LOADS = WgmmaLoads(loads)


def _norms(*targets):
    kinds = {NormTarget.Q: (NormKind.LAYERNORM, NormScope.HEAD), NormTarget.K: (NormKind.RMSNORM, NormScope.HEAD),
             NormTarget.O: (NormKind.RMSNORM, NormScope.HEAD)}
    return tuple(Norm(t, *kinds[t], 1e-5) for t in targets)


def test_plan_default_maps_and_fallback(monkeypatch):
    v = T.variant(T.causal(), (), D=128, heads=8, kv_heads=2, dtype=DType.BF16)
    bp = plan_bwd.plan(v, Arch.SM90A)
    assert bp.backward.wg_loads == WgmmaLoads.TMA
    maps = plan_bwd.wg_tma_maps(bp, v)
    assert [(m.name, m.tensor, m.rows, m.cols, m.heads, m.length, m.box_cols, m.fp32) for m in maps] == [
        ("tm_q", "q", 64, 128, 8, "Lq", 64, False), ("tm_do", "dO", 64, 128, 8, "Lq", 64, False), ("tm_k", "k", 128, 128, 2, "Lk", 64, False),
        ("tm_v", "v", 128, 128, 2, "Lk", 64, False)]
    assert bp.backward.wg_dq == plan_bwd.WgDq.WG_BULK
    # 24 bytes of mbarriers over the cp.async kernel's shared memory
    _force_loads("cp.async")
    cp = plan_bwd.plan(v, Arch.SM90A)
    assert cp.backward.wg_loads == WgmmaLoads.CP_ASYNC and plan_bwd.wg_tma_maps(cp, v) == () and cp.backward.wg_dq == plan_bwd.WgDq.WG_BULK
    assert bp.kernel("ag_bwd_dkdv").smem.bytes == cp.kernel("ag_bwd_dkdv").smem.bytes + 24 == 148480 + 2 * (64 * 136 * 4 + 16) + 24
    _force_loads("tma")
    # room for three descriptors but not four: cp.async copies
    end = plan_bwd.param_bytes([f.ctype for f in bp.fields])[-1]
    with monkeypatch.context() as m:
        m.setattr(plan_bwd, "MAX_PARAM_BYTES", (end + 63) // 64 * 64 + 3 * 128)
        assert plan_bwd.wg_tma_room(bp.fields, 3) and not plan_bwd.wg_tma_room(bp.fields, 4)
        tight = plan_bwd.plan(v, Arch.SM90A)
        assert tight.backward.wg_loads == WgmmaLoads.CP_ASYNC and tight.backward.wg_dq == plan_bwd.WgDq.WG_BULK
    # Under the norms the copies read the workspaces; the D64 step is 128 queries.
    n = T.variant(T.causal(), (), D=64, heads=4, kv_heads=2, dtype=DType.BF16, norms=_norms(NormTarget.Q, NormTarget.K, NormTarget.O))
    bn = plan_bwd.plan(n, Arch.SM90A)
    assert [(m.tensor, m.rows) for m in plan_bwd.wg_tma_maps(bn, n)] == [("ws_q", 128), ("ws_do", 128), ("ws_k", 128), ("v", 128)]
    # Other engines have none; no parameter room: cp.async, said in the plan.
    assert plan_bwd.plan(v, Arch.SM80).backward.wg_loads is None
    monkeypatch.setattr(plan_bwd, "MAX_PARAM_BYTES", 400)
    assert plan_bwd.plan(v, Arch.SM90A).backward.wg_loads == WgmmaLoads.CP_ASYNC


def test_render_names_the_descriptors_and_cp_async_render_has_none():
    v = T.variant(T.causal(), (), D=64, heads=4, kv_heads=2, dtype=DType.BF16, layout=Layout.BSHD, norms=_norms(NormTarget.O))
    src = render_bwd.render(v, Arch.SM90A)
    assert src == render_bwd.render(v, Arch.SM90A)  # stable
    header = src.split("\n\n")[0]
    assert "TMA descriptors of its copies" in src and "tm_do: ws_do, 64 columns, boxes of 128 rows over Lq" in src, header
    assert src.count("const __grid_constant__") == 4 and "cp.async.bulk.tensor.4d" in src and "tm_dq" not in src
    # the C++ launcher encodes the workspace's descriptor from its [B, H, Lq, Dv] rows
    assert ("_tmap(&maps[1], CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, p.ws_do, 64, p.Lq, 4, p.B, 64, (long long)p.Lq * 64, "
            "(long long)4 * p.Lq * 64, 64, 128)") in src
    _force_loads("cp.async")
    cp = render_bwd.render(v, Arch.SM90A)
    assert "cp.async.bulk.tensor" not in cp and "__grid_constant__" not in cp and "ag_tmap" not in cp


@nvcc
@pytest.mark.nvcc
@pytest.mark.parametrize("d", [64, 128])
def test_nvcc_tma_kernel_and_launcher_without_spills(d):
    # the kernel (no spills, 168 registers at 384 threads) and the host launcher that encodes the
    # descriptors through the runtime's driver entry point
    v = T.variant(T.causal(), (), D=d, heads=4, kv_heads=2, dtype=DType.BF16, name=f"t{d}")
    src = render_bwd.render(v, Arch.SM90A)
    assert "cp.reduce.async.bulk.tensor" not in src
    res = {r.kernel: r for r in compile_cuda.resources(src, Arch.SM90A)}
    r = next(r for name, r in res.items() if name.endswith("_bwd_dkdv"))
    assert r.spill_stores == 0 and r.spill_loads == 0 and r.registers == 168, r
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        cu = Path(tmp, "b.cu")
        cu.write_text(src)
        r = subprocess.run(["nvcc", "-c", "-gencode=arch=compute_90a,code=sm_90a", str(cu), "-o", str(Path(tmp, "b.o"))],
                           capture_output=True, text=True, check=False)
        assert r.returncode == 0, r.stderr[-3000:]


def _emu_grads(v, B, Lq, Lk, seed, loads):
    _force_loads(loads)
    rng = np.random.default_rng(seed)
    arrays = workload.make_inputs(v, B, Lq, Lk, rng)
    rest = {n: a for n, a in arrays.items() if n not in ("q", "k", "v")}
    if v.norm(NormTarget.O) is not None:
        y, _ = reference.attention(v, arrays["q"], arrays["k"], arrays["v"], rest)
        o, lse = _host_emu.pre_norm_forward(v, arrays)
    else:
        y = o = None
        o, lse = reference.attention(v, arrays["q"], arrays["k"], arrays["v"], rest)
        y = o
    dO = np.random.default_rng(seed + 1).normal(size=y.shape).astype(y.dtype)
    src, bp = render_bwd.render_with_plan(v, Arch.SM90A)
    assert bp.backward.wg_loads == loads
    got = _host_emu.run(src, bp, v, arrays, lse, dO, o)
    want = reference.attention_backward(v, arrays["q"], arrays["k"], arrays["v"], rest, dO.astype(np.float64))
    return got, want


@emu
@pytest.mark.parametrize("case", [
    # (D, heads, kv, kind, layout, norms, B, Lq, Lk)
    (64, 4, 2, AttnKind.SELF, Layout.BHSD, (), 1, 150, 150),  # 128-query steps, a partial one, rows past Lq zero-filled
    (128, 2, 1, AttnKind.CROSS, Layout.BSHD, (), 2, 70, 140),  # 64-query steps, a partial key tile (rows past Lk)
    (64, 2, 1, AttnKind.SELF, Layout.BSHD, (NormTarget.Q, NormTarget.K, NormTarget.O), 1, 90, 90),  # ws_q, ws_k, ws_do
], ids=["d64_gqa", "d128_cross_bshd", "d64_norms"])
def test_emulated_tma_equals_cp_async_and_reference(case):
    D, H, HKV, kind, layout, norms, B, Lq, Lk = case
    v = T.variant(T.causal(), (), D=D, heads=H, kv_heads=HKV, dtype=DType.BF16, kind=kind, layout=layout, norms=_norms(*norms))
    tma, want = _emu_grads(v, B, Lq, Lk, 11, WgmmaLoads.TMA)
    cpa, _ = _emu_grads(v, B, Lq, Lk, 11, WgmmaLoads.CP_ASYNC)
    # The same products, and the same dQ values added in the same order in the emulation's serial
    # blocks: every gradient bit-identical.
    for n in ("dq", "dk", "dv"):
        assert np.array_equal(tma[n], cpa[n]), f"{n}: the TMA kernel's differs from the cp.async kernel's"
    for n in ("dq", "dk", "dv"):
        scale = float(np.abs(want[n]).max())
        err = float(np.abs(tma[n] - want[n]).max())
        assert scale > 0 and np.all(np.isfinite(tma[n])) and err <= 3e-2 * scale, f"{n}: max error {err:.3g} vs max |ref| {scale:.3g}"
