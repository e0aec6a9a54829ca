"""IR builders for tests: build expressions and variants directly, without the parser.

Builtins are built the way docs/LANGUAGE.md defines them (name, args, and the plain `body`), so
the reference and the classifier are tested against the documented meaning.
"""

from __future__ import annotations

from attngen.ir.nodes import (
    PADDING_KV_LENS,
    PADDING_Q_LENS,
    TRUE,
    AttnKind,
    Binary,
    BinOp,
    Builtin,
    BuiltinName,
    Call,
    Const,
    DType,
    Expr,
    Func,
    Index,
    IndexVar,
    Layout,
    Load,
    Norm,
    ScalarType,
    Score,
    Size,
    SizeSym,
    TensorDecl,
    TensorRef,
    Unary,
    UnOp,
    Variant,
)
from attngen.check.reference import standard_alibi_slopes

I, F, BOOL = ScalarType.INT, ScalarType.FLOAT, ScalarType.BOOL

b, h, q, kv = (Index(IndexVar.B), Index(IndexVar.H), Index(IndexVar.Q), Index(IndexVar.KV))
s = Score()
Lq, Lk, H = Size(SizeSym.LQ), Size(SizeSym.LK), Size(SizeSym.H)


def ci(x: int) -> Const:
    return Const(int(x), I)


def cf(x: float) -> Const:
    return Const(float(x), F)


def cb(x: bool) -> Const:
    return Const(bool(x), BOOL)


def _arith_type(x: Expr, y: Expr) -> ScalarType:
    return F if F in (x.type, y.type) else I


def add(x, y):
    return Binary(BinOp.ADD, x, y, _arith_type(x, y))


def sub(x, y):
    return Binary(BinOp.SUB, x, y, _arith_type(x, y))


def mul(x, y):
    return Binary(BinOp.MUL, x, y, _arith_type(x, y))


def div(x, y):
    return Binary(BinOp.DIV, x, y, _arith_type(x, y))


def mod(x, y):
    return Binary(BinOp.MOD, x, y, _arith_type(x, y))


def cmp(op: str, x, y):
    return Binary(BinOp(op), x, y, BOOL)


def and_(x, y):
    return Binary(BinOp.AND, x, y, BOOL)


def or_(x, y):
    return Binary(BinOp.OR, x, y, BOOL)


def not_(x):
    return Unary(UnOp.NOT, x, BOOL)


def neg(x):
    return Unary(UnOp.NEG, x, x.type)


def call(f: str, *args):
    fn = Func(f)
    if fn in (Func.TANH, Func.EXP, Func.LOG, Func.SQRT):
        t = F
    elif fn == Func.WHERE:
        t = args[1].type if args[1].type == args[2].type else F
    elif fn == Func.ABS:
        t = args[0].type
    else:
        t = _arith_type(args[0], args[1])
    return Call(fn, tuple(args), t)


def load(name: str, *idx, t: ScalarType = I):
    return Load(name, tuple(idx), t)


def qprime() -> Expr:
    return add(q, sub(Lk, Lq))


# ---- builtins, as LANGUAGE.md defines them


def causal() -> Builtin:
    return Builtin(BuiltinName.CAUSAL, (), cmp("<=", kv, qprime()))


def window(left: int, right: int) -> Builtin:
    body = and_(cmp(">=", kv, sub(qprime(), ci(left))), cmp("<=", kv, add(qprime(), ci(right))))
    return Builtin(BuiltinName.WINDOW, (ci(left), ci(right)), body)


def padding() -> Builtin:
    body = and_(cmp("<", q, load(PADDING_Q_LENS, b)), cmp("<", kv, load(PADDING_KV_LENS, b)))
    return Builtin(BuiltinName.PADDING, (), body)


def document(ids: str, kv_ids: str | None = None) -> Builtin:
    other = kv_ids or ids
    body = cmp("==", load(ids, b, q), load(other, b, kv))
    args = (TensorRef(ids),) + ((TensorRef(kv_ids),) if kv_ids else ())
    return Builtin(BuiltinName.DOCUMENT, args, body)


def prefix(n: Expr) -> Builtin:
    return Builtin(BuiltinName.PREFIX, (n,), cmp("<", kv, n))


def block_sparse(t: str, rank: int, bq: int | None = None, bk: int | None = None) -> Builtin:
    qb, kb = bq or 128, bk or 128
    lead = {2: (), 3: (h,), 4: (b, h)}[rank]
    body = cmp("!=", load(t, *lead, div(q, ci(qb)), div(kv, ci(kb))), ci(0))
    args = (TensorRef(t),) + ((ci(bq), ci(bk)) if bq else ())
    return Builtin(BuiltinName.BLOCK_SPARSE, args, body)


def softcap(c: float) -> Builtin:
    return Builtin(BuiltinName.SOFTCAP, (cf(c),), mul(cf(c), call("tanh", div(s, cf(c)))))


def slope_table(heads: int) -> Expr:
    """slope[h] for the standard slopes, as the compile-time constant chain a lowering would emit."""
    sl = standard_alibi_slopes(heads)
    e: Expr = cf(sl[-1])
    for i in range(heads - 2, -1, -1):
        e = call("where", cmp("==", h, ci(i)), cf(sl[i]), e)
    return e


def alibi(heads: int | None = None, slopes: str | None = None) -> Builtin:
    slope = load(slopes, h, t=F) if slopes else slope_table(heads)
    body = sub(s, mul(slope, call("abs", sub(qprime(), kv))))
    return Builtin(BuiltinName.ALIBI, (TensorRef(slopes),) if slopes else (), body)


def bias(t: str, rank: int) -> Builtin:
    idx = {2: (q, kv), 3: (h, q, kv), 4: (b, h, q, kv)}[rank]
    return Builtin(BuiltinName.BIAS, (TensorRef(t),), add(s, load(t, *idx, t=F)))


def rel_bias(t: str, m: int) -> Builtin:
    rel = add(call("min", call("max", sub(kv, qprime()), ci(-m)), ci(m)), ci(m))
    return Builtin(BuiltinName.REL_BIAS, (TensorRef(t), ci(m)), add(s, load(t, h, rel, t=F)))


def decl(name: str, dtype: DType, *shape, sorted: bool = False) -> TensorDecl:
    return TensorDecl(name, dtype, tuple(shape), sorted)


def variant(
    mask: Expr = TRUE,
    scores: tuple[Expr, ...] = (),
    *,
    dtype: DType = DType.FP32,
    D: int = 8,
    Dv: int | None = None,
    heads: int = 2,
    kv_heads: int | None = None,
    kind: AttnKind = AttnKind.SELF,
    layout: Layout = Layout.BHSD,
    scale: float | None = None,
    norms: tuple[Norm, ...] = (),
    residual: bool = False,
    inputs: tuple[TensorDecl, ...] = (),
    name: str = "t",
) -> Variant:
    return Variant(
        name=name,
        dtype=dtype,
        head_dim=D,
        value_head_dim=Dv if Dv is not None else D,
        heads=heads,
        kv_heads=kv_heads if kv_heads is not None else heads,
        kind=kind,
        layout=layout,
        scale=scale,
        mask=mask,
        scores=tuple(scores),
        norms=tuple(norms),
        residual=residual,
        nan_check=False,
        lse=True,
        inputs=tuple(inputs),
        tile=None,
    )
