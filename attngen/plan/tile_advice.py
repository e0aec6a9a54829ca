"""Advice on an explicit `tile`: one that moves a variant off the engine `tile auto` picks for the
target (stage: plan; a warning, never an error: the tile is valid and may be chosen on purpose).

A tile picks the engine (`schedule.engine`): on sm_90a a fp16/bf16 tile of 4 warps runs on
mma.sync where `tile auto` would run wgmma, a large silent slowdown. `attngen check` prints the
warning at the tile statement; `attngen explain` says why under its tile plan.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from attngen.ir.nodes import TileConfig, Variant
from attngen.lang.diagnostics import Diagnostic
from attngen.plan.schedule import DEFAULT_ARCH, Arch, Engine, engine, variant_tile

__all__ = ["EngineMove", "engine_move", "tile_statement", "tile_warning"]


@dataclass(frozen=True, slots=True)
class EngineMove:
    """An explicit tile's engine against the one `tile auto` picks on the same target."""

    tile: TileConfig
    engine: Engine
    auto_tile: TileConfig
    auto_engine: Engine
    why: str  # what the auto engine needs that the explicit tile does not give (or why auto avoids it)


def tile_statement(t: TileConfig) -> str:
    """`t` as the canonical `tile` statement."""
    return f"tile block_m {t.block_m} block_n {t.block_n} warps {t.warps} stages {t.stages}"


def _why(v: Variant, t: TileConfig, auto_engine: Engine) -> str:
    if auto_engine is Engine.WGMMA:
        if t.stages < 2:
            return "wgmma needs at least 2 stages (its consumers hold two ring slots at once)"
        shapes = "block_m 128 with warps 8"
        if v.head_dim == v.value_head_dim == 64:
            shapes += " (or block_m 192 with warps 12)"
        return f"wgmma runs {shapes}; this tile has block_m {t.block_m} with warps {t.warps}"
    # (auto keeps some variants off wgmma on purpose: schedule.variant_tile says why for each)
    return f"`tile auto` picks {auto_engine.value} for this variant on this target"


def engine_move(v: Variant, arch: Arch = DEFAULT_ARCH) -> EngineMove | None:
    """How `v`'s explicit tile changes its engine on `arch`; None for `tile auto`, for a tile on
    the auto engine, and for a `kv_cache paged` variant (the decode family has its own tiles)."""
    if v.tile is None or v.page_size is not None:
        return None
    t = variant_tile(v, arch)
    auto_t = variant_tile(dataclasses.replace(v, tile=None), arch)
    e = engine(v.dtype, v.head_dim, v.value_head_dim, t, arch)
    auto_e = engine(v.dtype, v.head_dim, v.value_head_dim, auto_t, arch)
    if e == auto_e:
        return None
    return EngineMove(t, e, auto_t, auto_e, _why(v, t, auto_e))


def tile_warning(v: Variant, arch: Arch = DEFAULT_ARCH) -> Diagnostic | None:
    """A warning at the tile statement when it moves `v` off the engine `tile auto` picks."""
    m = engine_move(v, arch)
    if m is None:
        return None
    return Diagnostic(
        f"this tile moves `{v.name}` from {m.auto_engine.value} to {m.engine.value} on {arch.value}: {m.why}",
        v.tile.span if v.tile is not None else None,
        f"`tile auto` picks `{tile_statement(m.auto_tile)}` ({m.auto_engine.value}) here; write `tile auto` "
        f"(or that tile), or keep this one if {m.engine.value} is what you want",
        severity="warning",
    )
