"""`layout varlen` in the forward kernels: the tile-slot schedule covers every real tile exactly
once, renders are stable and carry the cu_seqlens ABI, the three engines compile without spills,
and the decode and backward families refuse it."""

from __future__ import annotations

import random
import re

import pytest

from attngen.cuda import compile as compile_cuda, render as render_cuda
from attngen.cuda.render import GridRule
from attngen.lang.frontend import loads
from attngen.plan import bwd as plan_bwd, decode as plan_decode
from attngen.plan.schedule import Arch, Engine

SPEC = """
attention vx {
  dtype fp16; head_dim 64; heads 8 kv 2; layout varlen; kind cross
  input lens: i32[B]
  mask causal && window(64, 0) && kv < lens[b]
  score softcap(30.0)
  residual
  output lse
}
attention vf {
  dtype fp32; head_dim 64; heads 4; layout varlen; kind cross
  mask causal
  output lse
}
attention vs {
  dtype bf16; head_dim 128; heads 16; layout varlen
  mask causal
  output lse
}
"""
PROGRAM = loads(SPEC)


def _slots(lens: list[int], block_m: int) -> list[tuple[int, int] | None]:
    """What every CTA of the grid does, as the kernel computes it (ag_varlen_view): the last
    sequence b with cu[b] // block_m + b <= slot (binary search), then its tile slot - that; None
    for an empty slot."""
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    B, total = len(lens), cu[-1]
    out: list[tuple[int, int] | None] = []
    for slot in range(total // block_m + B):
        lo, hi = 0, B - 1
        while lo < hi:
            mid = (lo + hi + 1) >> 1
            if cu[mid] // block_m + mid <= slot:
                lo = mid
            else:
                hi = mid - 1
        m = slot - (cu[lo] // block_m + lo)
        out.append((lo, m) if m * block_m < lens[lo] else None)
    return out


@pytest.mark.parametrize("seed", range(40))
def test_tile_slots_cover_every_tile_once(seed: int) -> None:
    rnd = random.Random(seed)
    block_m = rnd.choice([16, 64, 128, 192])
    lens = [rnd.choice([0, 1, block_m - 1, block_m, block_m + 1, rnd.randint(0, 5 * block_m)]) for _ in range(rnd.randint(1, 12))]
    if sum(lens) == 0:
        lens[0] = 1
    got = _slots(lens, block_m)
    real = [(b, m) for b, n in enumerate(lens) for m in range(-(-n // block_m))]
    done = [x for x in got if x is not None]
    assert sorted(done) == real  # each real tile exactly once, nothing else
    assert len(got) - len(done) <= len(lens)  # at most one empty slot a sequence


def test_render_is_stable_and_carries_the_varlen_abi() -> None:
    v = PROGRAM.get("vx")
    for arch in (Arch.SM80, Arch.SM90A):
        src, kp = render_cuda.render_with_plan(v, arch)
        assert src == render_cuda.render(v, arch)
        names = [f.name for f in kp.fields]
        assert {"lse_sh", "in_cu_seqlens_q", "in_cu_seqlens_q_s0", "in_cu_seqlens_k", "in_cu_seqlens_k_s0", "in_lens"} <= set(names)
        assert "Varlen (packed) batch: B sequences; sequence b owns q/o rows cu_seqlens_q[b]" in src
        assert "p.lse[(long long)h * p.lse_sh + " in src
        assert kp.attention.varlen
    _, kp = render_cuda.render_with_plan(v, Arch.SM80)
    assert kp.engine == Engine.MMA_SYNC and kp.attention.grid_rule == GridRule.TILES
    bm = kp.tile.block_m
    assert kp.attention.launch_grid(8, 3, 1000, 700, 132) == (1000 // bm + 3, 8, 1)
    assert re.search(r"dim3 grid\(p\.Lq / \w+::BLOCK_M \+ p\.B, \w+::H, 1\);", render_cuda.render(v, Arch.SM80))
    _, kp90 = render_cuda.render_with_plan(PROGRAM.get("vs"), Arch.SM90A)
    assert kp90.engine == Engine.WGMMA and kp90.attention.grid_rule == GridRule.PERSISTENT
    assert kp90.attention.launch_grid(16, 5, 32768, 32768, 132) == (132, 1, 1)
    assert kp90.attention.launch_grid(16, 5, 300, 300, 10 ** 9) == ((300 // 128 + 5) * 16, 1, 1)
    assert kp90.attention.regs == (88, 208)  # the varlen producer's share (schedule.wgmma_regs)
    self_fields = [f.name for f in kp90.fields]
    assert "in_cu_seqlens" in self_fields and "in_cu_seqlens_q" not in self_fields  # kind self: one array


def test_decode_refuses_varlen_and_the_backward_runs_tile_slots() -> None:
    v = PROGRAM.get("vs")
    assert "layout varlen" in (plan_decode.decode_unsupported(v) or "")
    assert not plan_bwd.unsupported(v)
    bp = plan_bwd.plan(v, Arch.SM90A)
    assert bp.backward.varlen and all(f in {x.name for x in bp.fields} for f in ("total_q", "total_k", "in_cu_seqlens"))
    # Key tile slots along x (total_k / tile + B), one sequence's tile each; the per-row kernels
    # run the packed rows as one sequence.
    bn = bp.backward.tc_block_n or bp.backward.block_n
    assert bp.launch_grid(bp.kernel("ag_bwd_dkdv"), 3, 500, 500) == (500 // bn + 3, v.kv_heads, 1)
    assert bp.launch_grid(bp.kernel("ag_bwd_pre"), 3, 500, 500)[0] == v.heads * 500 // 8 + 1


@pytest.mark.nvcc
@pytest.mark.parametrize("name,arch", [("vx", Arch.SM80), ("vx", Arch.SM90A), ("vf", Arch.SM80), ("vs", Arch.SM90A)],
                         ids=["vx-sm_80", "vx-sm_90a", "vf-sm_80", "vs-sm_90a"])
def test_varlen_compiles_without_spills(name: str, arch: Arch) -> None:
    v = PROGRAM.get(name)
    src, kp = render_cuda.render_with_plan(v, arch)
    (r,) = [x for x in compile_cuda.resources(src, arch) if x.kernel == kp.kernel_name]
    assert r.spill_stores == r.spill_loads == r.stack_bytes == 0, r
