"""The quantized forward (prefill) kernel's plan: which quantized specs it runs, its tile and its
shared memory (stage: plan). The kernel is the mma.sync engine's structure with Q·Kᵀ on
m16n8k32 FP8 MMAs (backends/cuda/fwd/_mma_q8.cu.j2); docs/QUANT.md states the numerics.

It runs: Q and K stored as fp8_e4m3 / fp8_e5m2 with `input` scales `per tensor` or `per head`
(FA3's descales); V stored in the output's type, or as fp8 with such a scale, P·V then in the
output's type (V dequantized tile by tile) or, with `quant p fp8_* static(c)`, on m16n8k32 too.
Everything else keeps a located refusal that names what is missing.

On sm_90a, FP8 Q·Kᵀ with FP8 P·V at head dims 64 and 128 (`wgmma_q8`) runs on the wgmma engine
instead (backends/cuda/fwd/_wgmma.cu.j2 with _wgmma_q8.cu.j2: m64nNk32 e4m3/e5m2 wgmma, the
producer / consumer warpgroups, 128 x 128 tiles), V transposed once by a prep kernel (`ag_prep_vt`).
"""

from __future__ import annotations

from dataclasses import replace

from attngen.ir.dtypes import DType
from attngen.ir import names
from attngen.ir.nodes import Layout, NormScope, NormTarget, Quant, QuantOperand, ScaleGranularity, ScaleSource, TileConfig, Variant, quant_scale_name
from attngen.plan.op_plan import Field, Prep
from attngen.plan.schedule import Arch, Engine, engine

FP8 = (DType.FP8_E4M3, DType.FP8_E5M2)
_GRANULARITIES = (ScaleGranularity.TENSOR, ScaleGranularity.HEAD)
_OUT = (DType.BF16, DType.FP16)

__all__ = ["I8_ROW_PAD", "WGMMA_Q8_TILE", "wgmma_q8", "wgmma_q8_smem", "cuda_problem", "forward_problem", "group_rows", "preps", "qk_i8", "quant_tile", "quant_smem_bytes", "tile_problem", "p_fp8", "v_fp8", "scale_code"]


def _input_scaled(qn: Quant | None, stored: DType) -> str | None:
    """Why operand `qn` (stored as `stored`) is not an FP8 input with a tensor/head descale."""
    if qn is None or stored not in FP8:
        return "stored as fp8_e4m3 or fp8_e5m2"
    if qn.source != ScaleSource.INPUT or qn.granularity not in _GRANULARITIES:
        return "with `input` scales `per tensor` or `per head`"
    return None


def qk_i8(v: Variant) -> bool:
    """Whether Q·Kᵀ runs on INT8 (Sage-style: q and k quantized to i8 in prep kernels)."""
    qq, qk = v.quant(QuantOperand.Q), v.quant(QuantOperand.K)
    return qq is not None and qk is not None and qq.dtype == DType.I8 and qk.dtype == DType.I8


def _i8_problems(v: Variant) -> list[str]:
    """What the INT8 Q·Kᵀ path lacks for `v`: q and k stored in the output's type, i8 with `amax`
    scales per token or per block(N), no smoothing; P·V in the output's type."""
    missing = []
    for op in (QuantOperand.Q, QuantOperand.K):
        qn = v.quant(op)
        assert qn is not None
        if qn.source != ScaleSource.AMAX or qn.granularity not in (ScaleGranularity.TOKEN, ScaleGranularity.BLOCK):
            missing.append(f"{op.value} i8 with `amax` scales `per token` or `per block(N)`")
    if v.quant(QuantOperand.V) is not None or v.quant(QuantOperand.P) is not None or v.v_dtype != v.dtype:
        missing.append("P·V unquantized next to INT8 Q·Kᵀ")
    return missing


def forward_problem(v: Variant) -> str | None:
    """Why the quantized forward kernel cannot run `v` (None when it can; v must be quantized)."""
    missing = []
    if qk_i8(v):
        missing += _i8_problems(v)
    for op, stored in (() if qk_i8(v) else ((QuantOperand.Q, v.q_dtype), (QuantOperand.K, v.k_dtype))):
        why = _input_scaled(v.quant(op), stored)
        if why:
            missing.append(f"{op.value} {why}")
    qv, qp = v.quant(QuantOperand.V), v.quant(QuantOperand.P)
    if not qk_i8(v) and (qv is not None or v.v_dtype != v.dtype):
        why = _input_scaled(qv, v.v_dtype)
        if why:
            missing.append(f"v {why} (or stored in the output's type)")
    if qp is not None and (qp.source != ScaleSource.STATIC or qp.dtype not in FP8):
        missing.append("p quantized `static(c)` to an fp8 type")
    if v.dtype not in _OUT:
        missing.append("an fp16 or bf16 output")
    if v.head_dim % 32 or v.value_head_dim % 16 or max(v.head_dim, v.value_head_dim) > 256:
        missing.append("head dims D a multiple of 32 and Dv of 16, both at most 256")
    if qk_i8(v):
        if any(n.target != NormTarget.Q or n.scope != NormScope.TOKEN for n in v.norms):
            missing.append("no norms but a token-scope q pre-norm (fused into q's quantization)")
    elif v.norms or v.residual:
        missing.append("no norms or residual")
    if v.page_size is not None:
        missing.append("a contiguous K/V (a paged cache runs on the decode family)")
    if not missing:
        return None
    return ("the CUDA forward runs quantized attention as FP8 Q·Kᵀ with input scales, or INT8 Q·Kᵀ with amax scales "
            "(mma.sync m16n8k32): it needs " + "; ".join(dict.fromkeys(missing)) +
            "; the CPU backend (--target cpu) and the NumPy reference run every quantized spec")


def p_fp8(v: Variant) -> DType | None:
    """P's fp8 type when P·V runs on FP8 MMAs."""
    qp = v.quant(QuantOperand.P)
    return qp.dtype if qp is not None else None


def v_fp8(v: Variant) -> bool:
    """Whether V is stored as fp8 (dequantized in the kernel, or P·V in fp8)."""
    return v.v_dtype in FP8


# The FP8 wgmma engine's tile: two consumer warpgroups of 64 query rows, 128 keys (one 128-byte
# swizzle row of fp8 V^T a channel), three ring stages; ptxas figures in docs/QUANT.md.
WGMMA_Q8_TILE = TileConfig(block_m=128, block_n=128, warps=8, stages=3)
WGMMA_Q8_Q_BUFS = 2


def wgmma_q8(v: Variant, arch: Arch) -> bool:
    """Whether `v` runs on the sm_90a FP8 wgmma engine: FP8 Q·Kᵀ and FP8 P·V (q, k, v stored fp8
    with input scales, `quant p fp8_* static(c)`), head dims 64 or 128 (D = Dv), not varlen, and no
    tile hint but one of WGMMA_Q8_TILE's shape (128 x 128, 8 warps) with two to four stages. The
    other quantized specs (and these on sm_89) keep the mma.sync kernel."""
    h, t = v.tile, WGMMA_Q8_TILE
    hint_ok = h is None or (h.block_m in (None, t.block_m) and h.block_n in (None, t.block_n) and h.warps in (None, t.warps)
                            and (h.stages is None or 2 <= h.stages <= 4))
    return (arch == Arch.SM90A and not qk_i8(v) and forward_problem(v) is None and p_fp8(v) is not None
            and v_fp8(v) and v.head_dim == v.value_head_dim in (64, 128) and hint_ok and v.layout != Layout.VARLEN)


def wgmma_q8_smem(v: Variant, tile: TileConfig) -> int:
    """Dynamic shared memory of the FP8 wgmma engine (_wgmma.cu.j2's layout at one byte an element):
    Q buffers, the K and V^T ring, the mbarriers, four work ints and a header int a slot."""
    tiles = WGMMA_Q8_Q_BUFS * tile.block_m * v.head_dim + tile.stages * tile.block_n * (v.head_dim + v.value_head_dim)
    bar_off = (tiles + 7) // 8 * 8
    return bar_off + 8 * (2 * WGMMA_Q8_Q_BUFS + 2 * tile.stages) + 16 + 4 * tile.stages


def quant_tile(v: Variant, arch: Arch) -> TileConfig:
    """The kernel's tile: WGMMA_Q8_TILE where `wgmma_q8` (a hint's stage count kept); else the spec's
    `tile` hint over 128x64 (128x32 above head dim 64, 64x32 above 128), four warps, two stages.
    Four warps keep every arch on mma.sync (the wgmma engine's tiles have eight).
    Key tiles of 32 where ptxas (CUDA 13) reports spills at 128x64: above D64 (FP8 with V
    dequantized, D128 causal: 76 bytes on sm_89, 84 on sm_90a; FP8 P·V: 8 on sm_89 with the LSE,
    1240 on sm_90a; INT8: 20 on sm_80/sm_89) and FP8 P·V on sm_90a (D64: 284 bytes). At 128x32:
    none, but 4 bytes (FP8 V dequantized and INT8, D128 causal) and 140 (FP8 P·V, D128) on sm_90a."""
    if wgmma_q8(v, arch):
        return WGMMA_Q8_TILE if v.tile is None or v.tile.stages is None else replace(WGMMA_Q8_TILE, stages=v.tile.stages)
    d = max(v.head_dim, v.value_head_dim)
    wide = d > 128
    narrow = d > 64 or (p_fp8(v) is not None and arch == Arch.SM90A)
    base = TileConfig(block_m=64 if wide else 128, block_n=32 if narrow else 64, warps=4, stages=2)
    h = v.tile
    if h is None:
        return base
    return TileConfig(block_m=h.block_m or base.block_m, block_n=h.block_n or base.block_n, warps=h.warps or base.warps,
                      stages=h.stages or base.stages, span=h.span)


def quant_smem_bytes(v: Variant, tile: TileConfig) -> int:
    """Dynamic shared memory of the quantized kernel (backends/cuda/fwd/_mma_q8.cu.j2's layout):
    Q and the K/V ring (rows padded by 16 bytes), the converted V tile, or the fp32 epilogue
    staging that reuses them, whichever is larger."""
    d, dv, bm, bn = v.head_dim, v.value_head_dim, tile.block_m, tile.block_n
    # (with INT8 Q·Kᵀ the Q and K rows carry their fp32 scale in the 16 bytes of padding)
    sv = bn * (dv + 16) if v_fp8(v) else bn * (dv + 8) * 2
    svb = dv * (bn + 16) if p_fp8(v) else bn * (dv + 8) * 2 if v_fp8(v) else 0
    tiles = bm * (d + 16) + tile.stages * (bn * (d + 16) + sv) + svb
    return max(tiles, bm * (dv + 8) * 4)


def tile_problem(v: Variant, tile: TileConfig, arch: Arch) -> str | None:
    """Why the quantized kernel cannot take `tile` on `arch` (None when it can)."""
    if arch.cc < 89 and not qk_i8(v):
        return f"FP8 tensor cores (mma.sync m16n8k32 e4m3/e5m2) need sm_89 or newer, not {arch.value}"
    if arch.cc < 80:
        return f"INT8 tensor cores (mma.sync m16n8k32 s8) need sm_80 or newer, not {arch.value}"
    if tile.warps not in (4, 8) or tile.block_m % (16 * tile.warps) or tile.block_m // tile.warps not in (16, 32):
        return f"the tile needs 16 or 32 query rows a warp (4 or 8 warps), got {tile.block_m} rows on {tile.warps} warps"
    if tile.block_n % 32 or not 32 <= tile.block_n <= 128:
        return f"block_n must be 32, 64, 96 or 128 (m16n8k32 steps over 32 keys), got {tile.block_n}"
    if not 1 <= tile.stages <= 4:
        return f"stages must be between 1 and 4, got {tile.stages}"
    if wgmma_q8(v, arch):
        need = wgmma_q8_smem(v, tile)
        if need > arch.smem_budget:
            return f"the tile needs {need // 1024} KiB of shared memory, more than {arch.value}'s {arch.smem_budget // 1024} KiB"
        return None
    if engine(v.dtype, v.head_dim, v.value_head_dim, tile, arch) != Engine.MMA_SYNC:
        return "the quantized forward runs on mma.sync: use a tile of four warps (eight warps with 128 rows select wgmma on sm_90a)"
    need = quant_smem_bytes(v, tile)
    if need > arch.smem_budget:
        return f"the tile needs {need // 1024} KiB of shared memory, more than {arch.value}'s {arch.smem_budget // 1024} KiB"
    return None


def scale_code(v: Variant, op: QuantOperand) -> str:
    """C++ reading operand `op`'s descale for batch `b`, kv head `hk` (docs/QUANT.md's shapes)."""
    qn = v.quant(op)
    assert qn is not None and qn.granularity in _GRANULARITIES
    name = quant_scale_name(op)
    f = f"p.{names.input_field(name)}"
    if qn.granularity == ScaleGranularity.TENSOR:
        return f"{f}[0]"
    return (f"{f}[(long long)b * p.{names.input_stride_field(name, 0)} + "
            f"(long long)hk * p.{names.input_stride_field(name, 1)}]")


def cuda_problem(v: Variant, arch: Arch) -> str | None:
    """Why no CUDA kernel runs quantized `v` on `arch` (None when the forward kernel does)."""
    return forward_problem(v) or tile_problem(v, quant_tile(v, arch), arch)


I8_ROW_PAD = 16  # bytes after each INT8 workspace row: its fp32 scale, then padding to 16-byte rows


def preps(v: Variant, name: str, arch: Arch | None = None) -> tuple[Prep, ...]:
    """The FP8 wgmma engine's V transpose (`wgmma_q8` on `arch`), or INT8 Q·Kᵀ's prep kernels: q and
    k quantized once a row (not once a query tile), each row of the workspace [B, heads, L, D + 16]
    bytes holding the D int8 values, then the row's fp32 scale; with `smooth mean`, first k's mean
    over its keys ([B, Hkv, D] fp32), which k's prep subtracts."""
    if v.quantized and arch is not None and wgmma_q8(v, arch):
        bn = WGMMA_Q8_TILE.block_n
        return (Prep(f"{name}_prep_vt", "ag_prep_vt",
                     Field("unsigned char* __restrict__", "ws_vt", f"workspace, B*Hkv*Dv*Lkp bytes (Lkp: Lk rounded up to {bn}): "
                           "V^T in fp8 as key tiles of Dv x 128 bytes in the 128-byte swizzle, keys permuted within each "
                           "32 (the wgmma A fragment of P), zero past Lk, written by the prep kernel"),
                     v.kv_heads, False, v.value_head_dim, DType.I8,
                     "v transposed once (keys contiguous: wgmma's 8-bit B operand is K-major)", pad_keys=bn),)
    if not v.quantized or not qk_i8(v):
        return ()
    w = v.head_dim + I8_ROW_PAD
    qk = v.quant(QuantOperand.K)
    smooth = (Prep(f"{name}_prep_kmean", "ag_prep_kmean",
                   Field("float* __restrict__", "ws_kmean", "workspace, B*Hkv*D floats: k's mean over the Lk keys of each "
                         "(batch, kv head), written by the prep kernel (K smoothing)"),
                   v.kv_heads, False, v.head_dim, DType.FP32, "k's per-channel mean for `smooth mean`", per_head=True),) \
        if qk is not None and qk.smooth is not None else ()
    return smooth + (
        Prep(f"{name}_prep_q8", "ag_prep_q8",
             Field("signed char* __restrict__", "ws_q8", f"workspace, B*H*Lq*(D+{I8_ROW_PAD}) bytes, 16-byte aligned: "
                   "the int8 queries and each row's scale, written by the prep kernel"),
             v.heads, True, w, DType.I8, "q quantized to int8 once a row (amax of its group)"),
        Prep(f"{name}_prep_k8", "ag_prep_k8",
             Field("signed char* __restrict__", "ws_k8", f"workspace, B*Hkv*Lk*(D+{I8_ROW_PAD}) bytes, 16-byte aligned: "
                   "the int8 keys and each row's scale, written by the prep kernel"),
             v.kv_heads, False, w, DType.I8, "k quantized to int8 once a row (amax of its group)"),
    )


def group_rows(v: Variant, op: QuantOperand) -> int:
    """Rows one INT8 scale covers: 1 per token, N per block(N)."""
    qn = v.quant(op)
    assert qn is not None
    return qn.block if qn.granularity == ScaleGranularity.BLOCK and qn.block else 1
