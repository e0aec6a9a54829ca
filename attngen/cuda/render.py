"""Validated IR → one self-contained CUDA C++ source file (stage: render).

Python computes everything the templates need (the `KernelPlan` context); the jinja2 templates
under `backends/cuda/` only splice it in and branch on flags. The same variant, tile and arch
always give the same bytes: no timestamps, no dict-order dependence, no absolute paths.
"""

from __future__ import annotations

import dataclasses
import functools
import re

import jinja2
import numpy as np

from attngen import __version__
from attngen.ir import names
from attngen.ir.nodes import (
    DType,
    Expr,
    Layout,
    NormKind,
    NormScope,
    NormTarget,
    Program,
    QuantOperand,
    SizeSym,
    TileConfig,
    Variant,
    norm_bias_name,
    norm_weight_name,
    tensors_used,
)
from attngen.lang.printer import print_expr, print_program
from attngen.analysis.kv_bounds import kv_upper_bounds
from attngen.cuda.emit import INT_UNKNOWN, AxisSplit, ElementEmitter, IntervalEmitter, float_literal, split_by_axis, tensor_ctype
from attngen.resources import cache_dir, cuda_template_dir
from attngen.plan import quant_fwd
from attngen.plan.limits import MAX_PARAM_BYTES, param_bytes
from attngen.plan.schedule import (
    DEFAULT_ARCH,
    Arch,
    Engine,
    SmemLayout,
    engine,
    head_dims_problem,
    min_blocks_per_sm,
    persistent,
    q_token_norm,
    threads,
    validate_tile,
    variant_smem_layout,
    variant_tile,
    wgmma_regs,
    wgmma_softmax,
    wgmma_tma_ok,
    WgmmaLoads,
    WgmmaSoftmax,
)
# The plan's types live in the plan stage; named here too, where importers have always found them.
from attngen.plan.op_plan import (  # noqa: F401
    PREP_MAX_BLOCKS,
    PREP_ROWS_PER_BLOCK,
    PREP_THREADS,
    Field,
    GridRule,
    KernelPlan,
    KernelRole,
    OpKernel,
    OpPlan,
    Prep,
    Problem,
    TmaMap,
    tma_maps,
)


DEFAULT_PREFIX = "attngen"
_C_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def kernel_name(v: Variant, prefix: str = DEFAULT_PREFIX) -> str:
    """`{prefix}_{variant}`: every exported symbol of the generated code starts with it (the
    kernel, its prep kernels, its namespace, the launcher and the workspace functions), so two
    variants, or one variant built for two arches under two prefixes, link into one binary."""
    if not _C_IDENT.fullmatch(prefix):
        raise ValueError(f"prefix {prefix!r} is not a C identifier (letters, digits and _, not starting with a digit)")
    return f"{prefix}_{v.name}"


def resolve_tile(v: Variant, arch: Arch = DEFAULT_ARCH) -> TileConfig:
    """The variant's tile, or the auto choice; re-validated for `arch` (a spec checked against
    sm_90a may not fit an sm_86 budget)."""
    tile = variant_tile(v, arch)
    errs = validate_tile(v.dtype, v.head_dim, v.value_head_dim, tile, arch, token_norm=q_token_norm(v))
    if errs:
        raise ValueError(f"variant {v.name}: tile {tile.block_m}x{tile.block_n} cannot be used on {arch.value}: " + "; ".join(errs))
    return tile


def _fields(v: Variant, preps: tuple[Prep, ...], persistent_ctas: bool) -> tuple[Field, ...]:
    e = "const elem_t* __restrict__"
    # An input stored quantized is read as its own type (docs/QUANT.md); the others as elem_t.
    qe, ke, ve = (f"const {tensor_ctype(t)}* __restrict__" if t != v.dtype else e for t in (v.q_dtype, v.k_dtype, v.v_dtype))
    f = [
        Field(qe, "q", "query (the hidden state x when q has a token-scope norm)"),
        Field(ke, "k", "keys"),
        Field(ve, "v", "values"),
        Field("elem_t* __restrict__", "o", "output"),
        Field("float* __restrict__", "lse", ("log-sum-exp [H, total_q] (head stride lse_sh)" if v.layout == Layout.VARLEN else
                                             "log-sum-exp [B, H, Lq], contiguous") + " (nullptr unless `output lse`)"),
        Field("int*", "nan_flag", "set to 1 when the output holds NaN/Inf (nullptr unless `nan_check`)"),
        *([Field("int*", "work_counter",
                 "one int, 0 before the first launch (every launch leaves it 0): the persistent CTAs' work-tile "
                 "counter; one per stream that may run this kernel concurrently")] if persistent_ctas else []),
        Field("int", "B", "batch"),
        Field("int", "Lq", "query length"),
        Field("int", "Lk", "key length"),
        # Where this launch sits in a longer sequence (context-parallel shards, chunked prefill):
        # masks and scores read positions q + q_offset, kv + kv_offset and lengths Lq_total,
        # Lk_total. A plain call passes 0, 0, Lq, Lk.
        Field("int", "q_offset", "global position of query row 0 (0 for a whole sequence)"),
        Field("int", "kv_offset", "global position of key row 0 (0 for a whole sequence)"),
        Field("int", "Lq_total", "global query length the mask sees (>= q_offset + Lq; the C++ launcher reads 0 as q_offset + Lq)"),
        Field("int", "Lk_total", "global key length the mask sees (>= kv_offset + Lk; the C++ launcher reads 0 as kv_offset + Lk)"),
    ]
    for t in ("q", "k", "v", "o"):
        for s, what in (("sb", "batch"), ("sh", "head"), ("ss", "sequence")):
            f.append(Field("long long", f"{t}_{s}", f"{t} {what} stride, elements"))
    if v.layout == Layout.VARLEN:
        f.append(Field("long long", "lse_sh", "lse head stride, elements: total_q (the LSE is [H, total_q], contiguous; "
                                              "the C++ launcher reads 0 as Lq)"))
    f.extend(pr.field for pr in preps)
    f.extend(input_fields(v))
    return tuple(f)


def input_fields(v: Variant) -> list[Field]:
    """The runtime inputs' fields, every family's ABI tail: each input's pointer, then its sizes,
    then its strides (names from `attngen.ir.names`, the one mangling scheme)."""
    f = []
    for d in v.runtime_inputs():
        f.append(Field(f"const {tensor_ctype(d.dtype)}* __restrict__", names.input_field(d.name),
                       f"runtime input {d.name}: {d.dtype.value}"))
        for i in range(len(d.shape)):
            f.append(Field("int", names.input_size_field(d.name, i), f"{d.name} size of dim {i}"))
        for i in range(len(d.shape)):
            f.append(Field("long long", names.input_stride_field(d.name, i), f"{d.name} stride of dim {i}, elements"))
    return f


def _preps(v: Variant, prefix: str = DEFAULT_PREFIX) -> tuple[Prep, ...]:
    """The prep kernels a variant needs, in ABI order of their workspace fields."""
    out = []
    name = kernel_name(v, prefix)
    elem = "elem_t* __restrict__"
    qn, kn = v.norm(NormTarget.Q), v.norm(NormTarget.K)
    if qn is not None and qn.scope == NormScope.TOKEN:
        out.append(Prep(f"{name}_prep_qstats", "ag_prep_qstats",
                        Field("float* __restrict__", "ws_qstats",
                              "workspace, B*Lq*2 floats, 8-byte aligned: (mean, rstd) of each hidden row, written by the prep kernel"),
                        1, True, 2, DType.FP32, "token-scope q norm: statistics of each hidden row, once (not once per head)"))
    if qn is not None and qn.scope == NormScope.HEAD:
        out.append(Prep(f"{name}_prep_q", "ag_prep_q",
                        Field(elem, "ws_q", "workspace, B*H*Lq*D elements, 16-byte aligned: the pre-normalised queries, written by the prep kernel"),
                        v.heads, True, v.head_dim, v.dtype, "q pre-norm: each query row once, outside the attention kernel's register budget"))
    if kn is not None:
        out.append(Prep(f"{name}_prep_k", "ag_prep_k",
                        Field(elem, "ws_k", "workspace, B*Hkv*Lk*D elements, 16-byte aligned: the pre-normalised keys, written by the prep kernel"),
                        v.kv_heads, False, v.head_dim, v.dtype, "k pre-norm: each key row once (not once per query tile)"))
    out.extend(quant_fwd.preps(v, name))
    return tuple(out)


def plan(v: Variant, arch: Arch = DEFAULT_ARCH, *, prefix: str = DEFAULT_PREFIX, softmax: WgmmaSoftmax | None = None) -> OpPlan:
    """The frozen plan of a variant on `arch` (computed once per (variant, arch, prefix), then
    cached; `prefix` starts every symbol name: see `kernel_name`). `softmax` replaces the wgmma
    consumers' softmax schedule `wgmma_softmax` picks (for A/B timing; ignored off wgmma)."""
    return _plan(v, arch, prefix, softmax)


@functools.lru_cache(maxsize=512)
def _plan(v: Variant, arch: Arch, prefix: str = DEFAULT_PREFIX, softmax: WgmmaSoftmax | None = None) -> OpPlan:
    if v.page_size is not None:  # the forward kernels read contiguous K/V only
        raise ValueError(f"variant {v.name}: `kv_cache paged` runs on the decode family (render_decode), not the forward kernel")
    bad_dims = head_dims_problem(v.dtype, v.head_dim, v.value_head_dim)
    if bad_dims:
        raise ValueError(f"variant {v.name}: {bad_dims}")
    if v.quantized:
        why = quant_fwd.forward_problem(v) or quant_fwd.tile_problem(v, tile := quant_fwd.quant_tile(v, arch), arch)
        if why:
            raise ValueError(f"variant {v.name}: {why}")
    else:
        tile = resolve_tile(v, arch)
    preps = _preps(v, prefix)
    eng = engine(v.dtype, v.head_dim, v.value_head_dim, tile, arch)
    pers = persistent(eng)
    problem = Problem(
        name=v.name, dtype=v.dtype, head_dim=v.head_dim, value_head_dim=v.value_head_dim, heads=v.heads,
        kv_heads=v.kv_heads, layout=v.layout, kind=v.kind, arch=arch, lse=v.lse, nan_check=v.nan_check,
        residual=v.residual, token_norm=q_token_norm(v), runtime_inputs=v.runtime_inputs(),
    )
    attention = OpKernel(
        name=kernel_name(v, prefix),
        role=KernelRole.ATTENTION,
        threads=threads(v.dtype, v.head_dim, v.value_head_dim, tile, arch),
        grid_rule=GridRule.PERSISTENT if pers else GridRule.TILES,
        engine=eng,
        tile=tile,
        smem=SmemLayout(quant_fwd.quant_smem_bytes(v, tile)) if v.quantized else variant_smem_layout(v, tile, arch),
        min_blocks=min_blocks_per_sm(v.dtype, v.head_dim, v.value_head_dim, tile, arch),
        regs=wgmma_regs(tile, bool(tensors_used(v.mask)), bool(v.scores), v.layout == Layout.VARLEN) if eng == Engine.WGMMA else None,
        softmax=(softmax or wgmma_softmax(v.head_dim, v.value_head_dim, tile)) if eng == Engine.WGMMA else None,
    )
    if v.layout == Layout.VARLEN:
        attention = dataclasses.replace(attention, varlen=True)
    sm = attention.softmax
    fields = _fields(v, preps, pers)
    if sm is not None and sm.loads == WgmmaLoads.TMA and not (wgmma_tma_ok(
            varlen=v.layout == Layout.VARLEN, wide_rows=max(v.head_dim, v.value_head_dim) > 128,
            q_norm=v.norm(NormTarget.Q) is not None, k_norm=v.norm(NormTarget.K) is not None,
            residual_copy=attention.smem.residual_copy, score_lookups=any(tensors_used(e) for e in v.scores))
            and _tma_param_room(fields)):
        attention = dataclasses.replace(attention, softmax=dataclasses.replace(sm, loads=WgmmaLoads.CP_ASYNC))
    prep_kernels = tuple(OpKernel(name=pr.kernel, role=KernelRole.PREP, threads=PREP_THREADS, grid_rule=GridRule.ROWS, prep=pr)
                         for pr in preps)
    return OpPlan(problem=problem, kernels=(*prep_kernels, attention), fields=fields, workspaces=preps)


def _tma_param_room(fields: tuple[Field, ...]) -> bool:
    """Whether the three 128-byte descriptors (64-byte aligned) still fit the kernel's parameter
    space after the ABI fields (a variant with many runtime inputs keeps cp.async instead)."""
    ends = param_bytes([f.ctype for f in fields])
    end = ends[-1] if ends else 0
    return (end + 63) // 64 * 64 + 3 * 128 <= MAX_PARAM_BYTES


def _spec_text(v: Variant) -> str:
    return print_program(Program((v,)))


def _expr_text(e: Expr) -> str:
    return print_expr(e)


def _header(v: Variant, kp: OpPlan) -> str:
    layout = v.layout.value
    qs = "[B, H, Lq, D]" if layout == "bhsd" else "[B, Lq, H, D]"
    ks = "[B, Hkv, Lk, D]" if layout == "bhsd" else "[B, Lk, Hkv, D]"
    vs = "[B, Hkv, Lk, Dv]" if layout == "bhsd" else "[B, Lk, Hkv, Dv]"
    os_ = "[B, H, Lq, Dv]" if layout == "bhsd" else "[B, Lq, H, Dv]"
    varlen_lines: list[str] = []
    if v.layout == Layout.VARLEN:
        qs, ks, vs, os_ = "[total_q, H, D]", "[total_k, Hkv, D]", "[total_k, Hkv, Dv]", "[total_q, H, Dv]"
        cu_q, cu_k = v.cu_seqlens_names
        varlen_lines = [
            f"Varlen (packed) batch: B sequences; sequence b owns q/o rows {cu_q}[b] .. {cu_q}[b+1] - 1 and k/v rows",
            f"{cu_k}[b] .. {cu_k}[b+1] - 1 ({'one array for both: kind self' if cu_q == cu_k else 'i32[B+1] each'}: prefix sums, 0 first,",
            "the total last, never decreasing; values are clamped to [0, total] in the kernel). Positions restart at 0",
            "in every sequence: masks and scores see q, kv < that sequence's Lq, Lk. Params: B = sequences, Lq = total_q,",
            "Lk = total_k, offsets 0; the batch strides are ignored; lse is [H, total_q] (head stride lse_sh).",
        ]
    t = kp.tile
    lines = [
        f"Generated by attngen {__version__} from the spec below. Do not edit: regenerate.",
        "",
        *("  " + ln for ln in _spec_text(v).rstrip("\n").splitlines()),
        "",
        f"Variant {v.name}: dtype {v.dtype.value}, D={v.head_dim}, Dv={v.value_head_dim}, H={v.heads}, Hkv={v.kv_heads}, "
        f"layout {layout}, {v.kind.value} attention, scale {v.effective_scale!r}",
        f"Shapes: q {qs}, k {ks}, v {vs}, o {os_}; last dimension contiguous, every stride and",
        "pointer a multiple of 16 bytes. Accumulation in fp32.",
        *varlen_lines,
        "",
        f"Kernel {kp.kernel_name}: grid {grid_text(kp, v.heads)}, block {kp.threads} threads,",
        f"dynamic shared memory {kp.smem_bytes} bytes (opt in with cudaFuncSetAttribute above 48 KiB).",
        f"Tile: block_m {t.block_m}, block_n {t.block_n}, warps {t.warps}, stages {t.stages}; "
        f"{kp.engine.describe(t, kp.attention.tma)}; target {kp.arch.value}.",
        *(
            [f"Prep kernels, launched first on the same stream with the same arguments, {PREP_THREADS} threads a block,",
             f"grid min(rows / {PREP_ROWS_PER_BLOCK} + 1, {PREP_MAX_BLOCKS}) (any grid is correct):",
             *(f"  {pr.kernel}: rows = {pr.rows_expr.replace('(long long)', '').replace('p.', '')}; {pr.doc}" for pr in kp.preps)]
            if kp.preps else []
        ),
        "Arguments, in order (also the fields of Params, for the host launcher):",
        *(f"  {i:2d}. {f.ctype} {f.name}: {f.doc}" for i, f in enumerate(kp.fields)),
        *(
            ["The kernel takes after them (not in Params) the TMA descriptors of its copies, CUtensorMap, 128 bytes each,",
             "passed __grid_constant__, which the host encodes per call (the launcher below does, from Params): 4-d views",
             "(columns, rows, heads, batch) of the tensor at its pointer and strides, bf16/fp16, boxes of 64 columns, the",
             "128-byte swizzle, zero fill past the length:",
             *(f"  {len(kp.fields) + i:2d}. {m.name}: {m.tensor}, box 64 x {m.rows}, dims ({m.cols}, {m.length}, {m.heads}, B)"
               for i, m in enumerate(tma_maps(kp)))]
            if kp.attention.tma else []
        ),
        "",
        f"Host: cudaError_t {kp.kernel_name}_launch(const Params* p, cudaStream_t stream) (nvcc builds only).",
        *(
            ["Build for sm_90a only: nvcc -gencode=arch=compute_90a,code=sm_90a (wgmma and setmaxnreg; nvcc 13.0's",
             "-arch=sm_90a shorthand also runs a plain sm_90 pass, which stops at an #error naming this flag)."]
            if kp.engine == Engine.WGMMA else []
        ),
    ]
    return "\n".join("// " + ln if ln else "//" for ln in lines) + "\n"


def grid_text(kp: OpPlan, heads: int) -> str:
    """The attention kernel's launch grid in words, for headers (`OpKernel.grid_text`)."""
    return kp.attention.grid_text(heads)


def _tensor_ctx(v: Variant) -> list[dict]:
    out = []
    for d in v.runtime_inputs():
        out.append(
            dict(
                name=d.name,
                dims=list(range(len(d.shape))),
                value_ctype="float" if d.dtype.is_float else "int",
                convert=d.dtype.info.to_float,
            )
        )
    return out


def _norm_ctx(v: Variant) -> dict:
    ctx: dict = {}
    for target in NormTarget:
        n = v.norm(target)
        key = target.value
        ctx[f"{key}_norm"] = n is not None
        ctx[f"{key}_norm_token"] = n is not None and n.scope == NormScope.TOKEN
        ctx[f"{key}_norm_layernorm"] = n is not None and n.kind == NormKind.LAYERNORM
        ctx[f"{key}_norm_affine"] = n is not None and n.affine
        ctx[f"{key}_norm_eps"] = float_literal(n.eps) if n is not None else "0.0f"
    return ctx


def _varlen_ctx(v: Variant) -> dict:
    """`layout varlen`: the Params fields of the cu_seqlens arrays (q's, k's: one array for kind self)."""
    cu = v.cu_seqlens_names or ("", "")
    return dict(varlen=v.layout == Layout.VARLEN,
                cu_q=names.input_field(cu[0]), cu_q_s0=names.input_stride_field(cu[0], 0),
                cu_k=names.input_field(cu[1]), cu_k_s0=names.input_stride_field(cu[1], 0))


def _quant_ctx(v: Variant) -> dict:
    """The quantized kernel's types and scales (plan.quant_fwd); q_ctype/k_ctype are elem_t otherwise."""
    if not v.quantized:
        return dict(quant=False, q_ctype="elem_t", k_ctype="elem_t")
    pt = quant_fwd.p_fp8(v)
    qp = v.quant(QuantOperand.P)
    if quant_fwd.qk_i8(v):
        return dict(quant=True, q_ctype="elem_t", k_ctype="elem_t", v_ctype="elem_t", qk_i8=True, q_fp8="i8", k_fp8="i8",
                    qk_types="s8.s8", v_fp8=False, p_fp8="", q_group=quant_fwd.group_rows(v, QuantOperand.Q),
                    k_group=quant_fwd.group_rows(v, QuantOperand.K), row_pad=quant_fwd.I8_ROW_PAD,
                    k_smooth=v.quant(QuantOperand.K).smooth is not None)
    ptx = {t: t.info.ptx for t in (v.q_dtype, v.k_dtype, v.v_dtype)}
    return dict(qk_i8=False,
        quant=True, q_ctype=tensor_ctype(v.q_dtype), k_ctype=tensor_ctype(v.k_dtype), v_ctype=tensor_ctype(v.v_dtype),
        q_fp8=v.q_dtype.value, k_fp8=v.k_dtype.value, qk_types=f"{ptx[v.q_dtype]}.{ptx[v.k_dtype]}",
        v_fp8=quant_fwd.v_fp8(v), p_fp8=pt.value if pt else "", p_ptx=pt.info.ptx if pt else "",
        pv_types=f"{pt.info.ptx}.{ptx[v.v_dtype]}" if pt else "",
        p_static=float_literal(qp.static) if qp is not None and qp.static is not None else "",
        p_descale=float_literal(float(np.float32(1) / np.float32(qp.static))) if qp is not None and qp.static is not None else "",
        q_scale_code=quant_fwd.scale_code(v, QuantOperand.Q), k_scale_code=quant_fwd.scale_code(v, QuantOperand.K),
        v_scale_code=quant_fwd.scale_code(v, QuantOperand.V) if quant_fwd.v_fp8(v) else "",
    )


def _wgmma_shapes(kp: OpPlan, v: Variant) -> list[dict]:
    """Operand lists of the m64nNk16 wgmma wrappers the kernel uses (N = block_n for S, Dv for O):
    N / 2 fp32 accumulators per thread, then the A and B operands and the accumulate flag."""
    if kp.engine != Engine.WGMMA:
        return []
    out = []
    for n in sorted({kp.tile.block_n, v.value_head_dim}):
        regs = n // 2
        out.append(dict(
            n=n,
            regs=regs,
            d_list=", ".join(f"%{i}" for i in range(regs)),
            d_operands=", ".join(f'"+f"(d[{i}])' for i in range(regs)),
            ss_a=regs, ss_b=regs + 1, ss_flag=regs + 2,
            rs_a_list=", ".join(f"%{regs + i}" for i in range(4)), rs_b=regs + 4, rs_flag=regs + 5,
        ))
    return out


class _TemplateBytecode(jinja2.FileSystemBytecodeCache):
    """Compiled templates on disk, keyed by template name and source checksum (an edited template
    is a miss). Jinja writes entries by rename; an unreadable entry is a miss here, not an error."""

    def load_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
        try:
            super().load_bytecode(bucket)
        except Exception:
            bucket.reset()


@functools.cache
def _environment() -> jinja2.Environment:
    """One environment a process, so each template is compiled once, not at every render (about
    30 ms a render before); its compiled code is also kept on disk for the next process."""
    bytecode = None
    try:
        d = cache_dir() / "templates"
        d.mkdir(parents=True, exist_ok=True)
        bytecode = _TemplateBytecode(str(d))
    except OSError:
        pass  # an unwritable cache directory only costs compiling the templates
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(cuda_template_dir())),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
        bytecode_cache=bytecode,
    )


def render(v: Variant, arch: Arch = DEFAULT_ARCH, *, prefix: str = DEFAULT_PREFIX) -> str:
    """The complete `.cu` source for one variant (kernel, helpers, extern "C" host launcher)."""
    return render_with_plan(v, arch, prefix=prefix)[0]


def _split_ctx(sp: AxisSplit | None) -> dict | None:
    """A mask split by axis (emit.split_by_axis) for the templates; each value with the type its
    shuffle moves it as."""
    if sp is None:
        return None

    def val(x) -> dict:
        return dict(ctype=x.ctype, name=x.name, code=x.code, shfl_type="float" if x.ctype == "float" else "int")

    return dict(rows=[val(x) for x in sp.rows], cols=[val(x) for x in sp.cols], elem=sp.elem, elem_q=sp.elem_q,
                elem_kv=sp.elem_kv)


# Where each tensor-core forward engine's element loop finds a hoisted value: the wgmma visibility
# loop's two rows and its shuffled key (`ag_wg_vis`); the mma.sync pre-mask loop's rows by (row
# tile, half) and the same shuffled key (`ag_tile_step`; both accumulators put key 8 j + 2 (lane %
# 4) + e in a thread's column e of group j).
_SPLIT_REFS = {Engine.WGMMA: ("{}[ri]", "{}k"), Engine.MMA_SYNC: ("{}[mt][half]", "{}k")}


# The mma.sync engine takes the split up to this head dim. Above it its tiles hold 255 registers
# and ptxas spills erratically either way: at 128 x 64 the split took a padding mask's spills from
# 156 bytes to 0 at head dim 128 and a document mask's from 0 to 84, a prefix-LM's from 0 to 240
# (tools/mma_split_ptxas.py, results/mma_split_ptxas.txt); at 64 no form spills and the split
# needs fewer registers for documents and padding. The mma.sync dK/dV kernel (render_bwd) follows
# the same bound: at 128 the split spilled 20-44 bytes where the per-element form spilled 0-28.
# Wider heads keep the per-element form until a GPU run (benchmarks/mma_split_ab.py) weighs the
# loads it saves against the spills.
MMA_SPLIT_MAX_HEAD_DIM = 64


def _fwd_split(v: Variant, consts: dict, engine: Engine) -> AxisSplit | None:
    """The mask split by axis for a forward engine's visibility loop, or None (the FFMA engine,
    mma.sync above MMA_SPLIT_MAX_HEAD_DIM, masks without lookups or that do not split)."""
    if engine not in _SPLIT_REFS or not tensors_used(v.mask):
        return None
    if engine == Engine.MMA_SYNC and max(v.head_dim, v.value_head_dim) > MMA_SPLIT_MAX_HEAD_DIM:
        return None
    row_ref, col_ref = _SPLIT_REFS[engine]
    return split_by_axis(v.mask, consts, fast_math=True, row_ref=row_ref, col_ref=col_ref)


def mask_split(v: Variant, engine: Engine) -> AxisSplit | None:
    """How the forward kernel on `engine` reads the mask's lookups in partial tiles: split by axis
    (each row lookup once per row, each key lookup once per key) or None (per element)."""
    consts = {SizeSym.H: v.heads, SizeSym.HKV: v.kv_heads, SizeSym.D: v.head_dim, SizeSym.DV: v.value_head_dim}
    return _fwd_split(v, consts, engine)


def _kv_bounds_ctx(v: Variant, elem: ElementEmitter, engine: Engine) -> dict:
    """C++ for the mask's key upper bound at a global query position `q` ('' where the mask states
    none, or off the wgmma engine, whose producer alone walks key tiles downwards)."""
    code = ""
    walks = engine == Engine.WGMMA and max(v.head_dim, v.value_head_dim) <= 128  # wide rows keep the stateless scan
    for e in (kv_upper_bounds(v.mask) if walks else ()):
        c = elem.emit(e)
        code = c if not code else f"min({code}, {c})"
    return dict(kv_hi_code=code)


def render_with_plan(v: Variant, arch: Arch = DEFAULT_ARCH, *, prefix: str = DEFAULT_PREFIX,
                     softmax: WgmmaSoftmax | None = None) -> tuple[str, OpPlan]:
    """`render`, and the plan it rendered (`softmax`: as in `plan`)."""
    kp = plan(v, arch, prefix=prefix, softmax=softmax)
    consts = {SizeSym.H: v.heads, SizeSym.HKV: v.kv_heads, SizeSym.D: v.head_dim, SizeSym.DV: v.value_head_dim}
    decls = {d.name: d for d in v.runtime_inputs()}
    tc = kp.engine != Engine.FFMA
    elem = ElementEmitter(consts, fast_math=tc)
    mask_early = kp.engine == Engine.WGMMA and bool(tensors_used(v.mask))
    classify_lines, classify_result = IntervalEmitter(consts, decls).classify(v.mask)
    ctx = dict(
        header=_header(v, kp),
        ns=f"{kp.kernel_name}_impl",
        kernel_name=kp.kernel_name,
        elem_ctype=tensor_ctype(v.dtype),
        mma_type=v.dtype.info.ptx or "none",
        path="mma_q8" if v.quantized else {Engine.WGMMA: "wgmma", Engine.MMA_SYNC: "mma", Engine.FFMA: "simt"}[kp.engine],
        cp_async=arch.cp_async,
        mma_k16=arch.mma_k16,
        persistent=persistent(kp.engine),
        grid_cpp=kp.attention.grid_cpp(f"{kp.kernel_name}_impl"),
        D=v.head_dim,
        DV=v.value_head_dim,
        H=v.heads,
        HKV=v.kv_heads,
        scale=float_literal(v.effective_scale),
        block_m=kp.tile.block_m,
        block_n=kp.tile.block_n,
        warps=kp.threads // 32,
        epi_warps=kp.tile.warps,
        stages=kp.tile.stages,
        min_blocks=kp.attention.min_blocks,
        wgmma_shapes=_wgmma_shapes(kp, v),
        wgmma_regs=dict(zip(("producer", "consumer"), kp.attention.regs or (0, 0))),  # read on the wgmma path only
        q_buffers=kp.smem.q_buffers,
        kv_split=kp.smem.kv_split,
        wide_rows=max(v.head_dim, v.value_head_dim) > 128,
        tma=kp.attention.tma,
        # the arrivals a full barrier counts for its copies: every producer thread's cp.async, or
        # thread 0's TMA issue
        copy_arrivals="1" if kp.attention.tma else "PRODUCER_THREADS",
        tma_dtype=v.dtype.info.tma if v.dtype.info.tensor_cores else "",  # TMA copies feed tensor-core engines only
        tma_maps=[dict(name=m.name, tensor=m.tensor, rows=m.rows, cols=m.cols, heads=m.heads, length=m.length) for m in tma_maps(kp)] if kp.attention.tma else [],
        smem_bytes=kp.smem_bytes,
        fields=[dict(ctype=f.ctype, qctype=f.ctype.replace("elem_t", f"{kp.kernel_name}_impl::elem_t"), name=f.name) for f in kp.fields],
        tensors=_tensor_ctx(v),
        mask_text=_expr_text(v.mask),
        mask_code=elem.emit(v.mask),
        # Masks that read tensors are evaluated while S is on the tensor cores (wgmma engine),
        # their lookups hoisted per row and per key where the mask allows (emit.split_by_axis);
        # the mma.sync engine hoists them the same way into its visibility words.
        mask_early=mask_early,
        mask_split=_split_ctx(mask_split(v, kp.engine)),
        # The key bound the mask states (kv <= f(q)): the wgmma producer walks down from f.
        **_kv_bounds_ctx(v, elem, kp.engine),
        classify_lines=classify_lines,
        classify_result=classify_result,
        int_unknown=INT_UNKNOWN,
        has_score=bool(v.scores),
        score_texts=[_expr_text(s) for s in v.scores],
        score_codes=[elem.emit(s) for s in v.scores],
        residual=v.residual,
        residual_smem=kp.smem.residual_copy,
        nan_check=v.nan_check,
        lse=v.lse,
        sink=v.sink is not None,
        sink_tensor=v.sink or "",
        preps=[dict(kernel=pr.kernel, func=pr.func, rows=pr.rows_expr, workspace=pr.field.name, doc=pr.doc,
                    ws_bytes=pr.bytes_expr,
                    ws_ctype=pr.field.ctype.replace("__restrict__", "").strip().replace("elem_t", f"{kp.kernel_name}_impl::elem_t"))
               for pr in kp.preps],
        prep_threads=PREP_THREADS,
        prep_rows_per_block=PREP_ROWS_PER_BLOCK,
        prep_max_blocks=PREP_MAX_BLOCKS,
        **_norm_ctx(v),
        **_varlen_ctx(v),
        **_quant_ctx(v),
    )
    src = _environment().get_template("fwd/attention.cu.j2").render(**ctx)
    return src, kp


__all__ = ["render", "render_with_plan", "plan", "mask_split", "OpPlan", "TmaMap", "tma_maps", "OpKernel", "Problem", "KernelRole", "GridRule", "KernelPlan", "Field", "Prep", "resolve_tile", "kernel_name", "norm_weight_name", "norm_bias_name"]
