"""Three-valued tile classification: is a mask true on all, none, or some of a tile?

A tile is q in [q0, q1] × kv in [k0, k1] for one (b, h). Evaluating the mask over intervals instead
of numbers gives ALWAYS (skip the per-element mask), NEVER (skip the tile) or MAYBE. Every rule here
may lose precision (answer MAYBE) but must never be wrong, which the property tests check against
`reference.evaluate` element by element. Correlations between operands are ignored (q - q is
[q0 - q1, q1 - q0]), which is sound but loose.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from attngen.ir import abi
from attngen.ir.abi import Sizes
from attngen.ir.nodes import (
    COMPARE_OPS,
    Binary,
    BinOp,
    Builtin,
    Call,
    Const,
    DType,
    Expr,
    Func,
    Index,
    IndexVar,
    Load,
    ScalarType,
    Score,
    Size,
    SizeSym,
    TensorDecl,
    TensorRef,
    Unary,
    UnOp,
    Variant,
    walk,
    fp32_literal,
)

INF = math.inf

# Tensors with more elements than this are not scanned for a slice's extremes.
_SCAN_LIMIT = 1 << 12


class Tri(enum.Enum):
    NEVER = "never"
    MAYBE = "maybe"
    ALWAYS = "always"

    @staticmethod
    def of(value: bool) -> "Tri":
        return Tri.ALWAYS if value else Tri.NEVER

    def __invert__(self) -> "Tri":
        return {Tri.NEVER: Tri.ALWAYS, Tri.ALWAYS: Tri.NEVER, Tri.MAYBE: Tri.MAYBE}[self]

    def __and__(self, other: "Tri") -> "Tri":
        if Tri.NEVER in (self, other):
            return Tri.NEVER
        return Tri.ALWAYS if self == other == Tri.ALWAYS else Tri.MAYBE

    def __or__(self, other: "Tri") -> "Tri":
        if Tri.ALWAYS in (self, other):
            return Tri.ALWAYS
        return Tri.NEVER if self == other == Tri.NEVER else Tri.MAYBE


@dataclass(frozen=True, slots=True)
class Interval:
    """Every value an expression takes over a tile lies in [lo, hi] (inclusive); `nan` says it
    may also be NaN (float expressions only). Unbounded ends are ±inf."""

    lo: float | int
    hi: float | int
    nan: bool = False

    @staticmethod
    def point(x: float | int) -> "Interval":
        if isinstance(x, float) and math.isnan(x):
            return Interval(-INF, INF, True)
        return Interval(x, x)

    @property
    def is_point(self) -> bool:
        return self.lo == self.hi and not self.nan and math.isfinite(self.lo)

    def hull(self, other: "Interval") -> "Interval":
        return Interval(min(self.lo, other.lo), max(self.hi, other.hi), self.nan or other.nan)


UNKNOWN = Interval(-INF, INF, True)
_UNKNOWN_INT = Interval(-INF, INF)
_DTYPE_RANGE = {DType.I32: Interval(-(2**31), 2**31 - 1), DType.U8: Interval(0, 255)}


@dataclass(frozen=True, slots=True)
class TileContext:
    """What interval evaluation reads: index ranges, known sizes, optional data and declarations."""

    index: Mapping[IndexVar, Interval]
    sizes: Mapping[SizeSym, int]
    inputs: Mapping[str, np.ndarray] | None
    decls: Mapping[str, TensorDecl]


def _unknown(t: ScalarType) -> Interval | Tri:
    if t == ScalarType.BOOL:
        return Tri.MAYBE
    return _UNKNOWN_INT if t == ScalarType.INT else UNKNOWN


def _as_interval(x: Interval | Tri) -> Interval:
    if isinstance(x, Interval):
        return x
    return {Tri.NEVER: Interval(0, 0), Tri.ALWAYS: Interval(1, 1), Tri.MAYBE: Interval(0, 1)}[x]


def _as_tri(x: Interval | Tri) -> Tri:
    if isinstance(x, Tri):
        return x
    # A number used as a condition: nonzero is true.
    if x.nan:
        return Tri.MAYBE
    if x.lo == 0 and x.hi == 0:
        return Tri.NEVER
    if x.lo > 0 or x.hi < 0:
        return Tri.ALWAYS
    return Tri.MAYBE


def _safe(lo: float, hi: float, nan: bool) -> Interval:
    """An interval from computed ends; a NaN end (inf - inf, 0 * inf) means we know nothing."""
    if isinstance(lo, float) and math.isnan(lo) or isinstance(hi, float) and math.isnan(hi):
        return UNKNOWN
    return Interval(lo, hi, nan)


def _mul(a: float | int, b: float | int) -> float | int:
    # 0 * inf is 0 here: an unbounded end stands for "arbitrarily large", times an exact 0.
    if a == 0 or b == 0:
        return 0
    return a * b


def _floordiv_pt(a: float | int, c: int) -> float | int:
    """floor(a / c) for a nonzero integer c, a possibly infinite."""
    if math.isinf(a):
        return a if c > 0 else -a
    return int(a) // c


def _widen(x: Interval) -> Interval:
    """One ulp outward, so libm differences between scalar and vector code never matter."""
    lo = float(np.nextafter(x.lo, -INF)) if math.isfinite(x.lo) else x.lo
    hi = float(np.nextafter(x.hi, INF)) if math.isfinite(x.hi) else x.hi
    return Interval(lo, hi, x.nan)


def _compare(op: BinOp, a: Interval, b: Interval) -> Tri:
    if op == BinOp.LT:
        r = Tri.ALWAYS if a.hi < b.lo else Tri.NEVER if a.lo >= b.hi else Tri.MAYBE
    elif op == BinOp.LE:
        r = Tri.ALWAYS if a.hi <= b.lo else Tri.NEVER if a.lo > b.hi else Tri.MAYBE
    elif op == BinOp.GT:
        return _compare(BinOp.LT, b, a)
    elif op == BinOp.GE:
        return _compare(BinOp.LE, b, a)
    elif op == BinOp.EQ:
        if a.hi < b.lo or b.hi < a.lo:
            r = Tri.NEVER
        elif a.lo == a.hi == b.lo == b.hi and math.isfinite(a.lo):
            r = Tri.ALWAYS
        else:
            r = Tri.MAYBE
    else:  # NE
        return ~_compare(BinOp.EQ, a, b) if not (a.nan or b.nan) else _ne_nan(a, b)
    # NaN compares false: a definite NEVER stays NEVER, an ALWAYS becomes unsure.
    if (a.nan or b.nan) and r == Tri.ALWAYS:
        return Tri.MAYBE
    return r


def _ne_nan(a: Interval, b: Interval) -> Tri:
    # NaN != x is true: a definite ALWAYS stays ALWAYS, a NEVER becomes unsure.
    r = ~_compare(BinOp.EQ, Interval(a.lo, a.hi), Interval(b.lo, b.hi))
    return Tri.MAYBE if r == Tri.NEVER else r


def _div(a: Interval, b: Interval, integer: bool) -> Interval:
    if integer:
        if b.is_point:
            c = int(b.lo)
            if c == 0:
                return Interval(0, 0)
            ends = (_floordiv_pt(a.lo, c), _floordiv_pt(a.hi, c))
            return Interval(min(ends), max(ends))
        if not all(math.isfinite(x) for x in (a.lo, a.hi, b.lo, b.hi)):
            return _UNKNOWN_INT
        # floor(x / y) is monotone in x for fixed y and in y for fixed x on each side of 0, so the
        # extremes lie at corners of the pieces y in [lo, -1] and [1, hi]; y == 0 contributes 0.
        divs = []
        if b.lo <= -1:
            divs += [int(b.lo), min(int(b.hi), -1)]
        if b.hi >= 1:
            divs += [max(int(b.lo), 1), int(b.hi)]
        vals = [int(x) // d for x in (a.lo, a.hi) for d in divs]
        if b.lo <= 0 <= b.hi:
            vals.append(0)
        return Interval(min(vals), max(vals))
    if b.lo > 0 or b.hi < 0:
        with np.errstate(all="ignore"):
            vals = [float(np.float64(x) / np.float64(y)) for x in (a.lo, a.hi) for y in (b.lo, b.hi)]
        if any(math.isnan(x) for x in vals):
            return UNKNOWN
        return Interval(min(vals), max(vals), a.nan or b.nan)
    return UNKNOWN


def _mod(a: Interval, b: Interval, integer: bool) -> Interval:
    if not integer:
        return UNKNOWN
    if b.is_point:
        m = int(b.lo)
        if m == 0:
            return Interval(0, 0)
        if m < 0:
            r = _mod(Interval(-a.hi, -a.lo), Interval(-m, -m), True)
            return Interval(-r.hi, -r.lo)
        if not (math.isfinite(a.lo) and math.isfinite(a.hi)) or int(a.lo) // m != int(a.hi) // m:
            return Interval(0, m - 1)  # the range wraps: every residue may occur
        return Interval(int(a.lo) % m, int(a.hi) % m)
    # A varying divisor: only the sign bounds of floor modulo are kept (|x % y| < |y|).
    lo = min(b.lo + 1, 0) if b.lo < 0 else 0
    hi = max(b.hi - 1, 0) if b.hi > 0 else 0
    if a.lo >= 0 and b.lo >= 0:
        hi = min(hi, a.hi)
    return Interval(lo, hi)


def _arith(op: BinOp, a: Interval, b: Interval, t: ScalarType) -> Interval:
    nan = a.nan or b.nan
    floating = t == ScalarType.FLOAT
    # For floats an infinite end is a value that can occur, so inf - inf may give NaN; for ints
    # it only means "unbounded".
    if op == BinOp.ADD:
        clash = floating and (a.lo == -INF and b.hi == INF or a.hi == INF and b.lo == -INF)
        return _safe(a.lo + b.lo, a.hi + b.hi, nan or clash)
    if op == BinOp.SUB:
        clash = floating and (a.hi == INF and b.hi == INF or a.lo == -INF and b.lo == -INF)
        return _safe(a.lo - b.hi, a.hi - b.lo, nan or clash)
    if op == BinOp.MUL:
        prods = [_mul(x, y) for x in (a.lo, a.hi) for y in (b.lo, b.hi)]
        inf_times_zero = t == ScalarType.FLOAT and (
            (math.isinf(a.lo) or math.isinf(a.hi)) and b.lo <= 0 <= b.hi
            or (math.isinf(b.lo) or math.isinf(b.hi)) and a.lo <= 0 <= a.hi
        )
        return _safe(min(prods), max(prods), nan or inf_times_zero)
    integer = t == ScalarType.INT
    r = _div(a, b, integer) if op == BinOp.DIV else _mod(a, b, integer)
    return Interval(r.lo, r.hi, r.nan or nan) if r is not UNKNOWN else r


def _load(e: Load, ctx: TileContext) -> Interval:
    decl = ctx.decls.get(e.tensor)
    full = _DTYPE_RANGE.get(decl.dtype, UNKNOWN) if decl is not None else _unknown(e.type)
    if ctx.inputs is None or e.tensor not in ctx.inputs:
        return full  # type: ignore[return-value]
    t = np.asarray(ctx.inputs[e.tensor])
    if t.ndim != len(e.indices):
        raise ValueError(f"lookup {e.tensor}[...]: expected {t.ndim} indices, got {len(e.indices)}")
    idx = [_as_interval(eval_interval(i, ctx)) for i in e.indices]
    if any(i.nan for i in idx):
        return full  # type: ignore[return-value]
    # Clamp each index range to the tensor; a range that leaves it may also read 0.
    lo_hi = []
    reads_zero = False
    for n, i in zip(t.shape, idx):
        lo, hi = max(i.lo, 0), min(i.hi, n - 1)
        if lo > hi:
            return Interval(0, 0)
        if i.lo < 0 or i.hi > n - 1:
            reads_zero = True
        lo_hi.append((int(lo), int(hi)))

    def value(x) -> float | int:
        return float(x) if t.dtype.kind == "f" else int(x)

    def found(lo, hi) -> Interval:
        r = Interval(min(lo, hi), max(lo, hi))
        if isinstance(lo, float) and (math.isnan(lo) or math.isnan(hi)):
            r = UNKNOWN
        return r.hull(Interval(0, 0)) if reads_zero else r

    if all(lo == hi for lo, hi in lo_hi):
        x = value(t[tuple(lo for lo, _ in lo_hi)])
        return found(x, x) if not (isinstance(x, float) and math.isnan(x)) else UNKNOWN
    head_points = all(lo == hi for lo, hi in lo_hi[:-1])
    if decl is not None and decl.sorted and head_points:
        # Values never decrease along the last axis: the slice's ends bound it.
        pre = tuple(lo for lo, _ in lo_hi[:-1])
        a, b = value(t[pre + (lo_hi[-1][0],)]), value(t[pre + (lo_hi[-1][1],)])
        return found(a, b)
    return full  # type: ignore[return-value]


def _call(e: Call, ctx: TileContext) -> Interval | Tri:
    f = e.func
    if f == Func.WHERE:
        c = _as_tri(eval_interval(e.args[0], ctx))
        x, y = eval_interval(e.args[1], ctx), eval_interval(e.args[2], ctx)
        if c == Tri.ALWAYS:
            return x
        if c == Tri.NEVER:
            return y
        if e.type == ScalarType.BOOL:
            tx, ty = _as_tri(x), _as_tri(y)
            return tx if tx == ty else Tri.MAYBE
        return _as_interval(x).hull(_as_interval(y))
    args = [_as_interval(eval_interval(a, ctx)) for a in e.args]
    if f in (Func.MIN, Func.MAX):
        a, b = args
        g = min if f == Func.MIN else max
        return Interval(g(a.lo, b.lo), g(a.hi, b.hi), a.nan or b.nan)
    a = args[0]
    if f == Func.ABS:
        if a.lo >= 0:
            return a
        if a.hi <= 0:
            return Interval(-a.hi, -a.lo, a.nan)
        return Interval(0, max(-a.lo, a.hi), a.nan)
    lo, hi, nan = float(a.lo), float(a.hi), a.nan
    with np.errstate(all="ignore"):
        if f in (Func.LOG, Func.SQRT):
            # Negative arguments give NaN; clamp the ends into the domain.
            if lo < 0:
                nan = True
            if hi < 0:
                return UNKNOWN
            lo = max(lo, 0.0)
        fn = {Func.TANH: np.tanh, Func.EXP: np.exp, Func.LOG: np.log, Func.SQRT: np.sqrt}[f]
        return _widen(Interval(float(fn(np.float64(lo))), float(fn(np.float64(hi))), nan))


def eval_interval(e: Expr, ctx: TileContext) -> Interval | Tri:
    """Bounds of `e` over a tile: an Interval for numbers, a Tri for booleans."""
    if isinstance(e, Const):
        if e.type == ScalarType.BOOL:
            return Tri.of(bool(e.value))
        if e.type == ScalarType.FLOAT:  # the fp32 value the kernel and the reference use
            return Interval.point(fp32_literal(e.value))
        return Interval.point(int(e.value))
    if isinstance(e, Index):
        return ctx.index[e.var]
    if isinstance(e, Size):
        if e.sym in ctx.sizes:
            return Interval.point(ctx.sizes[e.sym])
        return _UNKNOWN_INT
    if isinstance(e, Score):
        return UNKNOWN
    if isinstance(e, Builtin):
        return eval_interval(e.body, ctx)
    if isinstance(e, TensorRef):
        raise ValueError(f"tensor {e.name!r} used as a value: expected a lookup {e.name}[...], got the bare name")
    if isinstance(e, Load):
        r = _load(e, ctx)
        return r if e.type != ScalarType.BOOL else _as_tri(r)
    if isinstance(e, Unary):
        x = eval_interval(e.operand, ctx)
        if e.op == UnOp.NOT:
            return ~_as_tri(x)
        x = _as_interval(x)
        return Interval(-x.hi, -x.lo, x.nan)
    if isinstance(e, Binary):
        if e.op == BinOp.AND:
            return _as_tri(eval_interval(e.lhs, ctx)) & _as_tri(eval_interval(e.rhs, ctx))
        if e.op == BinOp.OR:
            return _as_tri(eval_interval(e.lhs, ctx)) | _as_tri(eval_interval(e.rhs, ctx))
        a, b = eval_interval(e.lhs, ctx), eval_interval(e.rhs, ctx)
        if e.op in (BinOp.EQ, BinOp.NE) and isinstance(a, Tri) and isinstance(b, Tri):
            if Tri.MAYBE in (a, b):
                return Tri.MAYBE
            return Tri.of((a == b) == (e.op == BinOp.EQ))
        if e.op in COMPARE_OPS:
            return _compare(e.op, _as_interval(a), _as_interval(b))
        return _arith(e.op, _as_interval(a), _as_interval(b), e.type)
    if isinstance(e, Call):
        return _call(e, ctx)
    raise ValueError(f"expected an IR expression, got {type(e).__name__}")


def make_context(
    b: int,
    h: int,
    q0: int,
    q1: int,
    k0: int,
    k1: int,
    sizes: Sizes,
    inputs: Mapping[str, np.ndarray] | None = None,
    decls: Mapping[str, TensorDecl] | Sequence[TensorDecl] | None = None,
    variant: Variant | None = None,
) -> TileContext:
    """The interval environment of one tile (q and kv ranges inclusive)."""
    if q0 > q1 or k0 > k1:
        raise ValueError(f"tile: expected q0 <= q1 and k0 <= k1, got q [{q0}, {q1}], kv [{k0}, {k1}]")
    if decls is None:
        dmap: dict[str, TensorDecl] = {d.name: d for d in variant.runtime_inputs()} if variant else {}
    elif isinstance(decls, Mapping):
        dmap = dict(decls)
    else:
        dmap = {d.name: d for d in decls}
    if variant is not None:
        svals = {s: abi.size_value(variant, s, sizes) for s in SizeSym}
    else:
        svals = {SizeSym.B: sizes.B, SizeSym.LQ: sizes.Lq, SizeSym.LK: sizes.Lk}
        names = dict(sizes.symbols)
        for s in (SizeSym.H, SizeSym.HKV, SizeSym.D, SizeSym.DV):
            if s.value in names:
                svals[s] = names[s.value]
    index = {
        IndexVar.B: Interval.point(b),
        IndexVar.H: Interval.point(h),
        IndexVar.Q: Interval(q0, q1),
        IndexVar.KV: Interval(k0, k1),
    }
    tensors = None if inputs is None else {n: np.asarray(a) for n, a in inputs.items()}
    return TileContext(index, svals, tensors, dmap)


def classify(
    mask: Expr,
    b: int,
    h: int,
    q0: int,
    q1: int,
    k0: int,
    k1: int,
    sizes: Sizes,
    inputs: Mapping[str, np.ndarray] | None = None,
    decls: Mapping[str, TensorDecl] | Sequence[TensorDecl] | None = None,
    *,
    variant: Variant | None = None,
) -> Tri:
    """Whether `mask` holds on ALWAYS / NEVER / MAYBE some of the tile q in [q0, q1] × kv in [k0, k1]
    (inclusive) for batch b and head h. Sizes H, Hkv, D, Dv come from `variant` when given (or from
    `sizes.symbols` under their names); unknown ones make the answer looser, never wrong."""
    ctx = make_context(b, h, q0, q1, k0, k1, sizes, inputs, decls, variant)
    return _as_tri(eval_interval(mask, ctx))


def density(
    v: Variant, sizes: Sizes, inputs: Mapping[str, np.ndarray] | None, block_m: int, block_n: int
) -> dict:
    """How much of the score matrix the mask keeps, and how tiles of block_m × block_n classify.

    Returns {'visible': fraction of visible elements, 'tiles': total tile count over b and h,
    'never' / 'maybe' / 'always': tile counts per class, 'skipped': fraction of tiles that are NEVER}."""
    from attngen.check import reference  # the brute-force count; imported here to keep the layering light

    if block_m < 1 or block_n < 1:
        raise ValueError(f"density: expected positive block sizes, got block_m={block_m}, block_n={block_n}")
    uses = {n.var for n in walk(v.mask) if isinstance(n, Index)}
    # Only the index variables make a mask vary across the batch or the heads.
    bs = range(sizes.B) if IndexVar.B in uses else [0]
    hs = range(v.heads) if IndexVar.H in uses else [0]
    weight = (sizes.B // len(bs)) * (v.heads // len(hs))
    counts = {Tri.NEVER: 0, Tri.MAYBE: 0, Tri.ALWAYS: 0}
    decls = {d.name: d for d in v.runtime_inputs()}
    for b in bs:
        for h in hs:
            for q0 in range(0, sizes.Lq, block_m):
                q1 = min(sizes.Lq, q0 + block_m) - 1
                for k0 in range(0, sizes.Lk, block_n):
                    k1 = min(sizes.Lk, k0 + block_n) - 1
                    t = classify(v.mask, b, h, q0, q1, k0, k1, sizes, inputs, decls, variant=v)
                    counts[t] += weight
    visible = reference.count_visible(v, sizes, inputs)
    total = sum(counts.values())
    return {
        "visible": visible / (sizes.B * v.heads * sizes.Lq * sizes.Lk),
        "tiles": total,
        "never": counts[Tri.NEVER],
        "maybe": counts[Tri.MAYBE],
        "always": counts[Tri.ALWAYS],
        "skipped": counts[Tri.NEVER] / total if total else 0.0,
    }

