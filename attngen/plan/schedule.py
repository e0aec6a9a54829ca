"""Tile choices (the schedule), kept apart from semantics.

A `TileConfig` never changes what a variant computes, only how the CUDA kernel is blocked. This
module knows the backend's limits (which tiles the kernel template supports, how much shared
memory a tile needs, each architecture's budget) so that `lower` can reject a bad tile with a
located error and `tile auto` can pick a good one.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from attngen.ir.nodes import TRUE, Builtin, BuiltinName, DType, Layout, NormScope, NormTarget, TileConfig, Variant, walk


class Arch(enum.Enum):
    """A compilation target. Each gets its own cubin: since Blackwell a cubin runs only on its own
    major version (and sm_90a code only on 9.0), so 10.x and 12.x devices get sm_100 / sm_120
    builds of the same mma.sync and FFMA code. sm_90 is Hopper without its arch-specific
    instructions (the mma.sync path; sm_90a adds the wgmma engine). sm_75 (Turing) has neither
    cp.async (tiles are loaded synchronously) nor bf16 nor the m16n8k16 MMA (fp16 uses two
    m16n8k8 MMAs instead)."""

    SM75 = "sm_75"
    SM80 = "sm_80"
    SM86 = "sm_86"
    SM89 = "sm_89"
    SM90 = "sm_90"
    SM90A = "sm_90a"
    SM100 = "sm_100"
    SM120 = "sm_120"

    @property
    def smem_budget(self) -> int:
        """Largest dynamic shared memory one block may opt into (bytes)."""
        return _ARCH_SMEM[self][0]

    @property
    def smem_per_sm(self) -> int:
        """Shared memory of one SM (bytes); each resident block also takes 1 KiB of it."""
        return _ARCH_SMEM[self][1]

    @property
    def cc(self) -> int:
        """The compute capability as major * 10 + minor (sm_100: 100)."""
        return int(self.value.removeprefix("sm_").rstrip("a"))

    @property
    def cp_async(self) -> bool:
        """Whether cp.async (global -> shared copies without registers) exists: sm_80 and up."""
        return self.cc >= 80

    @property
    def bf16(self) -> bool:
        """Whether bf16 tensor-core MMAs exist: sm_80 and up."""
        return self.cc >= 80

    @property
    def mma_k16(self) -> bool:
        """Whether the m16n8k16 fp16 mma.sync exists (sm_80 and up; sm_75 has m16n8k8)."""
        return self.cc >= 80


# (per-block opt-in budget, per-SM shared memory), bytes, from the CUDA programming guide's
# table of compute capabilities.
_ARCH_SMEM = {
    Arch.SM75: (65536, 65536),
    Arch.SM80: (166912, 167936),
    Arch.SM86: (101376, 102400),
    Arch.SM89: (101376, 102400),
    Arch.SM90: (232448, 233472),
    Arch.SM90A: (232448, 233472),
    Arch.SM100: (232448, 233472),
    Arch.SM120: (101376, 102400),
}

DEFAULT_ARCH = Arch.SM90A


def arch_for_cc(cc: int) -> Arch:
    """The target whose cubin a device of compute capability `cc` (major * 10 + minor) runs.

    A cubin runs only on its own major version, at its minor or later (and sm_90a code only on
    9.0, where it is the choice): 8.7 takes sm_86, 10.3 sm_100, 12.1 sm_120. A device with no
    target of its major (before 7.5, or 11.x) is refused with ValueError rather than handed a
    cubin it cannot load."""
    if cc == 90:
        return Arch.SM90A
    same = [a for a in Arch if a != Arch.SM90A and a.cc // 10 == cc // 10 and a.cc <= cc]
    if same:
        return max(same, key=lambda a: a.cc)
    targets = ", ".join(a.value for a in Arch)
    if cc < 75:
        raise ValueError(f"attngen kernels need compute capability 7.5 or newer (ldmatrix and mma.sync); "
                         f"this device is {cc // 10}.{cc % 10}")
    raise ValueError(f"attngen has no target for compute capability {cc // 10}.{cc % 10} (a cubin runs only on "
                     f"its own major version; targets: {targets})")


class Engine(enum.Enum):
    """How the kernel computes (a consequence of dtype, head dims, tile and arch; see `engine`)."""

    FFMA = "ffma"  # fp32: CUDA-core FMAs, exact
    MMA_SYNC = "mma.sync"  # fp16/bf16: warp-level m16n8k16 tensor-core MMAs (sm_80 and up)
    WGMMA = "wgmma"  # fp16/bf16 on sm_90a: warpgroup MMAs fed by a producer warpgroup

    def describe(self, tile: TileConfig, tma: bool = False) -> str:
        """One phrase for headers and `explain` (`tma`: the wgmma producer copies by TMA)."""
        if self == Engine.WGMMA:
            return (f"Hopper wgmma tensor cores, one producer {'warp (TMA' if tma else 'warpgroup (cp.async'} + mbarriers) and "
                    f"{tile.warps // 4} consumer warpgroups")
        return {"ffma": "fp32 FFMA", "mma.sync": "mma.sync tensor cores"}[self.value]

# Head dims the CUDA backend implements in any pairing of D and Dv (multiples of 16 that keep the
# register budget of every engine).
SUPPORTED_HEAD_DIMS = (32, 64, 96, 128)
# Wide head dims, as (D, Dv) pairs, on the tensor-core engines only (fp16/bf16): 256 (Gemma 2/3) and
# 192 with value 128 (DeepSeek MLA prefill). Their output accumulators (Dv / 2 fp32 a thread, both of
# a 64-row wgmma warpgroup and of a 16-row mma.sync warp) take up to 128 registers a thread, so
# each engine gets tiles of its own for them (`auto_tile`); the FFMA engine, whose warps each hold a
# whole block_m x Dv partial O, has no such room (FFMA_MAX_O_REGS).
WIDE_HEAD_DIMS = ((256, 256), (192, 128))


def head_dims_supported(head_dim: int, value_head_dim: int) -> bool:
    """Whether the backend implements this (D, Dv) pair on some engine."""
    if head_dim in SUPPORTED_HEAD_DIMS and value_head_dim in SUPPORTED_HEAD_DIMS:
        return True
    return (head_dim, value_head_dim) in WIDE_HEAD_DIMS


def wide_head_dims(head_dim: int, value_head_dim: int) -> bool:
    """Whether (D, Dv) is one of the WIDE_HEAD_DIMS pairs (tensor-core engines only)."""
    return (head_dim, value_head_dim) in WIDE_HEAD_DIMS


def describe_head_dims() -> str:
    """The implemented head dims in words, for diagnostics."""
    wide = ", ".join(f"{d}" if d == dv else f"{d} with value {dv}" for d, dv in WIDE_HEAD_DIMS)
    return f"{', '.join(map(str, SUPPORTED_HEAD_DIMS))} (any pairing), and for fp16/bf16 also {wide}"


def head_dims_problem(dtype: DType, head_dim: int, value_head_dim: int) -> str | None:
    """Why the kernels cannot take these head dims (None when they can). Lowering checks this for
    specs read with a target; the plan checks it again for variants built without one, which
    would otherwise render a kernel whose tiles do not cover the rows."""
    if head_dim in SUPPORTED_HEAD_DIMS and value_head_dim in SUPPORTED_HEAD_DIMS:
        return None
    if (head_dim, value_head_dim) in WIDE_HEAD_DIMS and dtype in (DType.FP16, DType.BF16):
        return None
    what = f"head_dim {head_dim}" + (f" with value {value_head_dim}" if value_head_dim != head_dim else "")
    return f"{what} ({dtype.value}) is not supported: the CUDA backend implements {describe_head_dims()}"


SUPPORTED_WARPS = (1, 2, 4, 8)
# FFMA register tiles: a thread's output accumulators and scores per tile, at most.
FFMA_MAX_O_REGS = 64
FFMA_MAX_S_REGS = 32
MAX_STAGES = 4


def uses_tensor_cores(dtype: DType) -> bool:
    """fp16/bf16 run on mma.sync tensor cores; fp32 runs on the exact FFMA path."""
    return dtype in (DType.FP16, DType.BF16)


# The wgmma engine: head dims made of whole 128-byte swizzle rows, and 64 query rows per consumer
# warpgroup: 128 x N tiles of 8 warps, or for head dims of 64 also 192 x N tiles of 12. The producer
# warpgroup comes on top of `warps` (docs/DECISIONS.md#wgmma-tiles).
WGMMA_HEAD_DIMS = (64, 128)
WGMMA_PRODUCER_WARPS = 4


def wgmma_head_dims(head_dim: int, value_head_dim: int) -> bool:
    """Whether the wgmma engine implements (D, Dv): 64/128 in any pairing, or a wide pair (whose
    128 x N tiles of two consumer warpgroups it also runs; D = 192 is three swizzle rows)."""
    return (head_dim in WGMMA_HEAD_DIMS and value_head_dim in WGMMA_HEAD_DIMS) or wide_head_dims(head_dim, value_head_dim)


def wgmma_regs(tile: TileConfig, mask_lookups: bool = False, score_mods: bool = False, varlen: bool = False) -> tuple[int, int]:
    """setmaxnreg split of the registers of one CTA an SM (launched with 168 a thread: 64512)
    between producer and consumer threads. The producer classifies every key tile (interval
    arithmetic of the mask, and the tensor reads of a data mask) besides copying; the consumers'
    need grows with score mods. ptxas (sm_90a, every example) spills nowhere with 128 x 40 +
    256 x 232 for index-only masks; masks that read tensors need 64 producer registers (packed
    documents spill 92 bytes at 40, the prefix-LM mask 8 at 56), so 128 x 64 + 256 x 216, or
    128 x 56 + 256 x 224 with score mods (the T5 bias spills 16 bytes at 216). Three consumer
    warpgroups: 128 x 32 + 384 x 160. `layout varlen`: the producer reads each work tile's sequence
    through a per-sequence copy of the Params (render: ag_varlen_view), whose fields ptxas keeps in
    registers instead of reading kernel parameters at each use: it spills 12 bytes at 40 to 72
    producer registers (causal, D 128; even with the copy's fields unchanged), none at 128 x 80 +
    256 x 208. Since the producer keeps a walk state over windows of 32 key tiles (ag_tile_walk),
    varlen takes 128 x 88 + 256 x 208 (the whole register file; 12 bytes of spills at 80), and
    index-only masks with score mods 128 x 48 + 256 x 224 (gemma2_local, a window and softcap,
    spills 4 bytes at 40 / 232 and 8 at 56 / 224, none at 48 / 224)."""
    if tile.warps != 8:
        return (32, 160)
    if varlen:
        return (88, 208)
    if mask_lookups:
        return (56, 224) if score_mods else (64, 216)
    if score_mods:
        return (48, 224)
    return (40, 232)


class WgmmaLoads(enum.Enum):
    """How the wgmma producer copies Q, K and V tiles into shared memory."""

    # 16-byte cp.async from all 128 producer threads, arriving on the slot's mbarrier: where TMA
    # does not apply (`wgmma_tma_ok`)
    CP_ASYNC = "cp.async"
    # the Tensor Memory Accelerator (cp.async.bulk.tensor), the default where it applies: one
    # thread of one producer warp issues a tile's boxes of 64 columns, swizzled as wgmma reads
    # them, and the bytes complete on the slot's mbarrier; the host encodes a descriptor of q, k
    # and v per call (docs/DECISIONS.md#wgmma-tma-loads).
    TMA = "tma"


@dataclass(frozen=True, slots=True)
class WgmmaSoftmax:
    """How the wgmma producer copies the tiles: TMA where the plan allows it (`wgmma_tma_ok`), which
    turns this to CP_ASYNC elsewhere; CP_ASYNC asks for the copies of every producer thread (a
    caller's override for strides TMA cannot take). The consumers' softmax is the plain one: the
    schedules measured against it are in docs/DECISIONS.md#wgmma-softmax-schedules."""

    loads: WgmmaLoads = WgmmaLoads.TMA


def wgmma_softmax(head_dim: int, value_head_dim: int, tile: TileConfig) -> WgmmaSoftmax:
    """The softmax schedule of a wgmma kernel: the plain one, for every head dim and tile
    (docs/DECISIONS.md#wgmma-softmax-schedules)."""
    return WgmmaSoftmax()


def wgmma_tma_ok(*, varlen: bool, wide_rows: bool, q_norm: bool, k_norm: bool, residual_copy: bool,
                 score_lookups: bool = False) -> bool:
    """Whether the producer can copy by TMA (`WgmmaLoads.TMA`): its descriptors view q, k and v
    as [B, heads, L, D] tensors, so the packed sequences of varlen, the prep kernels' normalised
    copies (q or k norms) and the residual copy keep cp.async; so does the wide rows' producer
    (its own copy loop). Score expressions that read tensors (bias, rel_bias lookups) keep
    cp.async too: ptxas spills their TMA kernels at every register split the budget allows
    (docs/DECISIONS.md#tma-score-lookups)."""
    return not (varlen or wide_rows or q_norm or k_norm or residual_copy or score_lookups)


def wgmma_max_block_n(value_head_dim: int, tile: TileConfig) -> int:
    """Largest key tile whose registers fit a consumer thread: the S accumulators (block_n / 2),
    the packed P of the tile before (block_n / 4) and O (Dv / 2) within the setmaxnreg budget,
    with ~30 registers to spare for addressing and the softmax, under the largest consumer share
    (plain attention's: the auto tiles of dense D128, 176 keys, and D256, 80, reach it). A variant
    with lookups or score mods has a smaller share, and a tile hint at this limit may spill there
    (ptxas reports it; the kernel stays correct); their auto tiles stay narrower."""
    consumer = max(wgmma_regs(tile, lookups, scores)[1] for lookups in (False, True) for scores in (False, True))
    budget = consumer - 30 - value_head_dim // 2
    return min(256, budget * 4 // 3 // 16 * 16)


def engine(dtype: DType, head_dim: int, value_head_dim: int, tile: TileConfig, arch: Arch = DEFAULT_ARCH) -> Engine:
    """The engine a tile runs on. fp32 always uses FFMA. fp16/bf16 on sm_90a with head dims 64 or
    128, at least two stages and 64 query rows per warpgroup (128 x N with 8 warps, or for head
    dims 64 also 192 x N with 12) uses wgmma; every other 16-bit case mma.sync."""
    if not uses_tensor_cores(dtype):
        return Engine.FFMA
    # The consumers hold two ring slots at once (K of tile i, V of tile i - 1): one stage would
    # deadlock, so single-stage tiles stay on mma.sync.
    if arch == Arch.SM90A and wgmma_head_dims(head_dim, value_head_dim) and tile.stages >= 2:
        if (tile.warps, tile.block_m) == (8, 128):
            return Engine.WGMMA
        if (tile.warps, tile.block_m) == (12, 192) and head_dim == value_head_dim == 64:
            return Engine.WGMMA
    return Engine.MMA_SYNC


def threads(dtype: DType, head_dim: int, value_head_dim: int, tile: TileConfig, arch: Arch = DEFAULT_ARCH) -> int:
    """Threads a CTA: 32 per warp of the tile, plus the producer warpgroup on the wgmma engine."""
    extra = WGMMA_PRODUCER_WARPS if engine(dtype, head_dim, value_head_dim, tile, arch) == Engine.WGMMA else 0
    return 32 * (tile.warps + extra)


@dataclass(frozen=True, slots=True)
class SmemLayout:
    """What a kernel keeps in dynamic shared memory: its size, and the wgmma engine's optional
    parts (two Q buffers; the raw residual rows beside them; K and V rings with barriers of their
    own, `wgmma_kv_split`)."""

    bytes: int
    q_buffers: int = 1
    residual_copy: bool = False
    kv_split: bool = False


def smem_layout(dtype: DType, head_dim: int, value_head_dim: int, tile: TileConfig, arch: Arch = DEFAULT_ARCH,
                *, token_norm: bool = False, residual: bool = False) -> SmemLayout:
    """Dynamic shared memory the kernel template allocates for this tile.

    mma.sync: the Q tile plus a ring of `stages` K/V tiles, rows padded by 8 elements; the fp32
    epilogue staging of O reuses the same space. wgmma: the same tiles unpadded (swizzled), then
    8-byte mbarriers (full/empty per Q buffer and per stage), 16 bytes of work-tile indices and
    a 4-byte header per stage; one Q buffer, or two where they fit (`wgmma_q_buffers`), each with
    `wgmma_qside_bytes` beside it when q has a token-scope norm (`token_norm`), and a copy of the
    residual rows where `wgmma_residual_smem` says so. Its epilogue writes O from registers, since
    the producer is already refilling the tiles for the next work tile. FFMA: each warp's final
    softmax statistics, then fp32 Q, K and V tiles (one stage; rows padded by 4 floats), each
    warp's P (key-major, rows padded by 8) and rescale factors; the warps' weighted partial O
    (rows padded by 4) reuse the space after the statistics."""
    d, dv, bm, bn = head_dim, value_head_dim, tile.block_m, tile.block_n
    if engine(dtype, d, dv, tile, arch) == Engine.WGMMA:
        qb = wgmma_q_buffers(dtype, d, dv, tile, arch, token_norm=token_norm)
        res = wgmma_residual_smem(dtype, d, dv, tile, arch, token_norm=token_norm, residual=residual)
        split = wgmma_kv_split(tile)
        return SmemLayout(_wgmma_smem(dtype, d, dv, tile, qb, token_norm, res, split), qb, res, split)
    if uses_tensor_cores(dtype):
        tiles = (bm * (d + 8) + tile.stages * bn * ((d + 8) + (dv + 8))) * dtype.itemsize
        return SmemLayout(max(tiles, bm * (dv + 8) * 4))
    w = tile.warps
    tiles = bm * (d + 4) + bn * (d + 4) + bn * (dv + 4) + bn * (bm + 8) + w * bm
    return SmemLayout((2 * w * bm + max(tiles, w * bm * (dv + 4))) * 4)


def smem_bytes(dtype: DType, head_dim: int, value_head_dim: int, tile: TileConfig, arch: Arch = DEFAULT_ARCH,
               *, token_norm: bool = False, residual: bool = False) -> int:
    """Bytes of dynamic shared memory for this tile (`smem_layout`)."""
    return smem_layout(dtype, head_dim, value_head_dim, tile, arch, token_norm=token_norm, residual=residual).bytes


def variant_smem_layout(v: Variant, tile: TileConfig, arch: Arch = DEFAULT_ARCH) -> SmemLayout:
    """`smem_layout` for a variant's own norms and residual."""
    return smem_layout(v.dtype, v.head_dim, v.value_head_dim, tile, arch, token_norm=q_token_norm(v), residual=v.residual)


def wgmma_qside_bytes(head_dim: int, tile: TileConfig, token_norm: bool) -> int:
    """Bytes beside each wgmma Q buffer: with a token-scope q norm, its rows' statistics (an fp32
    (mean, rstd) pair a row) and the head's affine weight and bias (D fp32 each), which the
    producer copies along with the Q tile so that the consumers' norm never waits on global
    memory (docs/DECISIONS.md#pre-ln-tiles)."""
    return tile.block_m * 8 + 2 * head_dim * 4 if token_norm else 0


def _wgmma_smem(dtype: DType, d: int, dv: int, tile: TileConfig, q_buffers: int, token_norm: bool = False,
                res_copy: bool = False, kv_split: bool = False) -> int:
    tiles = (q_buffers * tile.block_m * d + tile.stages * tile.block_n * (d + dv)) * dtype.itemsize
    tiles += q_buffers * wgmma_qside_bytes(d, tile, token_norm)
    if res_copy:
        tiles += tile.block_m * (d * dtype.itemsize + 16)
    bars = 2 * q_buffers + 2 * tile.stages * (2 if kv_split else 1)
    return (tiles + 7) // 8 * 8 + 8 * bars + 16 + 4 * tile.stages


def wgmma_kv_split(tile: TileConfig) -> bool:
    """Whether the wgmma kernel hands K and V over through rings of their own (full/empty
    barriers a K slot and a V slot) rather than one slot holding both: with two stages. The
    consumers release a key tile's K as soon as its S product lands and its V after O += P.V, so
    two stages keep the producer a slot ahead; with one shared slot they hold two at once and two
    stages starve it. Two stages of split rings free the shared memory for wider key tiles (the
    auto tiles of `auto_tile` and `_wide_auto_tile`); three or more stages keep the shared slot
    (docs/DECISIONS.md#split-kv-rings)."""
    return tile.stages == 2


def wgmma_residual_smem(dtype: DType, head_dim: int, value_head_dim: int, tile: TileConfig, arch: Arch = DEFAULT_ARCH,
                        *, token_norm: bool = False, residual: bool = False) -> bool:
    """Whether the wgmma kernel's epilogue reads the residual from shared memory: with a
    token-scope q norm the consumers see the raw rows of x in the Q buffer before they normalise
    them, and copy them aside (rows padded by 16 bytes) where that fits the budget; otherwise the
    epilogue reads x from global memory, a round trip the consumers wait for."""
    if not (token_norm and residual):
        return False
    qb = wgmma_q_buffers(dtype, head_dim, value_head_dim, tile, arch, token_norm=True)
    return _wgmma_smem(dtype, head_dim, value_head_dim, tile, qb, True, True,
                       wgmma_kv_split(tile)) <= arch.smem_budget


def wgmma_q_buffers(dtype: DType, head_dim: int, value_head_dim: int, tile: TileConfig, arch: Arch = DEFAULT_ARCH,
                    *, token_norm: bool = False) -> int:
    """Q buffers of the wgmma kernel: two where they fit the shared-memory budget (the producer
    loads the next work tile's Q while the consumers finish the current one: short key loops,
    like cross attention over 512 keys, would otherwise wait for every Q), else one."""
    split = wgmma_kv_split(tile)
    return 2 if _wgmma_smem(dtype, head_dim, value_head_dim, tile, 2, token_norm, False, split) <= arch.smem_budget else 1


def ffma_accumulators(head_dim: int, value_head_dim: int, tile: TileConfig) -> int:
    """Registers a thread of the FFMA engine keeps for its output and score tiles."""
    return tile.block_m * value_head_dim // 32 + tile.block_m * tile.block_n // (32 * tile.warps)


def min_blocks_per_sm(dtype: DType, head_dim: int, value_head_dim: int, tile: TileConfig, arch: Arch = DEFAULT_ARCH) -> int:
    """The `__launch_bounds__` occupancy hint: with one 16-row MMA tile per warp, cap registers at
    128 so that 2048 threads' worth of registers can be resident; with two, let the O accumulators
    have up to 255. FFMA: what its register tiles need, within what shared memory admits. wgmma: one CTA an SM (setmaxnreg needs the cap at entry that this sets)."""
    if engine(dtype, head_dim, value_head_dim, tile, arch) == Engine.WGMMA:
        return 1
    threads = 32 * tile.warps
    if uses_tensor_cores(dtype) and tile.block_m // tile.warps == 32:
        return 1
    if uses_tensor_cores(dtype) and wide_head_dims(head_dim, value_head_dim):
        # Dv / 2 fp32 O accumulators a thread (128 at Dv = 256) plus S and the fragments: let
        # ptxas have up to 255 registers a thread (D = 192, Dv = 128 spills 8 bytes under 128).
        return max(1, 65536 // (threads * 256))
    if not uses_tensor_cores(dtype):
        # FFMA: each warp holds a whole block_m x dv partial O, so large head dims need more than
        # 128 registers a thread. Estimate them (accumulators plus ~88 for addresses and operands,
        # within a few of ptxas's count for the examples) and ask for no more blocks than both
        # that and shared memory allow.
        # Registers come from each SM sub-partition's 16384, split among the warps it holds.
        need = ffma_accumulators(head_dim, value_head_dim, tile) + 88
        blocks = max(1, arch.smem_per_sm // (smem_bytes(dtype, head_dim, value_head_dim, tile, arch) + 1024))
        while blocks > 1 and 16384 // (-(-blocks * tile.warps // 4) * 32) // 8 * 8 < need:
            blocks -= 1
        return blocks
    return max(1, 65536 // (threads * 128))


def persistent(eng: Engine) -> bool:
    """Whether the kernel on `eng` is persistent: a grid of at most one CTA an SM whose CTAs each
    loop over work tiles (query tile, head, batch), so that one tile's loads overlap the last
    one's epilogue. The wgmma engine is; the others launch one CTA a work tile."""
    return eng == Engine.WGMMA


def validate_tile(
    dtype: DType, head_dim: int, value_head_dim: int, tile: TileConfig, arch: Arch = DEFAULT_ARCH, *, token_norm: bool = False
) -> list[str]:
    """Every reason this tile cannot be used; empty when it is fine (`token_norm`: q has a
    token-scope norm, whose statistics take shared memory on the wgmma engine)."""
    errs: list[str] = []
    if dtype == DType.BF16 and not arch.bf16:
        errs.append(f"bf16 needs sm_80 or newer ({arch.value} has no bf16 tensor cores)")
        return errs
    if tile.block_m <= 0 or tile.block_m % 16:
        errs.append(f"block_m must be a positive multiple of 16, got {tile.block_m}")
    if tile.block_n <= 0 or tile.block_n % 16:
        errs.append(f"block_n must be a positive multiple of 16, got {tile.block_n}")
    if tile.block_m > 256 or tile.block_n > 256:
        errs.append(f"block_m and block_n are at most 256, got {tile.block_m} and {tile.block_n}")
    wg = engine(dtype, head_dim, value_head_dim, tile, arch) == Engine.WGMMA
    if tile.warps not in SUPPORTED_WARPS and not wg:
        errs.append(
            f"warps must be one of {', '.join(map(str, SUPPORTED_WARPS))} (or 12 with block_m 192: the wgmma engine, "
            f"fp16/bf16 with head dims 64 on sm_90a), got {tile.warps}"
        )
    if not 1 <= tile.stages <= MAX_STAGES:
        errs.append(f"stages must be between 1 and {MAX_STAGES}, got {tile.stages}")
    if errs:
        return errs
    if uses_tensor_cores(dtype):
        per_warp = tile.block_m / tile.warps
        limit = wgmma_max_block_n(value_head_dim, tile) if wg else 128
        if tile.block_n > limit:
            errs.append(f"on the {'wgmma' if wg else 'mma.sync'} engine block_n is at most {limit} here, got {tile.block_n}")
        if per_warp not in (16, 32):
            errs.append(
                f"on the tensor-core path each warp owns block_m / warps query rows, which must be 16 or 32; "
                f"block_m {tile.block_m} with {tile.warps} warps gives {per_warp:g}"
            )
        elif not wg and per_warp == 32 and value_head_dim > 128:
            # Two 16-row MMA tiles of O at Dv = 256 would be 256 fp32 accumulators a thread.
            errs.append(
                f"on the mma.sync engine with value head dim {value_head_dim} each warp owns 16 query rows "
                f"(block_m = 16 * warps), got block_m {tile.block_m} with {tile.warps} warps"
            )
        if wg and token_norm and head_dim > 128:
            errs.append(f"on the wgmma engine a token-scope q norm is implemented for head dims up to 128, not {head_dim}")
    else:
        # The FFMA register tiles (backends/cuda/fwd/_simt.cu.j2): each warp owns block_n / warps keys
        # of a tile in 4 key groups, 8 row groups of S and 4 of O; O takes block_m * dv / 32
        # accumulators a thread, S block_m * block_n / (32 * warps).
        if tile.block_n % (4 * tile.warps):
            errs.append(
                f"on the fp32 path each warp owns block_n / warps keys of a tile, which must be a multiple of 4; "
                f"block_n {tile.block_n} with {tile.warps} warps gives {tile.block_n / tile.warps:g}"
            )
        elif tile.block_m * value_head_dim > 32 * FFMA_MAX_O_REGS or tile.block_m * tile.block_n > 32 * tile.warps * FFMA_MAX_S_REGS:
            errs.append(
                f"on the fp32 path a thread holds block_m * value_head_dim / 32 output accumulators (at most "
                f"{FFMA_MAX_O_REGS}) and block_m * block_n / (32 * warps) scores (at most {FFMA_MAX_S_REGS}); "
                f"this tile gives {tile.block_m * value_head_dim // 32} and {tile.block_m * tile.block_n // (32 * tile.warps)}"
            )
        if tile.stages != 1:
            errs.append("the fp32 path is single-stage: use stages 1")
    if not errs:
        need = smem_bytes(dtype, head_dim, value_head_dim, tile, arch, token_norm=token_norm)
        if need > arch.smem_budget:
            errs.append(
                f"this tile needs {need} bytes of shared memory ({need / 1024:.0f} KiB), over the "
                f"{arch.smem_budget // 1024} KiB a block may use on {arch.value}"
            )
    return errs


def auto_tile(
    dtype: DType, head_dim: int, value_head_dim: int, arch: Arch = DEFAULT_ARCH, *, dense: bool = False
) -> TileConfig:
    """The tile `tile auto` resolves to (docs/DECISIONS.md#auto-tiles).

    sm_90a, fp16/bf16, head dims 64/128: the wgmma engine, 128 x 128 x 8 warps x 3 stages (D64:
    192 x 128 x 12 warps). Other tensor-core cases (mma.sync): 4 warps of two 16-row MMA tiles
    (128 query rows) share every K/V fragment they load from shared memory; for D > 64 an unmasked
    variant runs best with 48-key tiles, a masked one with 64; for D <= 64, 128-key tiles
    unmasked, 64 masked. fp32 (FFMA): small tiles, many CTAs."""
    if uses_tensor_cores(dtype) and wide_head_dims(head_dim, value_head_dim):
        return _wide_auto_tile(dtype, head_dim, value_head_dim, arch, dense)
    if arch == Arch.SM90A and uses_tensor_cores(dtype) and head_dim in WGMMA_HEAD_DIMS and value_head_dim in WGMMA_HEAD_DIMS:
        # Hopper: the wgmma engine, 128 x 128 x 3 stages on the shared K/V slot (two consumer
        # warpgroups); head-dim-64 variants run best with three.
        if head_dim == value_head_dim == 64:
            return TileConfig(block_m=192, block_n=128, warps=12, stages=3)
        if head_dim == value_head_dim == 128 and dense:
            # Unmasked D128: 176-key tiles on two stages of split K/V rings (`wgmma_kv_split`), as
            # FlashAttention-3 does; causal keeps 128 keys.
            return TileConfig(block_m=128, block_n=176, warps=8, stages=2)
        return TileConfig(block_m=128, block_n=128, warps=8, stages=3)
    if not uses_tensor_cores(dtype):
        # Short CTAs, many of them (the seed case's tile). Larger head dims keep the 4-warp tile
        # (64 output accumulators a thread).
        # Where shared memory is short (sm_75's 64 KiB) the next smaller tile that fits.
        tiles = [TileConfig(16, 128, 8, 1)] if max(head_dim, value_head_dim) <= 64 else []
        tiles += [TileConfig(16, 64, 4, 1), TileConfig(16, 32, 4, 1)]
        return next((t for t in tiles if not validate_tile(dtype, head_dim, value_head_dim, t, arch)), tiles[-1])
    if max(head_dim, value_head_dim) <= 64:
        t = TileConfig(block_m=128, block_n=128 if dense else 64, warps=4, stages=2)
    else:
        t = TileConfig(block_m=128, block_n=48 if dense else 64, warps=4, stages=2)
    while validate_tile(dtype, head_dim, value_head_dim, t, arch) and t.block_n > 16:
        t = TileConfig(t.block_m, max(16, t.block_n // 2 // 16 * 16), t.warps, t.stages)
    return t


def _wide_auto_tile(dtype: DType, head_dim: int, value_head_dim: int, arch: Arch, dense: bool = False) -> TileConfig:
    """`tile auto` for the WIDE_HEAD_DIMS pairs (FlashAttention-3's technique on Hopper: 128 query
    rows over two consumer warpgroups, narrow key tiles so that O (Dv / 2 registers a thread), S and
    the packed P fit the consumers' setmaxnreg share; FlashAttention-2's on mma.sync: 16 query
    rows a warp, 8 warps).

    wgmma, D = Dv = 256: two stages of split K and V rings (`wgmma_kv_split`), 128 x 80 unmasked
    (224 KiB) and 128 x 64 otherwise (docs/DECISIONS.md#wide-head-dims).
    D = 192, Dv = 128: 128 x 80 x 3 stages (198 KiB). mma.sync: 128 x 64 x 8 warps x 2 stages where
    shared memory admits it, else the first smaller tile that fits, counting the fp32 staging of O
    in the epilogue (D256 on sm_80: 128 x 32; sm_86/89: 64 x 32 x 4 warps single-stage; sm_75:
    32 x 16 x 2 warps single-stage)."""
    if arch == Arch.SM90A:
        t = (TileConfig(block_m=128, block_n=80 if dense else 64, warps=8, stages=2) if value_head_dim == 256
             else TileConfig(block_m=128, block_n=80, warps=8, stages=3))
        if not validate_tile(dtype, head_dim, value_head_dim, t, arch):
            return t
    tiles = [TileConfig(128, 64, 8, 2), TileConfig(128, 32, 8, 2), TileConfig(128, 64, 8, 1), TileConfig(128, 32, 8, 1),
             TileConfig(64, 32, 4, 1), TileConfig(32, 16, 2, 1)]
    return next((t for t in tiles if not validate_tile(dtype, head_dim, value_head_dim, t, arch)), tiles[-1])


def variant_tile(v: Variant, arch: Arch = DEFAULT_ARCH) -> TileConfig:
    """The variant's own tile (its hint, the fields it leaves out from `auto_tile`), or the auto
    choice for it on `arch`. Not validated: attngen.plan.validate and render do that."""
    if v.tile is not None:
        auto = auto_tile(v.dtype, v.head_dim, v.value_head_dim, arch)
        h = v.tile
        return TileConfig(
            block_m=h.block_m if h.block_m is not None else auto.block_m,
            block_n=h.block_n if h.block_n is not None else auto.block_n,
            warps=h.warps if h.warps is not None else auto.warps,
            stages=h.stages if h.stages is not None else auto.stages,
            span=h.span,
        )
    plain = v.mask == TRUE and not v.scores and not v.norms
    if q_token_norm(v) and uses_tensor_cores(v.dtype) and max(v.head_dim, v.value_head_dim) <= 64:
        # Pre-LN blocks (token-scope q norm, usually with a residual). On sm_90a the persistent
        # wgmma kernel with three consumer warpgroups (docs/DECISIONS.md#pre-ln-tiles).
        if arch == Arch.SM90A:
            t = TileConfig(block_m=192, block_n=128, warps=12, stages=3)
            if not validate_tile(v.dtype, v.head_dim, v.value_head_dim, t, arch, token_norm=True) and engine(
                    v.dtype, v.head_dim, v.value_head_dim, t, arch) == Engine.WGMMA:
                return t
        # Elsewhere 64-row mma.sync tiles, four CTAs an SM, hide the norm's and residual's row
        # traffic; 64x32 also stays spill-free on sm_80 under the 128-register cap.
        t = TileConfig(block_m=64, block_n=32, warps=4, stages=2)
        if not validate_tile(v.dtype, v.head_dim, v.value_head_dim, t, arch, token_norm=True):
            return t
    t = auto_tile(v.dtype, v.head_dim, v.value_head_dim, arch, dense=plain)
    if wide_head_dims(v.head_dim, v.value_head_dim) and not _plain_wide(v):
        # Wide head dims beyond dense and causal: the O registers (128 a thread at Dv = 256) leave
        # too few for the per-element mask, score, LSE and epilogue work at the dense tiles' key counts
        # (ptxas: wgmma D256 window mask at 48 keys spills 8 bytes, softcap 32; D192/128 window +
        # softcap + lse at 80 keys 4; mma.sync D256 window + softcap + lse at 64 keys 92), so
        # narrower key tiles: on wgmma 32 keys at Dv = 256 (three stages and two Q buffers in 224
        # KiB), 64 at D192/128 (216 KiB); on mma.sync at most 32 keys at Dv = 256.
        if engine(v.dtype, v.head_dim, v.value_head_dim, t, arch) == Engine.WGMMA:
            t = TileConfig(block_m=128, block_n=32 if v.value_head_dim == 256 else 64, warps=8, stages=3)
            if v.value_head_dim == 256 and any(n.target == NormTarget.O for n in v.norms):
                # An o post-norm's row statistics over 256 columns beside the 128 O registers: the
                # wgmma consumers spill (ptxas: 378 bytes with nan_check), so 16 rows a warp on
                # mma.sync (spill-free with post-norm, nan_check, sink and residual together).
                t = TileConfig(block_m=64, block_n=32, warps=4, stages=2)
        elif v.value_head_dim == 256 and t.block_n > 32:
            t = TileConfig(t.block_m, 32, t.warps, t.stages)
    # Document masks take the 128 x 128 tiles too (docs/DECISIONS.md#document-mask-tiles).
    if t.block_n > 128 and not wgmma_wide_keys_ok(v):
        # The 176-key tiles hold S, P and O in the whole plain consumer share: an epilogue or
        # per-sequence extra would spill there, so such variants keep 128 x 128 x 3.
        t = TileConfig(block_m=128, block_n=128, warps=8, stages=3)
    if t.warps == 12 and (v.scores or v.runtime_inputs()):
        # Three consumer warpgroups leave 160 registers a thread: lookups in the mask or score
        # mods spill there (ptxas, sm_90a: t5_relative_bias 1020 bytes), so two warpgroups.
        t = TileConfig(block_m=128, block_n=128, warps=8, stages=3)
    if t == TileConfig(block_m=128, block_n=128, warps=8, stages=3) and _short_runs(v, arch):
        t = SHORT_RUN_TILE
    return t


# The short-loop tile (`short_tile`): two stages of split K/V rings and two Q buffers.
SHORT_RUN_TILE = TileConfig(block_m=128, block_n=128, warps=8, stages=2)


def _short_runs(v: Variant, arch: Arch) -> bool:
    """Whether a plain D128 wgmma variant's mask keeps each query tile's visible keys few at any
    length (a window, documents), so the short-loop tile serves it at every length: its second Q
    buffer loads the next work tile's Q under the current one (docs/DECISIONS.md#short-run-tiles)."""
    if arch != Arch.SM90A or not uses_tensor_cores(v.dtype) or not (v.head_dim == v.value_head_dim == 128):
        return False
    if not _plain_consumers(v, lse_ok=True):
        return False
    return any(isinstance(n, Builtin) and n.name in (BuiltinName.DOCUMENT, BuiltinName.WINDOW) for n in walk(v.mask))


@dataclass(frozen=True, slots=True)
class ShortTile:
    """A second forward kernel for short key loops: calls with Lk <= max_lk launch `tile`."""

    tile: TileConfig
    max_lk: int


def short_tile(v: Variant, arch: Arch = DEFAULT_ARCH) -> ShortTile | None:
    """The tile for short key loops, chosen at launch (the runtime compiles both kernels), or None.

    One compiled kernel serves every length, but the best tile does not: where a work tile walks
    few key tiles, each work tile's prologue and epilogue weigh more, and a second Q buffer (the
    next work tile's Q loads under the current one) or fewer query rows a CTA win
    (docs/DECISIONS.md#short-loop-tile): D128 128 x 128 x 2 stages on split rings up to 4096 keys,
    causal D64 128 x 128 x 8 warps x 3 stages up to 1024.
    Plain variants only (nothing past the mask but the LSE: the tiles were measured on plain attention),
    on the wgmma engine, without a tile hint (a hinted tile is the user's choice for every length).
    The thresholds sit at the longest length measured faster; the standalone source of `attngen
    compile` carries the main tile only."""
    if arch != Arch.SM90A or v.tile is not None or not uses_tensor_cores(v.dtype):
        return None
    causal = _is_causal(v)
    if not _plain_consumers(v, lse_ok=True) or not (causal or v.mask == TRUE):
        return None
    d, dv = v.head_dim, v.value_head_dim
    if d == dv == 128:
        return ShortTile(TileConfig(block_m=128, block_n=128, warps=8, stages=2), 4096)
    if d == dv == 64 and causal:
        return ShortTile(TileConfig(block_m=128, block_n=128, warps=8, stages=3), 1024)
    return None


def wgmma_wide_keys_ok(v: Variant) -> bool:
    """Whether a variant is plain enough for key tiles past 128 on the wgmma engine: no mask, score,
    norm, LSE, sink, residual or NaN check, and dense (not packed or paged) K/V, so that its
    consumers have plain attention's register share and nothing past it (ptxas: the LSE alone
    spills 8 bytes at 176 keys)."""
    return v.mask == TRUE and _plain_consumers(v)


def _is_causal(v: Variant) -> bool:
    return isinstance(v.mask, Builtin) and v.mask.name == BuiltinName.CAUSAL


def _plain_consumers(v: Variant, *, lse_ok: bool = False) -> bool:
    """Whether the consumers run plain attention past the mask: no score mod, norm, sink, residual or
    NaN check (nor an LSE, unless `lse_ok`), over dense (not packed or paged) K/V. The tiles
    measured on plain attention (`wgmma_wide_keys_ok`, `short_tile`) are kept to such variants."""
    extras = v.scores or v.norms or (v.lse and not lse_ok) or v.sink is not None or v.residual or v.nan_check
    return not extras and v.layout != Layout.VARLEN and v.page_size is None


def _plain_wide(v: Variant) -> bool:
    """Whether a wide-head-dim variant keeps the dense tiles: no mask beyond causal (so no lookups),
    and nothing in the consumers' loop or epilogue past plain attention (score mods, LSE, sink,
    residual, nan_check, o post-norm); head-scope q/k pre-norms run in prep kernels and count as
    plain."""
    causal_or_none = v.mask == TRUE or _is_causal(v)
    extras = v.scores or v.lse or v.sink is not None or v.residual or v.nan_check
    return causal_or_none and not extras and not any(n.target == NormTarget.O for n in v.norms)


def q_token_norm(v: Variant) -> bool:
    """Whether q has a token-scope norm (statistics over the whole hidden row)."""
    return any(n.target == NormTarget.Q and n.scope == NormScope.TOKEN for n in v.norms)


def spill_budget(eng: Engine, tile: TileConfig) -> int:
    """Bytes of register spill ptxas may report for a kernel on `eng` with this tile and still be
    accepted by the tests.

    wgmma: none (the register split of `wgmma_regs` is chosen so that no example spills).
    mma.sync with two 16-row MMA tiles per warp: 128. Their 128 fp32 O accumulators (D = 128)
    leave ptxas a few registers short at 255, and it spills up to ~100 bytes outside the MMA
    loops (docs/DECISIONS.md#register-spills-of-two-tile-warps).
    Zero otherwise."""
    if eng == Engine.MMA_SYNC and tile.block_m // tile.warps == 32:
        return 128
    return 0
