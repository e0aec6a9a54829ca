"""Round trip over GENERATED IR: for random well-typed variants, loads(print_program(p)) == p.

The strategies below build IR directly (not text), exactly as `lower` would type it: consts are
non-negative (a minus sign is a `Unary`), builtins come from `lower.make_builtin`, and every
lookup matches its tensor's rank.
"""

from __future__ import annotations

from hypothesis import assume, given
from hypothesis import strategies as st

from attngen.lang.diagnostics import SpecError
from attngen.lang.frontend import format_source, loads, print_expr, print_program
from attngen.ir.dtypes import INPUT_DTYPES
from attngen.ir.nodes import (
    FP32_MAX,
    ATTENTION_DTYPES,
    TRUE,
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
    TensorDecl,
    TensorRef,
    TileHint,
    Unary,
    UnOp,
    Variant,
)
from attngen.lang.lower import MAX_LOOKUP_NESTING, make_builtin
from attngen.plan.schedule import SUPPORTED_HEAD_DIMS

I, F, BOOL = ScalarType.INT, ScalarType.FLOAT, ScalarType.BOOL
NUM = (I, F)

ints = st.integers(0, 2**31 - 1).map(lambda v: Const(v, I))
small_ints = st.integers(0, 300)
# Float literals must fit fp32 (kernels hold them as fp32 constants); below its range they read as 0.
floats = st.floats(min_value=0.0, max_value=FP32_MAX, allow_nan=False, allow_infinity=False).map(lambda f: Const(abs(f), F))
pos_floats = st.floats(min_value=1e-30, max_value=1e30, allow_nan=False, allow_infinity=False)
names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,12}", fullmatch=True).filter(
    lambda n: not n.startswith(("__", "ag_"))
)


def _arith_type(a: Expr, b: Expr) -> ScalarType:
    return F if F in (a.type, b.type) else I


class Ctx:
    def __init__(self, tensors: dict[str, TensorDecl], heads: int, kind: AttnKind, in_score: bool, loads: int = 0):
        self.tensors, self.heads, self.kind, self.in_score = tensors, heads, kind, in_score
        self.loads = loads  # lookups this expression sits inside (lower.MAX_LOOKUP_NESTING bounds them)

    def inside_load(self) -> "Ctx":
        return Ctx(self.tensors, self.heads, self.kind, self.in_score, self.loads + 1)

    def of(self, pred) -> list[TensorDecl]:
        return [t for t in self.tensors.values() if pred(t)]


@st.composite
def expr(draw, want: ScalarType, ctx: Ctx, depth: int) -> Expr:
    """A random expression of type `want` (for NUM: int or float)."""
    if want == BOOL:
        return draw(bool_expr(ctx, depth))
    t = draw(st.sampled_from([I, F])) if want is None else want
    return draw(int_expr(ctx, depth) if t == I else float_expr(ctx, depth))


def _load(draw, ctx: Ctx, depth: int, is_float: bool) -> Expr | None:
    cands = ctx.of(lambda t: t.dtype.is_float == is_float)
    if not cands or ctx.loads >= MAX_LOOKUP_NESTING:
        return None
    t = draw(st.sampled_from(cands))
    inner = ctx.inside_load()
    idx = tuple(draw(int_expr(inner, max(0, depth - 1))) for _ in t.shape)
    return Load(t.name, idx, F if is_float else I)


@st.composite
def int_expr(draw, ctx: Ctx, depth: int) -> Expr:
    leaf = st.one_of(
        ints,
        st.sampled_from(list(IndexVar)).map(Index),
        st.sampled_from(list(SizeSym)).map(Size),
    )
    if depth <= 0 or draw(st.integers(0, 3)) == 0:
        if draw(st.integers(0, 4)) == 0:
            ld = _load(draw, ctx, depth, is_float=False)
            if ld is not None:
                return ld
        return draw(leaf)
    k = draw(st.integers(0, 4))
    sub = lambda: draw(int_expr(ctx, depth - 1))  # noqa: E731
    if k == 0:
        return Unary(UnOp.NEG, sub(), I)
    if k == 1:
        op = draw(st.sampled_from([BinOp.ADD, BinOp.SUB, BinOp.MUL, BinOp.DIV, BinOp.MOD]))
        return Binary(op, sub(), sub(), I)
    if k == 2:
        f = draw(st.sampled_from([Func.ABS, Func.MIN, Func.MAX]))
        return Call(f, tuple(sub() for _ in range(1 if f == Func.ABS else 2)), I)
    if k == 3:
        return Call(Func.WHERE, (draw(bool_expr(ctx, depth - 1)), sub(), sub()), I)
    ld = _load(draw, ctx, depth, is_float=False)
    return ld if ld is not None else sub()


@st.composite
def float_expr(draw, ctx: Ctx, depth: int) -> Expr:
    leaves = [floats]
    if ctx.in_score:
        leaves.append(st.just(Score()))
    if depth <= 0 or draw(st.integers(0, 3)) == 0:
        if draw(st.integers(0, 4)) == 0:
            ld = _load(draw, ctx, depth, is_float=True)
            if ld is not None:
                return ld
        return draw(st.one_of(*leaves))
    k = draw(st.integers(0, 6))
    fsub = lambda: draw(float_expr(ctx, depth - 1))  # noqa: E731
    nsub = lambda: draw(expr(None, ctx, depth - 1))  # noqa: E731
    if k == 0:
        return Unary(UnOp.NEG, fsub(), F)
    if k == 1:
        op = draw(st.sampled_from([BinOp.ADD, BinOp.SUB, BinOp.MUL, BinOp.DIV, BinOp.MOD]))
        a, b = (fsub(), nsub()) if draw(st.booleans()) else (nsub(), fsub())
        return Binary(op, a, b, F)
    if k == 2:
        f = draw(st.sampled_from([Func.TANH, Func.EXP, Func.LOG, Func.SQRT]))
        return Call(f, (nsub(),), F)
    if k == 3:
        f = draw(st.sampled_from([Func.ABS, Func.MIN, Func.MAX]))
        args = (fsub(),) if f == Func.ABS else ((fsub(), nsub()) if draw(st.booleans()) else (nsub(), fsub()))
        return Call(f, args, F)
    if k == 4:
        a, b = (fsub(), nsub()) if draw(st.booleans()) else (nsub(), fsub())
        return Call(Func.WHERE, (draw(bool_expr(ctx, depth - 1)), a, b), F)
    if k == 5 and ctx.in_score:
        return draw(score_builtin(ctx, depth))
    ld = _load(draw, ctx, depth, is_float=True)
    return ld if ld is not None else fsub()


@st.composite
def bool_expr(draw, ctx: Ctx, depth: int) -> Expr:
    if depth <= 0 or draw(st.integers(0, 3)) == 0:
        if draw(st.booleans()):
            return draw(mask_builtin(ctx, depth))
        return Const(draw(st.booleans()), BOOL)
    k = draw(st.integers(0, 4))
    bsub = lambda: draw(bool_expr(ctx, depth - 1))  # noqa: E731
    if k == 0:
        return Unary(UnOp.NOT, bsub(), BOOL)
    if k == 1:
        return Binary(draw(st.sampled_from([BinOp.AND, BinOp.OR, BinOp.EQ, BinOp.NE])), bsub(), bsub(), BOOL)
    if k == 2:
        op = draw(st.sampled_from([BinOp.LT, BinOp.LE, BinOp.GT, BinOp.GE, BinOp.EQ, BinOp.NE]))
        return Binary(op, draw(expr(None, ctx, depth - 1)), draw(expr(None, ctx, depth - 1)), BOOL)
    if k == 3:
        return Call(Func.WHERE, (bsub(), bsub(), bsub()), BOOL)
    return draw(mask_builtin(ctx, depth))


@st.composite
def mask_builtin(draw, ctx: Ctx, depth: int) -> Expr:
    options = [BuiltinName.CAUSAL, BuiltinName.WINDOW, BuiltinName.PADDING, BuiltinName.PREFIX]
    int2 = ctx.of(lambda t: not t.dtype.is_float and len(t.shape) == 2)
    if int2:
        options.append(BuiltinName.DOCUMENT)
    bs = ctx.of(lambda t: 2 <= len(t.shape) <= 4)
    if bs:
        options.append(BuiltinName.BLOCK_SPARSE)
    name = draw(st.sampled_from(options))
    args: tuple[Expr, ...] = ()
    if name == BuiltinName.WINDOW:
        args = (Const(draw(small_ints), I), Const(draw(small_ints), I))
    elif name == BuiltinName.PREFIX:
        args = (draw(int_expr(ctx, max(0, depth - 1))),)
    elif name == BuiltinName.DOCUMENT:
        if ctx.kind == AttnKind.SELF and draw(st.booleans()):
            args = (TensorRef(draw(st.sampled_from(int2)).name),)
        else:
            args = (TensorRef(draw(st.sampled_from(int2)).name), TensorRef(draw(st.sampled_from(int2)).name))
    elif name == BuiltinName.BLOCK_SPARSE:
        t = TensorRef(draw(st.sampled_from(bs)).name)
        if draw(st.booleans()):
            args = (t,)
        else:
            args = (t, Const(draw(st.integers(1, 512)), I), Const(draw(st.integers(1, 512)), I))
    return make_builtin(name, args, ctx.tensors, ctx.heads)


@st.composite
def score_builtin(draw, ctx: Ctx, depth: int) -> Expr:
    options = [BuiltinName.SOFTCAP, BuiltinName.ALIBI]
    if ctx.of(lambda t: 2 <= len(t.shape) <= 4):
        options.append(BuiltinName.BIAS)
    rel = ctx.of(lambda t: t.dtype.is_float and len(t.shape) == 2)
    if rel:
        options.append(BuiltinName.REL_BIAS)
    name = draw(st.sampled_from(options))
    args: tuple[Expr, ...] = ()
    if name == BuiltinName.SOFTCAP:
        c = draw(st.one_of(st.integers(1, 1000).map(lambda v: Const(v, I)), pos_floats.map(lambda f: Const(f, F))))
        args = (c,)
    elif name == BuiltinName.ALIBI:
        slopes = ctx.of(lambda t: t.dtype.is_float and len(t.shape) == 1)
        if slopes and draw(st.booleans()):
            args = (TensorRef(draw(st.sampled_from(slopes)).name),)
    elif name == BuiltinName.BIAS:
        args = (TensorRef(draw(st.sampled_from(ctx.of(lambda t: 2 <= len(t.shape) <= 4))).name),)
    else:
        t = draw(st.sampled_from(rel))
        width = t.shape[1]
        m = (width - 1) // 2 if isinstance(width, int) else draw(small_ints)
        if isinstance(width, int) and width % 2 == 0:
            return Score()  # no m gives an even width; fall back to a plain score
        args = (TensorRef(t.name), Const(m, I))
    return make_builtin(name, args, ctx.tensors, ctx.heads)


RESERVED = {
    "b", "h", "q", "kv", "s", "k", "v", "o", "lse", "true", "false",
    *(x.value for x in SizeSym), *(f.value for f in Func), *(n.value for n in BuiltinName),
    "q_lens", "kv_lens", "alibi_slopes",
    *(f"{t}_norm_{w}" for t in "qko" for w in ("weight", "bias")),
}
tensor_names = names.filter(lambda n: n not in RESERVED)
dims = st.one_of(st.integers(1, 4096), st.sampled_from(list(SizeSym)), tensor_names.filter(lambda n: n not in RESERVED))


@st.composite
def tensor_decls(draw) -> tuple[TensorDecl, ...]:
    ns = draw(st.lists(tensor_names, max_size=5, unique=True))
    return tuple(
        TensorDecl(n, draw(st.sampled_from(INPUT_DTYPES)), tuple(draw(st.lists(dims, min_size=1, max_size=4))), draw(st.booleans()))
        for n in ns
    )


@st.composite
def variants(draw, name: str | None = None) -> Variant:
    dtype = draw(st.sampled_from(ATTENTION_DTYPES))
    d = draw(st.sampled_from(SUPPORTED_HEAD_DIMS))
    residual = draw(st.booleans())
    dv = d if residual else draw(st.sampled_from(SUPPORTED_HEAD_DIMS))
    kvh = draw(st.integers(1, 8))
    heads = kvh * draw(st.integers(1, 4))
    kind = draw(st.sampled_from(list(AttnKind)))
    layout = draw(st.sampled_from(list(Layout)))
    scale = draw(st.one_of(st.none(), pos_floats))
    inputs = draw(tensor_decls())
    if layout == Layout.VARLEN and any(x in (SizeSym.LQ, SizeSym.LK) or t.name.startswith("cu_seqlens") for t in inputs for x in t.shape):
        layout = Layout.BSHD  # varlen refuses inputs sized by Lq or Lk (lengths vary by sequence)
    tensors = {t.name: t for t in inputs}
    depth = draw(st.integers(0, 4))
    mask = draw(st.one_of(st.just(TRUE), bool_expr(Ctx(tensors, heads, kind, False), depth)))
    scores = tuple(draw(st.lists(expr(None, Ctx(tensors, heads, kind, True), depth), max_size=3)))
    norms = []
    for target in NormTarget:
        if layout != Layout.VARLEN and draw(st.booleans()):  # varlen has no fused norms
            scope = NormScope.TOKEN if target == NormTarget.Q and layout == Layout.BSHD and draw(st.booleans()) else NormScope.HEAD
            norms.append(Norm(target, draw(st.sampled_from(list(NormKind))), scope, draw(pos_floats), draw(st.booleans())))
    norms = draw(st.permutations(norms))
    tile = None
    if draw(st.booleans()):
        # A hint as written (the front end checks no backend limit): any given subset of fields.
        tile = TileHint(
            draw(st.one_of(st.none(), st.sampled_from([16, 32, 64, 128]))),
            draw(st.one_of(st.none(), st.sampled_from([16, 32, 64, 128]))),
            draw(st.one_of(st.none(), st.sampled_from([1, 2, 4, 8]))), draw(st.one_of(st.none(), st.integers(1, 4))),
        )
        if not tile.given():
            tile = None
    return Variant(
        name=name or draw(names),
        dtype=dtype,
        head_dim=d,
        value_head_dim=dv,
        heads=heads,
        kv_heads=kvh,
        kind=kind,
        layout=layout,
        scale=scale,
        mask=mask,
        scores=scores,
        norms=tuple(norms),
        residual=residual,
        nan_check=draw(st.booleans()),
        lse=draw(st.booleans()),
        inputs=inputs,
        tile=tile,
    )


@st.composite
def programs(draw) -> Program:
    ns = draw(st.lists(names, min_size=1, max_size=3, unique=True))
    return Program(tuple(draw(variants(n)) for n in ns))


def _loads_in_budget(text: str):
    """`loads`, with drawn programs past the expression-size bound (lower.MAX_EXPR_NODES, a
    located refusal of its own: tests/hostile) set aside rather than failed."""
    try:
        return loads(text)
    except SpecError as e:
        assume(not all("operations here" in d.message for d in e.diagnostics))
        raise


@given(programs())
def test_print_then_load_is_identity(p: Program):
    text = print_program(p)
    assert _loads_in_budget(text) == p


@given(programs())
def test_printed_text_is_formatted(p: Program):
    # The printer's output is already canonical: the formatter leaves it alone.
    text = print_program(p)
    assert format_source(text) == text


@given(expr(None, Ctx({}, 8, AttnKind.SELF, True), 5))
def test_expression_round_trip(e: Expr):
    text = print_expr(e)
    v = _loads_in_budget(f"attention a {{ dtype bf16; head_dim 64; heads 8\n score {text}\n}}").get()
    assert v.scores == (e,)


@given(bool_expr(Ctx({}, 8, AttnKind.SELF, False), 5))
def test_mask_round_trip(e: Expr):
    v = _loads_in_budget(f"attention a {{ dtype bf16; head_dim 64; heads 8\n mask {print_expr(e)}\n}}").get()
    assert v.mask == e
