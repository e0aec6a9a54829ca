"""The backward pass's plan (stage: plan): which constructs the backward kernels take, their tile,
shared memory, kernels, launch grids and ABI.

The backward is three to five launches on one stream (see `backends/cuda/bwd/backward.cu.j2`):

    <name>_bwd_pre      with an o post-norm: dO' from dY and the saved pre-norm O' (and
                        dgamma/dbeta); delta = rowsum(dO' * O') per query row; zeroes the fp32
                        dQ accumulator
    <name>_bwd_prep     with q/k pre-norms: the normalised rows Q', K' into workspaces (a
                        token-scope q norm: a token, H*D wide, a row)
    <name>_bwd_dkdv     per (key tile, kv head, batch): walks the visible query tiles of every head
                        of the group; dK, dV (no atomics), dQ' by fp32 atomics (default)
    <name>_bwd_dq       deterministic: per (query tile, head, batch), dQ' without atomics
    <name>_bwd_finish   dq from dQ' (through the q norm's backward, head or token scope, + dO for a
                        residual); dk from dK' through the k norm's backward

`layout varlen`: the per-row kernels run the packed rows as one sequence; the tile kernels run
tile slots of the sequences (total / tile + B along x, the forward's rule) and find their sequence
by a binary search over cu_seqlens.

Engines (`choose_engine`): the dK/dV kernel runs on warpgroup MMA (wgmma, sm_90a: Hopper's
asynchronous tensor cores, operands from 128-byte swizzled shared memory; FlashAttention-3's
"swapped" products, see `backends/cuda/bwd/_wgmma_bwd.cu.j2`) for fp16/bf16 at head dims 64 and
128 (dense layouts), on mma.sync tensor cores (m16n8k16, fp16/bf16 inputs, fp32 accumulators;
FlashAttention-2's structure) for fp16/bf16 on sm_80 and newer at head dims that are multiples of
16 up to 128, and on FFMA (every product in fp32) otherwise: fp32, sm_75, other head dims. The pre/prep/finish kernels and the deterministic dQ kernel are FFMA in both. The
forward must have saved the LSE (natural log, [B, H, Lq] fp32, -inf for rows with nothing visible).
"""

from __future__ import annotations

import enum
import dataclasses
from dataclasses import dataclass

from attngen.lang.diagnostics import Diagnostic
from attngen.ir.nodes import Layout, NormKind, NormScope, NormTarget, Variant, norm_bias_name, norm_weight_name, tensors_used
from attngen.plan.forward import DEFAULT_PREFIX, kernel_name
from attngen.plan.op_plan import (BwdEngine, Field, GridRule, KernelRole, OpFamily, OpKernel, OpPlan, RowSpan, TmaMap,
                                  problem_of)
from attngen.plan.limits import MAX_PARAM_BYTES, param_bytes
from attngen.plan.schedule import DEFAULT_ARCH, Arch, SmemLayout, WgmmaLoads
from attngen.ir.nodes import TileConfig

THREADS = 256  # per CTA of the dK/dV and dQ kernels
PRE_THREADS = 256  # per CTA of the grid-stride pre / convert kernels (8 warps, a row each)
PRE_MAX_BLOCKS = 4096
# Kernels that sum norm weight gradients (dgamma, dbeta over every row) add each block's rows in
# shared memory first and then once into the global sums: at most this many blocks, so the global
# fp32 atomics are at most this many per element (a row each made e.g. 65536 a weight element in
# the pre-LN block's token norm, all on the same few thousand addresses).
NORM_GRAD_MAX_BLOCKS = 1024
# The per-row kernels' 16-byte vector paths (fp16 / bf16: 8 elements a load or store). A token of a
# token-scope q norm stays in one warp's registers: H*D / 256 vectors a lane, at most TOK_MAX_VECS.
VEC_ELEMS = 8
TOK_MAX_VECS = 8
TILE_CHOICES = (64, 32, 16)  # square tiles, the largest whose shared memory fits the arch
TC_BLOCK_M = 64  # tensor-core dK/dV kernel: query rows a step
# Key rows a CTA (16 a warp), the largest that fits: 128 halves the Q/dO traffic and dQ atomics
# per key of 64 (FlashAttention-2's choice); it needs head dims that are multiples of 32 (each warp
# then takes whole 16-column blocks of dQ).
TC_BLOCK_N_CHOICES = (128, 64)
# The tensor-core kernels start each CTA's walk over the query tiles at its own key tile's index,
# so the CTAs of a head do not all add dQ into the same rows at once (docs/DECISIONS.md#the-rotated-walks-switch).

TC_MAX_DIM = 128  # head dims (multiples of 16) the tensor-core engine serves


class WgDq(enum.Enum):
    """How the wgmma dK/dV kernel adds a step's dQ partial into ws_dq (the atomic dQ mode): a third
    warpgroup of few registers (setmaxnreg) takes each step's tile, staged row-major by the
    consumers (rows padded to stay conflict-free, SCALE applied, two buffers), and adds each row by
    one cp.reduce.async.bulk, so the consumers' next products never wait on the reductions. The
    modes measured against it: docs/DECISIONS.md#dq-reductions."""

    WG_BULK = "wgbulk"


class WgPrefetch(enum.Enum):
    """Where a wgmma dK/dV step issues the next step's cp.async loads (schedule only: every mode
    computes the same bits)."""

    TOP = "top"  # at the top of the step, before its first product
    UNDER_DQ = "under_dq"  # right after the step's dQ product is issued (the last dK product in the
    # deterministic kernel), so that their address arithmetic runs under a product in flight


def wg_prefetch(v: Variant) -> WgPrefetch:
    """The wgmma step's prefetch point. UNDER_DQ keeps the walk's results (the next step's head and
    query tile) live across the step's products; with masks that read tensors the mask's own
    indices are live there too and ptxas spills, so only masks without tensors take UNDER_DQ
    (docs/DECISIONS.md#bwd-prefetch-point)."""
    return WgPrefetch.TOP if tensors_used(v.mask) else WgPrefetch.UNDER_DQ


# How the wgmma dK/dV kernel copies its K, V tiles and each step's Q and dO tiles (the LSE and
# delta rows stay 4-byte cp.async: a descriptor needs 16-byte row strides, which Lq * 4 bytes
# need not be): TMA (cp.async.bulk.tensor from one consumer thread, completing on a stage's
# mbarrier, so that the other 255 threads issue no copies and compute no addresses), or cp.async
# from all 256 consumer threads where the descriptors do not fit the parameter space (`wg_tma_room`;
# docs/DECISIONS.md#the-backwards-copy-switches).
WG_LOADS = WgmmaLoads.TMA


def wg_tma_room(fields: tuple[Field, ...], maps: int = 4) -> bool:
    """Whether `maps` 128-byte descriptors (64-byte aligned: the TMA copies' four) fit the kernel's parameter space after the ABI fields (else the kernel
    keeps cp.async)."""
    ends = param_bytes([f.ctype for f in fields])
    end = ends[-1] if ends else 0
    return (end + 63) // 64 * 64 + maps * 128 <= MAX_PARAM_BYTES


def wg_tma_maps(op: OpPlan, v: Variant) -> tuple[TmaMap, ...]:
    """The TMA descriptors the wgmma dK/dV kernel takes after its ABI fields (empty with cp.async):
    Q (Q' in ws_q under a q pre-norm), dO (dO' in ws_do under the o post-norm) in boxes of a step's
    query rows, K (K' in ws_k under a k pre-norm) and V in boxes of the CTA's key rows. A
    workspace's strides are its [B, heads, L, D] rows'."""
    bp = op.backward
    assert bp is not None
    if bp.wg_loads != WgmmaLoads.TMA:
        return ()
    return (TmaMap("tm_q", "ws_q" if bp.q_norm else "q", bp.tc_block_m, v.head_dim, v.heads, "Lq"),
            TmaMap("tm_do", "ws_do" if bp.o_norm else "dO", bp.tc_block_m, v.value_head_dim, v.heads, "Lq"),
            TmaMap("tm_k", "ws_k" if bp.k_norm else "k", bp.tc_block_n, v.head_dim, v.kv_heads, "Lk"),
            TmaMap("tm_v", "v", bp.tc_block_n, v.value_head_dim, v.kv_heads, "Lk"))


# The wgmma dK/dV kernel: a CTA per 128 keys, two warpgroups of 64 keys each (the wgmma M
# dimension), 64 query rows a step (the N of S^T and dP^T, the M of dQ), or WG_BLOCK_M_D64 at
# head dims 64: a step of 128 queries runs S^T, dP^T, the softmax gradient, dV and dK as two
# sub-steps of WG_SUB_M queries (the registers of 64) and one barrier and one dQ product for both
# (see `wg_block_m`).
WG_BLOCK_M = 64
WG_BLOCK_M_D64 = 128
WG_SUB_M = 64
WG_BLOCK_N = 128
WG_THREADS = 256
WG_DQ_PAD = 8  # fp32 words padding each staged dQ row
# The dQ warpgroup's threads and the registers setmaxnreg leaves it and gives the two consumer
# warpgroups: 128 * 24 + 256 * 240 = 384 * 168, the allocation of a 384-thread CTA
# (`wg_launch_regs`). setmaxnreg.inc waits for registers that decrements freed, so the counts must
# fit that allocation, not merely the register file (docs/DECISIONS.md#dq-warpgroup-registers).
WG_DQ_THREADS = 128
WG_DQ_REGS = 24
WG_CONSUMER_REGS = 240


def wg_launch_regs(threads: int) -> int:
    """Registers a thread a CTA of `threads` is launched with at one CTA an SM: the register file
    (65536) over its threads, in units of 8."""
    return 65536 // threads // 8 * 8


# The atomic dQ mode's reductions: docs/DECISIONS.md#dq-reductions.
WG_DQ = WgDq.WG_BULK
WG_DIMS = (64, 128)  # head dims (q/k and v) the wgmma engine takes: whole 128-byte swizzle rows


@dataclass(frozen=True, slots=True)
class BwdRules:
    """The backward's decisions beside its kernels (`OpPlan.backward`); the dK/dV kernel carries
    the engine (`OpPlan.engine`)."""

    deterministic: bool
    block_m: int  # the FFMA kernels' square tile
    block_n: int
    q_norm: bool = False  # q pre-norm: Q' in ws_q, a norm backward for dq
    q_norm_token: bool = False  # ... at token scope: the prep and finish kernels take a token (H*D) a row
    o_norm: bool = False  # o post-norm: `o` is O' (before the norm); the pre kernel writes dO' into ws_do
    k_norm: bool = False  # k pre-norm: K' in ws_k, dK' in ws_dk, a norm backward for dk
    engine_reason: str = ""  # why the dK/dV kernel's engine (for explain)
    tc_block_m: int = 0  # the tensor-core dK/dV kernel's tile (0 on FFMA)
    tc_block_n: int = 0
    # `layout varlen`: B packed sequences of Lq = total_q (Lk = total_k) rows. The per-row kernels
    # run the packed rows as one sequence; the tile kernels run tile slots of the sequences
    # (total / tile + B of them along x, the forward's rule) and find theirs by a binary search.
    varlen: bool = False
    # The token-scope q norm's 16-byte vector paths: vectors a lane (0: none), and whether the
    # finish kernel's dgamma/dbeta sums take a shared-memory slice a warp.
    tok_vecs: int = 0
    tok_grad_slices: bool = False
    wg_dq: WgDq | None = None  # the wgmma kernel's dQ reductions (None: another engine, or deterministic)
    wg_prefetch: WgPrefetch | None = None  # the wgmma step's prefetch point (None: another engine)
    wg_loads: WgmmaLoads | None = None  # the wgmma kernel's tile copies (None: another engine; `wg_tma_maps`)

    @property
    def tc_rotate(self) -> bool:
        """Whether the dK/dV kernel walks its query tiles from a rotated start: always on the
        tensor-core engines (docs/DECISIONS.md#the-rotated-walks-switch)."""
        return self.tc_block_m > 0


def unsupported(v: Variant) -> list[Diagnostic]:
    """What the backward kernels do not differentiate, located at the construct: a paged KV cache
    (decode-time inference state, not a training workload) and a `sink` under the o post-norm.
    Everything else trains: masks, scores, GQA, varlen, q/k pre-norms (head scope, q also token
    scope), the o post-norm and the residual."""
    out = []
    if v.quantized:
        # No silent full-precision fallback: a quantized forward's gradient is not the one of the
        # spec it was trained through.
        out.append(Diagnostic(
            "--pass backward: quantized attention has no backward kernels yet", v.quants[0].span or v.span,
            "train the full-precision spec (drop `quant` and the quantized `dtype`) and quantize for inference"))
    on = v.norm(NormTarget.O)
    if on is not None and v.sink is not None:
        out.append(Diagnostic(
            "--pass backward: `sink` with `norm o` is not supported by the backward kernels yet",
            on.span or v.span, "the sink's gradient is taken from the output before the post-norm; drop one of the two to train"))
    if v.page_size is not None:
        out.append(Diagnostic(
            "--pass backward: `kv_cache paged` is decode-time inference state, not a training workload; the backward "
            "takes contiguous K/V",
            v.span, "train the same attention without `kv_cache paged` (contiguous K/V, layout bshd/bhsd/varlen); "
                    "the paged cache is filled from the trained weights at inference"))
    return out


def smem_floats(block_m: int, block_n: int, D: int, Dv: int, deterministic_dq: bool) -> int:
    """fp32 words of shared memory of the dK/dV kernel (or of the dQ kernel)."""
    common = block_n * (D + 1) + block_n * (Dv + 1) + block_m * (D + 1) + block_m * (Dv + 1) + 2 * block_m * (block_n + 1) + 2 * block_m
    return common + (block_m * D if deterministic_dq else block_n * (D + Dv))


def choose_tile(v: Variant, arch: Arch) -> int:
    """The largest square tile with room for two CTAs an SM, else the largest that fits at all."""
    def need(t: int) -> int:
        return 4 * max(smem_floats(t, t, v.head_dim, v.value_head_dim, False), smem_floats(t, t, v.head_dim, v.value_head_dim, True))

    for limit in (arch.smem_per_sm // 2 - 1024, arch.smem_budget):
        for t in TILE_CHOICES:
            if need(t) <= limit:
                return t
    raise ValueError(f"variant {v.name}: the backward's smallest tile ({TILE_CHOICES[-1]}) does not fit {arch.value}'s shared memory")


def tc_smem_bytes(D: int, Dv: int, block_n: int) -> int:
    """Dynamic shared memory of the tensor-core dK/dV kernel: K, V (one tile), Q, dO (two stages),
    dS^T (elements, rows padded by 16 bytes), LSE and delta (two stages, fp32)."""
    rows = block_n * (D + 8) + block_n * (Dv + 8) + 2 * TC_BLOCK_M * (D + 8) + 2 * TC_BLOCK_M * (Dv + 8) + block_n * (TC_BLOCK_M + 8)
    return 2 * rows + 4 * 4 * TC_BLOCK_M


def tc_block_n(v: Variant, arch: Arch) -> int | None:
    """The tensor-core kernel's key tile for a variant (None: no choice fits)."""
    for bn in TC_BLOCK_N_CHOICES:
        warps = bn // 16
        if (v.head_dim * (TC_BLOCK_M // 16)) % (16 * warps) == 0 and warps % (TC_BLOCK_M // 16) == 0 \
                and tc_smem_bytes(v.head_dim, v.value_head_dim, bn) <= arch.smem_budget:
            return bn
    return None


def wg_block_m(D: int, Dv: int, deterministic: bool = False) -> int:
    """Query rows a step of the wgmma dK/dV kernel: WG_BLOCK_M_D64 at D = Dv = 64 in the atomic dQ
    mode (half the barriers, loads and dQ reductions a query, and a dQ product of N = 64 rather
    than 32, which reads shared memory faster than the tensor cores take it; its larger shared
    tiles and dQ accumulators fit only at this head dim), else WG_BLOCK_M (the deterministic mode's
    kernel has no dQ product, and its time is the FFMA dQ kernel's)."""
    return WG_BLOCK_M_D64 if D == Dv == 64 and not deterministic else WG_BLOCK_M


def wg_dq_cols(D: int, block_m: int) -> int:
    """dQ columns a warpgroup computes: half of D with 64 queries a step (the warpgroups split the
    columns), all of D with 128 (they split the rows)."""
    return D if block_m > 64 else D // 2


def wg_dq_mode(D: int, Dv: int, deterministic: bool = False) -> WgDq | None:
    """The wgmma kernel's dQ reductions (WG_DQ); None in the deterministic mode, whose dQ kernel
    adds nothing."""
    return None if deterministic else WG_DQ


def wg_dq_split(mode: WgDq | None) -> bool:
    """Whether the dQ mode adds dQ from a third warpgroup (every atomic mode)."""
    return mode is not None


def wg_threads(D: int, Dv: int, deterministic: bool = False) -> int:
    """Threads of the wgmma dK/dV kernel: its two warpgroups, and the dQ warpgroup in the atomic
    dQ mode."""
    return WG_THREADS + (WG_DQ_THREADS if wg_dq_split(wg_dq_mode(D, Dv, deterministic)) else 0)


def wg_smem_bytes(D: int, Dv: int, deterministic: bool = False, tma: bool = False) -> int:
    """Dynamic shared memory of the wgmma dK/dV kernel: K, V (one tile), Q, dO (two stages), dS^T
    (elements; all 128-byte swizzled, 1024-byte aligned), LSE and delta (two stages, fp32), in the
    atomic dQ mode two dQ tiles (rows of D + WG_DQ_PAD words) and a 16-byte header each, and with
    TMA copies the mbarriers of the two stages and of K and V (8 bytes each, after the dQ staging)."""
    bm = wg_block_m(D, Dv, deterministic)
    return (2 * (WG_BLOCK_N * D + WG_BLOCK_N * Dv + 2 * bm * D + 2 * bm * Dv + WG_BLOCK_N * bm) + 4 * 4 * bm
            + (2 * (4 * bm * (D + WG_DQ_PAD) + 16) if wg_dq_mode(D, Dv, deterministic) else 0)
            + (24 if tma else 0))


def wgmma_fits(v: Variant, arch: Arch) -> str | None:
    """None when the wgmma engine can run the variant on the arch, else why not (explain's wording)."""
    if arch != Arch.SM90A:
        return f"{arch.value} has no wgmma (sm_90a only)"
    if not v.dtype.info.has_mma("m64nNk16"):
        return f"{v.dtype.value} inputs"
    if v.layout == Layout.VARLEN or v.page_size is not None:
        return "packed (varlen) or paged layouts"
    # Its kernel reads Q (ws_q under a q pre-norm of either scope: the prep kernel writes it [B, H,
    # Lq, D] for a token-scope norm too), dO (dO' in ws_do under the o post-norm), the LSE/delta
    # rows and the dQ'/dK' workspaces in the dense [B, H, L] row order, as the mma.sync engine does.
    for name, d in (("head_dim", v.head_dim), ("value head dim", v.value_head_dim)):
        if d not in WG_DIMS:
            return f"{name} {d}: the wgmma engine takes {' and '.join(map(str, WG_DIMS))}"
    if wg_smem_bytes(v.head_dim, v.value_head_dim, tma=True) > arch.smem_budget:
        return f"its tiles do not fit {arch.value}'s shared memory"
    return None


def choose_engine(v: Variant, arch: Arch, prefer: BwdEngine | None = None) -> tuple[BwdEngine, str]:
    """The dK/dV engine of a variant on an arch, and why (explain's wording). `prefer` asks for an
    engine (ValueError when it cannot run the variant); None: the default, wgmma where it fits
    (docs/DECISIONS.md#the-backwards-engine-switch)."""
    if prefer == BwdEngine.WGMMA:
        why = wgmma_fits(v, arch)
        if why is not None:
            raise ValueError(f"variant {v.name}: the wgmma backward engine cannot run it: {why}")
        return BwdEngine.WGMMA, "requested; fp16/bf16 on sm_90a at head dims 64 / 128"
    why_not = wgmma_fits(v, arch)
    if prefer is None and why_not is None:
        return BwdEngine.WGMMA, "fp16/bf16 on sm_90a at head dims 64 / 128"
    engine, reason = _choose_engine_sm80(v, arch)
    if arch == Arch.SM90A and why_not is not None and prefer is None:
        reason += f"; not wgmma: {why_not}"
    if prefer is not None and prefer != engine:
        raise ValueError(f"variant {v.name}: the {prefer.value} backward engine cannot run it on {arch.value} ({engine.value}: {reason})")
    return engine, reason


def _choose_engine_sm80(v: Variant, arch: Arch) -> tuple[BwdEngine, str]:
    """The mma.sync or FFMA engine of a variant, and why."""
    if not v.dtype.info.has_mma("m16n8k16"):
        return BwdEngine.FFMA, f"{v.dtype.value} inputs: exact fp32 products"
    if not (arch.mma_k16 and arch.cp_async):
        return BwdEngine.FFMA, f"{arch.value} has no m16n8k16 mma.sync / cp.async (sm_80 and newer)"
    for name, d in (("head_dim", v.head_dim), ("value head dim", v.value_head_dim)):
        if d % 16 or d > TC_MAX_DIM:
            return BwdEngine.FFMA, f"{name} {d}: the tensor-core engine takes multiples of 16 up to {TC_MAX_DIM}"
    if tc_block_n(v, arch) is None:
        return BwdEngine.FFMA, f"the tensor-core tiles do not fit {arch.value}'s shared memory"
    return BwdEngine.MMA, "fp16/bf16 inputs on sm_80+"


def _fields(v: Variant) -> tuple[Field, ...]:
    e, w = "const elem_t* __restrict__", "elem_t* __restrict__"
    f = [
        Field(e, "q", "query (the forward's input)"),
        Field(e, "k", "keys"),
        Field(e, "v", "values"),
        *([Field(e, "o", "O', the attention output before the o post-norm and the residual (the training forward's output)"),
           Field(e, "dO", "gradient at the output y = norm(O') (+ x) (o's shape)")] if v.norm(NormTarget.O) else
          [Field(e, "o", "the forward's output"),
           Field(e, "dO", "gradient at the output (o's shape)")]),
        Field("const float* __restrict__", "lse", "the forward's log-sum-exp " + ("[H, total_q]" if v.layout == Layout.VARLEN else "[B, H, Lq]") + ", contiguous, natural log"),
        Field(w, "dq", "gradient of q (q's shape)"),
        Field(w, "dk", "gradient of k (k's shape)"),
        Field(w, "dv", "gradient of v (v's shape)"),
        Field("float* __restrict__", "ws_delta", "workspace, B*H*Lq floats: rowsum(dO * O') per query row"),
        Field("float* __restrict__", "ws_dq", "workspace, B*H*Lq*D floats: dQ' (of the normalised q) in fp32"),
        *([Field(w, "ws_q", "workspace, B*H*Lq*D elements: the pre-normalised queries, written by the prep kernel")]
          if v.norm(NormTarget.Q) else []),
        *([Field(w, "ws_k", "workspace, B*Hkv*Lk*D elements: the pre-normalised keys, written by the prep kernel"),
           Field("float* __restrict__", "ws_dk", "workspace, B*Hkv*Lk*D floats: dK' (of the normalised k) in fp32")]
          if v.norm(NormTarget.K) else []),
        *([Field(w, "ws_do", "workspace, B*H*Lq*Dv elements: dO' (the gradient at the o post-norm's input), written by the pre kernel")]
          if v.norm(NormTarget.O) else []),
        Field("int", "B", "batch"),
        Field("int", "Lq", "query length"),
        Field("int", "Lk", "key length"),
        # As in the forward's ABI (position offsets): masks and scores read positions q + q_offset,
        # kv + kv_offset and lengths Lq_total, Lk_total. The backward runs whole sequences for now:
        # 0, 0, Lq, Lk.
        Field("int", "q_offset", "global position of query row 0 (0: the backward runs whole sequences)"),
        Field("int", "kv_offset", "global position of key row 0 (0)"),
        Field("int", "Lq_total", "global query length the mask sees (Lq)"),
        Field("int", "Lk_total", "global key length the mask sees (Lk)"),
        *([Field("int", "total_q", "varlen: the packed query rows (= Lq; the LSE is [H, total_q])"),
           Field("int", "total_k", "varlen: the packed key rows (= Lk)")] if v.layout == Layout.VARLEN else []),
    ]
    for t in ("q", "k", "v", "o", "dO", "dq", "dk", "dv"):
        for s, what in (("sb", "batch"), ("sh", "head"), ("ss", "sequence")):
            f.append(Field("long long", f"{t}_{s}", f"{t} {what} stride, elements"))
    for d in v.runtime_inputs():
        f.append(Field(f"const {d.dtype.info.cuda}* __restrict__", f"in_{d.name}", f"runtime input {d.name}: {d.dtype.value}"))
        for i in range(len(d.shape)):
            f.append(Field("int", f"in_{d.name}_n{i}", f"{d.name} size of dim {i}"))
        for i in range(len(d.shape)):
            f.append(Field("long long", f"in_{d.name}_s{i}", f"{d.name} stride of dim {i}, elements"))
    for name in learnable(v) + norm_params(v):
        f.append(Field("float* __restrict__", f"grad_{name}",
                       f"gradient of {name}: fp32, contiguous in {name}'s shape, zeroed by the caller (nullptr: not computed)"))
    return tuple(f)


def norm_params(v: Variant) -> tuple[str, ...]:
    """The affine weights (and layernorm biases) of the q/k pre-norms and the o post-norm, which the
    backward kernels can return gradients for."""
    out: list[str] = []
    for t in (NormTarget.Q, NormTarget.K, NormTarget.O):
        n = v.norm(t)
        if n is not None and n.affine:
            out.append(norm_weight_name(t))
            if n.kind == NormKind.LAYERNORM:
                out.append(norm_bias_name(t))
    return tuple(out)


def learnable(v: Variant) -> tuple[str, ...]:
    """Score inputs the backward kernels can return a gradient for (`bias`, `alibi(slopes)`,
    `rel_bias` tables, float lookups in custom scores), in first-appearance order."""
    from attngen.analysis import derivative

    return derivative.learnable_tensors(v.scores)


def tok_vecs(v: Variant) -> int:
    """16-byte vectors a lane in the token-scope q norm's vector paths of the prep and finish kernels
    (a warp a token, its H*D row in registers); 0: none (no token norm, fp32, or a row that is not
    a whole number of 256-element warp loads)."""
    qn = v.norm(NormTarget.Q)
    tok = v.heads * v.head_dim
    if qn is None or qn.scope != NormScope.TOKEN or v.dtype.info.vec_elems != VEC_ELEMS or v.head_dim % VEC_ELEMS:
        return 0
    n, rem = divmod(tok, 32 * VEC_ELEMS)
    return n if rem == 0 and n <= TOK_MAX_VECS else 0


_WG_DQ_DOC = {None: "", WgDq.WG_BULK: "; dQ a step staged in shared memory and added by bulk fp32 reductions (cp.reduce.async.bulk, a row each) from a third warpgroup"}


def plan(v: Variant, arch: Arch = DEFAULT_ARCH, *, deterministic: bool = False, engine: BwdEngine | None = None,
         prefix: str = DEFAULT_PREFIX) -> OpPlan:
    """The backward kernels of a variant, in launch order, as an OpPlan of the backward family
    (every symbol under `{prefix}_{variant}_bwd`). ValueError if a construct is unsupported (see
    `unsupported`, which locates it), no tile fits, the requested `engine` (None: the default of
    `choose_engine`) cannot run it, or `prefix` is not a C identifier."""
    bad = unsupported(v)
    if bad:
        raise ValueError("; ".join(d.message for d in bad))
    t = choose_tile(v, arch)
    base = kernel_name(v, prefix) + "_bwd"
    qn, kn = v.norm(NormTarget.Q) is not None, v.norm(NormTarget.K) is not None
    q_token = qn and v.norm(NormTarget.Q).scope == NormScope.TOKEN
    on = v.norm(NormTarget.O) is not None
    varlen = v.layout == Layout.VARLEN
    # The per-row kernels' rows: a query row a head (a token with a token-scope q norm), a key row a KV head.
    q_rows, k_rows = (RowSpan(None) if q_token else RowSpan(v.heads)), RowSpan(v.kv_heads, keys=True)

    def rows_kernel(role: KernelRole, rows: tuple[RowSpan, ...], grads: int, doc: str) -> OpKernel:
        """A grid-stride kernel, a warp a row; `grads`: the shared floats it sums norm weight
        gradients in (its grid then capped at NORM_GRAD_MAX_BLOCKS)."""
        return OpKernel(name=f"{base}_{role.value.removeprefix('bwd_')}", role=role, threads=PRE_THREADS, grid_rule=GridRule.ROWS,
                        smem=SmemLayout(4 * grads), min_blocks=0, func=f"ag_{role.value}", doc=doc, rows=rows,
                        max_blocks=NORM_GRAD_MAX_BLOCKS if grads else PRE_MAX_BLOCKS, varlen=varlen)

    pre_grads = _fits(arch, _grad_floats(v, NormTarget.O, v.value_head_dim))
    kernels = [rows_kernel(KernelRole.BWD_PRE, (RowSpan(v.heads),), pre_grads,
                           ("the o post-norm's backward: dO' (ws_do) from dO and O', dgamma/dbeta (summed per block in shared memory); delta = rowsum(dO' * O')" if on and pre_grads
                            else "the o post-norm's backward: dO' (ws_do) from dO and O'; delta = rowsum(dO' * O')" if on
                            else "delta = rowsum(dO * O')") + " per query row" + ("" if deterministic else "; zero the dQ accumulator"))]
    if qn or kn:
        kernels.append(rows_kernel(KernelRole.BWD_PREP, tuple(r for r, use in ((q_rows, qn), (k_rows, kn)) if use), 0,
                                   "the pre-normalised " + " and ".join(n for n, use in (("queries (ws_q)", qn), ("keys (ws_k)", kn)) if use)
                                   + ", rounded as the forward rounds them" + (" (q: a warp a token, statistics over its H*D row)" if q_token else "")))
    eng, reason = choose_engine(v, arch, engine)
    fields = _fields(v)
    dkdv, loads, wg_dq = _dkdv_kernel(v, arch, base, t, eng, deterministic, fields)
    kernels.append(dkdv)
    if deterministic:
        kernels.append(OpKernel(name=f"{base}_dq", role=KernelRole.BWD_DQ, threads=THREADS, grid_rule=GridRule.TILES,
                                tile=TileConfig(t, t, THREADS // 32, 1), min_blocks=0, func="ag_bwd_dq", varlen=varlen,
                                smem=SmemLayout(4 * smem_floats(t, t, v.head_dim, v.value_head_dim, True)),
                                doc="dQ' per query tile over the visible key tiles, no atomics"))
    q_sums, k_sums = _grad_floats(v, NormTarget.Q, v.heads * v.head_dim if q_token else v.head_dim), _grad_floats(v, NormTarget.K, v.head_dim)
    fin_grads = _fits(arch, q_sums + k_sums)
    tv, slices = tok_vecs(v), False
    if tv and q_sums:
        # The token vector path sums dgamma/dbeta in a slice a warp with plain adds (a float
        # atomicAdd to shared memory is a compare-and-swap loop); no room for them: no vector path.
        if 4 * ((PRE_THREADS // 32) * q_sums + k_sums) <= arch.smem_budget:
            fin_grads, slices = (PRE_THREADS // 32) * q_sums + k_sums, True
        else:
            tv = 0
    kernels.append(rows_kernel(KernelRole.BWD_FINISH, (q_rows, k_rows) if kn else (q_rows,), fin_grads,
                               "dq from dQ'" + (" through the token-scope q norm's backward (a warp a token: dX over its H*D row, dgamma, dbeta)"
                                                if q_token else " through the q norm's backward" if qn else "") + (" (+ dO: residual)" if v.residual else "")
                               + ("; dk from dK' through the k norm's backward" if kn else "") + ", a warp a row"
                               + ("; weight gradients summed per block in shared memory" if fin_grads else "")
                               + (" (a slice a warp, 16-byte vector path)" if slices else "")))
    wg = eng == BwdEngine.WGMMA
    rules = BwdRules(deterministic, t, t, qn, q_token, on, kn, reason, dkdv.tile.block_m if eng != BwdEngine.FFMA else 0,
                     dkdv.tile.block_n if eng != BwdEngine.FFMA else 0, varlen, tv, slices, wg_dq,
                     wg_prefetch(v) if wg else None, loads)
    return OpPlan(problem=problem_of(v, arch), kernels=tuple(kernels), fields=fields, family=OpFamily.BACKWARD, base_name=base,
                  backward=rules)


def _grad_floats(v: Variant, target: NormTarget, n_elems: int) -> int:
    """Shared floats a block sums a norm's weight (and bias) gradients in (0: none learnable)."""
    n = v.norm(target)
    if n is None or not n.affine:
        return 0
    return n_elems * (2 if n.kind == NormKind.LAYERNORM else 1)


def _fits(arch: Arch, floats: int) -> int:
    """The block sums where they fit the arch's shared memory (else 0: global atomics a row)."""
    return floats if 4 * floats <= min(arch.smem_budget, 48 * 1024) else 0


def _dkdv_kernel(v: Variant, arch: Arch, base: str, t: int, eng: BwdEngine, deterministic: bool,
                 fields: tuple[Field, ...]) -> tuple[OpKernel, WgmmaLoads | None, WgDq | None]:
    """The dK/dV kernel on `eng` (its tile, threads, shared memory, copies and dQ reductions)."""
    atomics = "" if deterministic else "; dQ by fp32 atomics"
    common = dict(name=f"{base}_dkdv", role=KernelRole.BWD_DKDV, grid_rule=GridRule.TILES, engine=eng, func="ag_bwd_dkdv",
                  over_keys=True, varlen=v.layout == Layout.VARLEN)
    if eng == BwdEngine.WGMMA:
        loads = WG_LOADS if WG_LOADS != WgmmaLoads.TMA or wg_tma_room(fields) else WgmmaLoads.CP_ASYNC
        wg_dq = wg_dq_mode(v.head_dim, v.value_head_dim, deterministic)
        n = wg_threads(v.head_dim, v.value_head_dim, deterministic)
        return OpKernel(**common, threads=n, tile=TileConfig(wg_block_m(v.head_dim, v.value_head_dim, deterministic), WG_BLOCK_N, n // 32, 2),
                        smem=SmemLayout(wg_smem_bytes(v.head_dim, v.value_head_dim, deterministic, loads == WgmmaLoads.TMA)),
                        min_blocks=1 if wg_dq_split(wg_dq) else 0,
                        doc="warpgroup MMA (wgmma, fp32 accumulators): dK, dV per key tile over the visible "
                            "query tiles of the group" + _WG_DQ_DOC[wg_dq]
                            + ("; K, V and each step's Q and dO copied by TMA (one thread, the stage's mbarrier)" if loads == WgmmaLoads.TMA else "")), loads, wg_dq
    if eng == BwdEngine.MMA:
        bn = tc_block_n(v, arch)
        assert bn is not None  # choose_engine picks mma.sync only where a tile fits
        return OpKernel(**common, threads=32 * bn // 16, tile=TileConfig(TC_BLOCK_M, bn, bn // 16, 2), min_blocks=0,
                        smem=SmemLayout(tc_smem_bytes(v.head_dim, v.value_head_dim, bn)),
                        doc="tensor cores (mma.sync m16n8k16, fp32 accumulators): dK, dV per key tile over the visible "
                            "query tiles of the group" + atomics), None, None
    return OpKernel(**common, threads=THREADS, tile=TileConfig(t, t, THREADS // 32, 1), min_blocks=0,
                    smem=SmemLayout(4 * smem_floats(t, t, v.head_dim, v.value_head_dim, False)),
                    doc="dK, dV per key tile over the visible query tiles of the group" + atomics), None, None


def describe(v: Variant, arch: Arch = DEFAULT_ARCH) -> list[str]:
    """`attngen explain`'s lines about the backward pass of a variant."""
    from attngen.analysis import derivative
    from attngen.lang.printer import print_expr

    out = ["Backward pass (attngen compile --pass backward): gradients of sum(dO * O)"]
    out.append(f"  d(score)/ds = {print_expr(derivative.score_derivative(v.scores))} (from the score expressions, by the chain rule)")
    for ld, de in derivative.param_derivatives(v.scores):
        idx = ", ".join(print_expr(i) for i in ld.indices)
        out.append(f"  d(score)/d{ld.tensor}[{idx}] = {print_expr(de)} (on request: fp32 atomics of dS times it)")
    bad = unsupported(v)
    if bad:
        for d in bad:
            where = f" (line {d.span.line})" if d.span else ""
            out.append(f"  refused{where}: {d.message.removeprefix('--pass backward: ')}")
        return out
    op = plan(v, arch)
    bp = op.backward
    assert bp is not None
    if op.engine == BwdEngine.WGMMA:
        out.append(f"  on {arch.value}: wgmma engine (warpgroup MMA, {v.dtype.value} inputs, fp32 accumulators; {bp.engine_reason}) "
                   f"for {op.base_name}_dkdv, tile {bp.tc_block_m} queries x {bp.tc_block_n} keys (two warpgroups of 64 keys); "
                   "FFMA for the other kernels; P recomputed from the forward's LSE")
    elif op.engine == BwdEngine.MMA:
        out.append(f"  on {arch.value}: tensor-core engine (mma.sync m16n8k16, {v.dtype.value} inputs, fp32 accumulators; {bp.engine_reason}) "
                   f"for {op.base_name}_dkdv, tile {bp.tc_block_m} queries x {bp.tc_block_n} keys; FFMA for the other kernels; "
                   "P recomputed from the forward's LSE")
    elif not v.dtype.info.tensor_cores:
        out.append(f"  on {arch.value}: FFMA engine (fp32 products for every dtype), tile {bp.block_m} x {bp.block_n}; P recomputed from the forward's LSE")
    else:
        out.append(f"  on {arch.value}: FFMA engine (fp32 products), tile {bp.block_m} x {bp.block_n}, not tensor cores: {bp.engine_reason}; "
                   "P recomputed from the forward's LSE")
    if bp.varlen:
        out.append("  layout varlen: the per-row kernels run the packed rows as one sequence; dK/dV (and the deterministic dQ) "
                   "run tile slots, total / tile + B along x, each finding its sequence by a binary search over cu_seqlens "
                   "and walking only that sequence's visible tiles")
    for k in op.kernels:
        out.append(f"  {k.name}: {k.threads} threads, {k.smem.bytes} bytes of shared memory; {k.doc}")
    if op.engine != BwdEngine.FFMA:
        out.append(f"  --deterministic: dQ by an FFMA kernel per query tile (tile {bp.block_m} x {bp.block_n}) instead of fp32 atomics "
                   "(bitwise reproducible); dK, dV stay on tensor cores")
    else:
        out.append("  --deterministic: dQ by a kernel per query tile instead of fp32 atomics (bitwise reproducible)")
    return out



def training_variant(v: Variant) -> Variant:
    """The forward whose outputs the backward reads: `v` writing the LSE; with `norm o`, also
    without the post-norm and the residual, so that its output is O', the attention output the
    norm normalises (the backward's pre kernel maps dY to dO' through the norm with it; the
    caller applies y = norm(O') (+ x), `apply_o_norm`)."""
    v = dataclasses.replace(v, lse=True, nan_check=False)
    if v.norm(NormTarget.O) is None:
        return v
    return dataclasses.replace(v, norms=tuple(n for n in v.norms if n.target != NormTarget.O), residual=False)


def o_norm_inputs(v: Variant) -> tuple[str, ...]:
    """The runtime inputs of the o post-norm (read by `apply_o_norm`, not by `training_variant`'s forward)."""
    n = v.norm(NormTarget.O)
    if n is None or not n.affine:
        return ()
    return (norm_weight_name(NormTarget.O),) + ((norm_bias_name(NormTarget.O),) if n.kind == NormKind.LAYERNORM else ())

__all__ = ["training_variant", "o_norm_inputs",
    "describe",
    "learnable",
    "norm_params", "BwdEngine", "BwdRules", "WG_BLOCK_M", "WG_BLOCK_N", "WG_THREADS", "WG_BLOCK_M_D64", "WG_SUB_M", "WG_DQ_PAD", "WG_DQ_THREADS", "WG_DQ_REGS", "WG_CONSUMER_REGS", "wg_launch_regs", "WG_DQ", "WgDq", "wg_dq_split", "WgPrefetch", "wg_prefetch", "WG_LOADS", "wg_tma_room", "wg_tma_maps", "wg_threads", "wg_dq_mode", "wg_block_m", "wg_dq_cols", "wg_smem_bytes", "wgmma_fits", "TC_BLOCK_M", "TC_BLOCK_N_CHOICES", "choose_engine", "tc_block_n", "tc_smem_bytes", "THREADS", "PRE_THREADS", "choose_tile", "plan", "smem_floats", "unsupported"]
