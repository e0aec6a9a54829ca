"""The plan type of every kernel family: the problem, the kernels in launch order with their grid
rules, the ABI fields, the workspaces and the family's own rules, one frozen `OpPlan`. Made once by
the plan stage (`attngen.plan.forward.plan`, `attngen.plan.bwd.plan`, `attngen.plan.decode.plan`);
read by render, render_bwd, render_decode, the runtime, `explain`, the C header and the plan
stage's limits (attngen.plan.limits), none of which changes a decision made there."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from attngen.ir.nodes import AttnKind, DType, Layout, TensorDecl, TileConfig, Variant
from attngen.plan.schedule import Arch, Engine, SmemLayout, WgmmaLoads, WgmmaSoftmax, q_token_norm

if TYPE_CHECKING:
    from attngen.plan.bwd import BwdRules
    from attngen.plan.decode import SplitSchedule


@dataclass(frozen=True, slots=True)
class Field:
    """One kernel parameter (and field of the launcher's Params struct), in ABI order."""

    ctype: str
    name: str
    doc: str


@dataclass(frozen=True, slots=True)
class RowSpan:
    """Rows a grid-stride kernel covers: batches x heads x L (L: Lq, or Lk for key rows); `heads`
    None for token rows (a whole H*D hidden row each: one a position)."""

    heads: int | None
    keys: bool = False

    def count(self, batches: int, Lq: int, Lk: int) -> int:
        return batches * (self.heads or 1) * (Lk if self.keys else Lq)

    def cpp(self, batches: str) -> str:
        heads = f" * {self.heads}" if self.heads is not None else ""
        return f"{batches}{heads} * p.{'Lk' if self.keys else 'Lq'}"


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
    # Key rows rounded up to a multiple of this in the workspace (0: none), zero-filled by the
    # kernel: the FP8 wgmma engine's V^T, read a whole key tile at a time.
    pad_keys: int = 0

    @property
    def span(self) -> RowSpan:
        """The rows it covers (its kernel's ROWS grid counts them)."""
        return RowSpan(self.heads if self.heads != 1 else None, keys=not self.queries)

    @property
    def rows_expr(self) -> str:
        """How many rows it covers, as a C++ expression over Params `p`."""
        return self.span.cpp("(long long)p.B")

    @property
    def bytes_expr(self) -> str:
        """Its workspace's bytes, as a C expression over ints B, Lq and Lk."""
        heads = f" * {self.heads}" if self.heads != 1 else ""
        if self.per_head:
            return f"(size_t)B{heads} * {self.width * self.dtype.itemsize}"
        length = f"(((size_t)Lk + {self.pad_keys - 1}) / {self.pad_keys} * {self.pad_keys})" if self.pad_keys else "Lq" if self.queries else "Lk"
        return f"(size_t)B{heads} * {length} * {self.width * self.dtype.itemsize}"

    def rows(self, B: int, Lq: int, Lk: int) -> int:
        return self.span.count(B, Lq, Lk)

    def workspace_shape(self, B: int, Lq: int, Lk: int) -> tuple[int, int, int, int]:
        length = -(-Lk // self.pad_keys) * self.pad_keys if self.pad_keys else Lq if self.queries else Lk
        return (B, self.heads, 1 if self.per_head else length, self.width)


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


def _rows_grid(rows: int, cap: int = PREP_MAX_BLOCKS) -> int:
    return min(rows // PREP_ROWS_PER_BLOCK + 1, cap)


class OpFamily(enum.Enum):
    """The kernel family an OpPlan belongs to."""

    FORWARD = "forward"
    BACKWARD = "backward"
    DECODE = "decode"


class KernelRole(enum.Enum):
    """What a kernel of an op does, in launch order."""

    PREP = "prep"  # per-row work before the attention kernel (norm statistics, normalised rows)
    ATTENTION = "attention"  # the forward attention kernel
    BWD_PRE = "bwd_pre"  # delta per query row (the o post-norm's backward; zeroes the dQ accumulator)
    BWD_PREP = "bwd_prep"  # the pre-normalised rows Q', K' into workspaces
    BWD_DKDV = "bwd_dkdv"  # dK, dV per key tile (and dQ by fp32 reductions)
    BWD_DQ = "bwd_dq"  # deterministic: dQ per query tile, no atomics
    BWD_FINISH = "bwd_finish"  # dq (and dk) from the fp32 workspaces through the norms' backward
    SPLIT = "split"  # decode: split-KV attention into partials (or O itself)
    COMBINE = "combine"  # decode: merges a row block's partials into O and the LSE


# The kernel that carries each family's engine and tile.
MAIN_ROLE = {OpFamily.FORWARD: KernelRole.ATTENTION, OpFamily.BACKWARD: KernelRole.BWD_DKDV, OpFamily.DECODE: KernelRole.SPLIT}


class BwdEngine(enum.Enum):
    """What computes the backward's dK/dV (and atomic dQ) products."""

    FFMA = "ffma"  # fp32 products on the CUDA cores, every dtype and arch
    MMA = "mma"  # mma.sync m16n8k16 tensor cores, fp16/bf16 inputs, fp32 accumulators (sm_80+)
    WGMMA = "wgmma"  # warpgroup MMA (sm_90a), fp16/bf16 inputs, fp32 accumulators, head dims 64 / 128


MAX_GRID_YZ = 65535  # CUDA's limit on a launch grid's y and z dimensions
MAX_WORK_TILES = 2**31 - 1
WARP_ROWS_MAX_BLOCKS = 65535  # the decode combine kernel's grid cap (it grid-strides past it)


@dataclass(frozen=True, slots=True)
class Launch:
    """One kernel launch of a call, in order."""

    kernel: str
    grid: tuple[int, int, int]
    threads: int
    smem_bytes: int


class GridRule(enum.Enum):
    """How a kernel's launch grid follows from the call's sizes. The one place the formulas live:
    the runtime evaluates `OpKernel.launch_grid`, the launcher, header and `explain` print
    `OpKernel.grid_cpp` / `OpKernel.grid_text`."""

    TILES = "tiles"  # ceil(L / block) x heads x B: one CTA a query tile (or key tile, `over_keys`)
    PERSISTENT = "persistent"  # min(work tiles, SMs) x 1 x 1: CTAs loop over the work tiles
    ROWS = "rows"  # min(rows / PREP_ROWS_PER_BLOCK + 1, max_blocks): grid-stride over rows
    CTAS = "ctas"  # (ctas, 1, 1): the decode split schedule's CTA count, chosen a call
    WARP_ROWS = "warp_rows"  # min(ceil(B * H * Lq / warps), WARP_ROWS_MAX_BLOCKS): a warp a (b, h, q) row


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
    def wide_rows(self) -> bool:
        """Head dims past 128 (the wide pairs): the wgmma producer's own copy loop, no TMA, and
        the stateless key scan instead of the walk down from the mask's key bound."""
        return max(self.head_dim, self.value_head_dim) > 128

    @property
    def sorted_inputs(self) -> tuple[TensorDecl, ...]:
        """Runtime inputs whose `sorted` promise the kernel trusts (tile classification reads
        only a tile's two ends), so the runtime checks them before a launch."""
        return tuple(d for d in self.runtime_inputs if d.sorted and d.shape)


def problem_of(v: Variant, arch: Arch) -> Problem:
    """The problem `v` poses on `arch` (every family's plan starts from it)."""
    return Problem(
        name=v.name, dtype=v.dtype, head_dim=v.head_dim, value_head_dim=v.value_head_dim, heads=v.heads,
        kv_heads=v.kv_heads, layout=v.layout, kind=v.kind, arch=arch, lse=v.lse, nan_check=v.nan_check,
        residual=v.residual, token_norm=q_token_norm(v), runtime_inputs=v.runtime_inputs(),
    )


@dataclass(frozen=True, slots=True)
class OpKernel:
    """One kernel of an op: its role, entry point, engine and tile, block size, shared memory,
    grid rule and (wgmma) register split."""

    name: str
    role: KernelRole
    threads: int
    grid_rule: GridRule
    engine: Engine | BwdEngine | None = None  # the family's main kernel (MAIN_ROLE) only
    tile: TileConfig | None = None
    smem: SmemLayout = SmemLayout(0)
    min_blocks: int = 1  # the __launch_bounds__ occupancy hint (0: none given)
    func: str = ""  # the device function in the template (backward kernels)
    doc: str = ""  # what it does, for headers and explain
    over_keys: bool = False  # TILES over key tiles: L = Lk, tile.block_n rows a CTA, the KV heads
    rows: tuple[RowSpan, ...] = ()  # ROWS: the rows it covers, summed
    max_blocks: int = PREP_MAX_BLOCKS  # ROWS: the grid's cap
    regs: tuple[int, int] | None = None  # wgmma setmaxnreg (producer, consumer) registers a thread
    softmax: WgmmaSoftmax | None = None  # wgmma: the consumers' softmax schedule
    prep: Prep | None = None  # prep kernels: what they write
    # `layout varlen`: the query tiles are those of B packed sequences of total Lq rows. Sequence b
    # owns the tile slots [cu_q[b] / block_m + b, ...) (its ceil(L_b / block_m) tiles, then at most
    # one empty slot), so Lq / block_m + B slots cover every real tile; a CTA finds its sequence by
    # a binary search over cu_seqlens, and an empty slot exits at once (the backward's tile kernels
    # the same over their length; its grid-stride row kernels run the packed rows as one sequence).
    varlen: bool = False

    @property
    def tma(self) -> bool:
        """Whether the producer copies by TMA: the kernel then takes the descriptors of q, k and v
        (`tma_maps`) after its ABI fields."""
        return self.softmax is not None and self.softmax.loads == WgmmaLoads.TMA

    def tile_slots(self, B: int, L: int) -> int:
        """Tile slots along the kernel's length L (Lq, or Lk `over_keys`): ceil(L / block), or
        varlen's L / block + B (each sequence's tiles, then at most one empty slot)."""
        assert self.tile is not None
        block = self.tile.block_n if self.over_keys else self.tile.block_m
        return L // block + B if self.varlen else -(-L // block)

    def launch_grid(self, heads: int, B: int, Lq: int, Lk: int, sm_count: int, ctas: int = 0) -> tuple[int, int, int]:
        """The launch grid for one call's sizes (`heads`: the heads along the grid, the KV heads
        for a grid over key tiles; `ctas`: a CTAS grid's count, from the split schedule)."""
        if self.grid_rule == GridRule.ROWS:
            batches = 1 if self.varlen else B  # varlen: the packed rows are one sequence
            return (_rows_grid(sum(r.count(batches, Lq, Lk) for r in self.rows), self.max_blocks), 1, 1)
        if self.grid_rule == GridRule.CTAS:
            return (ctas, 1, 1)
        if self.grid_rule == GridRule.WARP_ROWS:
            return (min(-(-B * heads * Lq // (self.threads // 32)), WARP_ROWS_MAX_BLOCKS), 1, 1)
        assert self.tile is not None
        n_m = self.tile_slots(B, Lk if self.over_keys else Lq)
        if self.varlen:  # the tile slots of all sequences run along x
            return (max(1, min(n_m * heads, sm_count)), 1, 1) if self.grid_rule == GridRule.PERSISTENT else (n_m, heads, 1)
        if self.grid_rule == GridRule.PERSISTENT:
            # The kernel counts work tiles in an int.
            if n_m * heads * B > MAX_WORK_TILES:
                raise ValueError(f"B={B}, H={heads}, Lq={Lq}: {n_m * heads * B} work tiles of {self.tile.block_m} query rows, "
                                 f"more than the {MAX_WORK_TILES} one launch can count; split the batch")
            return (max(1, min(n_m * heads * B, sm_count)), 1, 1)
        if B > MAX_GRID_YZ:
            on = f"on the {self.engine.value} engine" if self.engine is not None else f"of {self.name}"
            raise ValueError(f"B={B}: at most {MAX_GRID_YZ} sequences a launch (the grid's z dimension {on}); split the batch")
        return (n_m, heads, B)

    def grid_cpp(self, ns: str = "", heads: int = 0) -> str:
        """The launcher's C++ for the grid over Params `p`: the dim3 arguments of a TILES or ROWS
        grid, or the work-tile count a PERSISTENT grid caps at the SM count. `ns`: the namespace
        whose BLOCK_M and H spell the forward's tile and heads ('' spells the tile's rows and
        `heads` as numbers)."""
        if self.grid_rule == GridRule.ROWS:
            if self.prep is not None or not self.rows:
                raise ValueError(f"{self.name}: the launcher sizes its prep grids itself")
            rows = " + ".join(r.cpp("1LL" if self.varlen else "(long long)p.B") for r in self.rows)
            if self.role != KernelRole.BWD_PRE:  # (the pre kernel's one term is printed bare)
                rows = f"({rows})"
            n = f"{rows} / {PREP_ROWS_PER_BLOCK} + 1"
            return f"(unsigned)({n} < {self.max_blocks} ? {n} : {self.max_blocks})"
        if self.tile is None:  # CTAS, WARP_ROWS: the decode launcher's schedule sizes them
            raise ValueError(f"{self.name}: the launcher sizes {self.grid_rule.value} grids itself")
        if ns:
            length, block, less, h = "p.Lq", f"{ns}::BLOCK_M", f"{ns}::BLOCK_M - 1", f"{ns}::H"
        else:
            b = self.tile.block_n if self.over_keys else self.tile.block_m
            length, block, less, h = ("p.Lk" if self.over_keys else "p.Lq"), str(b), str(b - 1), str(heads)
        if self.varlen:
            n_m = f"{length} / {block} + p.B"
            if self.grid_rule == GridRule.PERSISTENT:
                return f"(long long)({n_m}) * {h}"
            if self.grid_rule == GridRule.TILES:
                return f"{n_m}, {h}, 1"
        n_m = f"({length} + {less}) / {block}"
        if self.grid_rule == GridRule.PERSISTENT:
            return f"(long long)({n_m}) * {h} * p.B"
        if self.grid_rule == GridRule.TILES:
            return f"{n_m}, {h}, p.B"
        raise ValueError(f"{self.name}: the launcher sizes {self.grid_rule.value} grids itself")

    def grid_text(self, heads: int) -> str:
        """The launch grid in words, for headers."""
        if self.grid_rule == GridRule.ROWS:
            return f"min(rows / {PREP_ROWS_PER_BLOCK} + 1, {self.max_blocks})"
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
    """Everything decided about one variant on one arch for one family, computed once (the
    family's `plan`, cached) and read by render, the runtime, `explain` and the C header: the
    problem, the kernels in launch order (forward: preps, then the attention kernel; backward:
    pre, prep, dK/dV, the deterministic dQ, finish; decode: split, then combine), the ABI fields
    every kernel of the op takes, the workspaces, the family's own rules (`backward`, `split`)
    and the forward's short-loop kernel."""

    problem: Problem
    kernels: tuple[OpKernel, ...]
    fields: tuple[Field, ...]
    workspaces: tuple[Prep, ...] = ()
    # The short-loop kernel (`schedule.short_tile`): the same op at a tile for short key loops, a
    # plan of its own (its source is rendered from it and loaded beside this one's), which calls
    # with Lk <= short_max_lk launch instead. None where one tile serves every length.
    short: "OpPlan | None" = None
    short_max_lk: int = 0
    family: OpFamily = OpFamily.FORWARD
    base_name: str = ""  # the symbol prefix of its kernels and launcher (`{prefix}_{variant}`, + `_bwd`, `_decode`)
    backward: "BwdRules | None" = None  # the backward's rules (engine choice, tiles, norms, wgmma schedule)
    split: "SplitSchedule | None" = None  # decode: the split schedule (row blocks, chunks, splits a call)

    @property
    def main(self) -> OpKernel:
        """The kernel that carries the family's engine and tile (MAIN_ROLE)."""
        return self.kernel(MAIN_ROLE[self.family])

    @property
    def attention(self) -> OpKernel:
        """The forward's attention kernel (the last one launched)."""
        return self.kernel(KernelRole.ATTENTION)

    @property
    def prep_kernels(self) -> tuple[OpKernel, ...]:
        return tuple(k for k in self.kernels if k.role == KernelRole.PREP)

    def kernel(self, key: "KernelRole | str") -> OpKernel:
        """The kernel of a role, or of a device function's name (the backward's `ag_bwd_*`)."""
        return next(k for k in self.kernels if (k.role == key if isinstance(key, KernelRole) else k.func == key))

    @property
    def launcher(self) -> str:
        return f"{self.base_name}_launch"

    # The main kernel's figures, under the names the runtime and tests have always used.
    @property
    def kernel_name(self) -> str:
        return self.main.name

    @property
    def tile(self) -> TileConfig:
        t = self.main.tile
        assert t is not None
        return t

    @property
    def threads(self) -> int:
        return self.main.threads

    @property
    def smem(self) -> SmemLayout:
        return self.main.smem

    @property
    def smem_bytes(self) -> int:
        return self.main.smem.bytes

    @property
    def arch(self) -> Arch:
        return self.problem.arch

    @property
    def engine(self) -> Any:
        """The main kernel's engine: an `Engine` (forward, decode) or a `BwdEngine` (backward)."""
        e = self.main.engine
        assert e is not None
        return e

    @property
    def preps(self) -> tuple[Prep, ...]:
        return self.workspaces

    def grid(self, heads: int, B: int, Lq: int, sm_count: int) -> tuple[int, int, int]:
        """The attention kernel's launch grid (`OpKernel.launch_grid`)."""
        return self.attention.launch_grid(heads, B, Lq, Lq, sm_count)

    def _grid_heads(self, k: OpKernel) -> int:
        return self.problem.kv_heads if k.over_keys else self.problem.heads

    def launch_grid(self, k: OpKernel, B: int, Lq: int, Lk: int, sm_count: int = 0, ctas: int = 0) -> tuple[int, int, int]:
        """Kernel `k`'s launch grid for one call's sizes (varlen: B sequences, Lq and Lk the
        packed totals; `ctas`: the decode split schedule's)."""
        return k.launch_grid(self._grid_heads(k), B, Lq, Lk, sm_count, ctas)

    def grid_code(self, k: OpKernel) -> str:
        """Kernel `k`'s launch grid as the launcher's C++ over Params `p`, numbers spelt out."""
        return k.grid_cpp("", self._grid_heads(k))

    def launches(self, B: int, Lq: int, splits: int, ctas: int, merged: bool = False) -> tuple[Launch, ...]:
        """Decode: the call's kernels with their grids, in launch order (no combine for one slot
        a row, where the split kernel writes O itself, nor when it merges the partials, `merged`:
        with row-block counters, ws_count)."""
        out = []
        for k in self.kernels:
            if k.role == KernelRole.COMBINE and (splits == 1 or merged):
                continue
            out.append(Launch(k.name, self.launch_grid(k, B, Lq, 0, ctas=ctas), k.threads, k.smem.bytes))
        return tuple(out)

    def prep_grid(self, rows: int) -> int:
        """Blocks for a prep kernel covering `rows` rows (the launcher's formula)."""
        return _rows_grid(rows)


# The name the runtime and other modules imported before the plan covered every kernel.
KernelPlan = OpPlan
