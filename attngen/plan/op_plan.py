"""The forward op's plan types: the problem, the kernels in launch order with their grid rules,
the ABI fields and the workspaces. Made by `attngen.cuda.render.plan`; read by render, the
runtime's binder, `explain`, the C header and the plan stage's limits (attngen.plan.limits)."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from attngen.ir.nodes import AttnKind, DType, Layout, TensorDecl, TileConfig
from attngen.plan.schedule import Arch, Engine, SmemLayout, WgmmaLoads, WgmmaSoftmax


@dataclass(frozen=True, slots=True)
class Field:
    """One kernel parameter (and field of the launcher's Params struct), in ABI order."""

    ctype: str
    name: str
    doc: str


@dataclass(frozen=True, slots=True)
class Prep:
    """A kernel launched before the attention kernel (same arguments, same stream): per-row work
    that would otherwise be repeated by every query tile's CTA. It writes the workspace `field`,
    laid out [B, heads, L, width] in `dtype` (L is Lq for query rows, Lk for key rows)."""

    kernel: str
    func: str  # the device function in the template
    field: Field  # the Params field of its workspace
    heads: int  # rows per (batch, position): H or Hkv, or 1 for whole hidden rows
    queries: bool  # rows run over Lq (else Lk)
    width: int  # workspace elements per row
    dtype: DType
    doc: str
    # The workspace holds one row a (batch, head), not one a position (a reduction over L, like
    # K smoothing's mean); the kernel still covers every row (its grid).
    per_head: bool = False

    @property
    def rows_expr(self) -> str:
        """How many rows it covers, as a C++ expression over Params `p`."""
        heads = f" * {self.heads}" if self.heads != 1 else ""
        return f"(long long)p.B{heads} * p.{'Lq' if self.queries else 'Lk'}"

    @property
    def bytes_expr(self) -> str:
        """Its workspace's bytes, as a C expression over ints B, Lq and Lk."""
        heads = f" * {self.heads}" if self.heads != 1 else ""
        if self.per_head:
            return f"(size_t)B{heads} * {self.width * self.dtype.itemsize}"
        return f"(size_t)B{heads} * {'Lq' if self.queries else 'Lk'} * {self.width * self.dtype.itemsize}"

    def rows(self, B: int, Lq: int, Lk: int) -> int:
        return B * self.heads * (Lq if self.queries else Lk)

    def workspace_shape(self, B: int, Lq: int, Lk: int) -> tuple[int, int, int, int]:
        return (B, self.heads, 1 if self.per_head else Lq if self.queries else Lk, self.width)


@dataclass(frozen=True, slots=True)
class TmaMap:
    """One TMA descriptor a `WgmmaLoads.TMA` kernel takes after its ABI fields: a 4-d view
    (columns, rows, heads, batch) of q, k or v, from the tensor's pointer and strides, copied in
    boxes of 64 columns x `rows` rows with the 128-byte swizzle, zero-filled past the length (or,
    `fp32`, the backward's dQ workspace, reduced into in boxes of 32 columns, nothing written
    past the length)."""

    name: str  # the kernel parameter: a CUtensorMap, 128 bytes, passed __grid_constant__
    tensor: str  # q, k or v: the ABI field of its pointer, and the prefix of its stride fields
    rows: int  # the box's rows: the tile's block_m (q) or block_n (k, v)
    cols: int  # the tensor's last dimension (its boxes cover it 64 columns at a time)
    heads: int
    length: str  # the ABI field of the length the rows run over: Lq or Lk
    box_cols: int = 64  # the box's columns: 128 bytes of the element type (32 for an fp32 tensor)
    fp32: bool = False  # an fp32 tensor (the backward's ws_dq, reduced into), else of the inputs' dtype

    def dims(self, B: int, L: int) -> tuple[int, int, int, int]:
        """globalDim, innermost first."""
        return (self.cols, L, self.heads, B)

    def dense_strides(self, L: int) -> tuple[int, int, int]:
        """Element strides (rows, heads, batch) of a dense [B, heads, L, cols] tensor: the
        backward's workspaces (ws_q, ws_k, ws_do, ws_dq)."""
        return (self.cols, L * self.cols, self.heads * L * self.cols)

    @staticmethod
    def byte_strides(dims: tuple[int, int, int, int], strides: tuple[int, int, int], itemsize: int) -> tuple[int, int, int]:
        """globalStrides (rows, heads, batch) in bytes from element strides: a dimension of size 1
        gets the extent of the dimensions inside it (its own stride is never used and may be
        anything, 0 included, which the encoder refuses)."""
        out: list[int] = []
        extent = dims[0] * itemsize
        for d, st in zip(dims[1:], strides):
            b = st * itemsize if d > 1 else extent
            out.append(b)
            extent = max(extent, b * d)
        return (out[0], out[1], out[2])


def tma_maps(kp: "OpPlan") -> tuple[TmaMap, ...]:
    """The descriptors of a TMA kernel, in parameter order (empty on cp.async)."""
    if not kp.attention.tma:
        return ()
    pr, t = kp.problem, kp.tile
    return (TmaMap("tm_q", "q", t.block_m, pr.head_dim, pr.heads, "Lq"),
            TmaMap("tm_k", "k", t.block_n, pr.head_dim, pr.kv_heads, "Lk"),
            TmaMap("tm_v", "v", t.block_n, pr.value_head_dim, pr.kv_heads, "Lk"))


# Prep kernels: PREP_THREADS threads a block, grid-stride over rows; launchers size the grid as
# min(rows / PREP_ROWS_PER_BLOCK + 1, PREP_MAX_BLOCKS) (any grid is correct).
PREP_THREADS = 256
PREP_ROWS_PER_BLOCK = PREP_THREADS // 32
PREP_MAX_BLOCKS = 4096


def _rows_grid(rows: int) -> int:
    return min(rows // PREP_ROWS_PER_BLOCK + 1, PREP_MAX_BLOCKS)


class KernelRole(enum.Enum):
    """What a kernel of an op does, in launch order (the backward and decode families add theirs)."""

    PREP = "prep"  # per-row work before the attention kernel (norm statistics, normalised rows)
    ATTENTION = "attention"  # the forward attention kernel


MAX_GRID_YZ = 65535  # CUDA's limit on a launch grid's y and z dimensions
MAX_WORK_TILES = 2**31 - 1


class GridRule(enum.Enum):
    """How a kernel's launch grid follows from the call's sizes. The one place the formulas live:
    the runtime evaluates `OpKernel.launch_grid`, the launcher, header and `explain` print
    `OpKernel.grid_cpp` / `OpKernel.grid_text`."""

    TILES = "tiles"  # ceil(Lq / block_m) x H x B: one CTA a query tile
    PERSISTENT = "persistent"  # min(work tiles, SMs) x 1 x 1: CTAs loop over the work tiles
    ROWS = "rows"  # min(rows / PREP_ROWS_PER_BLOCK + 1, PREP_MAX_BLOCKS): grid-stride over rows


@dataclass(frozen=True, slots=True)
class Problem:
    """The problem an op solves, independent of how it is blocked: element type, dims, heads,
    layout, target and the flags derived from the spec."""

    name: str
    dtype: DType
    head_dim: int
    value_head_dim: int
    heads: int
    kv_heads: int
    layout: Layout
    kind: AttnKind
    arch: Arch
    lse: bool
    nan_check: bool
    residual: bool
    token_norm: bool  # q has a token-scope norm (q may be a flat hidden state)
    runtime_inputs: tuple[TensorDecl, ...]  # beyond q, k, v, in ABI order

    @property
    def sorted_inputs(self) -> tuple[TensorDecl, ...]:
        """Runtime inputs whose `sorted` promise the kernel trusts (tile classification reads
        only a tile's two ends), so the runtime checks them before a launch."""
        return tuple(d for d in self.runtime_inputs if d.sorted and d.shape)


@dataclass(frozen=True, slots=True)
class OpKernel:
    """One kernel of an op: its role, entry point, engine and tile, block size, shared memory,
    grid rule and (wgmma) register split."""

    name: str
    role: KernelRole
    threads: int
    grid_rule: GridRule
    engine: Engine | None = None  # attention kernels only
    tile: TileConfig | None = None
    smem: SmemLayout = SmemLayout(0)
    min_blocks: int = 1  # the __launch_bounds__ occupancy hint
    regs: tuple[int, int] | None = None  # wgmma setmaxnreg (producer, consumer) registers a thread
    softmax: WgmmaSoftmax | None = None  # wgmma: the consumers' softmax schedule
    prep: Prep | None = None  # prep kernels: what they write
    # `layout varlen`: the query tiles are those of B packed sequences of total Lq rows. Sequence b
    # owns the tile slots [cu_q[b] / block_m + b, ...) (its ceil(L_b / block_m) tiles, then at most
    # one empty slot), so Lq / block_m + B slots cover every real tile; a CTA finds its sequence by
    # a binary search over cu_seqlens, and an empty slot exits at once.
    varlen: bool = False

    @property
    def tma(self) -> bool:
        """Whether the producer copies by TMA: the kernel then takes the descriptors of q, k and v
        (`tma_maps`) after its ABI fields."""
        return self.softmax is not None and self.softmax.loads == WgmmaLoads.TMA

    def _tile_slots(self, B: int, Lq: int) -> int:
        assert self.tile is not None
        return Lq // self.tile.block_m + B if self.varlen else -(-Lq // self.tile.block_m)

    def launch_grid(self, heads: int, B: int, Lq: int, Lk: int, sm_count: int) -> tuple[int, int, int]:
        """The launch grid for one call's sizes."""
        if self.grid_rule == GridRule.ROWS:
            assert self.prep is not None
            return (_rows_grid(self.prep.rows(B, Lq, Lk)), 1, 1)
        assert self.tile is not None
        n_m = self._tile_slots(B, Lq)
        if self.varlen:  # the tile slots of all sequences run along x
            return (max(1, min(n_m * heads, sm_count)), 1, 1) if self.grid_rule == GridRule.PERSISTENT else (n_m, heads, 1)
        if self.grid_rule == GridRule.PERSISTENT:
            # The kernel counts work tiles in an int.
            if n_m * heads * B > MAX_WORK_TILES:
                raise ValueError(f"B={B}, H={heads}, Lq={Lq}: {n_m * heads * B} work tiles of {self.tile.block_m} query rows, "
                                 f"more than the {MAX_WORK_TILES} one launch can count; split the batch")
            return (max(1, min(n_m * heads * B, sm_count)), 1, 1)
        if B > MAX_GRID_YZ:
            raise ValueError(f"B={B}: at most {MAX_GRID_YZ} sequences a launch (the grid's z dimension on the "
                             f"{self.engine.value} engine); split the batch")
        return (n_m, heads, B)

    def grid_cpp(self, ns: str) -> str:
        """The launcher's C++ for the grid over Params `p`: the dim3 arguments of a TILES grid, or
        the work-tile count a PERSISTENT grid caps at the SM count."""
        n_m = f"(p.Lq + {ns}::BLOCK_M - 1) / {ns}::BLOCK_M"
        if self.varlen:
            n_m = f"p.Lq / {ns}::BLOCK_M + p.B"
            if self.grid_rule == GridRule.PERSISTENT:
                return f"(long long)({n_m}) * {ns}::H"
            if self.grid_rule == GridRule.TILES:
                return f"{n_m}, {ns}::H, 1"
        if self.grid_rule == GridRule.PERSISTENT:
            return f"(long long)({n_m}) * {ns}::H * p.B"
        if self.grid_rule == GridRule.TILES:
            return f"{n_m}, {ns}::H, p.B"
        raise ValueError(f"{self.name}: the launcher sizes {self.grid_rule.value} grids itself")

    def grid_text(self, heads: int) -> str:
        """The launch grid in words, for headers."""
        if self.grid_rule == GridRule.ROWS:
            return f"min(rows / {PREP_ROWS_PER_BLOCK} + 1, {PREP_MAX_BLOCKS})"
        assert self.tile is not None
        if self.varlen:
            slots = f"total_q / {self.tile.block_m} + B"
            if self.grid_rule == GridRule.PERSISTENT:
                return (f"min(({slots}) * H={heads}, number of SMs) x 1 x 1 (persistent CTAs loop over the work tiles, "
                        f"each a sequence's query tile slot and a head; any grid is correct)")
            return f"({slots}, H={heads}, 1) (query tile slots of the packed sequences x heads)"
        if self.grid_rule == GridRule.PERSISTENT:
            return (f"min(ceil(Lq / {self.tile.block_m}) * H={heads} * B, number of SMs) x 1 x 1 (persistent CTAs "
                    f"loop over the work tiles; any grid is correct)")
        return f"(ceil(Lq / {self.tile.block_m}), H={heads}, B)"


@dataclass(frozen=True, slots=True)
class OpPlan:
    """Everything decided about one variant on one arch, computed once (`plan`, cached) and read
    by render, the runtime's binder, `explain` and the C header: the problem, the ordered
    kernels (preps first, then the attention kernel), the ABI fields and the workspaces."""

    problem: Problem
    kernels: tuple[OpKernel, ...]
    fields: tuple[Field, ...]
    workspaces: tuple[Prep, ...] = ()

    @property
    def attention(self) -> OpKernel:
        """The attention kernel (the last one launched)."""
        return next(k for k in self.kernels if k.role == KernelRole.ATTENTION)

    @property
    def prep_kernels(self) -> tuple[OpKernel, ...]:
        return tuple(k for k in self.kernels if k.role == KernelRole.PREP)

    # The attention kernel's figures, under the names the runtime and tests have always used.
    @property
    def kernel_name(self) -> str:
        return self.attention.name

    @property
    def tile(self) -> TileConfig:
        t = self.attention.tile
        assert t is not None
        return t

    @property
    def threads(self) -> int:
        return self.attention.threads

    @property
    def smem(self) -> SmemLayout:
        return self.attention.smem

    @property
    def smem_bytes(self) -> int:
        return self.attention.smem.bytes

    @property
    def arch(self) -> Arch:
        return self.problem.arch

    @property
    def engine(self) -> Engine:
        e = self.attention.engine
        assert e is not None
        return e

    @property
    def preps(self) -> tuple[Prep, ...]:
        return self.workspaces

    def grid(self, heads: int, B: int, Lq: int, sm_count: int) -> tuple[int, int, int]:
        """The attention kernel's launch grid (`OpKernel.launch_grid`)."""
        return self.attention.launch_grid(heads, B, Lq, Lq, sm_count)

    def prep_grid(self, rows: int) -> int:
        """Blocks for a prep kernel covering `rows` rows (the launcher's formula)."""
        return _rows_grid(rows)


# The name the runtime and other modules imported before the plan covered every kernel.
KernelPlan = OpPlan
