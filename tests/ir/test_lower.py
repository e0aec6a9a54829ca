"""Lowering: desugaring of every builtin (body structure), typing, defaults, runtime inputs, spans."""

from __future__ import annotations

import math

import pytest

from attngen.lang.diagnostics import SpecError
from attngen.lang import frontend
from attngen.plan.validate import loads  # the front end, then the plan stage's checks (`attngen check`)
from attngen.ir.nodes import (
    TRUE,
    AttnKind,
    Binary,
    BinOp,
    Builtin,
    BuiltinName,
    Call,
    Const,
    DType,
    Func,
    Index,
    IndexVar,
    Layout,
    Load,
    NormKind,
    NormScope,
    NormTarget,
    ScalarType,
    Score,
    Size,
    SizeSym,
    TensorDecl,
    TensorRef,
    TileConfig,
    TileHint,
    Unary,
    UnOp,
    strip_sugar,
)
from attngen.lang.lower import alibi_standard_slope
from attngen.plan.schedule import auto_tile, variant_tile

HEAD = "dtype bf16; head_dim 128; heads 16 kv 8\n"

I = ScalarType.INT
F = ScalarType.FLOAT
BOOL = ScalarType.BOOL
b, h, q, kv = (Index(v) for v in (IndexVar.B, IndexVar.H, IndexVar.Q, IndexVar.KV))
QP = Binary(BinOp.ADD, q, Binary(BinOp.SUB, Size(SizeSym.LK), Size(SizeSym.LQ), I), I)  # q'


def c(v) -> Const:
    return Const(v, I if isinstance(v, int) and not isinstance(v, bool) else (BOOL if isinstance(v, bool) else F))


def variant(body: str, head: str = HEAD):
    return loads(f"attention v {{\n{head}{body}\n}}\n").get()


def mask_of(body: str, head: str = HEAD):
    return variant(body, head).mask


def score_of(body: str, head: str = HEAD):
    (s,) = variant(body, head).scores
    return s


# --------------------------------------------------------------------------------------------
# Defaults and statements


def test_defaults():
    v = variant("")
    assert (v.name, v.dtype, v.head_dim, v.value_head_dim, v.heads, v.kv_heads) == ("v", DType.BF16, 128, 128, 16, 8)
    assert v.kind == AttnKind.SELF and v.layout == Layout.BHSD and v.scale is None
    assert v.mask == TRUE and v.scores == () and v.norms == () and v.inputs == ()
    assert not v.residual and not v.nan_check and not v.lse and v.tile is None
    assert v.effective_scale == pytest.approx(1 / math.sqrt(128))


def test_every_statement():
    v = variant(
        "head_dim 64 value 64; kind cross; layout bshd; scale 0.25; residual; nan_check; output lse\n"
        "norm q layernorm(1e-5) scope token affine false; norm k rmsnorm(1e-6); norm o rmsnorm(2e-6) scope head",
        head="dtype fp16; heads 4\n",
    )
    assert (v.head_dim, v.value_head_dim, v.heads, v.kv_heads) == (64, 64, 4, 4)
    assert v.kind == AttnKind.CROSS and v.layout == Layout.BSHD and v.scale == 0.25
    assert v.residual and v.nan_check and v.lse
    qn, kn, on = v.norms
    assert (qn.target, qn.kind, qn.scope, qn.eps, qn.affine) == (NormTarget.Q, NormKind.LAYERNORM, NormScope.TOKEN, 1e-5, False)
    assert (kn.target, kn.kind, kn.scope, kn.affine) == (NormTarget.K, NormKind.RMSNORM, NormScope.HEAD, True)
    assert on.target == NormTarget.O and on.eps == 2e-6


def test_tile_partial_filled_from_auto():
    # The IR keeps the hint as written; the plan stage fills the rest from auto_tile for its arch.
    auto = auto_tile(DType.BF16, 128, 128)
    v = variant("tile warps 8 block_m 128")
    assert v.tile == TileHint(block_m=128, warps=8) and v.tile.span is not None
    assert variant_tile(v) == TileConfig(128, auto.block_n, 8, auto.stages)
    assert variant("tile auto").tile is None
    assert variant("tile block_m 64 block_n 32 warps 4 stages 1").tile == TileHint(64, 32, 4, 1)


def test_front_end_alone_is_semantic():
    # Without a target, lowering checks only what the spec means: a head dim or a tile no backend
    # implements lowers; the plan stage refuses it at the spec with a caret.
    text = "attention v {\n  dtype bf16\n  head_dim 128\n  heads 16\n  tile block_m 100\n}\n"
    v = frontend.loads(text, "t.attn").get()
    assert v.tile == TileHint(block_m=100)
    assert frontend.loads(text.replace("128", "63")).get().head_dim == 63
    with pytest.raises(SpecError) as info:
        loads(text, "t.attn")
    assert str(info.value).startswith(
        "t.attn:5:3: error: bad tile: block_m must be a positive multiple of 16, got 100\n"
        "   5 |   tile block_m 100\n     |   ^^^^^^^^^^^^^^^^")
    with pytest.raises(SpecError, match="head_dim 63 is not supported"):
        loads(text.replace("128", "63"))


def test_inputs_in_source_order_with_dims():
    v = variant("input z: fp16[B, H, n, 7] sorted\ninput a: u8[Lq]")
    assert v.inputs == (
        TensorDecl("z", DType.FP16, (SizeSym.B, SizeSym.H, "n", 7), True),
        TensorDecl("a", DType.U8, (SizeSym.LQ,), False),
    )


def test_statements_in_any_order_and_inputs_after_use():
    v = loads("attention v { mask ids[b, q] > 0; heads 2; input ids: i32[B, Lq]; head_dim 64; dtype fp32 }").get()
    assert v.mask.type == BOOL and v.inputs[0].name == "ids"


# --------------------------------------------------------------------------------------------
# Expressions as written: types, no folding


def test_literals_and_types_no_folding():
    m = mask_of("mask 1 + 2 * 3 < 4.5")
    assert m == Binary(
        BinOp.LT, Binary(BinOp.ADD, c(1), Binary(BinOp.MUL, c(2), c(3), I), I), c(4.5), BOOL
    )
    assert score_of("score -s").type == F
    assert score_of("score -1") == Unary(UnOp.NEG, c(1), I)
    assert score_of("score 1 + 2.0").type == F  # mixing int and float gives float
    assert score_of("score abs(q - kv)").type == I
    assert score_of("score min(q, 2.0)").type == F
    assert score_of("score where(q < kv, 1, 2)") == Call(
        Func.WHERE, (Binary(BinOp.LT, q, kv, BOOL), c(1), c(2)), I
    )
    assert score_of("score sqrt(4)").type == F
    assert mask_of("mask true") == TRUE
    assert mask_of("mask !(q < kv) == false").type == BOOL


def test_lookup_types_follow_dtype():
    v = variant("input a: i32[B, Lk]\ninput f: bf16[Lq, Lk]\nmask a[b, kv] > 0\nscore s + f[q, kv]")
    assert v.mask.lhs == Load("a", (b, kv), I)
    assert v.scores[0].rhs == Load("f", (q, kv), F)


def test_precedence_and_associativity():
    assert mask_of("mask q - kv - 1 > 0").lhs == Binary(BinOp.SUB, Binary(BinOp.SUB, q, kv, I), c(1), I)
    m = mask_of("mask q < 1 || kv < 2 && b < 3")
    assert m.op == BinOp.OR and m.rhs.op == BinOp.AND
    assert mask_of("mask -q % 3 == 0").lhs == Binary(BinOp.MOD, Unary(UnOp.NEG, q, I), c(3), I)


# --------------------------------------------------------------------------------------------
# Builtins: name, args as written, body as LANGUAGE.md says


def test_causal():
    m = mask_of("mask causal")
    assert m == Builtin(BuiltinName.CAUSAL, (), Binary(BinOp.LE, kv, QP, BOOL))
    assert m.type == BOOL


def test_window():
    m = mask_of("mask window(256, 3)")
    body = Binary(
        BinOp.AND,
        Binary(BinOp.GE, kv, Binary(BinOp.SUB, QP, c(256), I), BOOL),
        Binary(BinOp.LE, kv, Binary(BinOp.ADD, QP, c(3), I), BOOL),
        BOOL,
    )
    assert m == Builtin(BuiltinName.WINDOW, (c(256), c(3)), body)


def test_padding_and_its_implied_inputs():
    v = variant("mask padding")
    body = Binary(
        BinOp.AND,
        Binary(BinOp.LT, q, Load("q_lens", (b,), I), BOOL),
        Binary(BinOp.LT, kv, Load("kv_lens", (b,), I), BOOL),
        BOOL,
    )
    assert v.mask == Builtin(BuiltinName.PADDING, (), body)
    assert [(t.name, t.dtype, t.shape) for t in v.runtime_inputs()] == [
        ("kv_lens", DType.I32, (SizeSym.B,)),
        ("q_lens", DType.I32, (SizeSym.B,)),
    ]


def test_document_one_and_two_tensors():
    v = variant("input ids: i32[B, Lk]\nmask document(ids)")
    assert v.mask == Builtin(
        BuiltinName.DOCUMENT, (TensorRef("ids"),), Binary(BinOp.EQ, Load("ids", (b, q), I), Load("ids", (b, kv), I), BOOL)
    )
    v = variant("kind cross\ninput qi: u8[B, Lq]\ninput ki: i32[B, Lk]\nmask document(qi, ki)")
    assert v.mask.body == Binary(BinOp.EQ, Load("qi", (b, q), I), Load("ki", (b, kv), I), BOOL)
    assert v.mask.args == (TensorRef("qi"), TensorRef("ki"))


def test_prefix():
    v = variant("input plen: i32[B]\nmask causal || prefix(plen[b])")
    pre = v.mask.rhs
    assert pre == Builtin(BuiltinName.PREFIX, (Load("plen", (b,), I),), Binary(BinOp.LT, kv, Load("plen", (b,), I), BOOL))


@pytest.mark.parametrize("rank, lead", [(2, ()), (3, (h,)), (4, (b, h))])
def test_block_sparse_by_rank(rank, lead):
    dims = ", ".join(["B", "H", "nq", "nk"][4 - rank :])
    m = mask_of(f"input t: u8[{dims}]\nmask block_sparse(t)")
    idx = (*lead, Binary(BinOp.DIV, q, c(128), I), Binary(BinOp.DIV, kv, c(128), I))
    assert m == Builtin(BuiltinName.BLOCK_SPARSE, (TensorRef("t"),), Binary(BinOp.NE, Load("t", idx, I), c(0), BOOL))
    m = mask_of(f"input t: u8[{dims}]\nmask block_sparse(t, 64, 32)")
    assert m.args == (TensorRef("t"), c(64), c(32))
    assert m.body.lhs.indices[-2:] == (Binary(BinOp.DIV, q, c(64), I), Binary(BinOp.DIV, kv, c(32), I))


def test_softcap():
    s = score_of("score softcap(30.0)")
    body = Binary(BinOp.MUL, c(30.0), Call(Func.TANH, (Binary(BinOp.DIV, Score(), c(30.0), F),), F), F)
    assert s == Builtin(BuiltinName.SOFTCAP, (c(30.0),), body)
    assert score_of("score softcap(30)").args == (c(30),)


def test_alibi_with_tensor():
    s = score_of("input sl: fp32[H]\nscore alibi(sl)")
    dist = Call(Func.ABS, (Binary(BinOp.SUB, QP, kv, I),), I)
    body = Binary(BinOp.SUB, Score(), Binary(BinOp.MUL, Load("sl", (h,), F), dist, F), F)
    assert s == Builtin(BuiltinName.ALIBI, (TensorRef("sl"),), body)


def test_alibi_standard_uses_slopes_of_h():
    s = score_of("score alibi")
    assert s.name == BuiltinName.ALIBI and s.args == ()
    assert s.body.rhs.lhs == alibi_standard_slope(16)
    assert not any(isinstance(n, Load) for n in _walk(s.body))  # standard slopes are no input
    assert all(t.name != "alibi_slopes" for t in variant("score alibi").runtime_inputs())


def _bloom_slopes(n: int) -> list[float]:
    # BLOOM / the ALiBi paper's reference code.
    def pow2(n):
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if math.log2(n).is_integer():
        return pow2(n)
    cl = 2 ** math.floor(math.log2(n))
    return pow2(cl) + _bloom_slopes(2 * cl)[0::2][: n - cl]


def _eval(e, env):
    """A tiny evaluator for index expressions (ints and floats only)."""
    if isinstance(e, Const):
        return e.value
    if isinstance(e, Index):
        return env[e.var]
    if isinstance(e, Unary):
        return -_eval(e.operand, env)
    if isinstance(e, Binary):
        a, b_ = _eval(e.lhs, env), _eval(e.rhs, env)
        return {BinOp.ADD: a + b_, BinOp.SUB: a - b_, BinOp.MUL: a * b_, BinOp.LT: a < b_}[e.op]
    if isinstance(e, Call):
        if e.func == Func.EXP:
            return math.exp(_eval(e.args[0], env))
        if e.func == Func.WHERE:
            return _eval(e.args[1], env) if _eval(e.args[0], env) else _eval(e.args[2], env)
    raise AssertionError(e)


@pytest.mark.parametrize("n", [1, 2, 3, 5, 6, 8, 12, 16, 20, 24, 32, 40, 64, 96, 112])
def test_alibi_standard_slopes_match_bloom(n):
    e = alibi_standard_slope(n)
    for head, want in enumerate(_bloom_slopes(n)):
        assert _eval(e, {IndexVar.H: head}) == pytest.approx(want, rel=1e-12)
    # only IR functions, no tensors
    assert all(not isinstance(x, (Load, TensorRef)) for x in _walk(e))


@pytest.mark.parametrize("rank, lead", [(2, ()), (3, (h,)), (4, (b, h))])
def test_bias_by_rank(rank, lead):
    dims = ", ".join(["B", "H", "Lq", "Lk"][4 - rank :])
    s = score_of(f"input t: fp16[{dims}]\nscore bias(t)")
    assert s == Builtin(BuiltinName.BIAS, (TensorRef("t"),), Binary(BinOp.ADD, Score(), Load("t", (*lead, q, kv), F), F))


def test_rel_bias():
    s = score_of("input rb: fp32[H, 9]\nscore rel_bias(rb, 4)")
    clipped = Call(Func.MIN, (Call(Func.MAX, (Binary(BinOp.SUB, kv, QP, I), Unary(UnOp.NEG, c(4), I)), I), c(4)), I)
    body = Binary(BinOp.ADD, Score(), Load("rb", (h, Binary(BinOp.ADD, clipped, c(4), I)), F), F)
    assert s == Builtin(BuiltinName.REL_BIAS, (TensorRef("rb"), c(4)), body)


def test_builtins_compose_and_strip():
    v = variant("mask causal && window(8, 0)\nscore softcap(5.0)\nscore s * 2.0")
    assert v.mask.op == BinOp.AND and isinstance(v.mask.lhs, Builtin) and isinstance(v.mask.rhs, Builtin)
    assert not any(isinstance(n, Builtin) for n in _walk(strip_sugar(v.mask)))
    assert len(v.scores) == 2 and v.scores[1] == Binary(BinOp.MUL, Score(), c(2.0), F)


def _walk(e):
    from attngen.ir.nodes import walk

    return list(walk(e))


# --------------------------------------------------------------------------------------------
# runtime_inputs


def test_runtime_inputs_declared_then_implied_sorted():
    v = variant(
        "layout bshd\ninput ids: i32[B, Lk]\ninput bm: u8[H, nq, nk]\nmask padding && document(ids)\n"
        "norm q layernorm(1e-5) scope token\nnorm k rmsnorm(1e-5)\nnorm o layernorm(1e-5) affine false"
    )
    names = [t.name for t in v.runtime_inputs()]
    assert names == ["ids", "bm", "k_norm_weight", "kv_lens", "q_lens", "q_norm_bias", "q_norm_weight"]
    widths = {t.name: t.shape for t in v.runtime_inputs()}
    assert widths["q_norm_weight"] == (16 * 128,)  # token scope: the whole hidden row
    assert widths["k_norm_weight"] == (SizeSym.D,)


def test_runtime_inputs_empty_without_extras():
    assert variant("mask causal\nscore softcap(2.0)").runtime_inputs() == ()


# --------------------------------------------------------------------------------------------
# Spans: carried, but not part of equality


def test_spans_excluded_from_equality():
    a = loads("attention v { dtype bf16; head_dim 128; heads 16 kv 8; mask causal && q < 5 }")
    bb = loads(
        "# a comment\n\nattention   v\n{\n  dtype   bf16\n  head_dim 128\n  heads 16   kv 8\n"
        "  mask (causal)\n    && (q < 5)  # same\n}\n",
        path="other.attn",
    )
    assert a == bb and hash(a.get()) == hash(bb.get())
    assert a.get().mask.span != bb.get().mask.span


def test_spans_point_at_source():
    v = loads("attention v {\n  dtype bf16; head_dim 128; heads 16\n  mask causal && q < 5\n}", path="p.attn").get()
    assert v.mask.span.path == "p.attn" and (v.mask.span.line, v.mask.span.col) == (3, 8)
    assert (v.mask.rhs.span.line, v.mask.rhs.span.col) == (3, 18)
    assert v.span.line == 1


def test_variants_in_source_order_and_get():
    p = loads("attention b { dtype bf16; head_dim 64; heads 1 }\nattention a { dtype fp16; head_dim 32; heads 2 }")
    assert [v.name for v in p.variants] == ["b", "a"]
    assert p.get("a").dtype == DType.FP16


# --------------------------------------------------------------------------------------------
# Semantic checks that are not covered by the golden files


@pytest.mark.parametrize(
    "body, fragment",
    [
        ("input t: fp32[H, 7]\nscore rel_bias(t, 4)", "width 9"),
        ("input t: i32[H, 9]\nscore rel_bias(t, 4)", "float tensor"),
        ("input t: i32[H]\nscore alibi(t)", "float tensor"),
        ("input t: u8[B]\nmask block_sparse(t)", "rank 2 or 3 or 4"),
        ("input t: u8[B, H, X, Y, Z]\nmask block_sparse(t)", "rank 2 or 3 or 4"),
        ("input t: u8[B, L]\nmask block_sparse(t, 64)", "takes 1 or 3 arguments"),
        ("input t: i32[B, Lk, 2]\nmask document(t)", "rank 2"),
        ("kind cross\ninput t: i32[B, Lk]\nmask document(t)", "needs `kind self`"),
        ("mask window(-1, 0)", "non-negative integer literal"),
        ("mask window(1.5, 0)", "non-negative integer literal"),
        ("mask window(q, 0)", "non-negative integer literal"),
        ("input x: fp32[B]\nmask prefix(x[b])", "int expression"),
        ("score softcap(q)", "positive number literal"),
        ("mask softcap(2.0) > 0", "cannot be used in a mask"),
        ("mask alibi > 0", "cannot be used in a mask"),
        ("score s[0]", "not a tensor"),
        ("input t: fp32[B]\nmask t > 0", "must be indexed"),
        ("input t: fp32[B]\nmask t(b) > 0", "is a tensor, not a function"),
        ("mask tanh > 0", "is a function"),
        ("mask causal(1)", "takes 0 arguments"),
        ("mask q == true", "compares a int with a bool"),
        ("score where(q, s, s)", "condition of `where`"),
        ("score exp(q < kv)", "needs a number"),
        ("score !s", "needs a bool"),
        ("mask -(q < kv)", "needs a number"),
        ("input t: fp32[B]\ninput t: fp32[B]", "declared twice"),
        ("input k: fp32[B]", "reserved name"),
        ("input kv_lens: i32[B]", "reserved name"),
        ("input q_norm_weight: fp32[D]", "reserved name"),
        ("input t: fp32[B, q]", "cannot name a dimension"),
        ("input t: fp32[B, 0]", "at least 1"),
        ("input t: fp32[B, 2.5]", "must be an integer"),
        ("input t: f64[B]", "unknown input dtype"),
        ("norm x rmsnorm(1e-5)", "unknown norm target"),
        ("norm q batchnorm(1e-5)", "unknown norm `batchnorm`"),
        ("norm q rmsnorm(1e-5)\nnorm q layernorm(1e-5)", "`norm q` given twice"),
        ("norm o rmsnorm(1e-5) scope token", "only for `q`"),
        ("norm q rmsnorm(1e-5) scope head scope head", "`scope` given twice"),
        ("norm q rmsnorm(1e-5) scope row", "unknown scope"),
        ("scale 0", "must be positive"),
        ("scale -0.5", "must be positive"),
        ("scale 1e999", "not finite"),
        ("output lse\noutput lse", "given twice"),
        ("tile warps 3", "warps must be one of"),
        ("tile block_m 64 block_m 64", "`block_m` given twice"),
        ("mask causal; mask causal", "given twice"),
        ("kind selff", "did you mean `self`?"),
    ],
)
def test_semantic_errors(body, fragment):
    with pytest.raises(SpecError) as info:
        variant(body)
    assert fragment in info.value.render()


def test_heads_value_checks():
    for head, fragment in [
        ("dtype bf16; head_dim 128; heads 0\n", "at least 1"),
        ("dtype bf16; head_dim 128; heads 16 kv 0\n", "at least 1"),
        ("dtype bf16; head_dim 128 value 48; heads 16\n", "value head_dim 48"),
        ("dtype i32; head_dim 128; heads 16\n", "unknown attention dtype"),
        ("dtype bf16; head_dim 64\n", "has no `heads`"),
    ]:
        with pytest.raises(SpecError) as info:
            variant("", head=head)
        assert fragment in info.value.render()


def test_identifier_rules():
    long = "a" * 65
    with pytest.raises(SpecError, match="at most 64"):
        loads(f"attention {long} {{ {HEAD} }}")
    assert loads(f"attention {'a' * 64} {{ {HEAD} }}").get().name == "a" * 64
    with pytest.raises(SpecError, match="reserved prefix"):
        loads(f"attention __v {{ {HEAD} }}")


def test_all_errors_of_all_variants_collected():
    with pytest.raises(SpecError) as info:
        loads("attention a { dtype bf17 head_dim 64 heads 1 }\nattention b { dtype bf16 head_dim 63 heads 1 }")
    assert [d.span.line for d in info.value.diagnostics] == [1, 2]


def test_arch_changes_tile_budget():
    from attngen.plan.schedule import Arch

    text = "attention v { dtype bf16; head_dim 128; heads 16; tile block_m 128 block_n 128 stages 2 warps 8 }"
    loads(text, arch=Arch.SM90A)
    with pytest.raises(SpecError, match="shared memory"):
        loads(text, arch=Arch.SM86)
