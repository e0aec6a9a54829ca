"""`attngen explain` and `attngen check`'s summary: a variant described in plain words.

Reads only the IR, with the ABI (shapes), the workload generator (sample inputs for data-dependent
masks) and the interval classifier (density and tile counts).
"""

from __future__ import annotations

import math
from typing import Any, Iterable

from attngen.ir.nodes import (
    BLOCK_TABLE,
    CACHE_LENS,
    LOGIC_OPS,
    AttnKind,
    Binary,
    BinOp,
    Builtin,
    Const,
    Expr,
    Layout,
    NormKind,
    NormScope,
    NormTarget,
    SizeSym,
    TensorDecl,
    TileConfig,
    Unary,
    UnOp,
    Variant,
    tensors_used,
)
from attngen.ir import abi
from attngen.analysis import intervals
from attngen.check import workload
from attngen.lang.builtins import BUILTINS
from attngen.lang.printer import print_expr
from attngen.plan.tile_advice import engine_move, tile_statement
from attngen.plan.op_plan import GridRule, KernelRole, OpPlan
from attngen.plan.schedule import (
    DEFAULT_ARCH,
    Arch,
    Engine,
    ffma_accumulators,
    q_token_norm,
    validate_tile,
    variant_tile,
)

DEFAULT_SHAPE = (1, 4096, 4096)  # B, Lq, Lk used for sample shapes and density

# explain's budget for the density sample. The visible fraction is counted element by element and
# tiles are classified one by one, over the batch rows and heads the mask indexes; the mask's input
# tensors are drawn at the sample shape. Past any of these the sample's Lq and Lk are halved until
# it fits (and the output says so); when even the smallest sample does not fit, the density is
# not computed (a fixed input dimension of 2^31 - 1, say).
MAX_SAMPLE_ELEMENTS = 1 << 24  # (b, h, q, kv) mask elements evaluated
MAX_SAMPLE_TILES = 4096  # tiles classified
MAX_SAMPLE_INPUT_ELEMENTS = 1 << 24  # elements of the drawn inputs the mask reads


# --------------------------------------------------------------------------------------------
# Expressions as readable text (for display only; `attngen fmt` owns the canonical form)

def expr_text(e: Expr) -> str:
    """`e` as canonical .attn text."""
    return print_expr(e)


# --------------------------------------------------------------------------------------------
# Plain words for masks and scores


def _builtin_words(b: Builtin, v: Variant) -> str:
    """The builtin's plain words, from its declaration (attngen.lang.builtins)."""
    aligned = "q" if v.kind == AttnKind.SELF else "q + (Lk - Lq)"
    if v.page_size is not None:
        aligned = f"q + ({CACHE_LENS}[b] - Lq)"  # a paged cache aligns to each row's own end
    return BUILTINS[b.name].words([expr_text(x) for x in b.args], v, aligned)


def _flatten(e: Expr, op: BinOp) -> list[Expr]:
    if isinstance(e, Binary) and e.op == op:
        return _flatten(e.lhs, op) + _flatten(e.rhs, op)
    return [e]


def _mask_lines(e: Expr, v: Variant, indent: str) -> list[str]:
    if isinstance(e, Const) and e.value is True:
        return [indent + "none: every query sees every key"]
    if isinstance(e, Binary) and e.op in LOGIC_OPS:
        parts = _flatten(e, e.op)
        head = "visible where ALL of these hold:" if e.op == BinOp.AND else "visible where ANY of these holds:"
        out = [indent + head]
        for p in parts:
            out += _mask_lines(p, v, indent + "  ")
        return out
    if isinstance(e, Unary) and e.op == UnOp.NOT:
        return [indent + "NOT the following:"] + _mask_lines(e.operand, v, indent + "  ")
    if isinstance(e, Builtin):
        return [indent + "- " + _builtin_words(e, v)]
    return [indent + f"- custom: {expr_text(e)}"]


def _score_line(e: Expr, v: Variant) -> str:
    if isinstance(e, Builtin):
        return _builtin_words(e, v)
    return f"custom: s -> {expr_text(e)}"


def is_data_dependent(v: Variant) -> bool:
    """True when the mask reads runtime tensors, so its density depends on the inputs given."""
    return bool(tensors_used(v.visibility()))


# --------------------------------------------------------------------------------------------
# Shapes


def io_shapes(v: Variant, B: int, Lq: int, Lk: int) -> dict[str, tuple[int, ...]]:
    """Shapes of q, k, v, o and lse at the given sizes."""
    return {
        "q": tuple(abi.q_shape(v, B, Lq)),
        "k": tuple(abi.kv_shape(v, B, Lk, False)),
        "v": tuple(abi.kv_shape(v, B, Lk, True)),
        "o": tuple(abi.o_shape(v, B, Lq)),
        "lse": tuple(abi.lse_shape(v, B, Lq)),
    }


def _symbolic(v: Variant, name: str) -> str:
    # Sizes fixed by the spec are shown as numbers; B, Lq, Lk stay symbols.
    if v.page_size is not None and name in ("k", "v"):
        # The page count is the caller's (any pool size), not a product of B and Lk.
        d = v.value_head_dim if name == "v" else v.head_dim
        return f"[num_pages, {v.page_size}, {v.kv_heads}, {d}]"
    shapes = io_shapes(v, _SB, _SLQ, _SLK)
    return _dims_text(shapes[name])


_SB, _SLQ, _SLK = 1000003, 1000033, 1000037  # distinct primes no fixed size can equal


def _dims_text(dims: Iterable[Any]) -> str:
    out = []
    for d in dims:
        if isinstance(d, SizeSym):
            out.append(d.value)
        elif d == _SB:
            out.append("B")
        elif d == _SLQ:
            out.append("Lq")
        elif d == _SLK:
            out.append("Lk")
        else:
            out.append(str(d))
    return "[" + ", ".join(out) + "]"


def _decl_symbolic(v: Variant, d: TensorDecl) -> str:
    fixed = {SizeSym.H: v.heads, SizeSym.HKV: v.kv_heads, SizeSym.D: v.head_dim, SizeSym.DV: v.value_head_dim}
    parts = []
    for dim in d.shape:
        if isinstance(dim, SizeSym) and dim in fixed:
            parts.append(f"{dim.value}={fixed[dim]}")
        elif isinstance(dim, SizeSym):
            parts.append(dim.value)
        else:
            parts.append(str(dim))
    return "[" + ", ".join(parts) + "]"


def _input_role(v: Variant, d: TensorDecl) -> str:
    users = []
    if d.name in tensors_used(v.mask):
        users.append("mask")
    if any(d.name in tensors_used(s) for s in v.scores):
        users.append("score")
    if d.name.endswith("_norm_weight"):
        return "norm weight (gamma)"
    if d.name.endswith("_norm_bias"):
        return "norm bias (beta)"
    if v.page_size is not None and d.name == BLOCK_TABLE and d.name not in (x.name for x in v.inputs):
        return (f"implied by kv_cache paged({v.page_size}): each row's pages in order (keys t*{v.page_size} .. "
                f"t*{v.page_size}+{v.page_size - 1} of row b live in page block_table[b, t]); Lk = max_pages * {v.page_size}")
    if v.page_size is not None and d.name == CACHE_LENS:
        return (f"implied by kv_cache paged({v.page_size}): row b's valid cached tokens, the Lq new ones included "
                f"(its last Lq); keys at or past {CACHE_LENS}[b] are invisible; from Lq to max_pages * {v.page_size}")
    if d.name in v.cu_seqlens_names and d.name not in (x.name for x in v.inputs):
        which = "q and k/v" if len(set(v.cu_seqlens_names)) == 1 else ("q" if d.name == v.cu_seqlens_names[0] else "k/v")
        return (f"implied by layout varlen: row offsets of the B packed sequences in {which} (prefix sums of the "
                "lengths, 0 first, the total last; B+1 values, checked never to decrease)")
    role = "read by the " + " and ".join(users) if users else "declared, unused"
    if d.sorted:
        role += "; sorted (never decreases along the last dim)"
    return role


# --------------------------------------------------------------------------------------------
# Density


def _pick(d: dict, *names: str) -> Any | None:
    for n in names:
        if n in d:
            return d[n]
    return None


def sample_sizes(v: Variant, B: int, Lq: int, Lk: int) -> abi.Sizes:
    """abi.Sizes at the sample shape, free dims bound as the workload would bind them."""
    syms = dict(workload.default_symbols(v, Lq, Lk))
    return abi.Sizes(B, Lq, Lk, tuple(sorted(syms.items())))


def _mask_inputs(v: Variant, B: int, Lq: int, Lk: int, sizes: Any, seed: int) -> dict:
    """Random contents for the tensors the mask reads (none for an index-only mask)."""
    used = tensors_used(v.visibility())
    if not used:
        return {}
    import dataclasses

    import numpy as np

    # make_inputs also draws q, k and v; at a sample shape such as H112 L4096 D128 those would
    # cost gigabytes, so they are drawn one element wide. Mask tensors never depend on D or norms.
    # Only the inputs the mask reads are drawn: a score's [H, Lq, Lk] bias would cost gigabytes.
    slim = dataclasses.replace(v, head_dim=1, value_head_dim=1, norms=(), residual=False, scores=(),
                               inputs=tuple(d for d in v.inputs if d.name in used))
    drawn = workload.make_inputs(slim, B, Lq, Lk, np.random.default_rng(seed), symbols=dict(sizes.symbols))
    return {n: drawn[n] for n in used if n in drawn}


def sample_cost(v: Variant, shape: tuple[int, int, int], tile: TileConfig) -> tuple[int, int, int]:
    """(mask elements evaluated, tiles classified, input elements drawn) of a density sample."""
    from attngen.ir.nodes import Index, IndexVar, walk

    B, Lq, Lk = shape
    uses = {n.var for n in walk(v.visibility()) if isinstance(n, Index)}
    rows = (B if IndexVar.B in uses else 1) * (v.heads if IndexVar.H in uses else 1)
    tiles = rows * math.ceil(Lq / tile.block_m) * math.ceil(Lk / tile.block_n)
    drawn = 0
    used = tensors_used(v.visibility())
    if used:
        sizes = sample_sizes(v, B, Lq, Lk)
        drawn = B * v.heads * Lq + 2 * B * v.kv_heads * Lk  # the one-wide q, k, v make_inputs draws too
        for d in v.runtime_inputs():
            if d.name in used:
                try:
                    drawn += math.prod(abi.input_shape(v, d, sizes))
                except ValueError:
                    pass  # a shape the sample cannot take: reported by the density itself
    return rows * Lq * Lk, tiles, drawn


def affordable_shape(v: Variant, shape: tuple[int, int, int], tile: TileConfig) -> tuple[int, int, int] | None:
    """`shape`, or the largest halving of its Lq and Lk within explain's budget; None if none fits."""
    B, Lq, Lk = shape
    while True:
        elems, tiles, drawn = sample_cost(v, (B, Lq, Lk), tile)
        if elems <= MAX_SAMPLE_ELEMENTS and tiles <= MAX_SAMPLE_TILES and drawn <= MAX_SAMPLE_INPUT_ELEMENTS:
            return B, Lq, Lk
        if Lq == 1 and Lk == 1:
            return None
        Lq, Lk = max(1, (Lq + 1) // 2), max(1, (Lk + 1) // 2)


def _density_lines(v: Variant, shape: tuple[int, int, int], tile: TileConfig, seed: int, tiles: bool = True) -> list[str]:
    """Lines about the mask's density at `shape` (or a smaller sample explain can afford, said so)
    and, with `tiles`, its classification into the forward's tiles."""
    fit = affordable_shape(v, shape, tile)
    if fit is None:
        elems, tiles, drawn = sample_cost(v, shape, tile)
        return [f"  (not computed: even a 1 x 1 sample needs {drawn} input elements, more than explain's budget "
                f"of {MAX_SAMPLE_INPUT_ELEMENTS})" if drawn > MAX_SAMPLE_INPUT_ELEMENTS else
                f"  (not computed: even a 1 x 1 sample classifies {tiles} tiles over {elems} elements, "
                f"more than explain's budget)"]
    if fit != shape:
        lines = [f"  (sampled at Lq={fit[1]}, Lk={fit[2]}: the full {shape[1]} x {shape[2]} sample is past explain's "
                 f"budget of {MAX_SAMPLE_ELEMENTS} mask elements, {MAX_SAMPLE_TILES} tiles and "
                 f"{MAX_SAMPLE_INPUT_ELEMENTS} input elements)"]
        return lines + _density_lines(v, fit, tile, seed, tiles)
    B, Lq, Lk = shape
    sizes = sample_sizes(v, B, Lq, Lk)
    try:
        inputs = _mask_inputs(v, B, Lq, Lk, sizes, seed)
        d = intervals.density(v, sizes, inputs, tile.block_m, tile.block_n)
    except ValueError as e:  # a sample shape the variant cannot take (e.g. a fixed-size input)
        return [f"  (not available at this shape: {e})"]
    lines = []
    frac = _pick(d, "visible", "visible_fraction", "density")
    if frac is not None:
        lines.append(f"  visible fraction: {100.0 * float(frac):.2f}% of the {Lq} x {Lk} score matrix")
    never, always, maybe = _pick(d, "never"), _pick(d, "always"), _pick(d, "maybe")
    if tiles and None not in (never, always, maybe):
        total = int(_pick(d, "tiles") or (never + always + maybe))
        lines.append(
            f"  tiles of {tile.block_m} x {tile.block_n} over all (b, h): {int(never)} skipped (nothing visible), "
            f"{int(always)} full (no per-element mask), {int(maybe)} partial of {total}"
        )
        if total:
            lines.append(f"  work done: {100.0 * (total - never) / total:.1f}% of the dense tiles")
    if is_data_dependent(v):
        used = ", ".join(sorted(tensors_used(v.visibility())))
        lines.append(f"  depends on runtime inputs ({used}); shown for random inputs (seed {seed})")
    return lines or [f"  {d}"]


# --------------------------------------------------------------------------------------------
# Public entry points


def resolved_tile(v: Variant, arch: Arch = DEFAULT_ARCH) -> tuple[TileConfig, bool]:
    """The tile the kernel uses and whether it came from `tile auto`."""
    return variant_tile(v, arch), v.tile is None


def _op_plan(v: Variant, arch: Arch) -> OpPlan:
    """The variant's forward plan on `arch`, its tile planned even where `arch` cannot take it
    (explain prints validate_tile's reasons beside it). ValueError where no plan exists (head dims
    the kernels do not implement)."""
    from attngen.plan.forward import plan

    return plan(v, arch, checked=False)


def _heads_text(v: Variant) -> str:
    if v.kv_heads == v.heads:
        return f"H{v.heads}"
    return f"H{v.heads}/Hkv{v.kv_heads}" + (" (MQA)" if v.kv_heads == 1 else " (GQA)")


def summary(v: Variant, arch: Arch = DEFAULT_ARCH) -> str:
    """One line: name, dtype, kind, layout, heads, dims, mask, scores, norms, tile."""
    d = f"D{v.head_dim}" + (f"/Dv{v.value_head_dim}" if v.value_head_dim != v.head_dim else "")
    parts = [f"{v.name}: {v.dtype.value} {v.kind.value} {v.layout.value} {_heads_text(v)} {d}"]
    parts.append("mask " + (expr_text(v.mask) if not (isinstance(v.mask, Const) and v.mask.value is True) else "none"))
    if v.scores:
        parts.append("score " + "; ".join(expr_text(s) for s in v.scores))
    for n in v.norms:
        parts.append(f"norm {n.target.value} {n.kind.value} {n.scope.value}")
    if v.residual:
        parts.append("residual")
    if v.sink is not None:
        parts.append(f"sink {v.sink}")
    from attngen.plan import decode as plan_decode

    if v.quantized:
        from attngen.lang.printer import quant_words

        from attngen.plan.quant_fwd import cuda_problem, qk_i8, quant_tile, wgmma_q8

        if plan_decode.fp8_kv(v):
            parts.append(quant_words(v) + ": the CUDA decode family (sm_89+) and the CPU backend")
        elif cuda_problem(v, arch) is None and wgmma_q8(v, arch):
            t = quant_tile(v, arch)
            parts.append(quant_words(v) + f": FP8 forward on wgmma m64n{t.block_n}k32 ({t.block_m}x{t.block_n}, {t.warps} warps and a "
                                          f"producer warpgroup, {t.stages} stages on {arch.value}; V transposed by a prep kernel)")
        elif cuda_problem(v, arch) is None:
            t = quant_tile(v, arch)
            parts.append(quant_words(v) + f": {'INT8' if qk_i8(v) else 'FP8'} forward on mma.sync m16n8k32 ({t.block_m}x{t.block_n}, {t.warps} warps, "
                                          f"{t.stages} stages on {arch.value})")
        else:
            parts.append(quant_words(v) + ": no CUDA kernel yet (CPU backend and reference)")
    elif plan_decode.forward_unsupported(v) is not None:
        op = plan_decode.plan(v, arch)
        dp = op.split
        assert dp is not None
        parts.append(f"kv_cache paged({v.page_size}): decode family for every Lq (split-KV mma.sync, "
                     f"{dp.block_n} keys a warp x {dp.warps} warps, {dp.stages} stages, {op.smem_bytes / 1024:.0f} KiB smem on {arch.value})")
    else:
        try:
            kp = _op_plan(v, arch)
        except ValueError as e:
            parts.append(f"no forward plan on {arch.value} ({e})")
        else:
            tile = kp.tile
            parts.append(
                f"tile {tile.block_m}x{tile.block_n} w{tile.warps} s{tile.stages}{' (auto)' if v.tile is None else ''} "
                f"{kp.engine.value} {kp.smem_bytes / 1024:.0f} KiB smem on {arch.value}"
            )
        if plan_decode.decode_unsupported(v) is None:
            parts.append(f"decode family (split-KV) for Lq <= {plan_decode.DECODE_MAX_LQ}")
    rt = v.runtime_inputs()
    if rt:
        parts.append("inputs " + ", ".join(f"{d.name}: {d.dtype.value}{_decl_symbolic(v, d)}" for d in rt))
    return ", ".join(parts)


def _partial_tile_lines(v: Variant, eng: Engine) -> list[str]:
    """How partial tiles read a mask that reads tensors: its lookups split by axis, or per element."""
    from attngen.cuda.render import mask_split

    if not tensors_used(v.mask):
        return []
    return [_split_line("  partial tiles", v, mask_split(v, eng), eng == Engine.FFMA, eng == Engine.MMA_SYNC, "query row")]


def _bwd_partial_tile_lines(v: Variant, arch: Arch) -> list[str]:
    """How the backward's dK/dV step reads a mask that reads tensors in partial tiles."""
    from attngen.cuda import render_bwd
    from attngen.plan import bwd as plan_bwd

    if not tensors_used(v.mask) or plan_bwd.unsupported(v):
        return []
    eng = plan_bwd.plan(v, arch).engine
    sp = render_bwd.mask_split(v, eng)
    return [_split_line("  dK/dV partial tiles", v, sp, eng == plan_bwd.BwdEngine.FFMA, eng == plan_bwd.BwdEngine.MMA, "query")]


def _split_line(head: str, v: Variant, sp, ffma: bool, mma: bool, row: str) -> str:
    """`head`: how a kernel reads the mask's lookups, from its split by axis `sp` (None: per element,
    and why: `ffma`, the FFMA engine; `mma`, the mma.sync engine, which splits up to a head dim)."""
    from attngen.cuda.render import MMA_SPLIT_MAX_HEAD_DIM

    if sp is None:
        why = "its lookups per element"
        if ffma:
            why += " (the FFMA engine)"
        elif mma and max(v.head_dim, v.value_head_dim) > MMA_SPLIT_MAX_HEAD_DIM:
            why += f" (the mma.sync engine reads them once per row and key up to head dim {MMA_SPLIT_MAX_HEAD_DIM})"
        else:
            why += " (a lookup reads both q and kv, or more than 4 would be held)"
        return f"{head}: the mask with {why}"
    parts = []
    if sp.rows:
        parts.append(f"once per {row}: " + ", ".join(print_expr(x.expr) for x in sp.rows))
    if sp.cols:
        parts.append("once per key: " + ", ".join(print_expr(x.expr) for x in sp.cols))
    return f"{head}: the mask's lookups read {'; '.join(parts)}; the rest per element, without memory reads"


def explain(
    v: Variant,
    shape: tuple[int, int, int] | None = None,
    arch: Arch = DEFAULT_ARCH,
    seed: int = 0,
) -> str:
    """A multi-line plain-words description of `v`; `shape` = (B, Lq, Lk) for sample shapes."""
    if v.quantized:
        return _quant_explain(v, shape, seed)
    B, Lq, Lk = shape or DEFAULT_SHAPE
    if v.kind == AttnKind.SELF and Lq > Lk:
        Lq = Lk  # (the command line refuses it) a self-attention call has at most as many queries as keys
    # Self attention with Lq < Lk is a decode (or extend) step: its Lq queries are the last Lq
    # positions of the Lk-long sequence, which the mask and the inputs sized Lq see whole.
    step_of = Lk if v.kind == AttnKind.SELF and Lq < Lk else None
    Lseq = Lq if step_of is None else Lk
    out = _heading_lines(v) + _computation_lines(v)

    # Inputs and outputs
    out.append("")
    out.append(f"Inputs and outputs (shapes at B={B}, Lq={Lq}, Lk={Lk}):")
    io = io_shapes(v, B, Lq, Lk)
    rows: list[tuple[str, str, str, str, str]] = []
    rows.append(("q", v.dtype.value, _symbolic(v, "q"), _dims_text(io["q"]), "queries" + (" (also x, the residual)" if v.residual else "")))
    rows.append(("k", v.dtype.value, _symbolic(v, "k"), _dims_text(io["k"]), "keys"))
    rows.append(("v", v.dtype.value, _symbolic(v, "v"), _dims_text(io["v"]), "values"))

    from attngen.plan import decode as plan_decode

    decode_only = plan_decode.forward_unsupported(v)
    tile, auto = resolved_tile(v, arch)
    dens_lines = _density_lines(v, (B, Lseq, Lk), tile, seed, tiles=decode_only is None)
    sizes = sample_sizes(v, B, Lseq, Lk)
    for d in v.runtime_inputs():
        try:
            concrete = _dims_text(abi.input_shape(v, d, sizes))
        except ValueError:
            concrete = "bound at run time"
        rows.append((d.name, d.dtype.value, _decl_symbolic(v, d), concrete, _input_role(v, d)))
    rows.append(("o", v.dtype.value, _symbolic(v, "o"), _dims_text(io["o"]), "output"))
    if v.lse:
        rows.append(("lse", "fp32", _symbolic(v, "lse"), _dims_text(io["lse"]), "output: log-sum-exp per row (natural log)"))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for r in rows:
        out.append("  " + "  ".join(r[i].ljust(widths[i]) for i in range(4)) + "  " + r[4])

    out.append("")
    if decode_only is not None:
        out += _decode_plan_lines(v, arch, B, Lq, Lk)
    else:
        out += _tile_plan_lines(v, arch, B, Lq, Lk, auto)
        if plan_decode.decode_unsupported(v, arch) is None:
            # The runtime's default family ("auto") sends small-Lq calls to the decode family: a
            # real decode step (one query, a long cache) only where Lq and Lk are independent.
            out.append("")
            if step_of is not None:
                out += _self_step_lines(v, Lq, Lk)
            elif v.kind == AttnKind.SELF:
                out.append(f"Decode family: calls with Lq = Lk <= {plan_decode.DECODE_MAX_LQ} and no offsets run on it under the "
                           "runtime's default family=\"auto\" (a decode step against a long cache is `kind cross`, or a "
                           "forward call placed by q_offset / kv_offset)")
            else:
                out += _decode_plan_lines(v, arch, B, 1, Lk, also=True)
        elif step_of is not None:
            out += [""] + _self_step_lines(v, Lq, Lk)

    out.append("")
    out.append(f"Mask density at B={B}, Lq={Lq}, Lk={Lk}:" if step_of is None else
               f"Mask density at B={B}, Lq = Lk = {Lk} (the whole sequence; this step computes its last {Lq} row"
               f"{'s' if Lq != 1 else ''}):")
    out += dens_lines

    from attngen.plan.bwd import describe as describe_backward

    out.append("")
    out += describe_backward(v, arch)
    out += _bwd_partial_tile_lines(v, arch)
    return "\n".join(out)


def _quant_explain(v: Variant, shape: tuple[int, int, int] | None, seed: int) -> str:
    """A quantized variant: its stored types and quant statements, its I/O, the accuracy report
    (attngen.tools.explain_quant); no CUDA plan, since no CUDA kernel runs it yet."""
    from attngen.tools import explain_quant

    B, Lq, Lk = shape or DEFAULT_SHAPE
    out = _heading_lines(v) + _computation_lines(v) + explain_quant.quant_lines(v)
    out += ["", f"Inputs and outputs (shapes at B={B}, Lq={Lq}, Lk={Lk}):"]
    io = io_shapes(v, B, Lq, Lk)
    rows = [(n, d.value, _symbolic(v, n), _dims_text(io[n]), role)
            for n, d, role in (("q", v.q_dtype, "queries"), ("k", v.k_dtype, "keys"), ("v", v.v_dtype, "values"))]
    sizes = sample_sizes(v, B, Lq, Lk)
    for d in v.runtime_inputs():
        try:
            concrete = _dims_text(abi.input_shape(v, d, sizes))
        except ValueError:
            concrete = "bound at run time"
        rows.append((d.name, d.dtype.value, _decl_symbolic(v, d), concrete, explain_quant.input_role(v, d.name) or _input_role(v, d)))
    rows.append(("o", v.dtype.value, _symbolic(v, "o"), _dims_text(io["o"]), "output"))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    out += ["  " + "  ".join(r[i].ljust(widths[i]) for i in range(4)) + "  " + r[4] for r in rows]
    return "\n".join(out + explain_quant.accuracy_lines(v, seed))


def _heading_lines(v: Variant) -> list[str]:
    """The variant's name, kind, dtype, layout and heads."""
    out: list[str] = []
    kind = "self attention (Lq == Lk)" if v.kind == AttnKind.SELF else "cross attention (Lq and Lk independent)"
    out.append(f"attention {v.name}: {kind}")
    out.append(
        f"  {v.dtype.value} Q/K/V/O, fp32 accumulation; layout {v.layout.value}"
        + {Layout.BSHD: " (a [B, L, H*D] hidden state)", Layout.VARLEN: " (B packed sequences: [total, H, D] rows, split by "
           "cu_seqlens; positions restart at 0 in each sequence, so q, kv, Lq and Lk below are those of one sequence)"}.get(v.layout, " ([B, H, L, D])")
    )
    heads = f"  {v.heads} query heads"
    if v.kv_heads == v.heads:
        heads += ", each with its own key/value head (MHA)"
    elif v.kv_heads == 1:
        heads += " share one key/value head (MQA)"
    else:
        heads += f" share {v.kv_heads} key/value heads (GQA: {v.group_size} query heads a group)"
    heads += f"; head_dim {v.head_dim}" + (f", value head_dim {v.value_head_dim}" if v.value_head_dim != v.head_dim else "")
    out.append(heads)
    return out


def _computation_lines(v: Variant) -> list[str]:
    """What is computed, step by step: the norms, the score, the mask, softmax, P @ V and what follows it."""
    out = ["", "What is computed, for each batch row b, head h, query q and key kv:"]
    step = 1
    for n in v.norms:
        if n.target == NormTarget.O:
            continue
        what = "LayerNorm" if n.kind == NormKind.LAYERNORM else "RMSNorm"
        over = (f"the whole {v.heads * v.head_dim}-wide hidden row (all heads; token scope)"
                if n.scope == NormScope.TOKEN else f"each head's {v.head_dim} values (head scope, QK-norm)")
        aff = "with learned weights" if n.affine else "without weights"
        out.append(f"  {step}. {n.target.value} = {what}({n.target.value}) over {over}, eps {n.eps:g}, {aff}; rounded to {v.dtype.value}")
        step += 1
    scale_words = f"{v.effective_scale:.6g}" + (f" (1/sqrt({v.head_dim}))" if v.scale is None else " (given)")
    hk = "h" if v.kv_heads == v.heads else f"h // {v.group_size}"
    out.append(f"  {step}. s = {scale_words} * dot(q[b, h, q, :], k[b, {hk}, kv, :])")
    step += 1
    for sc in v.scores:
        out.append(f"  {step}. score: {_score_line(sc, v)}")
        step += 1
    out.append(f"  {step}. mask:")
    out += _mask_lines(v.mask, v, "       ")
    if v.page_size is not None:
        out.append(f"       and, implied by kv_cache paged: kv < {CACHE_LENS}[b] (keys past each row's length are invisible)")
    step += 1
    out.append(f"  {step}. P = softmax over the visible keys of s (running max, fp32); a row with no visible key gives O = 0, LSE = -inf")
    step += 1
    out.append(f"  {step}. o = P @ v[b, {hk}, :, :]")
    step += 1
    on = v.norm(NormTarget.O)
    if on is not None:
        what = "LayerNorm" if on.kind == NormKind.LAYERNORM else "RMSNorm"
        out.append(f"  {step}. o = {what}(o) over each head's {v.value_head_dim} values, eps {on.eps:g}"
                   + (" with learned weights" if on.affine else ""))
        step += 1
    if v.residual:
        out.append(f"  {step}. o = x + o, x the q input before any norm (residual)")
        step += 1
    if v.nan_check:
        out.append(f"  {step}. nan_check: the kernel raises a flag if o holds NaN or Inf")
    return out


def _self_step_lines(v: Variant, Lq: int, Lk: int) -> list[str]:
    """How a self-attention decode (or extend) step of Lq new queries against Lk keys runs."""
    rows = "the query is the last position" if Lq == 1 else f"the {Lq} queries are the last {Lq} positions"
    return [f"Decode step (self attention, Lq={Lq} < Lk={Lk}): {rows} of the {Lk}-long sequence. Call",
            f"  kernel(q, k, v, q_offset={Lk - Lq}, ...) with k and v the whole sequence (Lq_total defaults to q_offset + Lq = Lk):",
            "  masks and scores see global positions. A call placed by q_offset runs on the forward family, at the tiles above."]


# An H200's SMs: the sample shape's split count is shown for it (the runtime reads the device's).
_SAMPLE_SMS = 132


def _decode_plan_lines(v: Variant, arch: Arch, B: int, Lq: int, Lk: int, also: bool = False) -> list[str]:
    """The decode family's plan: for variants only it runs (plan.decode.forward_unsupported: a
    paged KV cache), or (`also`) for the small-Lq calls of a forward variant it can run too."""
    from attngen.plan import decode as plan_decode

    try:
        op = plan_decode.plan(v, arch)
    except ValueError as e:  # an arch the decode family cannot target (before sm_80)
        return [f"Decode plan on {arch.value}: none ({e})"]
    dp = op.split
    assert dp is not None
    group = v.heads // v.kv_heads
    splits, ctas = dp.schedule(B, Lq, Lk, _SAMPLE_SMS)
    from attngen.runtime.decode import DecodeKernel

    merged = DecodeKernel.fused_default
    launches = op.launches(B, Lq, splits, ctas, merged=merged)
    if also:
        out = [f"Decode plan on {arch.value} (the runtime's default family=\"auto\" runs calls with Lq <= {plan_decode.DECODE_MAX_LQ} "
               "and no offsets on the decode family; `attngen compile --family decode` emits it):"]
    else:
        out = [f"Decode plan on {arch.value} (kv_cache paged: every Lq runs on the decode family; the forward family has no paged kernel):"]
    packed = (f"the {group} query heads of a key/value head packed as rows of one tile, so a group reads its K/V once"
              if group > 1 else "one query head a key/value head")
    out.append(f"  engine: split-KV mma.sync tensor cores, {dp.warps} warps ({dp.threads} threads), {dp.block_m} query rows a CTA "
               f"({packed})")
    out.append(f"  K/V stream through a ring of {dp.stages} chunks of {dp.chunk} keys ({dp.block_n} a warp)"
               + (f", copied page by page through block_table ({v.page_size}-token pages)" if v.page_size is not None else ""))
    out.append(f"  shared memory {op.smem_bytes} bytes ({op.smem_bytes / 1024:.1f} KiB) of {arch.smem_budget // 1024} KiB")
    out.append(f"  at B={B}, Lq={Lq}, Lk={Lk} on {_SAMPLE_SMS} SMs: each of {dp.row_blocks(B, Lq)} row blocks split into "
               f"{splits} key range(s), {ctas} CTAs; kernels: " + ", then ".join(f"{ln.kernel} (grid {ln.grid[0]})" for ln in launches))
    if splits > 1 and merged:
        out.append(f"  the last CTA of each row block merges its splits' partial O and LSE (fused=False launches "
                   f"{op.kernel(KernelRole.COMBINE).name} for it instead)")
    return out


def _tile_plan_lines(v: Variant, arch: Arch, B: int, Lq: int, Lk: int, auto: bool) -> list[str]:
    """The forward family's tile plan, read from its OpPlan."""
    out: list[str] = []
    try:
        kp = _op_plan(v, arch)
    except ValueError as e:
        return [f"Tile plan on {arch.value}: none ({e})"]
    tile, layout, eng, n_threads = kp.tile, kp.smem, kp.engine, kp.threads
    smem = layout.bytes
    out.append(f"Tile plan on {arch.value}{' (tile auto)' if auto else ''}:")
    out.append(
        f"  block_m {tile.block_m}, block_n {tile.block_n}, warps {tile.warps} ({n_threads} threads"
        f"{', with the producer warpgroup' if eng == Engine.WGMMA else ''}), stages {tile.stages}"
    )
    out.append(f"  engine: {eng.describe(tile, kp.attention.tma)}")
    move = engine_move(v, arch)
    if move is not None:
        out.append(f"  warning: this explicit tile moves the kernel from {move.auto_engine.value} to {move.engine.value}: "
                   f"{move.why}; `tile auto` picks `{tile_statement(move.auto_tile)}` ({move.auto_engine.value}) here")
    if kp.short is not None:
        t = kp.short.tile
        out.append(
            f"  short key loops (Lk <= {kp.short_max_lk}): a second kernel at block_m {t.block_m}, block_n {t.block_n}, "
            f"warps {t.warps}, stages {t.stages}, chosen at launch by the Python runtime (the source of "
            f"`attngen compile` carries the main tile only)"
        )
    q_tile = f"{tile.block_m} x {v.head_dim}"
    q_what = f"two {q_tile} Q buffers" if layout.q_buffers == 2 else f"a {q_tile} Q tile"
    out.append(
        f"  shared memory {smem} bytes ({smem / 1024:.1f} KiB) of {arch.smem_budget // 1024} KiB: "
        f"{q_what} and {tile.stages} stage(s) of {tile.block_n}-key K/V tiles"
    )
    if eng == Engine.WGMMA and q_token_norm(v):
        extra = "each Q buffer's row statistics and norm weights, copied with it"
        if layout.residual_copy:
            extra += "; a copy of the raw x rows for the residual"
        elif v.residual:
            extra += "; the residual read from global memory (a copy does not fit)"
        out.append(f"  with the token norm: {extra}")
    if eng == Engine.FFMA:
        kw = tile.block_n // tile.warps
        out.append(f"  each warp owns {kw} keys of every K/V tile (its own copies, softmax and partial O; "
                   f"the {tile.warps} partial results combine at the end): "
                   f"{ffma_accumulators(v.head_dim, v.value_head_dim, tile)} accumulator registers a thread")
    for msg in validate_tile(v.dtype, v.head_dim, v.value_head_dim, tile, arch, token_norm=q_token_norm(v)):
        out.append(f"  warning: {msg}")
    key_tiles = f"{math.ceil(Lk / tile.block_n)} key tiles per query tile at most"
    # The plan's grid rule; with unbounded SMs a persistent grid is the work-tile count.
    att = kp.attention
    g = att.launch_grid(v.heads, B, Lq, Lk, sm_count=1 << 62)
    pers = att.grid_rule == GridRule.PERSISTENT
    grid_m = math.ceil(Lq / tile.block_m)
    if att.varlen:
        unit = "work tiles" if pers else "CTAs"
        out.append(f"  {g[0] * g[1] * g[2] if not pers else g[0]} {unit} ({att.tile_slots(B, Lq)} query tile slots (total_q / {tile.block_m} + B: each "
                   f"sequence's tiles and at most one empty slot, which exits at once) x {v.heads} heads)"
                   f"{', over persistent CTAs, at most one an SM' if pers else ''}; {key_tiles}")
    elif pers:
        out.append(f"  {g[0]} work tiles ({grid_m} query tiles x {v.heads} heads x {B} batch) over persistent CTAs, "
                   f"at most one an SM; {key_tiles}")
    else:
        out.append(f"  grid {g[0]} x {g[1]} x {g[2]} CTAs (query tiles x heads x batch); {key_tiles}")

    out += _partial_tile_lines(v, eng)
    return out
