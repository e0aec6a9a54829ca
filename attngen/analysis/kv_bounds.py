"""Key upper bounds a mask states outright: `kv <= f(q)` (causal, the right edge of a window), as
conjuncts of the mask's top-level `&&`.

The wgmma producer uses them to walk a query tile's key tiles from the last one that can be
visible downwards: that tile's copy starts before any tile is classified, which on masks whose
classification reads memory (document ids) keeps the consumers from waiting at every work tile.

Only bounds that hold for every element are taken: f is `q`, `q + X`, `X + q` or `q - X` where X
is built from integer constants and size symbols alone, so the bound is exact arithmetic, never
reads memory, and grows with q (the bound at a tile's last row covers all of its rows).
"""

from __future__ import annotations

from attngen.ir.nodes import Binary, BinOp, Builtin, Const, Expr, Index, IndexVar, ScalarType, Size

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


def kv_upper_bounds(mask: Expr | None) -> tuple[Expr, ...]:
    """Expressions f(q) with kv <= f(q) for every visible (q, kv), one per top-level conjunct that
    states one (none for no mask); the tightest bound is their minimum."""
    if mask is None:
        return ()
    out: list[Expr] = []
    for c in _conjuncts(mask):
        if not (isinstance(c, Binary) and c.op in _FLIP):
            continue
        op, lhs, rhs = c.op, c.lhs, c.rhs
        if _is_kv(rhs) and not _is_kv(lhs):
            op, lhs, rhs = _FLIP[op], rhs, lhs
        if not (_is_kv(lhs) and _q_plus_closed(rhs)):
            continue
        if op == BinOp.LE:
            out.append(rhs)
        elif op == BinOp.LT:
            out.append(Binary(BinOp.SUB, rhs, Const(1, ScalarType.INT), ScalarType.INT))
    return tuple(out)


__all__ = ["kv_upper_bounds"]
