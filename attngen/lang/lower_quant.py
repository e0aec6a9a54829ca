"""Lowering of the quantization statements: the per-tensor `dtype` and `quant` (docs/QUANT.md).

`dtypes` turns a `dtype` statement into the output's type and the stored types of q, k and v;
`quants` turns the `quant` statements into `ir.Quant` nodes and checks how they combine with each
other, with the stored types, the norms, the cache and the tile hint. Every refusal is a located
error; the target's compute capability (`Target.cc`) is checked here as for the attention dtypes.
"""

from __future__ import annotations

from typing import Mapping

from attngen.ir.dtypes import ATTENTION_DTYPES, QUANT_DTYPES, DType
from attngen.ir.nodes import (
    QUANT_OPERAND_ORDER,
    QUANT_SCALE_NAMES,
    InputDTypes,
    Layout,
    Norm,
    NormTarget,
    Quant,
    QuantOperand,
    ScaleGranularity,
    ScaleSource,
    Smooth,
    Span,
    TensorDecl,
    TileHint,
)
from attngen.lang import ast as A
from attngen.lang.lower_expr import Lowerer, first_at

_ATTN = {d.value: d for d in ATTENTION_DTYPES}
_STORED = {d.value: d for d in (*ATTENTION_DTYPES, *QUANT_DTYPES)}
_QTYPES = {d.value: d for d in QUANT_DTYPES}
_TENSORS = {"q": "q", "k": "k", "v": "v", "out": "out"}
_OPERANDS = {o.value: o for o in QuantOperand}
_SOURCES = {s.value: s for s in ScaleSource}
_GRANULARITIES = {g.value: g for g in ScaleGranularity}
_SMOOTH = {s.value: s for s in Smooth}
BLOCK_SIZES = (16, 32, 64, 128, 256)  # tokens a `per block(N)` scale may cover (powers of two: they divide the tiles)

G = ScaleGranularity


def allowed_granularities(operand: QuantOperand, source: ScaleSource, paged: bool) -> tuple[ScaleGranularity, ...]:
    """What one scale may cover for `operand` with scales from `source` (docs/QUANT.md's table).
    v's scale must be constant along the P·V sum (tokens), so v has no token or block scales; a
    paged cache's pages are stored quantized, with their scales beside them."""
    if source == ScaleSource.STATIC:
        return ()
    if operand == QuantOperand.P:
        return (G.TOKEN,) if source == ScaleSource.AMAX else ()
    if source == ScaleSource.AMAX:
        if operand == QuantOperand.V:
            return () if paged else (G.CHANNEL,)
        return (G.TOKEN, G.BLOCK) if not (paged and operand == QuantOperand.K) else ()
    if operand == QuantOperand.Q:
        return (G.TENSOR, G.HEAD, G.TOKEN, G.BLOCK)
    if paged:
        return (G.TENSOR, G.HEAD, G.PAGE)
    return (G.TENSOR, G.HEAD, G.TOKEN, G.BLOCK) if operand == QuantOperand.K else (G.TENSOR, G.HEAD, G.CHANNEL)


def _arch(lw: Lowerer, d: DType, span: Span) -> bool:
    """False (and an error) when the target's compute capability is below the type's."""
    cc = lw.target.cc
    if cc is not None and d.info.min_cc > cc:
        need = f"sm_{d.info.min_cc}"
        lw.error(f"{d.value} needs {need} or newer; {lw.target.name} has no {d.value} tensor cores", span,
                 f"compile for {need} or newer" + (", or quantize to i8 (sm_80+)" if d != DType.I8 and cc >= 80 else ""))
        return False
    return True


def dtypes(lw: Lowerer, st: A.Stmt) -> tuple[DType | None, InputDTypes | None]:
    """`dtype T [q|k|v|out T]...`: (the output's type, the stored types of q/k/v where any differs
    from it). Inputs stored unquantized share the output's type; only quantized storage differs."""
    if isinstance(st, A.WordStmt):  # `dtype T`: one attention type for all four
        if st.value.text in _QTYPES:
            lw.error(f"the output cannot be {st.value.text}: quantized types are for q, k and v", st.value.span,
                     f"give the output its own type, e.g. `dtype {st.value.text} out bf16`")
            return None, None
        return lw.choice(st.value, _ATTN, "attention dtype"), None  # type: ignore[return-value]
    assert isinstance(st, A.DTypeStmt)
    pairs, first = st.overrides, st.value
    base = lw.choice(first, _STORED, "dtype")
    types: dict[str, tuple[object, A.Word]] = {t: (base, first) for t in _TENSORS}
    given: dict[str, A.Word] = {}
    ok = base is not None
    for tensor, word in pairs:
        t = lw.choice(tensor, _TENSORS, "dtype target")
        if t is None:
            ok = False
            continue
        if t in given:
            lw.error(f"the dtype of `{t}` given twice", tensor.span, f"first given at {first_at(given[t].span, tensor.span)}")
            ok = False
            continue
        given[t] = tensor
        d = lw.choice(word, _STORED, "dtype")
        ok = ok and d is not None
        types[t] = (d, word)
    if not ok:
        return None, None
    out, out_word = types["out"]
    assert isinstance(out, DType)
    if out.info.quant:
        lw.error(f"the output cannot be {out.value}: quantized types are for q, k and v", out_word.span,
                 f"give the output its own type, e.g. `dtype {out.value} out bf16`")
        return None, None
    stored: dict[str, DType] = {}
    for t in ("q", "k", "v"):
        d, word = types[t]
        assert isinstance(d, DType)
        if not d.info.quant and d != out:
            lw.error(f"`{t}` stored as {d.value} with a {out.value} output", word.span,
                     "inputs stored unquantized share the output's type; only quantized types (" +
                     ", ".join(_QTYPES) + ") may differ")
            return None, None
        if d.info.quant and not _arch(lw, d, word.span):
            return None, None
        stored[t] = d
    if all(d == out for d in stored.values()):
        return out, None
    return out, InputDTypes(stored["q"], stored["k"], stored["v"])


def _quant(lw: Lowerer, st: A.QuantStmt, paged: bool, stored: Mapping[QuantOperand, DType]) -> Quant | None:
    """One statement, checked on its own (the combinations: `quants`)."""
    op = lw.choice(st.operand, _OPERANDS, "quantized operand")
    qt = lw.choice(st.qtype, _QTYPES, "quantized type")
    src = lw.choice(st.source, _SOURCES, "scale source")
    if op is None or qt is None or src is None:
        return None
    assert isinstance(op, QuantOperand) and isinstance(qt, DType) and isinstance(src, ScaleSource)
    if not _arch(lw, qt, st.qtype.span):
        return None
    static = None
    if src == ScaleSource.STATIC:
        if op != QuantOperand.P:
            lw.error(f"`static` scales are for p, not `{op.value}`", st.source.span,
                     "q, k and v take scales as inputs (input per ...) or computed in the kernel (amax per ...)")
            return None
        if st.source_arg is None:
            lw.error("`static` needs its scale: `static(c)`", st.source.span,
                     f"e.g. `quant p {qt.value} static({qt.info.qmax:.1f})`: p in [0, 1] is multiplied by c before rounding")
            return None
        static = lw.positive_float(st.source_arg, "static scale")
        if static is None:
            return None
        if st.per is not None:
            lw.error("a `static` scale covers the whole of p", st.per.span, f"write `quant p {qt.value} static({static!r})`")
            return None
    elif st.source_arg is not None:
        lw.error(f"`{src.value}` takes no argument", st.source_arg.span, "only static(c) does")
        return None
    if op in stored and src == ScaleSource.AMAX:
        lw.error(f"`{op.value}` is stored as {stored[op].value}: its scale cannot be computed in the kernel", st.source.span,
                 f"a stored quantized input comes with its scales, e.g. `quant {op.value} {stored[op].value} input per head`")
        return None
    if op == QuantOperand.P and src == ScaleSource.INPUT:
        lw.error("p is computed in the kernel and has no input scale", st.source.span,
                 f"use `quant p {qt.value} static({qt.info.qmax:.1f})` or `quant p {qt.value} amax per token`")
        return None
    gran, block = _granularity(lw, st, op, src, paged)
    if src != ScaleSource.STATIC and gran is None:
        return None
    smooth = None
    if st.smooth is not None:
        s = lw.choice(st.smooth, _SMOOTH, "smoothing")
        if s is None:
            return None
        if op != QuantOperand.K:
            lw.error(f"smoothing is for k, not `{op.value}`", st.smooth.span,
                     "subtracting k's mean over tokens shifts each row of scores by one constant, which softmax ignores; "
                     "no other operand has that freedom")
            return None
        if src != ScaleSource.AMAX:
            lw.error("`smooth mean` needs scales computed in the kernel", st.smooth.span,
                     f"the mean is computed in the kernel, so are the scales of what it leaves: `quant k {qt.value} amax per token smooth mean`")
            return None
        smooth = s
    return Quant(op, qt, src, gran, block, static, smooth, st.span)  # type: ignore[arg-type]


def _granularity(lw: Lowerer, st: A.QuantStmt, op: QuantOperand, src: ScaleSource,
                 paged: bool) -> tuple[ScaleGranularity | None, int | None]:
    """`per G[(N)]`: the granularity and N, each checked against what `op` and `src` take."""
    if src == ScaleSource.STATIC:
        return None, None
    allowed = allowed_granularities(op, src, paged)
    if not allowed:
        lw.error(f"`{op.value}` takes no `{src.value}` scales here", st.source.span,
                 "a paged cache's pages are stored quantized, with their scales as inputs (input per ...)")
        return None, None
    if st.per is None:
        hint = ", ".join(f"`per {g.value}" + ("(64)" if g == G.BLOCK else "") + "`" for g in allowed)
        lw.error(f"say what one scale of `{op.value}` covers", st.source.span, f"add one of {hint}")
        return None, None
    g = lw.choice(st.per, _GRANULARITIES, "scale granularity")
    if g is None:
        return None, None
    if g not in allowed:
        why = {G.TOKEN: "a per-token v scale is not constant along P·V's sum over tokens",
               G.PAGE: "per-page scales are for a paged cache's k and v"}.get(g, "")  # type: ignore[call-overload]
        hint = ", ".join(f"`{g.value}" + ("(64)" if g == G.BLOCK else "") + "`" for g in allowed)
        lw.error(f"`{op.value}` takes no `{src.value}` scales `per {g.value}`" + (f": {why}" if why and op != QuantOperand.Q else ""),
                 st.per.span, f"use one of {hint}")
        return None, None
    block = None
    if g == G.BLOCK:
        if st.per_arg is None:
            lw.error("`block` needs its size: `per block(N)`", st.per.span, f"N is one of {', '.join(map(str, BLOCK_SIZES))} tokens")
            return None, None
        block = lw.int_of(st.per_arg, "scale block")
        if block is None:
            return None, None
        if block not in BLOCK_SIZES:
            lw.error(f"scale block {block} is not supported", st.per_arg.span, f"use one of {', '.join(map(str, BLOCK_SIZES))} tokens")
            return None, None
    elif st.per_arg is not None:
        lw.error(f"`per {g.value}` takes no argument", st.per_arg.span, "only per block(N) does")
        return None, None
    return g, block  # type: ignore[return-value]


def quants(lw: Lowerer, v: A.VariantDecl, input_dtypes: InputDTypes | None, paged: bool, layout: object,
           norms: Mapping[NormTarget, Norm], residual: A.Stmt | None, tile: TileHint | None,
           tensors: Mapping[str, TensorDecl]) -> tuple[Quant, ...] | None:
    """The `quant` statements in QUANT_OPERAND_ORDER, with every combination checked (None when
    one is refused; the errors are reported)."""
    stored: dict[QuantOperand, DType] = {}
    if input_dtypes is not None:
        for op, d in ((QuantOperand.Q, input_dtypes.q), (QuantOperand.K, input_dtypes.k), (QuantOperand.V, input_dtypes.v)):
            if d.info.quant:
                stored[op] = d
    stmts = [st for st in v.stmts if isinstance(st, A.QuantStmt)]
    n_before = len(lw.diags)
    by_op: dict[QuantOperand, Quant] = {}
    for st in stmts:
        qn = _quant(lw, st, paged, stored)
        if qn is None:
            continue
        if qn.operand in by_op:
            lw.error(f"`quant {qn.operand.value}` given twice", st.span, f"first given at {first_at(by_op[qn.operand].span, st.span)}")
            continue
        by_op[qn.operand] = qn
    if len(lw.diags) > n_before:
        return None
    missing = [op for op in stored if op not in by_op]
    if missing:
        lw.error(", ".join(f"`{op.value}`" for op in missing) + (" is" if len(missing) == 1 else " are") + " stored quantized without a scale",
                 v.name.span, "add " + ", ".join(f"`quant {op.value} {stored[op].value} input per head`" for op in missing)
                 + " (or per tensor, ...): a stored value means stored * scale")
    for op, d in stored.items():
        qn = by_op.get(op)
        if qn is not None and qn.dtype != d:
            lw.error(f"`{op.value}` is stored as {d.value}, not {qn.dtype.value}", qn.span,
                     f"a stored quantized input is used as stored: quantize it to {d.value}")
    if len(lw.diags) > n_before:
        return None
    _pairs(lw, by_op, stored)
    _context(lw, v, by_op, stored, layout, norms, residual, tile, tensors)
    if len(lw.diags) > n_before:
        return None
    return tuple(by_op[o] for o in QUANT_OPERAND_ORDER if o in by_op)


def _pairs(lw: Lowerer, by_op: Mapping[QuantOperand, Quant], stored: Mapping[QuantOperand, DType]) -> None:
    """A product runs quantized when both its operands are, on one kind of tensor core (fp8 or
    int8); an operand quantized in the kernel without its partner would only lose precision."""
    for a, b, product in ((QuantOperand.Q, QuantOperand.K, "Q·Kᵀ"), (QuantOperand.P, QuantOperand.V, "P·V")):
        qa, qb = by_op.get(a), by_op.get(b)
        if qa is not None and qb is not None:
            if qa.dtype.info.is_float != qb.dtype.info.is_float:
                lw.error(f"{product} of {qa.dtype.value} and {qb.dtype.value}", qb.span,
                         "a quantized product's operands are both fp8 (e4m3 and e5m2 mix) or both i8")
            continue
        for x, y in ((qa, b), (qb, a)):
            if x is None or x.operand in stored:
                continue  # a stored operand alone is dequantized as it is read
            if x.operand == QuantOperand.P:
                lw.error("p is quantized but v is not", x.span,
                         f"P·V runs quantized only with v quantized too: add e.g. `quant v {x.dtype.value} amax per channel`")
            else:
                lw.error(f"`{x.operand.value}` is quantized in the kernel but `{y.value}` is not", x.span,
                         f"{product} runs quantized only with both operands quantized: add e.g. `quant {y.value} {x.dtype.value} amax per token`, "
                         f"or drop this statement (quantizing one side alone only loses precision)")


def _context(lw: Lowerer, v: A.VariantDecl, by_op: Mapping[QuantOperand, Quant], stored: Mapping[QuantOperand, DType],
             layout: object, norms: Mapping[NormTarget, Norm], residual: A.Stmt | None, tile: TileHint | None,
             tensors: Mapping[str, TensorDecl]) -> None:
    """What the rest of the variant must agree with: layout, norms, residual, tile, input names."""
    if not by_op:
        return
    first = next(iter(by_op.values()))
    if layout == Layout.VARLEN:
        lw.error("`quant` is not implemented with `layout varlen`", first.span, "use `layout bshd` or `bhsd` (padded batches)")
    for op, target in ((QuantOperand.Q, NormTarget.Q), (QuantOperand.K, NormTarget.K)):
        nm = norms.get(target)
        if nm is not None and op in stored:
            lw.error(f"`norm {target.value}` on `{op.value}` stored as {stored[op].value}", nm.span,
                     f"the norm's output would not be quantized: store {op.value} unquantized and quantize it in the kernel "
                     f"(quant {op.value} {stored[op].value} amax per token), which folds the scale into the norm")
    k, pq, vq = by_op.get(QuantOperand.K), by_op.get(QuantOperand.P), by_op.get(QuantOperand.V)
    if k is not None and k.smooth is not None:
        shifted = [w for w, there in (("`score`", any(isinstance(st, A.ExprStmt) and st.kind == A.StmtKind.SCORE for st in v.stmts)),
                                      ("`output lse`", any(st.kind == A.StmtKind.OUTPUT for st in v.stmts)),
                                      ("`sink`", any(st.kind == A.StmtKind.SINK for st in v.stmts))) if there]
        if shifted:
            lw.error(f"`smooth mean` with {shifted[0]}", k.span,
                     "smoothing shifts each row's scores by a constant, which only a plain softmax ignores; "
                     "drop the smoothing, or that statement")
    if pq is not None and vq is not None and vq.granularity == G.PAGE:
        lw.error("P·V runs quantized, and v's scales change from page to page along its sum", vq.span,
                 "a quantized P·V needs one v scale along the keys (per tensor or per head); "
                 "or drop p's quantization (v is then dequantized as it is read)")
    if residual is not None and QuantOperand.Q in stored:
        lw.error(f"`residual` with q stored as {stored[QuantOperand.Q].value}", residual.span,
                 "the residual adds the q input to the output at full precision: store q unquantized")
    for op, field in ((QuantOperand.Q, "block_m"), (QuantOperand.K, "block_n")):
        qn = by_op.get(op)
        t = getattr(tile, field) if tile is not None else None
        if qn is not None and qn.block is not None and t is not None and t % qn.block:
            lw.error(f"scale block {qn.block} does not divide the tile's {field} {t}", qn.span,
                     f"a tile holds whole scale blocks: use a scale block dividing {t}, or change the tile")
    for name in QUANT_SCALE_NAMES:
        d = tensors.get(name)
        if d is not None:
            lw.error(f"`{name}` is the name of an implied scale input", d.span, "pick another name for this input")
