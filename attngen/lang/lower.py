"""Lowering: AST → validated IR, with every semantic error collected and reported in source order.

This module lowers a file's variants statement by statement; the expressions inside them (names,
functions, builtins, lookups) lower through attngen.lang.lower_expr, the only place that knows
what the names of the language mean.
It imports no backend: the few backend facts it checks as it goes (head dims, heads, bf16) come in
as a `Target` value the plan stage builds, and the `tile` statement stays a hint that the plan
stage validates (attngen.plan.validate). Nothing is constant-folded, so that `printer` can print
the IR back as it was written.
"""

from __future__ import annotations

from typing import Mapping

from attngen.lang import ast as A
from attngen.lang.diagnostics import SpecError
from attngen.ir.nodes import (
    BLOCK_TABLE,
    BLOCK_TABLE_PAGES,
    CACHE_LENS,
    CU_SEQLENS,
    CU_SEQLENS_K,
    CU_SEQLENS_Q,
    PAGE_SIZES,
    ATTENTION_DTYPES,
    TRUE,
    AttnKind,
    Dim,
    DType,
    Expr,
    Layout,
    Norm,
    NormKind,
    NormScope,
    NormTarget,
    Program,
    ScalarType,
    SizeSym,
    Span,
    TensorDecl,
    TileHint,
    Variant,
    cache_lens_decl,
)
from attngen.ir import names
from attngen.ir.dtypes import INPUT_DTYPES
from attngen.lang import lower_quant
from attngen.lang.builtins import alibi_standard_slope, make_builtin  # noqa: F401 (public here too, as before the registry)
from attngen.lang.lower_expr import MAX_LOOKUP_NESTING  # noqa: F401 (public here too)
from attngen.lang.lower_expr import (
    BUILTIN_NAMES,
    FUNC_NAMES,
    INDEX_NAMES,
    NUMERIC,
    RESERVED_TENSOR_NAMES,
    SCORE_NAME,
    SEMANTIC,
    SIZE_NAMES,
    Lowerer,
    Scope,
    Target,
    first_at,
)

# Expression nodes of one variant's mask and scores together: bounds the emitted code (a balanced
# tree of 142 lookups stays under the nesting bound but kept nvcc busy past 600 s; 12 took 8 s of
# CPU, 36 took 35 s; the examples use at most 9 nodes, generated specs 33).
MAX_EXPR_NODES = 128


_DTYPES = {d.value: d for d in INPUT_DTYPES}
_ATTN_DTYPES = {d.value: d for d in ATTENTION_DTYPES}
_LAYOUTS = {x.value: x for x in Layout}
_KINDS = {x.value: x for x in AttnKind}
_NORM_KINDS = {x.value: x for x in NormKind}
_NORM_TARGETS = {x.value: x for x in NormTarget}
_SCOPES = {x.value: x for x in NormScope}
_BOOLS = {"true": True, "false": False}
_OUTPUTS = {"lse": True}
_TILE_KEYS = ("block_m", "block_n", "warps", "stages")
_REPEATABLE = frozenset({A.StmtKind.INPUT, A.StmtKind.SCORE, A.StmtKind.NORM, A.StmtKind.QUANT})


# --------------------------------------------------------------------------------------------
# Variants


def _dtype_arch_error(lw: Lowerer, dtype: DType, cc: int, span: Span | None) -> None:
    """`dtype` needs a newer arch than the target's: name the dtypes this one takes, narrowest first."""
    need = f"sm_{dtype.info.min_cc}"
    ok = [d.value for d in sorted(ATTENTION_DTYPES, key=lambda d: d.itemsize) if d.info.min_cc <= cc]
    lw.error(f"{dtype.value} needs {need} or newer; {lw.target.name} has no {dtype.value} tensor cores", span,
             f"use {_either(ok)} on this arch, or compile for {need} or newer")


def _either(words: list[str]) -> str:
    """`a, b or c`."""
    return ", ".join(words[:-1]) + " or " + words[-1] if len(words) > 1 else words[0]


def _variant(lw: Lowerer, v: A.VariantDecl) -> Variant | None:
    n_before = len(lw.diags)
    _variant_name(lw, v.name)
    # Pass 1: everything expressions depend on (sizes, kind, inputs), so order in the file is free.
    seen = _statements_once(lw, v)
    dtype, input_dtypes = lower_quant.dtypes(lw, seen[A.StmtKind.DTYPE]) if A.StmtKind.DTYPE in seen else (None, None)
    if A.StmtKind.DTYPE not in seen:
        lw.error(f"variant `{v.name.text}` has no `dtype`", v.name.span, f"add e.g. `dtype bf16` ({_either([d.value for d in ATTENTION_DTYPES])})")
    elif isinstance(dtype, DType) and lw.target.cc is not None and dtype.info.min_cc > lw.target.cc:
        _dtype_arch_error(lw, dtype, lw.target.cc, seen[A.StmtKind.DTYPE].span)
    layout = _word(lw, seen, A.StmtKind.LAYOUT, _LAYOUTS, "layout") or Layout.BHSD
    kind = _word(lw, seen, A.StmtKind.KIND, _KINDS, "kind") or AttnKind.SELF
    lse = _word(lw, seen, A.StmtKind.OUTPUT, _OUTPUTS, "output") or False
    head_dim, value_dim = _head_dims(lw, v, seen.get(A.StmtKind.HEAD_DIM), dtype if isinstance(dtype, DType) else None)
    heads, kv_heads = _heads(lw, v, seen.get(A.StmtKind.HEADS))

    scale: float | None = None
    sc_st = seen.get(A.StmtKind.SCALE)
    if isinstance(sc_st, A.ScaleStmt) and sc_st.value is not None:
        scale = lw.positive_float(sc_st.value, "scale")

    inputs, tensors = _inputs(lw, v)
    # A paged cache implies its lengths (ir.nodes.CACHE_LENS), which expressions may read too.
    paged = A.StmtKind.KV_CACHE in seen
    scope_tensors = {CACHE_LENS: cache_lens_decl(), **tensors} if paged else tensors

    # Pass 2: expressions, norms, flags, tile.
    mask, scores, norms = _exprs_and_norms(lw, v, seen, Scope(scope_tensors, heads, kind, False, paged), layout)  # type: ignore[arg-type]
    if head_dim is not None and value_dim is not None and (head_dim, value_dim) in lw.target.wide_head_dims:
        for nm in norms.values():
            if nm.target == NormTarget.Q and nm.scope == NormScope.TOKEN:
                lw.error(f"a token-scope q norm is implemented for head dims up to 128, not {head_dim}", nm.span,
                         "normalise q outside the kernel, or use a head-scope norm")
    residual = A.StmtKind.RESIDUAL in seen
    if residual and head_dim is not None and value_dim is not None and head_dim != value_dim:
        lw.error(
            f"`residual` needs the value head_dim to equal head_dim ({value_dim} != {head_dim})",
            seen[A.StmtKind.RESIDUAL].span,
            "the residual adds the q input (width D) to the output (width Dv)",
        )

    sink = _sink(lw, seen.get(A.StmtKind.SINK), tensors)
    page_size = _kv_cache(lw, seen.get(A.StmtKind.KV_CACHE), tensors, kind)
    if layout == Layout.VARLEN:
        _varlen(lw, seen, inputs, tensors, norms, kind)

    tile = None
    ts = seen.get(A.StmtKind.TILE)
    if isinstance(ts, A.TileStmt) and ts.fields:
        tile = _tile(lw, ts)

    quants = lower_quant.quants(lw, v, input_dtypes, paged, layout, norms, seen.get(A.StmtKind.RESIDUAL), tile, tensors)

    if len(lw.diags) > n_before:
        return None
    assert isinstance(dtype, DType) and head_dim is not None and value_dim is not None
    assert heads is not None and kv_heads is not None
    lowered = Variant(
        name=v.name.text,
        dtype=dtype,
        head_dim=head_dim,
        value_head_dim=value_dim,
        heads=heads,
        kv_heads=kv_heads,
        kind=kind,  # type: ignore[arg-type]
        layout=layout,  # type: ignore[arg-type]
        scale=scale,
        mask=mask,
        scores=tuple(scores),
        norms=tuple(norms.values()),
        residual=residual,
        nan_check=A.StmtKind.NAN_CHECK in seen,
        lse=bool(lse),
        inputs=tuple(inputs),
        tile=tile,
        span=v.span,
        sink=sink,
        page_size=page_size,
        input_dtypes=input_dtypes,
        quants=quants or (),
    )
    return lowered


def _variant_name(lw: Lowerer, name: A.Word) -> None:
    """A variant name is an identifier that does not end in a suffix the generated C++ appends."""
    if lw.ident(name, "variant name"):
        suffix = names.reserved_variant_suffix(name.text)
        if suffix is not None:
            lw.error(f"variant name `{name.text}` ends in the reserved suffix `{suffix}`", name.span,
                     "generated C++ names append " + ", ".join(f"`{s}`" for s in names.VARIANT_SUFFIXES)
                     + " to a variant's kernel name; pick a name that does not end in one")


def _statements_once(lw: Lowerer, v: A.VariantDecl) -> dict[A.StmtKind, A.Stmt]:
    """The statements a variant gives at most once, by kind (a repeat is reported and dropped)."""
    seen: dict[A.StmtKind, A.Stmt] = {}
    for st in v.stmts:
        if st.kind in _REPEATABLE:
            continue
        if st.kind in seen:
            first = seen[st.kind].span
            lw.error(f"`{st.kind.value}` given twice", st.span, f"first given at {first_at(first, st.span)}")
            continue
        seen[st.kind] = st
    return seen


def _word(lw: Lowerer, seen: Mapping[A.StmtKind, A.Stmt], kind: A.StmtKind, table: Mapping[str, object], what: str) -> object | None:
    """The value of a one-word statement (`layout bshd`), None where absent or unknown."""
    st = seen.get(kind)
    return lw.choice(st.value, table, what) if isinstance(st, A.WordStmt) else None


def _head_dims(lw: Lowerer, v: A.VariantDecl, hd: A.Stmt | None, dtype: DType | None) -> tuple[int | None, int | None]:
    """`head_dim D [value Dv]`: (D, Dv), each None where refused."""
    if not isinstance(hd, A.PairStmt):
        dims = lw.target.head_dims
        lw.error(f"variant `{v.name.text}` has no `head_dim`", v.name.span,
                 "add e.g. `head_dim 128`" + (f" (one of {', '.join(map(str, dims))})" if dims else ""))
        return None, None
    head_dim = _head_dim(lw, hd.first, "head_dim")
    value_dim = _head_dim(lw, hd.second, "value head_dim") if hd.second is not None else head_dim
    if head_dim is not None and value_dim is not None and not _head_dim_pair(lw, hd, dtype, head_dim, value_dim):
        return None, None
    return head_dim, value_dim


def _heads(lw: Lowerer, v: A.VariantDecl, hs: A.Stmt | None) -> tuple[int | None, int | None]:
    """`heads H [kv Hkv]`: (H, Hkv); H is None where the pair is refused."""
    if not isinstance(hs, A.PairStmt):
        lw.error(f"variant `{v.name.text}` has no `heads`", v.name.span, "add e.g. `heads 16` or `heads 16 kv 8`")
        return None, None
    heads = lw.int_of(hs.first, "heads")
    kv_heads = lw.int_of(hs.second, "kv heads") if hs.second is not None else heads
    max_heads = lw.target.max_heads
    if heads is not None and max_heads is not None and heads > max_heads:
        lw.error(f"{heads} heads are more than a kernel launch can hold", hs.first.span,
                 f"heads are a dimension of the launch grid: at most {max_heads}")
        heads = None
    elif heads is not None and kv_heads is not None and heads % kv_heads:
        lw.error(
            f"{heads} query heads do not divide into {kv_heads} key/value heads",
            hs.span,
            "heads must be a multiple of kv (GQA groups query heads evenly)",
        )
        heads = None
    return heads, kv_heads


def _inputs(lw: Lowerer, v: A.VariantDecl) -> tuple[list[TensorDecl], dict[str, TensorDecl]]:
    """The accepted input declarations in order, and every declared tensor by name."""
    inputs: list[TensorDecl] = []
    tensors: dict[str, TensorDecl] = {}
    for st in v.stmts:
        if isinstance(st, A.InputStmt):
            d, name_ok = _input(lw, st, tensors)
            if d is not None:
                if name_ok:
                    inputs.append(d)
                # Known even when its name is rejected, so its uses do not report it again.
                tensors.setdefault(d.name, d)
    return inputs, tensors


def _exprs_and_norms(lw: Lowerer, v: A.VariantDecl, seen: Mapping[A.StmtKind, A.Stmt], sc: Scope,
                     layout: Layout) -> tuple[Expr, list[Expr], dict[NormTarget, Norm]]:
    """The mask, the scores in order and the norms by target, in file order (`sc`: the variant's
    scope; each score lowers in a copy of it that may read `s`)."""
    mask: Expr = TRUE
    scores: list[Expr] = []
    norms: dict[NormTarget, Norm] = {}
    nodes = 0  # expression nodes so far: the generated code, and ptxas time, grow with them
    for st in v.stmts:
        if isinstance(st, A.ExprStmt):
            in_score = st.kind == A.StmtKind.SCORE
            if not in_score and seen.get(A.StmtKind.MASK) is not st:
                continue  # a repeated mask is already reported
            nodes += _ast_size(st.expr)
            if nodes > MAX_EXPR_NODES:
                lw.error(f"the masks and scores of `{v.name.text}` pass {MAX_EXPR_NODES} operations here", st.span,
                         "each operation becomes code in the kernel's inner loop; simplify, or precompute "
                         "part of the expression into an input tensor")
                break
            e = lw.expr(st.expr, Scope(sc.tensors, sc.heads, sc.kind, in_score, sc.paged))
            if e is None:
                continue
            if in_score:
                if e.type not in NUMERIC:
                    lw.error(f"a score must be a number, got {e.type.value}", st.expr.span, "a `score` rewrites `s`, e.g. `score softcap(30.0)` or `score s * 0.5`; visibility goes in `mask`")
                else:
                    scores.append(e)
            elif e.type != ScalarType.BOOL:
                lw.error(f"a mask must be a bool, got {e.type.value}", st.expr.span, "compare it, e.g. `mask ids[b, kv] != 0`")
            else:
                mask = e
        elif isinstance(st, A.NormStmt):
            nm = _norm(lw, st, layout)
            if nm is None:
                continue
            if nm.target in norms:
                lw.error(f"`norm {nm.target.value}` given twice", st.span, f"first given at {first_at(norms[nm.target].span, st.span)}")
                continue
            norms[nm.target] = nm
    return mask, scores, norms


def _ast_size(e: A.AExpr) -> int:
    """Nodes of an expression (names, numbers, operators, calls, lookups), counted without recursion."""
    n, stack = 0, [e]
    while stack:
        x = stack.pop()
        n += 1
        if isinstance(x, A.UnaryE):
            stack.append(x.operand)
        elif isinstance(x, A.BinaryE):
            stack += (x.lhs, x.rhs)
        elif isinstance(x, (A.CallE, A.LookupE)):
            stack += x.args if isinstance(x, A.CallE) else x.indices
    return n


def _kv_cache(lw: Lowerer, st: A.Stmt | None, tensors: Mapping[str, TensorDecl], kind: object) -> int | None:
    """`kv_cache paged(N)`: the page size N (a multiple of 8 from 8 to 256); kind cross only."""
    if not isinstance(st, A.KvCacheStmt):
        return None
    if st.layout.text != "paged":
        lw.error(f"unknown kv_cache layout `{st.layout.text}`", st.layout.span, "the one layout is `paged(N)`, e.g. `kv_cache paged(16)`")
        return None
    n = lw.int_of(st.page_size, "page size")
    if n is None:
        return None
    lo, hi = PAGE_SIZES
    if not (lo <= n <= hi and n % 8 == 0):
        lw.error(f"page size {n} is not supported", st.page_size.span, f"use a multiple of 8 from {lo} to {hi}")
        return None
    if kind != AttnKind.CROSS:
        lw.error("`kv_cache paged` needs `kind cross`", st.span, "a KV cache has its own length: add `kind cross`")
        return None
    if BLOCK_TABLE in tensors:
        lw.error(f"`{BLOCK_TABLE}` is implied by `kv_cache paged`", tensors[BLOCK_TABLE].span or st.span,
                 f"remove its `input` line: it is i32[B, {BLOCK_TABLE_PAGES}]")
        return None
    lens = tensors.get(CACHE_LENS)
    if lens is not None and (lens.dtype, lens.shape) != (DType.I32, (SizeSym.B,)):
        # A declaration may spell the implied lengths out, but only as what they are.
        lw.error(f"`{CACHE_LENS}` is implied by `kv_cache paged` as i32[B]", lens.span or st.span,
                 "each row's valid cached tokens, the Lq new ones included: declare it as "
                 f"`input {CACHE_LENS}: i32[B]`, or remove its `input` line")
        return None
    srt = [d for d in tensors.values() if d.sorted]
    if srt:
        # Paged caches run on the decode family only, which has no device check of `sorted` yet
        # (plan.decode.decode_unsupported): such a spec would check clean and compile nowhere.
        lw.error(f"`sorted` input `{srt[0].name}` with `kv_cache paged`: the decode family, which runs paged caches, "
                 "does not check `sorted` promises yet", srt[0].span or st.span, "drop `sorted` (the mask is then classified per element)")
        return None
    return n


def _varlen(lw: Lowerer, seen: Mapping[A.StmtKind, A.Stmt], inputs: list[TensorDecl], tensors: Mapping[str, TensorDecl],
            norms: Mapping[NormTarget, Norm], kind: object) -> None:
    """`layout varlen`: what a packed batch cannot take (each error at its statement). Positions
    restart in every sequence, so an input sized Lq or Lk has no one meaning; the implied
    cu_seqlens inputs may not be declared; norms (prep kernels over [B, L] rows) and paged caches
    are not implemented for it."""
    implied = (CU_SEQLENS,) if kind == AttnKind.SELF else (CU_SEQLENS_Q, CU_SEQLENS_K)
    for name in (CU_SEQLENS, CU_SEQLENS_Q, CU_SEQLENS_K):
        d = tensors.get(name)
        if d is not None and name in implied:
            lw.error(f"`{name}` is implied by `layout varlen`", d.span, "remove its `input` line: it is i32[B+1], the prefix sums of the sequence lengths")
    for d in inputs:
        if d.name in implied:
            continue
        sized = [x.value for x in d.shape if x in (SizeSym.LQ, SizeSym.LK)]
        if sized:
            lw.error(f"input `{d.name}` is sized by {sized[0]}, which varies from sequence to sequence under `layout varlen`", d.span,
                     "size it by B (one value a sequence) or by a fixed or named dim; positions restart at 0 in every sequence")
    for n in norms.values():
        lw.error(f"`norm {n.target.value}` is not implemented with `layout varlen`", n.span, "use `layout bshd` (padded batches) for fused norms")
    kc = seen.get(A.StmtKind.KV_CACHE)
    if kc is not None:
        lw.error("`kv_cache paged` does not combine with `layout varlen`", kc.span, "a paged cache has per-row lengths of its own: use `layout bshd` with it")


def _sink(lw: Lowerer, st: A.Stmt | None, tensors: Mapping[str, TensorDecl]) -> str | None:
    """`sink NAME`: NAME must be a declared fp32[H] input (one learnable logit a query head)."""
    if not isinstance(st, A.WordStmt):
        return None
    name = st.value.text
    d = tensors.get(name)
    if d is None:
        lw.error(f"`sink {name}` names no declared input", st.value.span, f"declare it first: `input {name}: fp32[H]`")
        return None
    if d.dtype != DType.FP32 or d.shape != (SizeSym.H,):
        shape = ", ".join(x.value if isinstance(x, SizeSym) else str(x) for x in d.shape)
        lw.error(f"a sink input must be fp32[H], got {d.dtype.value}[{shape}]", st.value.span,
                 f"declare it as `input {name}: fp32[H]` (one logit a query head)")
        return None
    return name


def _head_dim(lw: Lowerer, n: A.Num, what: str) -> int | None:
    v = lw.int_of(n, what)
    t = lw.target
    if v is not None and t.head_dims is not None and v not in t.head_dims and v not in {d for pair in t.wide_head_dims for d in pair}:
        lw.error(f"{what} {v} is not supported", n.span, f"the CUDA backend implements {t.describe_head_dims()}")
        return None
    return v


def _head_dim_pair(lw: Lowerer, st: A.PairStmt, dtype: DType | None, d: int, dv: int) -> bool:
    """The (D, Dv) pair and the dtype together: wide pairs exist as listed, on tensor cores only."""
    t = lw.target
    if t.head_dims is None:
        return True
    wide = (d, dv) in t.wide_head_dims
    if not ((d in t.head_dims and dv in t.head_dims) or wide):
        lw.error(f"head_dim {d} with value head_dim {dv} is not supported", st.span,
                 f"the CUDA backend implements {t.describe_head_dims()}")
        return False
    if wide and dtype is not None and dtype not in t.wide_dtypes:
        lw.error(f"head_dim {d}{'' if d == dv else f' value {dv}'} runs on the tensor-core engines ({'/'.join(x.value for x in t.wide_dtypes)}), not {dtype.value}",
                 st.span, "the fp32 FFMA engine keeps a whole block_m x Dv partial output a warp, which does not fit "
                 "its registers past Dv = 128: use bf16 or fp16")
        return False
    return True


def _input(lw: Lowerer, st: A.InputStmt, tensors: Mapping[str, TensorDecl]) -> tuple[TensorDecl | None, bool]:
    """The declaration (None if its type or shape is bad) and whether its name is acceptable."""
    ok = lw.ident(st.name, "input name")
    name = st.name.text
    if ok and name in RESERVED_TENSOR_NAMES:
        lw.error(f"`{name}` is a reserved name and cannot name an input", st.name.span, "pick another name, e.g. `" + name + "_t`")
        ok = False
    suffix = names.reserved_input_suffix(name) if ok else None
    if suffix is not None:
        lw.error(f"input name `{name}` ends in the reserved suffix `{suffix}`", st.name.span,
                 "generated C++ names append `_n<i>` and `_s<i>` (sizes and strides) to input names, so "
                 "an input name may not end in `_n` or `_s` and digits")
        ok = False
    if ok and name in tensors:
        lw.error(f"input `{name}` declared twice", st.name.span, f"first declared at {first_at(tensors[name].span, st.span)}")
        ok = False
    dtype = lw.choice(st.dtype, _DTYPES, "input dtype")
    dims: list[Dim] = []
    dims_ok = True
    for d in st.dims:
        if isinstance(d, A.Num):
            v = lw.int_of(d, "a dimension")
            if v is None:
                dims_ok = False
            else:
                dims.append(v)
        elif d.text in SIZE_NAMES:
            dims.append(SIZE_NAMES[d.text])
        elif lw.ident(d, "dimension name"):
            if d.text in INDEX_NAMES or d.text in FUNC_NAMES or d.text in BUILTIN_NAMES or d.text == SCORE_NAME:
                lw.error(f"`{d.text}` cannot name a dimension", d.span, "sizes are `B H Hkv Lq Lk D Dv`, an integer, or a new name")
                dims_ok = False
            else:
                dims.append(d.text)
        else:
            dims_ok = False
    if not dims_ok or dtype is None:
        return None, ok
    return TensorDecl(name, dtype, tuple(dims), st.sorted, st.span), ok  # type: ignore[arg-type]


def _norm(lw: Lowerer, st: A.NormStmt, layout: Layout) -> Norm | None:
    target = lw.choice(st.target, _NORM_TARGETS, "norm target")
    nkind = lw.choice(st.norm_kind, _NORM_KINDS, "norm")
    eps = lw.positive_float(st.eps, "eps")
    scope: object = NormScope.HEAD
    affine: object = True
    given: dict[str, A.NormOption] = {}
    ok = target is not None and nkind is not None and eps is not None
    for opt in st.options:
        if opt.key in given:
            lw.error(f"`{opt.key}` given twice", opt.span, f"first given at {first_at(given[opt.key].span, opt.span)}")
            ok = False
            continue
        given[opt.key] = opt
        value = lw.choice(opt.value, _SCOPES if opt.key == "scope" else _BOOLS, opt.key)
        if value is None:
            ok = False
        elif opt.key == "scope":
            scope = value
        else:
            affine = value
    if target is not None and scope == NormScope.TOKEN:
        where = given["scope"].span
        if target != NormTarget.Q:
            lw.error(f"token-scope norm is only for `q`, not `{st.target.text}`", where, "k and o norms are per head (`scope head`)")
            ok = False
        elif layout != Layout.BSHD:
            lw.error("token-scope norm needs `layout bshd`", where, "it normalises the whole [H*D] hidden row, which is contiguous only in bshd")
            ok = False
    if not ok:
        return None
    return Norm(target, nkind, scope, eps, affine, st.span)  # type: ignore[arg-type]


def _tile(lw: Lowerer, st: A.TileStmt) -> TileHint | None:
    """The `tile` statement as a hint: each field given once, a positive integer. Whether an arch
    can run it is the plan stage's question (attngen.plan.validate)."""
    given: dict[str, int] = {}
    firsts: dict[str, A.TileField] = {}
    ok = True
    for f in st.fields:
        key = f.key.text
        if key in firsts:
            lw.error(f"`{key}` given twice", f.span, f"first given at {first_at(firsts[key].span, f.span)}")
            ok = False
            continue
        firsts[key] = f
        v = lw.int_of(f.value, key)
        if v is None:
            ok = False
        else:
            given[key] = v
    if not ok:
        return None
    return TileHint(**given, span=st.span)  # type: ignore[arg-type]


def lower(file: A.File, source: str | None = None, target: Target = SEMANTIC) -> Program:
    """Check a parsed file and build its IR; raises SpecError with every problem found (`target`:
    the backend facts to check as well, see `Target`)."""
    lw = Lowerer(file.path, target)
    variants: list[Variant] = []
    names: dict[str, A.VariantDecl] = {}
    for v in file.variants:
        if v.name.text in names:
            lw.error(f"variant `{v.name.text}` defined twice", v.name.span, f"first defined at {first_at(names[v.name.text].name.span, v.name.span)}")
        else:
            names[v.name.text] = v
        lowered = _variant(lw, v)
        if lowered is not None:
            variants.append(lowered)
    if not file.variants:
        lw.error("no `attention` variant in this file", Span(file.path, 1, 1, 1, 2), "a spec looks like `attention NAME { dtype bf16; head_dim 128; heads 16 }`")
    if lw.diags:
        raise SpecError(lw.diags, source=source, path=file.path)
    return Program(tuple(variants), path=file.path)
