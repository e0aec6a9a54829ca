"""The forward family's plan (stage: plan): the variant's tile, chosen once, its kernels in launch
order (prep kernels, then the attention kernel), the ABI fields, the workspaces and the short-loop
kernel, as one frozen `OpPlan` (attngen.plan.op_plan). Render, the runtime, the C header, `explain`
and the plan stage's limits read it; nothing downstream changes a decision made here."""

from __future__ import annotations

import functools
import re

from attngen.ir import names
from attngen.ir.nodes import DType, Layout, NormScope, NormTarget, TileConfig, Variant, tensors_used
from attngen.cuda.emit import tensor_ctype
from attngen.plan import quant_fwd
from attngen.plan.limits import MAX_PARAM_BYTES, param_bytes
from attngen.plan.op_plan import PREP_THREADS, Field, GridRule, KernelRole, OpFamily, OpKernel, OpPlan, Prep, Problem, problem_of
from attngen.plan.schedule import (
    DEFAULT_ARCH,
    Arch,
    Engine,
    SmemLayout,
    WgmmaLoads,
    WgmmaSoftmax,
    engine,
    head_dims_problem,
    min_blocks_per_sm,
    persistent,
    q_token_norm,
    short_tile,
    threads,
    validate_tile,
    variant_smem_layout,
    variant_tile,
    wgmma_regs,
    wgmma_softmax,
    wgmma_tma_ok,
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
    return _usable_tile(v, variant_tile(v, arch), arch)


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


def _preps(v: Variant, prefix: str = DEFAULT_PREFIX, arch: Arch | None = None) -> tuple[Prep, ...]:
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
    out.extend(quant_fwd.preps(v, name, arch))
    return tuple(out)


def plan(v: Variant, arch: Arch = DEFAULT_ARCH, *, prefix: str = DEFAULT_PREFIX, softmax: WgmmaSoftmax | None = None,
         checked: bool = True) -> OpPlan:
    """The frozen plan of a variant on `arch` (computed once per (variant, arch, prefix), then
    cached; `prefix` starts every symbol name: see `kernel_name`). `softmax` replaces the wgmma
    consumers' softmax schedule `wgmma_softmax` picks (for A/B timing; ignored off wgmma).
    `checked` False plans the variant's tile even where `arch` cannot take it (`explain` describes
    such a tile, with validate_tile's reasons, from this plan); such a plan is never rendered."""
    return _plan(v, arch, prefix, softmax, checked)


@functools.lru_cache(maxsize=512)
def _plan(v: Variant, arch: Arch, prefix: str = DEFAULT_PREFIX, softmax: WgmmaSoftmax | None = None,
          checked: bool = True) -> OpPlan:
    if v.page_size is not None:  # the forward kernels read contiguous K/V only
        raise ValueError(f"variant {v.name}: `kv_cache paged` runs on the decode family (render_decode), not the forward kernel")
    bad_dims = head_dims_problem(v.dtype, v.head_dim, v.value_head_dim)
    if bad_dims:
        raise ValueError(f"variant {v.name}: {bad_dims}")
    if v.quantized:  # the 8-bit forward's own tiles (plan.quant_fwd), no short-loop kernel
        why = quant_fwd.forward_problem(v) or quant_fwd.tile_problem(v, tile := quant_fwd.quant_tile(v, arch), arch)
        if why:
            raise ValueError(f"variant {v.name}: {why}")
        return _tile_plan(v, arch, prefix, softmax, tile)
    tile = resolve_tile(v, arch) if checked else variant_tile(v, arch)
    st = short_tile(v, arch)
    short = None
    if st is not None:
        # The short-loop kernel: the same variant at the short tile, chosen here once; the runtime
        # compiles it beside the main kernel and launches it for calls with Lk <= short_max_lk.
        short = _tile_plan(v, arch, prefix, softmax, _usable_tile(v, st.tile, arch))
    return _tile_plan(v, arch, prefix, softmax, tile, short, st.max_lk if st is not None else 0)


def _usable_tile(v: Variant, tile: TileConfig, arch: Arch) -> TileConfig:
    """`tile`, or a ValueError naming why `arch` cannot take it."""
    errs = validate_tile(v.dtype, v.head_dim, v.value_head_dim, tile, arch, token_norm=q_token_norm(v))
    if errs:
        raise ValueError(f"variant {v.name}: tile {tile.block_m}x{tile.block_n} cannot be used on {arch.value}: " + "; ".join(errs))
    return tile


def _tile_plan(v: Variant, arch: Arch, prefix: str, softmax: WgmmaSoftmax | None, tile: TileConfig,
               short: OpPlan | None = None, short_max_lk: int = 0) -> OpPlan:
    """The forward's kernels at `tile`: every decision made once, in order (engine, shared memory,
    ABI fields, then the copies the fields leave room for)."""
    preps = _preps(v, prefix, arch)
    eng = engine(v.dtype, v.head_dim, v.value_head_dim, tile, arch)
    pers = persistent(eng)
    problem = problem_of(v, arch)
    fields = _fields(v, preps, pers)
    if v.quantized:  # the FP8 wgmma engine's layout (two Q buffers, shared K / V^T slots), or mma.sync's
        q8 = quant_fwd.wgmma_q8(v, arch)
        smem = (SmemLayout(quant_fwd.wgmma_q8_smem(v, tile), q_buffers=quant_fwd.WGMMA_Q8_Q_BUFS) if q8
                else SmemLayout(quant_fwd.quant_smem_bytes(v, tile)))
    else:
        smem = variant_smem_layout(v, tile, arch)
    wg = eng == Engine.WGMMA
    attention = OpKernel(
        name=kernel_name(v, prefix),
        role=KernelRole.ATTENTION,
        threads=threads(v.dtype, v.head_dim, v.value_head_dim, tile, arch),
        grid_rule=GridRule.PERSISTENT if pers else GridRule.TILES,
        engine=eng,
        tile=tile,
        smem=smem,
        min_blocks=min_blocks_per_sm(v.dtype, v.head_dim, v.value_head_dim, tile, arch),
        regs=wgmma_regs(tile, bool(tensors_used(v.mask)), bool(v.scores), v.layout == Layout.VARLEN) if wg else None,
        softmax=_wgmma_softmax(v, problem, tile, smem, fields, softmax) if wg else None,
        varlen=v.layout == Layout.VARLEN,
    )
    prep_kernels = tuple(OpKernel(name=pr.kernel, role=KernelRole.PREP, threads=PREP_THREADS, grid_rule=GridRule.ROWS, prep=pr,
                                  rows=(pr.span,)) for pr in preps)
    return OpPlan(problem=problem, kernels=(*prep_kernels, attention), fields=fields, workspaces=preps,
                  short=short, short_max_lk=short_max_lk, family=OpFamily.FORWARD, base_name=attention.name)


def _wgmma_softmax(v: Variant, problem: Problem, tile: TileConfig, smem: SmemLayout, fields: tuple[Field, ...],
                   override: WgmmaSoftmax | None) -> WgmmaSoftmax:
    """The wgmma consumers' schedule: the asked (or default) one, whose TMA copies stay where the
    variant allows them (`wgmma_tma_ok`) and the descriptors fit the parameter space, else cp.async."""
    asked = override or wgmma_softmax(v.head_dim, v.value_head_dim, tile)
    # (the FP8 engine copies with cp.async: its descriptors would be byte-typed and V^T's a workspace's)
    tma = asked.loads == WgmmaLoads.TMA and not v.quantized and wgmma_tma_ok(
        varlen=v.layout == Layout.VARLEN, wide_rows=problem.wide_rows,
        q_norm=v.norm(NormTarget.Q) is not None, k_norm=v.norm(NormTarget.K) is not None,
        residual_copy=smem.residual_copy, score_lookups=any(tensors_used(e) for e in v.scores)) and _tma_param_room(fields)
    return WgmmaSoftmax(loads=WgmmaLoads.TMA if tma else WgmmaLoads.CP_ASYNC)


def _tma_param_room(fields: tuple[Field, ...]) -> bool:
    """Whether the three 128-byte descriptors (64-byte aligned) still fit the kernel's parameter
    space after the ABI fields (a variant with many runtime inputs keeps cp.async instead)."""
    ends = param_bytes([f.ctype for f in fields])
    end = ends[-1] if ends else 0
    return (end + 63) // 64 * 64 + 3 * 128 <= MAX_PARAM_BYTES


__all__ = ["DEFAULT_PREFIX", "input_fields", "kernel_name", "plan", "resolve_tile"]
