"""The frozen OpPlan: computed once per (variant, arch), ordered kernels, one grid formula."""

from __future__ import annotations

import dataclasses

import pytest

from attngen.cuda import render as render_cuda
from attngen.lang.frontend import loads
from attngen.cuda.render import GridRule, KernelRole, OpPlan, plan
from attngen.plan.schedule import Arch


def _v(body: str):
    return loads(f"attention t {{ {body} }}").variants[0]


def test_plan_is_frozen_and_cached():
    v = _v("dtype fp32; head_dim 64; heads 8; mask padding")
    kp = plan(v, Arch.SM90A)
    assert isinstance(kp, OpPlan) and plan(v, Arch.SM90A) is kp
    with pytest.raises(dataclasses.FrozenInstanceError):
        kp.fields = ()  # type: ignore[misc]
    assert kp.problem.dtype.value == "fp32" and kp.problem.heads == 8 and kp.problem.arch == Arch.SM90A
    assert [k.role for k in kp.kernels] == [KernelRole.ATTENTION]


def test_kernels_in_launch_order_with_workspaces():
    v = _v("dtype bf16; head_dim 64; heads 4; norm q rmsnorm(1e-6); norm k rmsnorm(1e-6)")
    kp = plan(v, Arch.SM80)
    assert [k.role for k in kp.kernels] == [KernelRole.PREP, KernelRole.PREP, KernelRole.ATTENTION]
    assert [k.prep for k in kp.prep_kernels] == list(kp.workspaces)
    names = [f.name for f in kp.fields]
    assert all(w.field.name in names for w in kp.workspaces)


@pytest.mark.parametrize("arch, rule", [(Arch.SM80, GridRule.TILES), (Arch.SM90A, GridRule.PERSISTENT)])
def test_one_grid_formula(arch, rule):
    v = _v("dtype bf16; head_dim 128; heads 16; mask causal")
    att = plan(v, arch).attention
    assert att.grid_rule == rule
    bm = att.tile.block_m
    g = att.launch_grid(16, 3, 5 * bm + 1, 5 * bm + 1, sm_count=132)
    if rule == GridRule.TILES:
        assert g == (6, 16, 3)
        assert "p.B" in att.grid_cpp("ns") and "ns::H" in att.grid_cpp("ns")
    else:
        assert g == (min(6 * 16 * 3, 132), 1, 1)
        assert att.launch_grid(1, 1, 1, 1, sm_count=132) == (1, 1, 1)
    # The header's words and the launcher's C++ come from the same kernel entry.
    assert f"ceil(Lq / {bm})" in render_cuda.grid_text(plan(v, arch), 16)
    assert att.grid_cpp(f"{att.name}_impl") in render_cuda.render(v, arch)


def test_sorted_inputs_on_the_problem():
    v = _v("dtype bf16; head_dim 64; heads 4; input doc: i32[B, Lk] sorted; input w: fp32[H]; mask document(doc)")
    kp = plan(v, Arch.SM80)
    assert [d.name for d in kp.problem.sorted_inputs] == ["doc"]


def test_grids_past_the_launch_limits_are_refused_before_launch():
    """B > 65535 on a one-CTA-a-tile engine was left to the driver's launch failure."""
    v = _v("dtype bf16; head_dim 64; heads 8; mask causal")
    tiles = plan(v, Arch.SM80).attention
    assert tiles.grid_rule == GridRule.TILES
    assert tiles.launch_grid(8, 65535, 1, 1, 132)[2] == 65535
    with pytest.raises(ValueError, match=r"B=65536: at most 65535 sequences a launch"):
        tiles.launch_grid(8, 65536, 1, 1, 132)
    persistent = plan(v, Arch.SM90A).attention
    assert persistent.grid_rule == GridRule.PERSISTENT
    assert persistent.launch_grid(8, 100_000, 128, 128, 132) == (132, 1, 1)
    with pytest.raises(ValueError, match="work tiles .* more than the 2147483647"):
        persistent.launch_grid(8, 2**28, 1024, 1024, 132)


@pytest.mark.parametrize("body", [
    "dtype bf16; head_dim 128; heads 8 kv 2; layout bshd; mask causal; output lse",
    "dtype bf16; head_dim 64; heads 8; mask causal",
    "dtype fp16; head_dim 128; heads 4",
])
def test_short_kernel_is_the_plans_and_renders_as_the_tile_hint_did(body: str) -> None:
    # The short-loop kernel is planned once, beside the main one: the same op and ABI at the short
    # tile. Rendered from that plan it is the code the runtime used to compile from the variant with
    # a forged tile hint, but for the header's copy of the spec, which printed the hint.
    from attngen.ir.nodes import TileHint
    from attngen.plan.schedule import short_tile

    v = _v(body)
    kp = plan(v, Arch.SM90A)
    st = short_tile(v, Arch.SM90A)
    assert st is not None and kp.short is not None and kp.short_max_lk == st.max_lk
    assert kp.short.tile == st.tile != kp.tile and kp.short.fields == kp.fields and kp.short.short is None
    t = st.tile
    hinted = render_cuda.render(dataclasses.replace(v, tile=TileHint(t.block_m, t.block_n, t.warps, t.stages)), Arch.SM90A)
    hint_line = f"//     tile block_m {t.block_m} block_n {t.block_n} warps {t.warps} stages {t.stages}"
    assert [ln for ln in hinted.splitlines() if ln != hint_line] == render_cuda.render_plan(v, kp.short).splitlines()
    assert plan(v, Arch.SM80).short is None  # a wgmma choice


def _eval_grid(code: str, B: int, Lq: int, Lk: int) -> tuple[int, ...]:
    """A launcher's grid (C++ over Params `p`) evaluated in Python."""
    import re

    e = code.replace("(long long)", "").replace("1LL", "1").replace("p.", "").replace("/", "//")
    sizes = dict(B=B, Lq=Lq, Lk=Lk)
    capped = re.fullmatch(r"\(unsigned\)\((.*) < (\d+) \? .* : \d+\)", e)
    if capped:
        return (min(eval(capped[1], {}, sizes), int(capped[2])), 1, 1)
    return tuple(eval(e, {}, sizes))


@pytest.mark.parametrize("body", [
    "dtype bf16; head_dim 64; heads 4 kv 2; mask causal; norm q rmsnorm(1e-6); norm k rmsnorm(1e-6)",
    "dtype fp32; head_dim 32; heads 4 kv 2; layout varlen; mask causal",
    "dtype bf16; head_dim 64; heads 4; layout bshd; mask causal; norm q rmsnorm(1e-6) scope token; residual",
])
def test_backward_is_an_op_plan_whose_grids_are_written_once(body: str) -> None:
    # The backward's kernels in launch order, each engine and the deterministic mode; the launcher's
    # grids (its C++) and the runtime's (Python) come from the same OpKernel rule and agree.
    from attngen.cuda import render_bwd
    from attngen.plan.op_plan import OpFamily

    v = _v(body)
    for arch in (Arch.SM80, Arch.SM90A):
        for det in (False, True):
            src, op = render_bwd.render_with_plan(v, arch, deterministic=det, prefix="pfx")
            assert op.family == OpFamily.BACKWARD and op.backward is not None and op.main.role == KernelRole.BWD_DKDV
            roles = [k.role for k in op.kernels]
            assert roles[0] == KernelRole.BWD_PRE and roles[-1] == KernelRole.BWD_FINISH
            assert (KernelRole.BWD_DQ in roles) == det and op.backward.deterministic == det
            assert all(k.name.startswith("pfx_t_bwd_") for k in op.kernels) and op.launcher == "pfx_t_bwd_launch"
            for k in op.kernels:
                assert op.grid_code(k) in src
                for B, Lq, Lk in ((1, 1, 1), (3, 100, 70), (2, 4097, 300)):
                    assert op.launch_grid(k, B, Lq, Lk) == _eval_grid(op.grid_code(k), B, Lq, Lk), (k.name, B, Lq, Lk)


def test_decode_is_an_op_plan_with_its_split_schedule() -> None:
    from attngen.plan import decode as plan_decode
    from attngen.plan.op_plan import OpFamily

    v = _v("dtype bf16; head_dim 128; heads 32 kv 8; kind cross; mask causal")
    op = plan_decode.plan(v, Arch.SM90A)
    assert op.family == OpFamily.DECODE and [k.role for k in op.kernels] == [KernelRole.SPLIT, KernelRole.COMBINE]
    assert op.split is not None and op.kernel_name == op.kernels[0].name and op.smem_bytes == op.split.smem_bytes
    splits, ctas = op.split.schedule(8, 1, 32768, 132)
    split, combine = op.launches(8, 1, splits, ctas)
    assert split.grid == (ctas, 1, 1) and combine.grid == (-(-8 * 32 // 8), 1, 1)
    assert op.launches(8, 1, splits, ctas, merged=True) == (split,)
