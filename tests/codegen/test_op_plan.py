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
