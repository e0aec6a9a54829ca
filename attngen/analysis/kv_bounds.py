"""Key bounds a mask states outright: `kv <= f(q)` (causal, the right edge of a window) and
`kv >= f(q)` (the left edge of a window), as conjuncts of the mask's top-level `&&`; and the
conjuncts `a[.., q] == c[.., kv]` over `sorted` inputs (documents), which bound either axis by a
binary search.

The wgmma producer uses them to walk a query tile's key tiles from the last one that can be
visible downwards: that tile's copy starts before any tile is classified, which on masks whose
classification reads memory (document ids) keeps the consumers from waiting at every work tile.

Only bounds that hold for every element are taken: f is `q`, `q + X`, `X + q` or `q - X` where X
is built from integer constants and size symbols alone, so the bound is exact arithmetic, never
reads memory, and grows with q (the bound at a tile's last row covers all of its rows).

The backward turns them around: with slope 1, `kv <= q + X` means `q >= kv - X`, so a key tile's
first key bounds the query rows that can see it from below, and a lower bound `kv >= q + Y` bounds
them from above; its dK/dV walk then visits only the query tiles in between.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from attngen.ir.nodes import Binary, BinOp, Builtin, Const, Expr, Index, IndexVar, Load, ScalarType, Size, TensorDecl

# kv OP f  <=>  f FLIP[OP] kv
_FLIP = {BinOp.LE: BinOp.GE, BinOp.LT: BinOp.GT, BinOp.GE: BinOp.LE, BinOp.GT: BinOp.LT}


def _conjuncts(e: Expr) -> list[Expr]:
    if isinstance(e, Builtin):
        return _conjuncts(e.body)
    if isinstance(e, Binary) and e.op == BinOp.AND:
        return _conjuncts(e.lhs) + _conjuncts(e.rhs)
    return [e]


def _is_kv(e: Expr) -> bool:
    return isinstance(e, Index) and e.var == IndexVar.KV


def _closed(e: Expr) -> bool:
    """Built from integer constants and size symbols with + - * only (exact, no memory)."""
    if isinstance(e, Builtin):
        return _closed(e.body)
    if isinstance(e, Const):
        return e.type == ScalarType.INT and not isinstance(e.value, bool)
    if isinstance(e, Size):
        return True
    if isinstance(e, Binary):
        return e.op in (BinOp.ADD, BinOp.SUB, BinOp.MUL) and _closed(e.lhs) and _closed(e.rhs)
    return False


def _q_plus_closed(e: Expr) -> bool:
    """`q`, `q + X`, `X + q` or `q - X` with X closed: non-decreasing in q, slope 1."""
    if isinstance(e, Builtin):
        return _q_plus_closed(e.body)
    if isinstance(e, Index):
        return e.var == IndexVar.Q
    if isinstance(e, Binary) and e.op == BinOp.ADD:
        return (_q_plus_closed(e.lhs) and _closed(e.rhs)) or (_closed(e.lhs) and _q_plus_closed(e.rhs))
    if isinstance(e, Binary) and e.op == BinOp.SUB:
        return _q_plus_closed(e.lhs) and _closed(e.rhs)
    return False


def _kv_bounds(mask: Expr | None, upper: bool) -> tuple[Expr, ...]:
    """f(q) of every top-level conjunct `kv <= f(q)` (upper) or `kv >= f(q)` (not upper), with
    strict comparisons moved by one."""
    if mask is None:
        return ()
    le, lt = (BinOp.LE, BinOp.LT) if upper else (BinOp.GE, BinOp.GT)
    step = BinOp.SUB if upper else BinOp.ADD
    out: list[Expr] = []
    for c in _conjuncts(mask):
        if not (isinstance(c, Binary) and c.op in _FLIP):
            continue
        op, lhs, rhs = c.op, c.lhs, c.rhs
        if _is_kv(rhs) and not _is_kv(lhs):
            op, lhs, rhs = _FLIP[op], rhs, lhs
        if not (_is_kv(lhs) and _q_plus_closed(rhs)):
            continue
        if op == le:
            out.append(rhs)
        elif op == lt:
            out.append(Binary(step, rhs, Const(1, ScalarType.INT), ScalarType.INT))
    return tuple(out)


def kv_upper_bounds(mask: Expr | None) -> tuple[Expr, ...]:
    """Expressions f(q) with kv <= f(q) for every visible (q, kv), one per top-level conjunct that
    states one (none for no mask); the tightest bound is their minimum."""
    return _kv_bounds(mask, True)


def kv_lower_bounds(mask: Expr | None) -> tuple[Expr, ...]:
    """Expressions f(q) with kv >= f(q) for every visible (q, kv), one per top-level conjunct that
    states one (none for no mask); the tightest bound is their maximum."""
    return _kv_bounds(mask, False)


@dataclass(frozen=True, slots=True)
class SortedMatch:
    """A top-level conjunct `q_load == kv_load` where both read integer `sorted` inputs whose last
    index is q (kv) itself and whose other indices read neither q, kv, h nor memory (so the match
    bounds every head of a batch row alike): a key range [k0, k1] lets only the queries whose value
    lies in [kv_load(k0), kv_load(k1)] see it, a contiguous run of rows, and the other way round."""

    q_load: Load
    kv_load: Load


def _batch_only(e: Expr) -> bool:
    """Reads at most b, constants and sizes (no q, kv, h, memory)."""
    if isinstance(e, Index):
        return e.var == IndexVar.B
    if isinstance(e, Binary):
        return e.op in (BinOp.ADD, BinOp.SUB, BinOp.MUL) and _batch_only(e.lhs) and _batch_only(e.rhs)
    return _closed(e)


def _sorted_load(e: Expr, var: IndexVar, decls: Mapping[str, TensorDecl]) -> bool:
    while isinstance(e, Builtin):
        e = e.body
    if not isinstance(e, Load) or e.type != ScalarType.INT or not e.indices:
        return False
    d = decls.get(e.tensor)
    last = e.indices[-1]
    return (d is not None and d.sorted and isinstance(last, Index) and last.var == var
            and all(_batch_only(i) for i in e.indices[:-1]))


def _unwrap(e: Expr) -> Expr:
    while isinstance(e, Builtin):
        e = e.body
    return e


def sorted_matches(mask: Expr | None, decls: Mapping[str, TensorDecl]) -> tuple[SortedMatch, ...]:
    """The top-level conjuncts `a[.., q] == c[.., kv]` over sorted inputs (`SortedMatch`), either
    side first (`document(ids)` among them); none for no mask."""
    if mask is None:
        return ()
    out: list[SortedMatch] = []
    for c in _conjuncts(mask):
        if not (isinstance(c, Binary) and c.op == BinOp.EQ):
            continue
        for a, k in ((c.lhs, c.rhs), (c.rhs, c.lhs)):
            if _sorted_load(a, IndexVar.Q, decls) and _sorted_load(k, IndexVar.KV, decls):
                out.append(SortedMatch(_unwrap(a), _unwrap(k)))  # type: ignore[arg-type]
                break
    return tuple(out)


__all__ = ["SortedMatch", "kv_lower_bounds", "kv_upper_bounds", "sorted_matches"]
