"""Lowering of expressions: names, operators, tensor lookups, function calls and builtins, with
the lowerer's literal, identifier and diagnostic helpers (attngen.lang.lower lowers the statements
of a variant through it).

This is where the names of the language get their meaning: index variables, sizes, functions,
builtins (checked against their signatures in the one registry, attngen.lang.builtins, and
desugared into `ir.Builtin` nodes whose `body` is the plain expression). `Target` carries the few
backend facts lowering checks, as plain data, so that the front end imports no backend.
"""

from __future__ import annotations

import difflib
import math
import re
from dataclasses import dataclass, field
from typing import Iterable, Mapping

from attngen.lang import ast as A
from attngen.lang.diagnostics import Diagnostic
from attngen.ir.nodes import (
    LOGIC_OPS,
    ARITH_OPS,
    ALIBI_SLOPES,
    PADDING_KV_LENS,
    PADDING_Q_LENS,
    AttnKind,
    BinOp,
    Binary,
    BuiltinName,
    Call,
    Const,
    DType,
    Expr,
    Func,
    Index,
    IndexVar,
    Load,
    NormTarget,
    ScalarType,
    Score,
    Size,
    SizeSym,
    Span,
    TensorDecl,
    TensorRef,
    Unary,
    UnOp,
    norm_bias_name,
    norm_weight_name,
    FP32_MAX,
    INT32_MAX,
    FP32_MIN_NORMAL,
    fp32_literal,
)
from attngen.lang.builtins import BUILTINS, IntExpr, IntLiteral, Param, PositiveLiteral, TensorParam, make_builtin

# Tensor lookups inside the indices of lookups (`t[u[kv]]` is 2 deep). ptxas time grows steeply
# with the depth (199 levels ran for more than 300 s); real masks compose one or two.
MAX_LOOKUP_NESTING = 4
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
NUMERIC = (ScalarType.INT, ScalarType.FLOAT)
ORDER_OPS = frozenset({BinOp.LT, BinOp.LE, BinOp.GT, BinOp.GE})


def first_at(first: Span | None, again: Span) -> str:
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
class Scope:
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
class Lowerer:
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

    def names_in_scope(self, sc: Scope) -> list[str]:
        names = [*INDEX_NAMES, *SIZE_NAMES, *FUNC_NAMES, *BUILTIN_NAMES, *sc.tensors, "true", "false"]
        if sc.in_score:
            names.append(SCORE_NAME)
        return names

    def expr(self, e: A.AExpr, sc: Scope) -> Expr | None:
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

    def name(self, e: A.NameE, sc: Scope) -> Expr | None:
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

    def unary(self, e: A.UnaryE, sc: Scope) -> Expr | None:
        x = self.expr(e.operand, sc)
        if x is None:
            return None
        op = _UNARY_OPS[e.op]
        if op == UnOp.NOT:
            if x.type != ScalarType.BOOL:
                self.error(f"`!` needs a bool, got {x.type.value}", e.operand.span, "compare first, e.g. `x != 0`")
                return None
            return Unary(op, x, ScalarType.BOOL, e.span)
        if x.type not in NUMERIC:
            self.error(f"`-` needs a number, got {x.type.value}", e.operand.span)
            return None
        return Unary(op, x, x.type, e.span)

    def binary(self, e: A.BinaryE, sc: Scope) -> Expr | None:
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
            elif op in ARITH_OPS | ORDER_OPS and x.type not in NUMERIC:
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

    def lookup(self, e: A.LookupE, sc: Scope) -> Expr | None:
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

    def call(self, e: A.CallE, sc: Scope) -> Expr | None:
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
        bad = [(a, ae) for a, ae in zip(targs, e.args) if a.type not in NUMERIC]
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
        sc: Scope,
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

    def builtin_extra(self, name: BuiltinName, args: tuple[Expr, ...], raw: tuple[A.AExpr, ...], span: Span, sc: Scope) -> bool:
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

    def param(self, p: Param, a: A.AExpr, sc: Scope, owner: BuiltinName) -> Expr | None:
        """One argument of a builtin, checked against its declared parameter kind."""
        if isinstance(p, TensorParam):
            return self.tensor_arg(a, sc, owner, p.ranks, p.types)
        if isinstance(p, IntLiteral):
            return self.int_literal(a, sc, owner, p.minimum)
        if isinstance(p, PositiveLiteral):
            return self.positive_literal(a, sc, owner)
        assert isinstance(p, IntExpr), p
        return self.int_expr(a, sc, owner)

    def tensor_arg(self, a: A.AExpr, sc: Scope, owner: BuiltinName, ranks: tuple[int, ...], types: str) -> Expr | None:
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

    def int_literal(self, a: A.AExpr, sc: Scope, owner: BuiltinName, minimum: int) -> Expr | None:
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

    def positive_literal(self, a: A.AExpr, sc: Scope, owner: BuiltinName) -> Expr | None:
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

    def int_expr(self, a: A.AExpr, sc: Scope, owner: BuiltinName) -> Expr | None:
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
