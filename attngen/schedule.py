"""Tile choices (the schedule), kept apart from semantics.

A `TileConfig` never changes what a variant computes, only how the CUDA kernel is blocked. This
module knows the backend's limits (which tiles the kernel template supports, how much shared
memory a tile needs, each architecture's budget) so that `lower` can reject a bad tile with a
located error and `tile auto` can pick a good one.
"""

from __future__ import annotations

import enum

from attngen.ir import DType, TileConfig


class Arch(enum.Enum):
    SM80 = "sm_80"
    SM86 = "sm_86"
    SM89 = "sm_89"
    SM90A = "sm_90a"

    @property
    def smem_budget(self) -> int:
        """Largest dynamic shared memory one block may opt into (bytes)."""
        return {"sm_80": 166912, "sm_86": 101376, "sm_89": 101376, "sm_90a": 232448}[self.value]

    @property
    def cc(self) -> int:
        return {"sm_80": 80, "sm_86": 86, "sm_89": 89, "sm_90a": 90}[self.value]


DEFAULT_ARCH = Arch.SM90A

# Head dims the CUDA backend implements (multiples of 16 that keep the register budget).
SUPPORTED_HEAD_DIMS = (32, 64, 96, 128)
SUPPORTED_WARPS = (1, 2, 4, 8)
MAX_STAGES = 4


def smem_bytes(dtype: DType, head_dim: int, value_head_dim: int, tile: TileConfig) -> int:
    """Shared memory the kernel template allocates: the Q tile plus a ring of K/V tiles.

    fp32 variants run on the FFMA path, which stages fp32 tiles (4 bytes an element)."""
    es = dtype.itemsize
    q_tile = tile.block_m * head_dim * es
    kv_ring = tile.stages * tile.block_n * (head_dim + value_head_dim) * es
    return q_tile + kv_ring


def validate_tile(
    dtype: DType, head_dim: int, value_head_dim: int, tile: TileConfig, arch: Arch = DEFAULT_ARCH
) -> list[str]:
    """Every reason this tile cannot be used; empty when it is fine."""
    errs: list[str] = []
    if tile.block_m <= 0 or tile.block_m % 16:
        errs.append(f"block_m must be a positive multiple of 16, got {tile.block_m}")
    if tile.block_n <= 0 or tile.block_n % 16:
        errs.append(f"block_n must be a positive multiple of 16, got {tile.block_n}")
    if tile.block_m > 256 or tile.block_n > 256:
        errs.append(f"block_m and block_n are at most 256, got {tile.block_m} and {tile.block_n}")
    if tile.warps not in SUPPORTED_WARPS:
        errs.append(f"warps must be one of {', '.join(map(str, SUPPORTED_WARPS))}, got {tile.warps}")
    elif tile.block_m % 16 == 0 and tile.block_m > 0:
        per_warp = tile.block_m // tile.warps
        if tile.block_m % tile.warps or per_warp % 16 or per_warp > 64:
            errs.append(
                f"each warp owns block_m / warps query rows, which must be 16, 32, 48 or 64; "
                f"block_m {tile.block_m} with {tile.warps} warps gives {tile.block_m / tile.warps:g}"
            )
    if not 1 <= tile.stages <= MAX_STAGES:
        errs.append(f"stages must be between 1 and {MAX_STAGES}, got {tile.stages}")
    if not errs:
        need = smem_bytes(dtype, head_dim, value_head_dim, tile)
        if need > arch.smem_budget:
            errs.append(
                f"this tile needs {need} bytes of shared memory ({need / 1024:.0f} KiB), over the "
                f"{arch.smem_budget // 1024} KiB a block may use on {arch.value}"
            )
    return errs


def auto_tile(dtype: DType, head_dim: int, value_head_dim: int, arch: Arch = DEFAULT_ARCH) -> TileConfig:
    """The tile `tile auto` resolves to: tuned on the H200 for bf16/fp16; fp32 uses small tiles."""
    if dtype == DType.FP32:
        return TileConfig(block_m=64, block_n=32, warps=4, stages=1)
    d = max(head_dim, value_head_dim)
    if d <= 64:
        t = TileConfig(block_m=128, block_n=128, warps=4, stages=2)
    else:
        t = TileConfig(block_m=128, block_n=64, warps=4, stages=2)
    while validate_tile(dtype, head_dim, value_head_dim, t, arch) and t.block_n > 16:
        t = TileConfig(t.block_m, t.block_n // 2, t.warps, t.stages)
    return t
