"""Lowering: AST → validated IR, with every semantic error collected and reported in source order.

This is the only place that knows what the names of the language mean: index variables, sizes,
functions, builtins (checked against their signatures in the one registry, attngen.lang.builtins,
and desugared into `ir.Builtin` nodes whose `body` is the plain expression).
It imports no backend: the few backend facts it checks as it goes (head dims, heads, bf16) come in
as a `Target` value the plan stage builds, and the `tile` statement stays a hint that the plan
stage validates (attngen.plan.validate). Nothing is constant-folded, so that `printer` can print
the IR back as it was written.
"""

from __future__ import annotations

import difflib
import math
import re
from dataclasses import dataclass, field
from typing import Iterable, Mapping

from attngen.lang import ast as A
from attngen.lang.diagnostics import Diagnostic, SpecError
from attngen.ir.nodes import (
    LOGIC_OPS,
    ARITH_OPS,
    ALIBI_SLOPES,
    BLOCK_TABLE,
    BLOCK_TABLE_PAGES,
    CACHE_LENS,
    CU_SEQLENS,
    CU_SEQLENS_K,
    CU_SEQLENS_Q,
    PAGE_SIZES,
    PADDING_KV_LENS,
    PADDING_Q_LENS,
    ATTENTION_DTYPES,
    TRUE,
    AttnKind,
    BinOp,
    Binary,
    BuiltinName,
    Call,
    Const,
    Dim,
    DType,
    Expr,
    Func,
    Index,
    IndexVar,
    Layout,
    Load,
    Norm,
    NormKind,
    NormScope,
    NormTarget,
    Program,
    ScalarType,
    Score,
    Size,
    SizeSym,
    Span,
    TensorDecl,
    TensorRef,
    TileHint,
    Unary,
    UnOp,
    Variant,
    cache_lens_decl,
    norm_bias_name,
    norm_weight_name,
    FP32_MAX,
    INT32_MAX,
    FP32_MIN_NORMAL,
    fp32_literal,
)
from attngen.ir import names
from attngen.lang.builtins import BUILTINS, IntExpr, IntLiteral, Param, PositiveLiteral, TensorParam, make_builtin
from attngen.lang.builtins import alibi_standard_slope  # noqa: F401 (public here too, as before the registry)

# Tensor lookups inside the indices of lookups (`t[u[kv]]` is 2 deep). ptxas time grows steeply
# with the depth (199 levels ran for more than 300 s); real masks compose one or two.
MAX_LOOKUP_NESTING = 4
# Expression nodes of one variant's mask and scores together: bounds the emitted code (a balanced
# tree of 142 lookups stays under the nesting bound but kept nvcc busy past 600 s; 12 took 8 s of
# CPU, 36 took 35 s; the examples use at most 9 nodes, generated specs 33).
MAX_EXPR_NODES = 128
MAX_IDENT = 64
IDENT_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_INT_RE = re.compile(r"[0-9]+\Z")
_FLOAT_RE = re.compile(r"(?:[0-9]+\.[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?\Z|[0-9]+[eE][+-]?[0-9]+\Z")

INDEX_NAMES = {v.value: v for v in IndexVar}
SIZE_NAMES = {s.value: s for s in SizeSym}
FUNC_NAMES = {f.value: f for f in Func}
BUILTIN_NAMES = {b.value: b for b in BuiltinName}
SCORE_NAME = "s"
# Tensor names that would be confused with something else: the language's own names, the
# attention operands and output, and every input a builtin or norm implies.
RESERVED_TENSOR_NAMES = frozenset(
    {*INDEX_NAMES, *SIZE_NAMES, *FUNC_NAMES, *BUILTIN_NAMES, SCORE_NAME, "true", "false"}
    | {"k", "v", "o", "lse"}
    | {"q_offset", "kv_offset", "Lq_total", "Lk_total"}  # the kernel call's position keywords
    | {PADDING_Q_LENS, PADDING_KV_LENS, ALIBI_SLOPES}
    | {norm_weight_name(t) for t in NormTarget}
    | {norm_bias_name(t) for t in NormTarget}
)

# Kernels hold float literals as fp32 constants and flush subnormals (fast math), so a value that
# must be positive is checked after that rounding, not as the fp64 number written.
_FP32_POSITIVE_HELP = (f"kernels hold it as an fp32 constant, and values below {FP32_MIN_NORMAL:.8g} (fp32's "
                       "smallest normal number) are flushed to 0")

_UNARY_OPS = {op.value: op for op in UnOp}
_BINARY_OPS = {op.value: op for op in BinOp}
_NUMERIC = (ScalarType.INT, ScalarType.FLOAT)
ORDER_OPS = frozenset({BinOp.LT, BinOp.LE, BinOp.GT, BinOp.GE})


def _first_at(first: Span | None, again: Span) -> str:
    """`first given at line 3` (or `column 9` on the same line)."""
    if first is None:
        return "given before"
    return f"line {first.line}" if first.line != again.line else f"column {first.col}"


# The index that walks a dimension of a declared size, for hints that show a lookup (`ids[b, kv]`).
_DIM_INDEX = {SizeSym.B: "b", SizeSym.H: "h", SizeSym.HKV: "h", SizeSym.LQ: "q", SizeSym.LK: "kv"}


def _index_for(dim: object, position: int) -> str:
    """The index a hint writes for a dimension: the one that walks its size, else `i`, `j`, ..."""
    return _DIM_INDEX.get(dim, "ijlmn"[position % 5]) if isinstance(dim, SizeSym) else "ijlmn"[position % 5]


def _declare_hint(name: str, type_text: str) -> str:
    """The help for an undeclared tensor: declare it, under another name where `name` is reserved
    (a hint to declare `input bias` would only lead to the reserved-name error)."""
    if name in RESERVED_TENSOR_NAMES:
        return (f"`{name}` is a reserved name, so an input cannot take it: declare it under another name, "
                f"`input {name}_t: {type_text}`, and write `{name}_t` here")
    return f"declare it: `input {name}: {type_text}`"


def _did_you_mean(word: str, choices: Iterable[str]) -> str | None:
    close = difflib.get_close_matches(word, sorted(set(choices)), n=1, cutoff=0.6)
    return f"did you mean `{close[0]}`?" if close else None


def _one_of(choices: Iterable[str]) -> str:
    return ", ".join(f"`{c}`" for c in choices)


# --------------------------------------------------------------------------------------------
# Checking


@dataclass
class _Scope:
    """What an expression may refer to."""

    tensors: Mapping[str, TensorDecl]
    heads: int | None
    kind: AttnKind
    in_score: bool
    paged: bool = False  # `kv_cache paged`: builtins align queries to cache_lens[b]


@dataclass(frozen=True, slots=True)
class Target:
    """The backend facts lowering checks as it goes, as plain data (the plan stage builds one for an
    arch: attngen.plan.validate.target), so that a construct no backend could run is refused at its
    span among the spec's other errors while the front end imports no backend. The default checks
    none of them: only what the language means."""

    name: str = "any target"  # e.g. "sm_90a", for messages
    head_dims: tuple[int, ...] | None = None  # None: any positive head dim
    max_heads: int | None = None  # None: no limit
    cc: int | None = None  # the compute capability, for the dtypes it takes (None: every dtype)
    wide_head_dims: tuple[tuple[int, int], ...] = ()  # (D, Dv) pairs beyond head_dims, for wide_dtypes only
    wide_dtypes: tuple[DType, ...] = ()
    head_dims_text: str | None = None  # the implemented dims in words, for messages

    def describe_head_dims(self) -> str:
        return self.head_dims_text or ", ".join(map(str, self.head_dims or ()))


SEMANTIC = Target()


@dataclass
class _Lowerer:
    path: str
    target: Target
    diags: list[Diagnostic] = field(default_factory=list)
    lookup_depth: int = 0  # lookups enclosing the expression being lowered

    def error(self, msg: str, span: Span | None, help_: str | None = None) -> None:
        self.diags.append(Diagnostic(msg, span, help_))

    # -- literals and identifiers ------------------------------------------------------------

    def number(self, text: str, span: Span) -> int | float | None:
        if _INT_RE.match(text):
            v = int(text)
            if v > INT32_MAX:
                self.error(f"integer `{text}` is too large", span, f"integers are at most {INT32_MAX} (int32)")
                return None
            return v
        if _FLOAT_RE.match(text):
            f = float(text)
            if not math.isfinite(f):
                self.error(f"number `{text}` is not finite", span, "floats must be finite fp64 values")
                return None
            if not math.isfinite(fp32_literal(f)):
                self.error(f"number `{text}` is beyond fp32's range", span,
                           f"kernels hold float literals as fp32 constants: at most {FP32_MAX:.7g} in magnitude")
                return None
            return f
        self.error(f"bad number `{text}`", span, "write an integer like `128` or a float like `0.5` or `1e-5`")
        return None

    def int_of(self, n: A.Num, what: str, minimum: int = 1) -> int | None:
        v = self.number(n.text, n.span)
        if v is None:
            return None
        if n.negative:
            v = -v
        if not isinstance(v, int):
            self.error(f"{what} must be an integer, got `{n.text}`", n.span)
            return None
        if v < minimum:
            self.error(f"{what} must be at least {minimum}, got {v}", n.span)
            return None
        return v

    def positive_float(self, n: A.Num, what: str) -> float | None:
        v = self.number(n.text, n.span)
        if v is None:
            return None
        value = -float(v) if n.negative else float(v)
        if not value > 0.0:
            self.error(f"{what} must be positive, got {'-' if n.negative else ''}{n.text}", n.span)
            return None
        if not fp32_literal(value) > 0.0:
            self.error(f"{what} `{n.text}` is 0 in fp32", n.span, _FP32_POSITIVE_HELP)
            return None
        return value

    def ident(self, w: A.Word, what: str) -> bool:
        """Names flow into generated C++, so they are held to a strict, reserved-free shape."""
        if not IDENT_RE.match(w.text):
            self.error(f"{what} `{w.text}` is not an identifier", w.span, "use letters, digits and `_`")
            return False
        if len(w.text) > MAX_IDENT:
            self.error(f"{what} is {len(w.text)} characters long", w.span, f"names are at most {MAX_IDENT} characters")
            return False
        if w.text.startswith("__") or w.text.startswith("ag_"):
            self.error(f"{what} `{w.text}` uses a reserved prefix", w.span, "names may not start with `__` or `ag_`")
            return False
        return True

    def choice(self, w: A.Word, table: Mapping[str, object], what: str) -> object | None:
        if w.text in table:
            return table[w.text]
        hint = _did_you_mean(w.text, table)
        choices = f"{what} is one of {_one_of(table)}"
        self.error(f"unknown {what} `{w.text}`", w.span, f"{hint} {choices}" if hint else choices)
        return None

    # -- expressions -------------------------------------------------------------------------

    def names_in_scope(self, sc: _Scope) -> list[str]:
        names = [*INDEX_NAMES, *SIZE_NAMES, *FUNC_NAMES, *BUILTIN_NAMES, *sc.tensors, "true", "false"]
        if sc.in_score:
            names.append(SCORE_NAME)
        return names

    def expr(self, e: A.AExpr, sc: _Scope) -> Expr | None:
        if isinstance(e, A.NumE):
            v = self.number(e.text, e.span)
            if v is None:
                return None
            return Const(v, ScalarType.INT if isinstance(v, int) else ScalarType.FLOAT, e.span)
        if isinstance(e, A.BoolE):
            return Const(e.value, ScalarType.BOOL, e.span)
        if isinstance(e, A.NameE):
            return self.name(e, sc)
        if isinstance(e, A.UnaryE):
            return self.unary(e, sc)
        if isinstance(e, A.BinaryE):
            return self.binary(e, sc)
        if isinstance(e, A.LookupE):
            return self.lookup(e, sc)
        if isinstance(e, A.CallE):
            return self.call(e, sc)
        raise AssertionError(f"unhandled expression {type(e).__name__}")

    def name(self, e: A.NameE, sc: _Scope) -> Expr | None:
        n = e.name
        if n in INDEX_NAMES:
            return Index(INDEX_NAMES[n], e.span)
        if n in SIZE_NAMES:
            return Size(SIZE_NAMES[n], e.span)
        if n == SCORE_NAME:
            if not sc.in_score:
                self.error("the score `s` cannot be used in a mask", e.span, "a mask decides visibility before any score exists; use `s` in a `score` statement")
                return None
            return Score(e.span)
        if n in BUILTIN_NAMES:
            return self.builtin(BUILTIN_NAMES[n], (), e.span, sc, bare=True)
        if n in FUNC_NAMES:
            self.error(f"`{n}` is a function", e.span, f"call it: `{n}({', '.join(_FUNC_PARAMS[FUNC_NAMES[n]])})`")
            return None
        if n in sc.tensors:
            rank = len(sc.tensors[n].shape)
            idx = ", ".join(_index_for(d, i) for i, d in enumerate(sc.tensors[n].shape))
            self.error(f"tensor `{n}` must be indexed", e.span, f"look it up with {rank} {'indices' if rank != 1 else 'index'}: `{n}[{idx}]`")
            return None
        self.error(f"unknown name `{n}`", e.span, _did_you_mean(n, self.names_in_scope(sc)))
        return None

    def unary(self, e: A.UnaryE, sc: _Scope) -> Expr | None:
        x = self.expr(e.operand, sc)
        if x is None:
            return None
        op = _UNARY_OPS[e.op]
        if op == UnOp.NOT:
            if x.type != ScalarType.BOOL:
                self.error(f"`!` needs a bool, got {x.type.value}", e.operand.span, "compare first, e.g. `x != 0`")
                return None
            return Unary(op, x, ScalarType.BOOL, e.span)
        if x.type not in _NUMERIC:
            self.error(f"`-` needs a number, got {x.type.value}", e.operand.span)
            return None
        return Unary(op, x, x.type, e.span)

    def binary(self, e: A.BinaryE, sc: _Scope) -> Expr | None:
        a, b = self.expr(e.lhs, sc), self.expr(e.rhs, sc)
        op = _BINARY_OPS[e.op]
        # Each operand is checked on its own, so an error on one side does not hide one on the other.
        ok = a is not None and b is not None
        for x, s in ((a, e.lhs.span), (b, e.rhs.span)):
            if x is None:
                continue
            if op in LOGIC_OPS and x.type != ScalarType.BOOL:
                self.error(f"`{e.op}` needs bools, got {x.type.value}", s, "compare first, e.g. `x != 0`")
                ok = False
            elif op in ARITH_OPS | ORDER_OPS and x.type not in _NUMERIC:
                what = "comparison" if op in ORDER_OPS else "arithmetic"
                self.error(f"`{e.op}` needs numbers, got {x.type.value}", s, f"{what} on bools is not defined; use `&&`, `||`, `!` or `where(c, a, b)`")
                ok = False
        if not ok:
            return None
        assert a is not None and b is not None
        if op in (BinOp.EQ, BinOp.NE) and (a.type == ScalarType.BOOL) != (b.type == ScalarType.BOOL):
            self.error(f"`{e.op}` compares a {a.type.value} with a {b.type.value}", e.op_span)
            return None
        if op in ARITH_OPS:
            t = ScalarType.FLOAT if ScalarType.FLOAT in (a.type, b.type) else ScalarType.INT
        else:
            t = ScalarType.BOOL
        return Binary(op, a, b, t, e.span)

    def lookup(self, e: A.LookupE, sc: _Scope) -> Expr | None:
        n = e.tensor.text
        if self.lookup_depth >= MAX_LOOKUP_NESTING:
            self.error(f"lookups nested more than {MAX_LOOKUP_NESTING} deep", e.span,
                       "each level is a dependent global load in the kernel, and ptxas time grows steeply with "
                       "the depth; precompute the composed index into one tensor")
            return None
        self.lookup_depth += 1
        try:
            idx = [self.expr(i, sc) for i in e.indices]
        finally:
            self.lookup_depth -= 1
        if n not in sc.tensors:
            if n in INDEX_NAMES or n in SIZE_NAMES or n == SCORE_NAME:
                self.error(f"`{n}` is not a tensor", e.tensor.span, "only declared inputs can be looked up")
            else:
                hint = _did_you_mean(n, sc.tensors)
                extra = _declare_hint(n, "fp32[...]")
                self.error(f"unknown tensor `{n}`", e.tensor.span, f"{hint} {extra}" if hint else extra)
            return None
        decl = sc.tensors[n]
        ok = True
        if len(e.indices) != len(decl.shape):
            self.error(
                f"`{n}` has rank {len(decl.shape)} but is indexed with {len(e.indices)} {'indices' if len(e.indices) != 1 else 'index'}",
                e.span,
                f"declared at line {decl.span.line}" if decl.span else None,
            )
            ok = False
        for x, ae in zip(idx, e.indices):
            if x is not None and x.type != ScalarType.INT:
                self.error(f"an index must be an int, got {x.type.value}", ae.span)
                ok = False
        if not ok or any(x is None for x in idx):
            return None
        return Load(n, tuple(idx), ScalarType.FLOAT if decl.dtype.is_float else ScalarType.INT, e.span)  # type: ignore[arg-type]

    def call(self, e: A.CallE, sc: _Scope) -> Expr | None:
        n = e.func.text
        if n in BUILTIN_NAMES:
            return self.builtin(BUILTIN_NAMES[n], e.args, e.span, sc, bare=False, name_span=e.func.span)
        if n not in FUNC_NAMES:
            if n in sc.tensors:
                self.error(f"`{n}` is a tensor, not a function", e.func.span, f"look it up with brackets: `{n}[...]`")
            else:
                self.error(f"unknown function `{n}`", e.func.span, _did_you_mean(n, [*FUNC_NAMES, *BUILTIN_NAMES]))
            return None
        f = FUNC_NAMES[n]
        params = _FUNC_PARAMS[f]
        args = [self.expr(a, sc) for a in e.args]
        if len(args) != len(params):
            self.error(f"`{n}` takes {len(params)} argument{'s' if len(params) != 1 else ''}, got {len(args)}", e.span, f"`{n}({', '.join(params)})`")
            return None
        if any(a is None for a in args):
            return None
        targs: tuple[Expr, ...] = tuple(args)  # type: ignore[arg-type]
        if f == Func.WHERE:
            c, x, y = targs
            ok = True
            if c.type != ScalarType.BOOL:
                self.error(f"the condition of `where` must be a bool, got {c.type.value}", e.args[0].span)
                ok = False
            if (x.type == ScalarType.BOOL) != (y.type == ScalarType.BOOL):
                self.error(f"the branches of `where` differ: {x.type.value} and {y.type.value}", e.span)
                ok = False
            if not ok:
                return None
            t = x.type if x.type == y.type else ScalarType.FLOAT
            return Call(f, targs, t, e.span)
        bad = [(a, ae) for a, ae in zip(targs, e.args) if a.type not in _NUMERIC]
        for a, ae in bad:
            self.error(f"`{n}` needs a number, got {a.type.value}", ae.span)
        if bad:
            return None
        if f in (Func.ABS, Func.MIN, Func.MAX):
            t = ScalarType.FLOAT if any(a.type == ScalarType.FLOAT for a in targs) else ScalarType.INT
        else:
            t = ScalarType.FLOAT
        return Call(f, targs, t, e.span)

    # -- builtins ----------------------------------------------------------------------------

    def builtin(
        self,
        name: BuiltinName,
        raw: tuple[A.AExpr, ...],
        span: Span,
        sc: _Scope,
        bare: bool,
        name_span: Span | None = None,
    ) -> Expr | None:
        sig = BUILTINS[name]
        nspan = name_span or span
        if sig.score_only and not sc.in_score:
            self.error(f"`{name.value}` modifies the score and cannot be used in a mask", nspan, f"use it in a `score` statement: `score {sig.usage}`")
            return None
        if len(raw) not in sig.arities:
            if bare:
                self.error(f"`{name.value}` needs arguments", span, f"`{sig.usage}`")
            else:
                self.error(f"`{name.value}` takes {_arity_words(sig.arities)}, got {len(raw)}", span, f"`{sig.usage}`")
            return None
        args: list[Expr | None] = [self.param(p, a, sc, name) for p, a in zip(sig.params, raw)]
        if any(a is None for a in args):
            return None
        targs: tuple[Expr, ...] = tuple(args)  # type: ignore[arg-type]
        if not self.builtin_extra(name, targs, raw, span, sc):
            return None
        return make_builtin(name, targs, sc.tensors, sc.heads or 1, span, paged=sc.paged)

    def builtin_extra(self, name: BuiltinName, args: tuple[Expr, ...], raw: tuple[A.AExpr, ...], span: Span, sc: _Scope) -> bool:
        """Checks that involve more than one argument or the variant."""
        if name == BuiltinName.DOCUMENT and len(args) == 1 and sc.kind == AttnKind.CROSS:
            self.error(
                "`document(ids)` with one tensor needs `kind self`",
                span,
                "for cross attention give the query and key ids: `document(q_ids, kv_ids)`",
            )
            return False
        if name == BuiltinName.ALIBI and not args and sc.heads is None:
            return False  # standard slopes depend on H, which is already reported missing
        if name == BuiltinName.REL_BIAS:
            t = sc.tensors[args[0].name]  # type: ignore[union-attr]
            m = args[1].value  # type: ignore[union-attr]
            width = t.shape[1]
            if isinstance(width, int) and width != 2 * m + 1:
                self.error(f"`rel_bias` with m = {m} needs `{t.name}` of width {2 * m + 1}, but it is declared with {width}", raw[0].span)
                return False
        return True

    def param(self, p: Param, a: A.AExpr, sc: _Scope, owner: BuiltinName) -> Expr | None:
        """One argument of a builtin, checked against its declared parameter kind."""
        if isinstance(p, TensorParam):
            return self.tensor_arg(a, sc, owner, p.ranks, p.types)
        if isinstance(p, IntLiteral):
            return self.int_literal(a, sc, owner, p.minimum)
        if isinstance(p, PositiveLiteral):
            return self.positive_literal(a, sc, owner)
        assert isinstance(p, IntExpr), p
        return self.int_expr(a, sc, owner)

    def tensor_arg(self, a: A.AExpr, sc: _Scope, owner: BuiltinName, ranks: tuple[int, ...], types: str) -> Expr | None:
        if not isinstance(a, A.NameE):
            self.error(f"`{owner.value}` takes a tensor name here", a.span, "write the name alone, without indices")
            return None
        if a.name not in sc.tensors:
            hint = _did_you_mean(a.name, sc.tensors)
            extra = _declare_hint(a.name, "...")
            self.error(f"unknown tensor `{a.name}`", a.span, f"{hint} {extra}" if hint else extra)
            return None
        decl = sc.tensors[a.name]
        ok = True
        if len(decl.shape) not in ranks:
            want = " or ".join(map(str, ranks))
            self.error(f"`{owner.value}` needs a tensor of rank {want}; `{a.name}` has rank {len(decl.shape)}", a.span)
            ok = False
        if types == "int" and decl.dtype.is_float:
            self.error(f"`{owner.value}` needs an integer tensor (i32 or u8); `{a.name}` is {decl.dtype.value}", a.span)
            ok = False
        if types == "float" and not decl.dtype.is_float:
            self.error(f"`{owner.value}` needs a float tensor (fp32, fp16 or bf16); `{a.name}` is {decl.dtype.value}", a.span)
            ok = False
        return TensorRef(a.name, a.span) if ok else None

    def int_literal(self, a: A.AExpr, sc: _Scope, owner: BuiltinName, minimum: int) -> Expr | None:
        words = "a non-negative" if minimum == 0 else "a positive"
        if not isinstance(a, A.NumE):
            self.error(f"`{owner.value}` takes {words} integer literal here", a.span)
            return None
        v = self.number(a.text, a.span)
        if v is None:
            return None
        if not isinstance(v, int) or v < minimum:
            self.error(f"`{owner.value}` takes {words} integer literal here, got `{a.text}`", a.span)
            return None
        return Const(v, ScalarType.INT, a.span)

    def positive_literal(self, a: A.AExpr, sc: _Scope, owner: BuiltinName) -> Expr | None:
        if not isinstance(a, A.NumE):
            self.error(f"`{owner.value}` takes a positive number literal", a.span)
            return None
        v = self.number(a.text, a.span)
        if v is None:
            return None
        if not v > 0:
            self.error(f"`{owner.value}(c)` needs c > 0, got `{a.text}`", a.span)
            return None
        if not fp32_literal(float(v)) > 0.0:
            self.error(f"`{owner.value}(c)` needs c > 0, but `{a.text}` is 0 in fp32", a.span, _FP32_POSITIVE_HELP)
            return None
        return Const(v, ScalarType.INT if isinstance(v, int) else ScalarType.FLOAT, a.span)

    def int_expr(self, a: A.AExpr, sc: _Scope, owner: BuiltinName) -> Expr | None:
        x = self.expr(a, sc)
        if x is not None and x.type != ScalarType.INT:
            self.error(f"`{owner.value}` takes an int expression, got {x.type.value}", a.span)
            return None
        return x


def _arity_words(arities: tuple[int, ...]) -> str:
    n = " or ".join(str(a) for a in arities)
    return f"{n} argument{'s' if arities != (1,) else ''}"
_FUNC_PARAMS: dict[Func, tuple[str, ...]] = {
    Func.TANH: ("x",),
    Func.EXP: ("x",),
    Func.LOG: ("x",),
    Func.SQRT: ("x",),
    Func.ABS: ("x",),
    Func.MIN: ("a", "b"),
    Func.MAX: ("a", "b"),
    Func.WHERE: ("cond", "a", "b"),
}

_DTYPES = {d.value: d for d in DType}
_ATTN_DTYPES = {d.value: d for d in ATTENTION_DTYPES}
_LAYOUTS = {x.value: x for x in Layout}
_KINDS = {x.value: x for x in AttnKind}
_NORM_KINDS = {x.value: x for x in NormKind}
_NORM_TARGETS = {x.value: x for x in NormTarget}
_SCOPES = {x.value: x for x in NormScope}
_BOOLS = {"true": True, "false": False}
_OUTPUTS = {"lse": True}
_TILE_KEYS = ("block_m", "block_n", "warps", "stages")
_REPEATABLE = frozenset({A.StmtKind.INPUT, A.StmtKind.SCORE, A.StmtKind.NORM})


# --------------------------------------------------------------------------------------------
# Variants


def _dtype_arch_error(lw: _Lowerer, dtype: DType, cc: int, span: Span | None) -> None:
    """`dtype` needs a newer arch than the target's: name the dtypes this one takes, narrowest first."""
    need = f"sm_{dtype.info.min_cc}"
    ok = [d.value for d in sorted(ATTENTION_DTYPES, key=lambda d: d.itemsize) if d.info.min_cc <= cc]
    lw.error(f"{dtype.value} needs {need} or newer; {lw.target.name} has no {dtype.value} tensor cores", span,
             f"use {_either(ok)} on this arch, or compile for {need} or newer")


def _either(words: list[str]) -> str:
    """`a, b or c`."""
    return ", ".join(words[:-1]) + " or " + words[-1] if len(words) > 1 else words[0]


def _variant(lw: _Lowerer, v: A.VariantDecl) -> Variant | None:
    n_before = len(lw.diags)
    if lw.ident(v.name, "variant name"):
        suffix = names.reserved_variant_suffix(v.name.text)
        if suffix is not None:
            lw.error(f"variant name `{v.name.text}` ends in the reserved suffix `{suffix}`", v.name.span,
                     "generated C++ names append " + ", ".join(f"`{s}`" for s in names.VARIANT_SUFFIXES)
                     + " to a variant's kernel name; pick a name that does not end in one")

    # Pass 1: everything expressions depend on (sizes, kind, inputs), so order in the file is free.
    seen: dict[A.StmtKind, A.Stmt] = {}
    for st in v.stmts:
        if st.kind in _REPEATABLE:
            continue
        if st.kind in seen:
            first = seen[st.kind].span
            lw.error(f"`{st.kind.value}` given twice", st.span, f"first given at {_first_at(first, st.span)}")
            continue
        seen[st.kind] = st

    def word_stmt(kind: A.StmtKind, table: Mapping[str, object], what: str) -> object | None:
        st = seen.get(kind)
        return lw.choice(st.value, table, what) if isinstance(st, A.WordStmt) else None

    dtype = word_stmt(A.StmtKind.DTYPE, _ATTN_DTYPES, "attention dtype")
    if A.StmtKind.DTYPE not in seen:
        lw.error(f"variant `{v.name.text}` has no `dtype`", v.name.span, f"add e.g. `dtype bf16` ({_either([d.value for d in ATTENTION_DTYPES])})")
    elif isinstance(dtype, DType) and lw.target.cc is not None and dtype.info.min_cc > lw.target.cc:
        _dtype_arch_error(lw, dtype, lw.target.cc, seen[A.StmtKind.DTYPE].span)
    layout = word_stmt(A.StmtKind.LAYOUT, _LAYOUTS, "layout") or Layout.BHSD
    kind = word_stmt(A.StmtKind.KIND, _KINDS, "kind") or AttnKind.SELF
    lse = word_stmt(A.StmtKind.OUTPUT, _OUTPUTS, "output") or False

    head_dim = value_dim = None
    hd = seen.get(A.StmtKind.HEAD_DIM)
    if isinstance(hd, A.PairStmt):
        head_dim = _head_dim(lw, hd.first, "head_dim")
        value_dim = _head_dim(lw, hd.second, "value head_dim") if hd.second is not None else head_dim
        if head_dim is not None and value_dim is not None and not _head_dim_pair(lw, hd, dtype if isinstance(dtype, DType) else None, head_dim, value_dim):
            head_dim = value_dim = None
    else:
        dims = lw.target.head_dims
        lw.error(f"variant `{v.name.text}` has no `head_dim`", v.name.span,
                 "add e.g. `head_dim 128`" + (f" (one of {', '.join(map(str, dims))})" if dims else ""))

    heads = kv_heads = None
    hs = seen.get(A.StmtKind.HEADS)
    if isinstance(hs, A.PairStmt):
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
    else:
        lw.error(f"variant `{v.name.text}` has no `heads`", v.name.span, "add e.g. `heads 16` or `heads 16 kv 8`")

    scale: float | None = None
    sc_st = seen.get(A.StmtKind.SCALE)
    if isinstance(sc_st, A.ScaleStmt) and sc_st.value is not None:
        scale = lw.positive_float(sc_st.value, "scale")

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

    # A paged cache implies its lengths (ir.nodes.CACHE_LENS), which expressions may read too.
    paged = A.StmtKind.KV_CACHE in seen
    scope_tensors = {CACHE_LENS: cache_lens_decl(), **tensors} if paged else tensors

    # Pass 2: expressions, norms, flags, tile.
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
            e = lw.expr(st.expr, _Scope(scope_tensors, heads, kind, in_score, paged))  # type: ignore[arg-type]
            if e is None:
                continue
            if in_score:
                if e.type not in _NUMERIC:
                    lw.error(f"a score must be a number, got {e.type.value}", st.expr.span, "a `score` rewrites `s`, e.g. `score softcap(30.0)` or `score s * 0.5`; visibility goes in `mask`")
                else:
                    scores.append(e)
            elif e.type != ScalarType.BOOL:
                lw.error(f"a mask must be a bool, got {e.type.value}", st.expr.span, "compare it, e.g. `mask ids[b, kv] != 0`")
            else:
                mask = e
        elif isinstance(st, A.NormStmt):
            nm = _norm(lw, st, layout)  # type: ignore[arg-type]
            if nm is None:
                continue
            if nm.target in norms:
                lw.error(f"`norm {nm.target.value}` given twice", st.span, f"first given at {_first_at(norms[nm.target].span, st.span)}")
                continue
            norms[nm.target] = nm

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
    )
    return lowered


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


def _kv_cache(lw: _Lowerer, st: A.Stmt | None, tensors: Mapping[str, TensorDecl], kind: object) -> int | None:
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


def _varlen(lw: _Lowerer, seen: Mapping[A.StmtKind, A.Stmt], inputs: list[TensorDecl], tensors: Mapping[str, TensorDecl],
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


def _sink(lw: _Lowerer, st: A.Stmt | None, tensors: Mapping[str, TensorDecl]) -> str | None:
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


def _head_dim(lw: _Lowerer, n: A.Num, what: str) -> int | None:
    v = lw.int_of(n, what)
    t = lw.target
    if v is not None and t.head_dims is not None and v not in t.head_dims and v not in {d for pair in t.wide_head_dims for d in pair}:
        lw.error(f"{what} {v} is not supported", n.span, f"the CUDA backend implements {t.describe_head_dims()}")
        return None
    return v


def _head_dim_pair(lw: _Lowerer, st: A.PairStmt, dtype: DType | None, d: int, dv: int) -> bool:
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


def _input(lw: _Lowerer, st: A.InputStmt, tensors: Mapping[str, TensorDecl]) -> tuple[TensorDecl | None, bool]:
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
        lw.error(f"input `{name}` declared twice", st.name.span, f"first declared at {_first_at(tensors[name].span, st.span)}")
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


def _norm(lw: _Lowerer, st: A.NormStmt, layout: Layout) -> Norm | None:
    target = lw.choice(st.target, _NORM_TARGETS, "norm target")
    nkind = lw.choice(st.norm_kind, _NORM_KINDS, "norm")
    eps = lw.positive_float(st.eps, "eps")
    scope: object = NormScope.HEAD
    affine: object = True
    given: dict[str, A.NormOption] = {}
    ok = target is not None and nkind is not None and eps is not None
    for opt in st.options:
        if opt.key in given:
            lw.error(f"`{opt.key}` given twice", opt.span, f"first given at {_first_at(given[opt.key].span, opt.span)}")
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


def _tile(lw: _Lowerer, st: A.TileStmt) -> TileHint | None:
    """The `tile` statement as a hint: each field given once, a positive integer. Whether an arch
    can run it is the plan stage's question (attngen.plan.validate)."""
    given: dict[str, int] = {}
    firsts: dict[str, A.TileField] = {}
    ok = True
    for f in st.fields:
        key = f.key.text
        if key in firsts:
            lw.error(f"`{key}` given twice", f.span, f"first given at {_first_at(firsts[key].span, f.span)}")
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
    lw = _Lowerer(file.path, target)
    variants: list[Variant] = []
    names: dict[str, A.VariantDecl] = {}
    for v in file.variants:
        if v.name.text in names:
            lw.error(f"variant `{v.name.text}` defined twice", v.name.span, f"first defined at {_first_at(names[v.name.text].name.span, v.name.span)}")
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
