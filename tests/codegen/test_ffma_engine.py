"""The fp32 FFMA engine's register tiles: which tiles it takes (and what it says about the rest),
the shared memory and occupancy its plan promises, and that its tiles compile without spills
(marker `nvcc`: skipped where nvcc is absent)."""

from __future__ import annotations

import pytest

from attngen.cuda import compile as compile_cuda, render as render_cuda
from attngen.lang.frontend import loads
from attngen.ir.nodes import DType, TileConfig
from attngen.plan.schedule import Arch, ffma_accumulators, min_blocks_per_sm, smem_bytes, validate_tile

F32 = DType.FP32

# Explicit fp32 tiles beside the auto ones: one warp, 32 and 64 rows (two float4 runs of P·V rows),
# 32-key warp slices, and a value head dim unlike the key's.
TILES = {
    "auto_d64": "dtype fp32; head_dim 64; heads 8; mask padding",
    "auto_d128": "dtype fp32; head_dim 128; heads 4 kv 2; mask causal; output lse",
    "one_warp": "dtype fp32; head_dim 32; heads 2; mask causal; tile block_m 16 block_n 16 warps 1 stages 1",
    "rows32": "dtype fp32; head_dim 64; heads 2; mask window(40, 3); tile block_m 32 block_n 64 warps 4 stages 1",
    "rows64_2warps": "dtype fp32; head_dim 32; heads 2; mask padding; tile block_m 64 block_n 32 warps 2 stages 1",
    "slices32": "dtype fp32; head_dim 128; heads 2; mask causal; tile block_m 16 block_n 128 warps 4 stages 1",
    "dv_differs": "dtype fp32; head_dim 32 value 96; heads 2; kind cross; layout bshd",
    "token_norm": "dtype fp32; head_dim 64; heads 4; layout bshd; norm q layernorm(1e-5) scope token; residual",
}


def _v(name: str):
    return loads(f"attention f_{name} {{ {TILES[name]} }}").variants[0]


def test_warp_slices_must_split_into_key_groups():
    assert validate_tile(F32, 64, 64, TileConfig(16, 128, 8, 1)) == []
    errs = validate_tile(F32, 64, 64, TileConfig(16, 48, 8, 1))
    assert len(errs) == 1 and "block_n / warps keys" in errs[0] and "gives 6" in errs[0]


def test_register_tiles_are_bounded():
    assert ffma_accumulators(64, 64, TileConfig(16, 128, 8, 1)) == 32 + 8
    assert validate_tile(F32, 128, 128, TileConfig(16, 64, 4, 1)) == []  # 64 output accumulators
    errs = validate_tile(F32, 128, 128, TileConfig(32, 64, 4, 1))
    assert len(errs) == 1 and "output accumulators" in errs[0] and "gives 128 and 16" in errs[0]
    errs = validate_tile(F32, 32, 32, TileConfig(64, 128, 2, 1))
    assert len(errs) == 1 and "gives 64 and 128" in errs[0]


def test_shared_memory_holds_the_tiles_and_the_combine():
    # statistics [2][8][16], then Q 16x68, K and V 128x68, P 128x24 and alphas [8][16] floats,
    # which the [8][16][68] weighted partial O later reuses.
    t = TileConfig(16, 128, 8, 1)
    tiles = 16 * 68 + 2 * 128 * 68 + 128 * 24 + 8 * 16
    assert smem_bytes(F32, 64, 64, t, Arch.SM90A) == 4 * (2 * 8 * 16 + max(tiles, 8 * 16 * 68))
    # Few keys a warp, a wide value: the combine buffer is the larger part.
    t = TileConfig(16, 32, 8, 1)
    tiles = 16 * 36 + 32 * 36 + 32 * 132 + 32 * 24 + 8 * 16
    assert tiles < 8 * 16 * 132
    assert smem_bytes(F32, 32, 128, t, Arch.SM90A) == 4 * (2 * 8 * 16 + 8 * 16 * 132)


def test_occupancy_hint_follows_the_register_tiles():
    # The seed tile fits 128 registers (two 256-thread blocks an SM); the D128 auto tile's 64
    # output accumulators get more, which shared memory (two blocks) allows anyway.
    assert min_blocks_per_sm(F32, 64, 64, TileConfig(16, 128, 8, 1), Arch.SM90A) == 2
    assert min_blocks_per_sm(F32, 128, 128, TileConfig(16, 64, 4, 1), Arch.SM90A) == 2
    assert min_blocks_per_sm(F32, 128, 128, TileConfig(16, 64, 4, 1), Arch.SM86) == 1


@pytest.mark.nvcc
@pytest.mark.parametrize("arch", [Arch.SM80, Arch.SM90A], ids=lambda a: a.value)
@pytest.mark.parametrize("name", sorted(TILES))
def test_tiles_compile_without_spills(name: str, arch: Arch):
    v = _v(name)
    src, kp = render_cuda.render_with_plan(v, arch)
    r = next(x for x in compile_cuda.resources(src, arch) if x.kernel == kp.kernel_name)
    assert r.spill_stores == r.spill_loads == r.stack_bytes == 0, r
    blocks = min_blocks_per_sm(v.dtype, v.head_dim, v.value_head_dim, kp.tile, arch)
    assert r.registers <= 65536 // (kp.threads * blocks), r
