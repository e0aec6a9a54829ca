"""Symbolic derivatives of score expressions, as IR rewrites (the backward pass's score hook).

The backward needs, per visible (q, kv), the derivative of the final score with respect to the raw
score s0 = scale * q.k, and, for learnable inputs read by the scores (`bias(t)`, `alibi(slopes)`,
`rel_bias(t, m)`, any float lookup), the derivative with respect to the element read. Both come
from one rule table mapping each IR operation to its derivative (the chain rule applied node by
node), so the reference and every backend differentiate the same expression:

    composed = compose_scores(v.scores)          # one expression of s0 (builtins desugared)
    ds       = diff(composed, SCORE)              # d(score)/d(s0), an Expr reading s0 as `s`
    params   = param_derivatives(composed)        # ((Load, d(score)/d(Load)), ...)

Conventions match torch autograd, so the float64 torch oracle agrees: at a tie min/max split the
gradient evenly, abs'(0) = 0, and integer or boolean subexpressions are piecewise constant
(derivative 0; comparisons and `where` conditions pass no gradient). The results are simplified
(x*1, x+0, 0*x, where(c, 0, 0), constant folding of 0/1) so emitted code stays lean.
"""

from __future__ import annotations

from collections.abc import Callable

from attngen.ir.nodes import (
    Binary,
    BinOp,
    Call,
    Const,
    Expr,
    Func,
    Load,
    ScalarType,
    Score,
    Unary,
    UnOp,
    strip_sugar,
    walk,
)

F, B = ScalarType.FLOAT, ScalarType.BOOL
ZERO = Const(0.0, F)
ONE = Const(1.0, F)
HALF = Const(0.5, F)
SCORE = Score()


# --------------------------------------------------------------------------------------------
# Constructors that simplify as they build


def _is(e: Expr, value: float) -> bool:
    return isinstance(e, Const) and e.type != B and not isinstance(e.value, bool) and float(e.value) == value


def add(a: Expr, b: Expr) -> Expr:
    if _is(a, 0.0):
        return b
    if _is(b, 0.0):
        return a
    return Binary(BinOp.ADD, a, b, F)


def sub(a: Expr, b: Expr) -> Expr:
    if _is(b, 0.0):
        return a
    if _is(a, 0.0):
        return neg(b)
    return Binary(BinOp.SUB, a, b, F)


def _fconst(e: Expr) -> float | None:
    """The value of a float constant (None for anything else)."""
    if isinstance(e, Const) and e.type == F:
        return float(e.value)
    return None


def mul(a: Expr, b: Expr) -> Expr:
    # 0 * x is taken as 0 even where x is inf: a zero derivative stays zero, as in the kernels.
    if _is(a, 0.0) or _is(b, 0.0):
        return ZERO
    ca, cb = _fconst(a), _fconst(b)
    if ca is not None and cb is not None:
        return Const(ca * cb, F)
    if cb is not None:  # constants to the left: c * x
        a, b, ca, cb = b, a, cb, ca
    if ca is not None and isinstance(b, Binary) and b.op == BinOp.MUL and b.type == F:
        # c * (x * d) and c * (d * x) fold to (c d) * x: softcap's c * (...) * (1/c) becomes (...)
        for inner, other in ((b.rhs, b.lhs), (b.lhs, b.rhs)):
            d = _fconst(inner)
            if d is not None:
                return mul(Const(ca * d, F), other)
    if _is(a, 1.0):
        return b if b.type == F else Binary(BinOp.MUL, ONE, b, F)
    if _is(b, 1.0):
        return a if a.type == F else Binary(BinOp.MUL, a, ONE, F)
    return Binary(BinOp.MUL, a, b, F)


def div(a: Expr, b: Expr) -> Expr:
    if _is(a, 0.0):
        return ZERO
    ca, cb = _fconst(a), _fconst(b)
    if ca is not None and cb:
        return Const(ca / cb, F)
    if _is(b, 1.0) and a.type == F:
        return a
    return Binary(BinOp.DIV, a, b, F)


def neg(a: Expr) -> Expr:
    if _is(a, 0.0):
        return ZERO
    if isinstance(a, Unary) and a.op == UnOp.NEG and a.type == F:
        return a.operand
    return Unary(UnOp.NEG, a, F)


def where(c: Expr, a: Expr, b: Expr) -> Expr:
    if a == b:
        return a
    if isinstance(c, Const) and c.type == B:
        return a if c.value else b
    return Call(Func.WHERE, (c, a, b), F)


def _cmp(op: BinOp, a: Expr, b: Expr) -> Expr:
    return Binary(op, a, b, B)


def _as_float(e: Expr) -> Expr:
    """e as a float value: int subexpressions of a float expression (e.g. |q - kv|) are promoted."""
    return e if e.type == F else Binary(BinOp.MUL, e, ONE, F)


# --------------------------------------------------------------------------------------------
# The rule table: op -> (node, derivatives of its children) -> derivative of the node

# A rule receives the node and a function d(child) -> Expr; it returns the node's derivative.
Rule = Callable[[Expr, Callable[[Expr], Expr]], Expr]


def _d_add(e: Binary, d) -> Expr:
    return add(d(e.lhs), d(e.rhs))


def _d_sub(e: Binary, d) -> Expr:
    return sub(d(e.lhs), d(e.rhs))


def _d_mul(e: Binary, d) -> Expr:
    return add(mul(d(e.lhs), _as_float(e.rhs)), mul(_as_float(e.lhs), d(e.rhs)))


def _d_div(e: Binary, d) -> Expr:
    # (a/b)' = a'/b - a b' / b^2
    a, b = _as_float(e.lhs), _as_float(e.rhs)
    return sub(div(d(e.lhs), b), div(mul(a, d(e.rhs)), mul(b, b)))


def _d_mod(e: Binary, d) -> Expr:
    # a % b = a - floor(a/b) b, floor piecewise constant: a' - floor(a/b) b', floor(a/b) = (a - a%b)/b.
    db = d(e.rhs)
    if _is(db, 0.0):
        return d(e.lhs)
    a, b = _as_float(e.lhs), _as_float(e.rhs)
    return sub(d(e.lhs), mul(div(sub(a, e), b), db))


def _d_neg(e: Unary, d) -> Expr:
    return neg(d(e.operand))


def _d_tanh(e: Call, d) -> Expr:
    return mul(sub(ONE, mul(e, e)), d(e.args[0]))


def _d_exp(e: Call, d) -> Expr:
    return mul(e, d(e.args[0]))


def _d_log(e: Call, d) -> Expr:
    return div(d(e.args[0]), _as_float(e.args[0]))


def _d_sqrt(e: Call, d) -> Expr:
    return div(d(e.args[0]), mul(Const(2.0, F), e))


def _d_abs(e: Call, d) -> Expr:
    x, dx = e.args[0], d(e.args[0])
    if _is(dx, 0.0):
        return ZERO
    zero = Const(0, x.type) if x.type != F else ZERO
    return where(_cmp(BinOp.GT, x, zero), dx, where(_cmp(BinOp.LT, x, zero), neg(dx), ZERO))


def _d_minmax(first: BinOp) -> Rule:
    # min: a' where a < b, b' where a > b, the mean at a tie (torch's convention); max mirrored.
    def rule(e: Call, d) -> Expr:
        a, b = e.args
        da, db = d(a), d(b)
        if da == db:
            return da
        other = BinOp.GT if first == BinOp.LT else BinOp.LT
        tie = mul(HALF, add(da, db))
        return where(_cmp(first, a, b), da, where(_cmp(other, a, b), db, tie))

    return rule


def _d_where(e: Call, d) -> Expr:
    c, a, b = e.args
    return where(c, d(a), d(b))


BINARY_RULES: dict[BinOp, Rule] = {
    BinOp.ADD: _d_add,
    BinOp.SUB: _d_sub,
    BinOp.MUL: _d_mul,
    BinOp.DIV: _d_div,
    BinOp.MOD: _d_mod,
}
UNARY_RULES: dict[UnOp, Rule] = {UnOp.NEG: _d_neg}
CALL_RULES: dict[Func, Rule] = {
    Func.TANH: _d_tanh,
    Func.EXP: _d_exp,
    Func.LOG: _d_log,
    Func.SQRT: _d_sqrt,
    Func.ABS: _d_abs,
    Func.MIN: _d_minmax(BinOp.LT),
    Func.MAX: _d_minmax(BinOp.GT),
    Func.WHERE: _d_where,
}


def _rule(e: Expr) -> Rule | None:
    """The rule for a node, looked up by its operation (None: a leaf)."""
    op = getattr(e, "op", None) if isinstance(e, (Binary, Unary)) else getattr(e, "func", None)
    for table in (BINARY_RULES, UNARY_RULES, CALL_RULES):
        if op in table:
            return table[op]  # type: ignore[index]
    return None


def diff(e: Expr, wrt: Expr = SCORE) -> Expr:
    """d(e)/d(wrt) as a simplified float expression. `wrt` is the score `s` or a float `Load`
    (a learnable element); builtins are differentiated through their bodies."""
    e = strip_sugar(e)
    memo: dict[Expr, Expr] = {}

    def d(x: Expr) -> Expr:
        if x in memo:
            return memo[x]
        if x.type != F:
            r: Expr = ZERO  # integers and booleans are piecewise constant
        elif x == wrt:
            r = ONE
        else:
            rule = _rule(x)
            r = ZERO if rule is None else rule(x, d)
        memo[x] = r
        return r

    return d(e)


# --------------------------------------------------------------------------------------------
# Composition and learnable inputs


def substitute_score(e: Expr, s: Expr) -> Expr:
    """e with every `s` replaced by the expression s (builtins desugared)."""
    e = strip_sugar(e)
    if isinstance(e, Score):
        return s
    if isinstance(e, Load):
        return Load(e.tensor, tuple(substitute_score(i, s) for i in e.indices), e.type)
    if isinstance(e, Unary):
        return Unary(e.op, substitute_score(e.operand, s), e.type)
    if isinstance(e, Binary):
        return Binary(e.op, substitute_score(e.lhs, s), substitute_score(e.rhs, s), e.type)
    if isinstance(e, Call):
        return Call(e.func, tuple(substitute_score(a, s) for a in e.args), e.type)
    return e


def compose_scores(scores: tuple[Expr, ...]) -> Expr:
    """The variant's score modifications as one expression of the raw score `s` (s itself when
    there are none): scores[-1](... scores[0](s))."""
    out: Expr = SCORE
    for sc in scores:
        out = substitute_score(sc, out)
    return out


def float_loads(e: Expr) -> tuple[Load, ...]:
    """The distinct float lookups in e, in first-appearance order (the learnable elements). Read
    from the desugared expression: a builtin's arguments are its spelling, only its body computes
    (the IR's `walk` would visit both)."""
    return tuple(dict.fromkeys(x for x in walk(strip_sugar(e)) if isinstance(x, Load) and x.type == F))


def score_derivative(scores: tuple[Expr, ...]) -> Expr:
    """d(final score)/d(raw score), reading the raw score as `s`."""
    return diff(compose_scores(scores), SCORE)


def param_derivatives(scores: tuple[Expr, ...]) -> tuple[tuple[Load, Expr], ...]:
    """For each float lookup the scores read: (the lookup, d(final score)/d(its value)). The
    gradient of tensor t is the sum, over its lookups, of dS * derivative scattered at the lookup's
    indices (an index outside the tensor reads 0 and receives nothing)."""
    composed = compose_scores(scores)
    return tuple((ld, diff(composed, ld)) for ld in float_loads(composed))


def learnable_tensors(scores: tuple[Expr, ...]) -> tuple[str, ...]:
    """Names of the float inputs the scores read, in first-appearance order."""
    return tuple(dict.fromkeys(ld.tensor for ld in float_loads(compose_scores(scores))))


__all__ = [
    "BINARY_RULES",
    "CALL_RULES",
    "UNARY_RULES",
    "compose_scores",
    "diff",
    "float_loads",
    "learnable_tensors",
    "param_derivatives",
    "score_derivative",
    "substitute_score",
]
