"""The decode kernel family: planning (stage: schedule/plan, kept apart from the forward's).

Decoding is memory-bound: a few query rows (Lq = 1, or up to ~16 for speculative decoding) read a
long KV cache once. The forward kernel tiles the query rows of one head, so with Lq = 1 each CTA
reads all of K/V for one query row and the GPU idles. The decode family instead

- packs a KV head's whole group of query heads (GQA) times Lq into the M dimension of one
  16-row mma.sync tile, so each K/V tile is read once per group, not once per query head;
- splits the key range (flash-decoding), stream-K style: the call's work is T = B * Hkv *
  m_blocks * ceil(Lk / chunk) units (a row block times a ring chunk of keys), and CTA c of a 1-D
  grid of `ctas` takes units [c * T / ctas, (c + 1) * T / ctas), the same number (to one) for
  every CTA, whether or not `ctas` is a multiple of the row blocks. A CTA streams each row block
  its share meets (a segment) through a cp.async ring, its four warps each taking a quarter of
  every ring chunk, and writes that segment's fp32 partial O and LSE to a workspace
  [B, H, Lq, splits, Dv] (never sized by Lk; `splits` bounds the segments of one row block);
- merges the partials in a small combine kernel that writes O (and `output lse`'s LSE), or, given
  row-block counters (`ws_count`, zero before a launch and left zero by it), in the split kernel:
  the CTA that finishes a row block last merges it. Where every row block is one CTA's whole
  segment (`splits` == 1) the split kernel writes O itself; either way no combine launch.

The schedule is chosen at launch (`SplitSchedule.schedule`, the plan's `split` rules) from B, Hkv,
Lq, Lk and the SM count: whole splits of every row block (ctas = row blocks x splits), so that the
grid fills the GPU in one wave of resident CTAs; other CTA counts are an override. The plan (an
`OpPlan` of the decode family) lists its kernels in launch order (`OpPlan.launches`), so the
runtime launches them without knowing what they do.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from attngen.ir.dtypes import TENSOR_CORE_DTYPES, DType
from attngen.ir.nodes import (Index, Layout, IndexVar, QuantOperand, ScaleGranularity, ScaleSource, TileConfig, Variant,
                              strip_sugar, walk)
from attngen.plan.forward import input_fields
from attngen.plan.op_plan import Field, GridRule, KernelRole, Launch, OpFamily, OpKernel, OpPlan, problem_of
from attngen.plan.schedule import DEFAULT_ARCH, Arch, Engine, SmemLayout

# Query rows (per KV head: group x Lq) up to which `Family.AUTO` picks the decode family.
DECODE_MAX_LQ = 16
DECODE_HEAD_DIMS = (64, 128, 256)
BLOCK_M = 16  # packed query rows a CTA (one m16 MMA tile; more rows take more CTAs)
WARPS = 4
COMBINE_THREADS = 256
# A CTA should stream at least this many ring chunks, or the pipeline never fills.
MIN_CHUNKS_PER_SPLIT = 4
MAX_SPLITS = 256  # CTAs a row block at most (the policy's bound; `splits` may exceed it by one)
# T * ctas must fit a signed 64-bit product in the kernels' share arithmetic.
MAX_UNITS_TIMES_CTAS = 1 << 62


class Family(enum.Enum):
    """Which kernel family runs a call: `auto` picks decode for Lq <= DECODE_MAX_LQ where the
    variant supports it (`decode_unsupported`), the forward otherwise."""

    AUTO = "auto"
    FORWARD = "forward"
    DECODE = "decode"


def quant_unsupported(v: Variant) -> str | None:
    """Why the CUDA kernels cannot run quantized `v` (None for a full-precision spec): none of
    them reads quantized operands yet; the CPU backend and the reference do (docs/QUANT.md)."""
    if not v.quantized:
        return None
    return ("quantized attention (`quant`, quantized `dtype`) is not yet on the CUDA backend; "
            "the CPU backend (--target cpu, attngen fuzz --device cpu) and the NumPy reference run it")


FP8_KV_DTYPES = (DType.FP8_E4M3, DType.FP8_E5M2)
FP8_KV_SCALES = (ScaleGranularity.TENSOR, ScaleGranularity.HEAD, ScaleGranularity.PAGE)
FP8_KV_MIN_CC = 89  # cvt.rn.f16x2.e4m3x2 / e5m2x2


def fp8_kv(v: Variant) -> bool:
    """Whether `v` is the quantized spec the decode family runs: an FP8 KV cache (k and v stored
    fp8_e4m3/e5m2 with `input` scales per tensor, head or page) beside full-precision q and output
    (k and v dequantized as they are read, docs/QUANT.md); no other operand quantized."""
    qk, qv = v.quant(QuantOperand.K), v.quant(QuantOperand.V)
    if qk is None or qv is None or len(v.quants) != 2:
        return False
    if v.q_dtype != v.dtype or v.k_dtype not in FP8_KV_DTYPES or v.v_dtype not in FP8_KV_DTYPES:
        return False
    return all(qn.source == ScaleSource.INPUT and qn.granularity in FP8_KV_SCALES and qn.dtype == stored
               for qn, stored in ((qk, v.k_dtype), (qv, v.v_dtype)))


def fp8_page_scales(v: Variant) -> bool:
    """Whether an FP8 cache has a scale per page (k's or v's): the ring then carries each row's
    scales beside it (4 bytes a row of K and of V a slot)."""
    return fp8_kv(v) and any(qn.granularity == ScaleGranularity.PAGE for qn in v.quants)


def decode_unsupported(v: Variant, arch: Arch | None = None) -> str | None:
    """Why the decode family cannot run `v` (None when it can); with `arch`, also on that target
    (cp.async and m16n8k16 tensor cores, and the head dim's ring in its shared memory). Of the
    quantized specs it runs an FP8 KV cache (`fp8_kv`), on sm_89 and newer."""
    if v.quantized and not fp8_kv(v):
        return quant_unsupported(v)
    if v.quantized and arch is not None and arch.cc < FP8_KV_MIN_CC:
        return f"the decode family dequantizes an FP8 KV cache with the sm_89+ fp8 conversions, not on {arch.value}"
    if v.layout == Layout.VARLEN:
        return "the decode family takes padded batches, not `layout varlen` (packed batches run on the forward family)"
    if not v.dtype.info.has_mma("m16n8k16"):
        takes = "/".join(d.value for d in TENSOR_CORE_DTYPES if d.info.has_mma("m16n8k16"))
        return f"the decode family runs {takes} on tensor cores, not {v.dtype.value}"
    if v.head_dim != v.value_head_dim or v.head_dim not in DECODE_HEAD_DIMS:
        return (f"the decode family implements head dims {', '.join(map(str, DECODE_HEAD_DIMS))} with Dv == D, "
                f"not D={v.head_dim}, Dv={v.value_head_dim}")
    if v.norms:
        return "the decode family has no pre/post norms (use the forward family)"
    if v.residual:
        return "the decode family has no residual (use the forward family)"
    if any(d.sorted for d in v.runtime_inputs()):
        # The forward binder checks `sorted` promises on the device before each launch; the decode
        # runtime has no such check yet, and an unchecked broken promise is a silently wrong answer.
        return "the decode family does not check `sorted` inputs on the device yet (use the forward family)"
    if arch is not None:
        if not arch.cp_async or not arch.mma_k16:
            return f"the decode family needs cp.async and m16n8k16 tensor cores (sm_80 or newer), not {arch.value}"
        block_n, stages = _tile(v, arch)
        need = smem_bytes(v, block_n, stages)
        if need > arch.smem_budget:
            return (f"the decode family's D={v.head_dim} ring needs {need // 1024} KiB of shared memory a block, "
                    f"more than {arch.value}'s {arch.smem_budget // 1024} KiB")
    return None


def forward_unsupported(v: Variant) -> str | None:
    """Why the forward family cannot run `v` (None when it can)."""
    if v.quantized:
        from attngen.plan.quant_fwd import forward_problem

        return forward_problem(v)
    if v.page_size is not None:
        return "`kv_cache paged` runs on the decode family (attngen.compile(..., family=\"decode\") or \"auto\")"
    return None


def mask_uses_head(v: Variant) -> bool:
    """Whether the mask reads `h` (then a CTA's packed rows, which span heads, are classified
    head by head)."""
    return any(isinstance(n, Index) and n.var == IndexVar.H for n in walk(strip_sugar(v.mask)))


@dataclass(frozen=True, slots=True)
class SplitSchedule:
    """The decode family's rules (`OpPlan.split`): the split kernel's tile and how a call's work
    is cut into row blocks, ring chunks and splits."""

    heads: int
    kv_heads: int
    value_head_dim: int
    block_m: int
    block_n: int  # keys per warp per ring chunk
    warps: int
    stages: int
    smem_bytes: int
    arch: Arch
    paged: bool = False  # K/V in a paged cache (the split policy then aims at two CTAs an SM)

    @property
    def threads(self) -> int:
        return 32 * self.warps

    @property
    def chunk(self) -> int:
        """Keys a ring slot holds (every warp takes block_n of them)."""
        return self.block_n * self.warps

    def ctas_per_sm(self) -> int:
        return max(1, min(16, self.arch.smem_per_sm // (self.smem_bytes + 1024)))

    def m_blocks(self, Lq: int) -> int:
        """CTAs along the packed query rows of one KV head (group x Lq rows, BLOCK_M a CTA)."""
        return -(-(self.heads // self.kv_heads) * Lq // self.block_m)

    def ctas_per_sm_target(self) -> int:
        """Resident CTAs an SM the schedule aims at: one for a contiguous cache, two for a paged
        one, whose copies wait on block-table reads that one CTA alone does not hide. H200, page
        16, shuffled pages (benchmarks/results/h200_decode.json): (8, 32768) 2 splits 453 us, 4
        splits 269 (contiguous 281); (1, 131072) 16 splits 234 us, 32 splits 143 (contiguous
        147); (64, 4096) keeps 1 split either way (272 us; contiguous 267)."""
        return min(2, self.ctas_per_sm()) if self.paged else 1

    def row_blocks(self, B: int, Lq: int) -> int:
        """Row blocks of a call: (batch, KV head, packed row block) triples."""
        return B * self.kv_heads * self.m_blocks(Lq)

    def units(self, B: int, Lq: int, Lk: int) -> int:
        """Work units of a call: row blocks times ring chunks (Lk 0 counts one empty chunk)."""
        return self.row_blocks(B, Lq) * max(1, -(-Lk // self.chunk))

    def slots(self, B: int, Lq: int, ctas: int) -> int:
        """Partial slots a row in the workspace for `ctas` CTAs: the most CTAs one row block's
        units meet. With ctas = s * row blocks every row block takes exactly s; otherwise a range
        of n units meets at most ceil(ctas / row blocks) + 1 shares of >= floor(T / ctas) units,
        and never more than ctas (one CTA: one slot, every row block whole in it)."""
        base = self.row_blocks(B, Lq)
        if ctas % base == 0:
            return ctas // base
        return min(ctas, -(-ctas // base) + 1)

    def schedule(self, B: int, Lq: int, Lk: int, sm_count: int) -> tuple[int, int]:
        """(splits, ctas) for a call: every row block split into `splits` equal key ranges, one CTA
        each (ctas = row blocks * splits), raising the grid to at most the target (one CTA an SM,
        two for a paged cache), never below MIN_CHUNKS_PER_SPLIT chunks a split.

        Fewer, longer splits stream K/V faster. H200 (benchmarks/results/h200_decode_shares.json;
        bf16 D128 H32/Hkv8, Lq 1): (1, 131072) 16 splits 135.2 us, 32 142.4 (h200_decode.json), 132 equal
        shares of the units 139.1; (8, 32768) 2 splits (128 CTAs) 257.9 us, 4 269.2, 132 equal
        shares 261.5 (all 132 SMs busy, but a CTA that meets two row blocks drains and refills
        its ring between them, which costs more than the 4 idle SMs), 264 shares 262.5; (1, 8192)
        16 splits 18.2 us, 132 shares 19.7. So equal shares (`ctas` override) stay available to
        the runtime and C++ callers, and the policy keeps whole splits."""
        n_chunks = max(1, -(-Lk // self.chunk))
        base = self.row_blocks(B, Lq)
        want = max(1, sm_count * self.ctas_per_sm_target() // base)
        want = min(want, max(1, n_chunks // MIN_CHUNKS_PER_SPLIT), MAX_SPLITS)
        per = -(-n_chunks // want)
        splits = -(-n_chunks // per)
        return splits, base * splits

    def split_ctas(self, B: int, Lq: int, Lk: int, splits: int) -> int:
        """CTAs for `splits` equal splits of every row block (the runtime's `splits` override)."""
        return self.row_blocks(B, Lq) * splits

    def splits_cpp(self) -> str:
        """`schedule` as C++ (the standalone launcher's copy of the policy, for C++ engines; a
        test compiles it and compares it with `schedule` over a grid of sizes)."""
        group = self.heads // self.kv_heads
        return "\n".join([
            "  const long long chunk = " + str(self.chunk) + ";",
            "  const long long n_chunks = Lk > 0 ? (Lk + chunk - 1) / chunk : 1;",
            f"  const long long base = (long long)B * {self.kv_heads} * (({group}LL * Lq + {self.block_m} - 1) / {self.block_m});",
            "  long long want = base > 0 ? " + ("sm_count" if self.ctas_per_sm_target() == 1 else
                                                 f"(long long)sm_count * {self.ctas_per_sm_target()}") + " / base : 1;",
            "  if (want < 1) want = 1;",
            f"  const long long by_length = n_chunks / {MIN_CHUNKS_PER_SPLIT} > 1 ? n_chunks / {MIN_CHUNKS_PER_SPLIT} : 1;",
            "  if (want > by_length) want = by_length;",
            f"  if (want > {MAX_SPLITS}) want = {MAX_SPLITS};",
            "  const long long per = (n_chunks + want - 1) / want;",
            "  const long long s = (n_chunks + per - 1) / per;",
            "  *splits = (int)s;",
            "  *ctas = (int)(base * s);",
        ])

    def workspace_shapes(self, B: int, Lq: int, splits: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """fp32 partial O [B, H, Lq, splits, Dv] and partial LSE [B, H, Lq, splits]."""
        return (B, self.heads, Lq, splits, self.value_head_dim), (B, self.heads, Lq, splits)


def _tile(v: Variant, arch: Arch = DEFAULT_ARCH) -> tuple[int, int]:
    """(keys per warp, stages): a ring chunk of K and V is 32 KiB at D64 and D128, three slots
    (~110 KB with Q) so that two CTAs share an SM with up to ~128 KB of loads in flight. At D256
    a chunk (64 keys, the least four warps of m16n8k16 take) is 66 KiB: three slots (206 KiB) where
    a block may opt into that much (sm_90, sm_100), one CTA an SM. Where three slots do not fit a
    block's shared memory (sm_86/89/120 at every head dim, sm_80 at D256), two."""
    block_n = 32 if v.head_dim == 64 else 16
    return (block_n, 3) if smem_bytes(v, block_n, 3) <= arch.smem_budget else (block_n, 2)


def smem_bytes(v: Variant, block_n: int, stages: int) -> int:
    """Q tile plus the K/V ring (rows padded by 8 elements), or the epilogue's fp32 per-warp
    partial O and row statistics, whichever is larger (they share the space)."""
    d, dv = v.head_dim, v.value_head_dim
    if fp8_kv(v):
        # The ring holds fp8 rows padded by 16 bytes; each warp dequantizes its rows of the slot it
        # computes into one chunk of the output type (rows padded by 8 elements), which ldmatrix reads.
        tiles = ((BLOCK_M * (d + 8) + block_n * WARPS * ((d + 8) + (dv + 8))) * v.dtype.itemsize
                 + stages * block_n * WARPS * ((d + 16) + (dv + 16) + (8 if fp8_page_scales(v) else 0)))
    else:
        tiles = (BLOCK_M * (d + 8) + stages * block_n * WARPS * ((d + 8) + (dv + 8))) * v.dtype.itemsize
    reduce = WARPS * BLOCK_M * (dv + 4) * 4 + 2 * WARPS * BLOCK_M * 4
    return max(tiles, reduce)


def plan(v: Variant, arch: Arch = DEFAULT_ARCH, tile: tuple[int, int] | None = None, *, prefix: str = "attngen") -> OpPlan:
    """The decode family's OpPlan of a variant (the split kernel, then the combine kernel; the
    split schedule its `split` rules); ValueError when the family cannot run it. `tile` overrides
    (keys a warp, stages) for schedule sweeps (benchmarks/decode_bench.py); `prefix` starts the
    kernels' names (as `attngen compile --prefix` for the forward family)."""
    why = decode_unsupported(v, arch if tile is None else None)
    if why is None and (not arch.cp_async or not arch.mma_k16 or (v.quantized and arch.cc < FP8_KV_MIN_CC)):
        why = decode_unsupported(v, arch)
    if why is not None:
        raise ValueError(f"variant {v.name}: {why}")
    block_n, stages = tile or _tile(v, arch)
    if block_n % 16 or not 2 <= stages <= 6:
        raise ValueError(f"decode tile: expected keys a warp a multiple of 16 and 2..6 stages, got {block_n}, {stages}")
    if smem_bytes(v, block_n, stages) > arch.smem_budget:
        raise ValueError(f"decode tile {block_n}x{stages}: {smem_bytes(v, block_n, stages)} bytes of shared memory, "
                         f"more than {arch.value}'s {arch.smem_budget}")
    suffix = "" if tile is None else f"_n{block_n}s{stages}"
    name = f"{prefix}_{v.name}_decode{suffix}"
    sched = SplitSchedule(heads=v.heads, kv_heads=v.kv_heads, value_head_dim=v.value_head_dim, block_m=BLOCK_M, block_n=block_n,
                          warps=WARPS, stages=stages, smem_bytes=smem_bytes(v, block_n, stages), arch=arch, paged=v.page_size is not None)
    split = OpKernel(name=name, role=KernelRole.SPLIT, threads=sched.threads, grid_rule=GridRule.CTAS, engine=Engine.MMA_SYNC,
                     tile=TileConfig(BLOCK_M, block_n, WARPS, stages), smem=SmemLayout(sched.smem_bytes), min_blocks=sched.ctas_per_sm(),
                     doc="split-KV attention: each CTA's share of the units, a partial O and LSE a row block it meets (or O itself)")
    combine = OpKernel(name=f"{name}_combine", role=KernelRole.COMBINE, threads=COMBINE_THREADS, grid_rule=GridRule.WARP_ROWS,
                       doc="merges a row block's partials into O and the LSE, a warp a (b, h, q) row")
    return OpPlan(problem=problem_of(v, arch), kernels=(split, combine), fields=decode_fields(v), family=OpFamily.DECODE,
                  base_name=name, split=sched)


def decode_fields(v: Variant) -> tuple[Field, ...]:
    """Kernel parameters of both decode kernels (the same list), in ABI order."""
    e = "const elem_t* __restrict__"
    kv = e
    if fp8_kv(v):  # the FP8 cache's bytes (k_scale and v_scale follow among the runtime inputs)
        kv = "const unsigned char* __restrict__"
    f = [
        Field(e, "q", "query"),
        Field(kv, "k", "keys" if kv == e else f"keys, {v.k_dtype.value} bytes, dequantized as read: fp32(k * k_scale) to {v.dtype.value}"),
        Field(kv, "v", "values" if kv == e else f"values, {v.v_dtype.value} bytes, dequantized as read: fp32(v * v_scale) to {v.dtype.value}"),
        Field("elem_t* __restrict__", "o", "output"),
        Field("float* __restrict__", "lse", "log-sum-exp [B, H, Lq], contiguous (nullptr unless `output lse`)"),
        Field("int*", "nan_flag", "set to 1 when the output holds NaN/Inf (nullptr unless `nan_check`)"),
        Field("float* __restrict__", "ws_o", "workspace, B*H*Lq*splits*Dv floats, 16-byte aligned: each segment's partial O "
              "(unread when splits == 1)"),
        Field("float* __restrict__", "ws_lse", "workspace, B*H*Lq*splits floats: each segment's partial LSE (natural log)"),
        Field("int*", "ws_count", "nullptr (the combine kernel merges), or B*Hkv*ceil(H/Hkv*Lq/16) ints, zero before the "
              "launch and left zero by it: row-block counters with which the last CTA of a row block merges its partials"),
        Field("int", "B", "batch"),
        Field("int", "Lq", "query length"),
        Field("int", "Lk", "key length"),
        # The forward's mask and score emitters read global positions (a forward ABI for context
        # parallelism); the decode family runs whole sequences, so these are 0, 0, Lq, Lk.
        Field("int", "q_offset", "global position of query row 0 (always 0 here)"),
        Field("int", "kv_offset", "global position of key row 0 (always 0 here)"),
        Field("int", "Lq_total", "global query length the mask sees (Lq here; the C++ launcher reads 0 as Lq)"),
        Field("int", "Lk_total", "global key length the mask sees (Lk here; the C++ launcher reads 0 as Lk)"),
        Field("int", "splits", "partial slots a (b, h, q) row in the workspace: at least the CTAs one row block's keys meet "
              "(1: every row block is one CTA's, which writes O; no combine)"),
        Field("int", "ctas", "CTAs of the split kernel (its 1-D grid), 1 to the call's units; each takes an equal share"),
        *([Field("int", "num_pages", "pages of the paged K/V cache (k and v are [num_pages, page_size, Hkv, D])")]
          if v.page_size is not None else []),
    ]
    for t in ("q", "k", "v", "o"):
        paged = v.page_size is not None and t in ("k", "v")
        for s, what in (("sb", "page" if paged else "batch"), ("sh", "head"), ("ss", "slot-in-page" if paged else "sequence")):
            f.append(Field("long long", f"{t}_{s}", f"{t} {what} stride, elements"))
    f.extend(input_fields(v))
    return tuple(f)


def choose_family(v: Variant, Lq: int, family: Family = Family.AUTO) -> Family:
    """The family that runs a call with Lq query rows: a forced family as given, `auto` decode for
    small Lq where supported."""
    if family != Family.AUTO:
        return family
    if v.page_size is not None:
        return Family.DECODE  # the paged cache runs on the decode family only (any Lq)
    return Family.DECODE if Lq <= DECODE_MAX_LQ and decode_unsupported(v) is None else Family.FORWARD


__all__ = ["Family", "SplitSchedule", "Launch", "decode_fields", "plan", "decode_unsupported", "quant_unsupported", "fp8_kv", "fp8_page_scales", "choose_family", "mask_uses_head",
           "DECODE_MAX_LQ", "COMBINE_THREADS"]
