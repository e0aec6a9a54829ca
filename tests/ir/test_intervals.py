"""Tile classification: never wrong (property test against element-wise evaluation), and exact
for the builtins whose tiles are fully inside or outside."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

# The IR builders live with the reference tests (this directory holds only files of other owners).
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "reference"))
from _irb import (  # noqa: E402
    Lk,
    Lq,
    add,
    and_,
    b,
    block_sparse,
    call,
    causal,
    cf,
    ci,
    cmp,
    decl,
    div,
    document,
    h,
    kv,
    load,
    mod,
    mul,
    neg,
    not_,
    or_,
    padding,
    prefix,
    q,
    sub,
    variant,
    window,
)

from attngen.check import reference as ref  # noqa: E402
from attngen.ir.abi import Sizes, size_value  # noqa: E402
from attngen.analysis.intervals import Interval, Tri, TileContext, classify, density, eval_interval, make_context  # noqa: E402
from attngen.ir.nodes import AttnKind, DType, IndexVar, ScalarType, SizeSym  # noqa: E402

F, I = ScalarType.FLOAT, ScalarType.INT
B_, H_ = 2, 2
BQ, BK = 4, 4

DECLS = (
    decl("tab", DType.I32, 8),
    decl("ftab", DType.FP32, 8),
    decl("qids", DType.I32, SizeSym.B, SizeSym.LQ, sorted=True),
    decl("kids", DType.I32, SizeSym.B, SizeSym.LK, sorted=True),
    decl("blk", DType.U8, SizeSym.H, "nq", "nk"),
    decl("plen", DType.I32, SizeSym.B),
)


def make_data(rng: np.random.Generator, Lq: int, Lk: int) -> tuple[Sizes, dict]:
    nq, nk = -(-Lq // BQ), -(-Lk // BK)
    ins = {
        "tab": rng.integers(-5, 6, size=8).astype(np.int32),
        "ftab": rng.standard_normal(8).astype(np.float32),
        "qids": np.sort(rng.integers(0, 4, size=(B_, Lq)), axis=-1).astype(np.int32),
        "kids": np.sort(rng.integers(0, 4, size=(B_, Lk)), axis=-1).astype(np.int32),
        "blk": (rng.random((H_, nq, nk)) < 0.5).astype(np.uint8),
        "plen": rng.integers(0, Lk + 1, size=B_).astype(np.int32),
        "q_lens": rng.integers(0, Lq + 1, size=B_).astype(np.int32),
        "kv_lens": rng.integers(0, Lk + 1, size=B_).astype(np.int32),
    }
    return Sizes(B_, Lq, Lk, (("nk", nk), ("nq", nq))), ins


def brute(mask, v, sizes, ins, bb, hh, q0, q1, k0, k1) -> np.ndarray:
    env = ref.Env(
        {
            IndexVar.B: bb,
            IndexVar.H: hh,
            IndexVar.Q: np.arange(q0, q1 + 1)[:, None],
            IndexVar.KV: np.arange(k0, k1 + 1)[None, :],
        },
        {s: size_value(v, s, sizes) for s in SizeSym},
        ref.prepare_tensors(v, ins),
    )
    with np.errstate(all="ignore"):
        out = ref.evaluate(mask, env)
    return np.broadcast_to(np.asarray(out, dtype=bool), (q1 - q0 + 1, k1 - k0 + 1))


def the_variant(mask):
    return variant(mask, heads=H_, kind=AttnKind.CROSS, inputs=DECLS)


# ---- random expression trees


def int_leaf():
    return st.sampled_from([q, kv, b, h, Lq, Lk]) | st.integers(-6, 6).map(ci)


def int_expr(depth: int):
    if depth == 0:
        return int_leaf()
    sub_ = int_expr(depth - 1)
    return st.one_of(
        int_leaf(),
        st.tuples(st.sampled_from([add, sub, mul, div, mod]), sub_, sub_).map(lambda t: t[0](t[1], t[2])),
        st.tuples(st.sampled_from([div, mod]), sub_, st.integers(-5, 9)).map(lambda t: t[0](t[1], ci(t[2]))),
        st.tuples(st.sampled_from(["min", "max"]), sub_, sub_).map(lambda t: call(t[0], t[1], t[2])),
        sub_.map(lambda e: call("abs", e)),
        sub_.map(neg),
        sub_.map(lambda e: load("tab", e)),
        st.tuples(st.sampled_from(["qids", "kids"]), sub_, sub_).map(lambda t: load(t[0], t[1], t[2])),
        st.tuples(sub_, sub_).map(lambda t: load("blk", h, t[0], t[1])),
        st.tuples(bool_leaf(), sub_, sub_).map(lambda t: call("where", t[0], t[1], t[2])),
    )


def float_expr(depth: int):
    ie = int_expr(max(0, depth - 1))
    base = st.one_of(
        st.floats(-4, 4, allow_nan=False).map(cf),
        ie.map(lambda e: mul(e, cf(0.5))),
        ie.map(lambda e: load("ftab", e, t=F)),
    )
    if depth == 0:
        return base
    fe = float_expr(depth - 1)
    return st.one_of(
        base,
        st.tuples(st.sampled_from(["exp", "log", "sqrt", "tanh"]), fe).map(lambda t: call(t[0], t[1])),
        st.tuples(st.sampled_from([add, sub, mul, div]), fe, fe).map(lambda t: t[0](t[1], t[2])),
    )


def bool_leaf():
    return st.sampled_from(
        [
            causal(),
            window(2, 1),
            window(0, 0),
            padding(),
            document("qids", "kids"),
            prefix(load("plen", b)),
            block_sparse("blk", 3, BQ, BK),
            cmp("<", q, ci(5)),
        ]
    )


def bool_expr(depth: int):
    ops = st.sampled_from(["<", "<=", ">", ">=", "==", "!="])
    leaf = st.one_of(
        bool_leaf(),
        st.tuples(ops, int_expr(2), int_expr(2)).map(lambda t: cmp(*t)),
        st.tuples(ops, float_expr(2), float_expr(1)).map(lambda t: cmp(*t)),
    )
    if depth == 0:
        return leaf
    be = bool_expr(depth - 1)
    return st.one_of(
        leaf,
        st.tuples(be, be).map(lambda t: and_(*t)),
        st.tuples(be, be).map(lambda t: or_(*t)),
        be.map(not_),
        st.tuples(be, be, be).map(lambda t: call("where", *t)),
        st.tuples(st.sampled_from(["==", "!="]), be, be).map(lambda t: cmp(*t)),
    )


@st.composite
def case(draw):
    Lq = draw(st.integers(1, 24))
    Lk = draw(st.integers(1, 24))
    q0 = draw(st.integers(0, Lq - 1))
    q1 = draw(st.integers(q0, Lq - 1))
    k0 = draw(st.integers(0, Lk - 1))
    k1 = draw(st.integers(k0, Lk - 1))
    return (
        draw(bool_expr(2)),
        Lq,
        Lk,
        (draw(st.integers(0, B_ - 1)), draw(st.integers(0, H_ - 1)), q0, q1, k0, k1),
        draw(st.integers(0, 2**31)),
        draw(st.booleans()),
    )


def test_property_classification_is_never_wrong():
    seen = {Tri.ALWAYS: 0, Tri.NEVER: 0, Tri.MAYBE: 0}

    @given(case())
    def prop(c):
        mask, Lq_, Lk_, tile, seed, with_data = c
        sizes, ins = make_data(np.random.default_rng(seed), Lq_, Lk_)
        v = the_variant(mask)
        got = classify(mask, *tile, sizes, ins if with_data else None, DECLS, variant=v)
        el = brute(mask, v, sizes, ins, *tile)
        seen[got] += 1
        if got == Tri.ALWAYS:
            assert el.all(), f"ALWAYS but some element false: {mask}"
        if got == Tri.NEVER:
            assert not el.any(), f"NEVER but some element true: {mask}"

    prop()
    # Not vacuous: the generator reaches every class.
    assert all(seen.values()), seen


EXACT = {
    "causal": lambda: causal(),
    "window": lambda: window(3, 1),
    "causal&window": lambda: and_(causal(), window(5, 0)),
    "padding": lambda: padding(),
    "prefix": lambda: prefix(load("plen", b)),
    "document_self": lambda: document("kids"),
}


@pytest.mark.parametrize(
    "name,Lq,Lk",
    [(n, a, c) for n in sorted(EXACT) for a, c in [(24, 24), (12, 24), (24, 12)] if n != "document_self" or a == c],
)
def test_exact_for_tiles_fully_inside_or_outside(name, Lq, Lk):
    rng = np.random.default_rng(0)
    mask = EXACT[name]()
    decls = DECLS
    v = variant(mask, heads=H_, kind=AttnKind.CROSS, inputs=decls)
    exact_tiles = 0
    for trial in range(3):
        sizes, ins = make_data(rng, Lq, Lk)
        for bm, bn in [(4, 4), (8, 4), (3, 5)]:
            for bb in range(B_):
                for q0 in range(0, Lq, bm):
                    for k0 in range(0, Lk, bn):
                        tile = (bb, 0, q0, min(Lq, q0 + bm) - 1, k0, min(Lk, k0 + bn) - 1)
                        el = brute(mask, v, sizes, ins, *tile)
                        got = classify(mask, *tile, sizes, ins, decls, variant=v)
                        want = Tri.ALWAYS if el.all() else Tri.NEVER if not el.any() else Tri.MAYBE
                        assert got == want, (name, tile)
                        exact_tiles += want != Tri.MAYBE
    assert exact_tiles > 0


@pytest.mark.parametrize("rank", [2, 3, 4])
def test_block_sparse_exact_on_tiles_within_blocks(rank):
    rng = np.random.default_rng(rank)
    Lq, Lk, bq, bk = 16, 24, 8, 4
    nq, nk = Lq // bq, Lk // bk
    shape = {2: (nq, nk), 3: (H_, nq, nk), 4: (B_, H_, nq, nk)}[rank]
    dims = {2: ("nq", "nk"), 3: (SizeSym.H, "nq", "nk"), 4: (SizeSym.B, SizeSym.H, "nq", "nk")}[rank]
    t = (rng.random(shape) < 0.5).astype(np.uint8)
    mask = block_sparse("m", rank, bq, bk)
    decls = (decl("m", DType.U8, *dims),)
    v = variant(mask, heads=H_, kind=AttnKind.CROSS, inputs=decls)
    sizes = Sizes(B_, Lq, Lk, (("nk", nk), ("nq", nq)))
    classes = set()
    for bb in range(B_):
        for hh in range(H_):
            for q0 in range(0, Lq, 4):  # 4-row tiles inside 8-row blocks
                for k0 in range(0, Lk, 2):
                    tile = (bb, hh, q0, q0 + 3, k0, k0 + 1)
                    el = brute(mask, v, sizes, {"m": t}, *tile)
                    got = classify(mask, *tile, sizes, {"m": t}, decls, variant=v)
                    assert got == (Tri.ALWAYS if el.all() else Tri.NEVER)
                    classes.add(got)
    assert classes == {Tri.ALWAYS, Tri.NEVER}


# ---- unit cases of the interval rules


def ctx(q0=0, q1=0, k0=0, k1=0, ins=None, decls=DECLS, Lq_=32, Lk_=32) -> TileContext:
    return make_context(0, 0, q0, q1, k0, k1, Sizes(2, Lq_, Lk_), ins, decls)


def test_mod_rules():
    assert eval_interval(mod(q, ci(4)), ctx(3, 10)) == Interval(0, 3)  # wider than the modulus
    assert eval_interval(mod(q, ci(8)), ctx(9, 12)) == Interval(1, 4)  # no wrap: exact
    assert eval_interval(mod(q, ci(8)), ctx(6, 9)) == Interval(0, 7)  # wraps
    assert eval_interval(mod(neg(q), ci(8)), ctx(1, 3)) == Interval(5, 7)  # floor modulo of negatives
    assert eval_interval(mod(q, ci(-3)), ctx(4, 4)) == Interval(-2, -2)
    assert eval_interval(mod(q, ci(0)), ctx(4, 9)) == Interval(0, 0)


def test_floor_division_rules():
    assert eval_interval(div(neg(q), ci(3)), ctx(1, 7)) == Interval(-3, -1)
    assert eval_interval(div(q, ci(-2)), ctx(1, 5)) == Interval(-3, -1)
    assert eval_interval(div(q, ci(0)), ctx(1, 5)) == Interval(0, 0)
    r = eval_interval(div(q, sub(kv, ci(2))), ctx(4, 6, 0, 5))  # divisor spans 0: includes 0 and ±q
    assert r.lo <= -6 and r.hi >= 6 and r.lo <= 0 <= r.hi


def test_arith_and_minmax():
    assert eval_interval(mul(sub(q, kv), neg(q)), ctx(1, 2, 3, 5)) == Interval(1, 8)
    assert eval_interval(call("abs", sub(q, kv)), ctx(0, 4, 2, 3)) == Interval(0, 3)
    assert eval_interval(call("min", q, kv), ctx(0, 4, 2, 3)) == Interval(0, 3)
    assert eval_interval(add(Lq, Lk), ctx()) == Interval(64, 64)


def test_three_valued_logic():
    c = ctx(0, 3, 2, 5)
    maybe = cmp("<", q, kv)
    assert eval_interval(maybe, c) == Tri.MAYBE
    assert eval_interval(and_(maybe, cmp(">", q, ci(10))), c) == Tri.NEVER
    assert eval_interval(or_(maybe, cmp("<", q, ci(10))), c) == Tri.ALWAYS
    assert eval_interval(not_(cmp("<", q, ci(10))), c) == Tri.NEVER
    assert eval_interval(call("where", maybe, cmp("<", q, ci(10)), cmp("<", kv, ci(10))), c) == Tri.ALWAYS


def test_loads():
    ins = {
        "tab": np.arange(8, dtype=np.int32) * 2,
        "kids": np.array([[0, 0, 1, 1, 3, 3, 3, 7]] * 2, dtype=np.int32),
    }
    c = ctx(2, 2, 1, 4, ins=ins, Lk_=8)
    assert eval_interval(load("tab", q), c) == Interval(4, 4)  # point: the value
    assert eval_interval(load("tab", add(q, ci(20))), c) == Interval(0, 0)  # out of range: 0
    assert eval_interval(load("tab", neg(q)), c) == Interval(0, 0)  # negative: 0, no wrap-around
    assert eval_interval(load("tab", kv), c) == Interval(-(2**31), 2**31 - 1)  # unsorted range: unknown
    assert eval_interval(load("kids", b, kv), c) == Interval(0, 3)  # sorted: the ends
    r = eval_interval(load("kids", b, add(kv, ci(5))), c)  # runs past the end: ends and 0
    assert r == Interval(0, 7)
    assert eval_interval(load("kids", b, kv), ctx(0, 0, 1, 4, ins=None, Lk_=8)).hi == 2**31 - 1  # no data


def test_float_functions_and_nan():
    c = ctx(1, 3)
    r = eval_interval(call("exp", mul(q, cf(1.0))), c)
    assert r.lo <= math.exp(1) <= math.exp(3) <= r.hi and r.hi < math.exp(3) * (1 + 1e-12) and not r.nan
    # log of a negative is NaN, which compares false, so `log(x) < 100` is not ALWAYS even though
    # every number it can produce is below 100.
    assert eval_interval(cmp("<", call("log", mul(neg(q), cf(1.0))), cf(100.0)), c) == Tri.MAYBE
    assert eval_interval(cmp("<", call("log", mul(q, cf(1.0))), cf(100.0)), c) == Tri.ALWAYS
    assert eval_interval(cmp("<", call("log", mul(sub(q, ci(2)), cf(1.0))), cf(100.0)), c) == Tri.MAYBE
    assert eval_interval(cmp("<=", call("tanh", mul(q, cf(1.0))), cf(1.0)), c) == Tri.ALWAYS


def test_unknown_sizes_are_looser_not_wrong():
    from _irb import H

    # Without the variant, H is unknown: h < H is MAYBE; with it, ALWAYS.
    mask = cmp("<", h, H)
    v = variant(mask, heads=4)
    assert classify(mask, 0, 1, 0, 3, 0, 3, Sizes(1, 4, 4)) == Tri.MAYBE
    assert classify(mask, 0, 1, 0, 3, 0, 3, Sizes(1, 4, 4), variant=v) == Tri.ALWAYS


def test_bad_tile_rejected():
    with pytest.raises(ValueError, match="q0 <= q1"):
        classify(causal(), 0, 0, 5, 2, 0, 1, Sizes(1, 8, 8))


def test_density_causal():
    v = variant(causal(), heads=2)
    d = density(v, Sizes(2, 256, 256), None, 64, 64)
    assert d["visible"] == pytest.approx((256 * 257 / 2) / 256**2)
    assert (d["never"], d["maybe"], d["always"]) == (6 * 4, 4 * 4, 6 * 4)
    assert d["tiles"] == 16 * 4 and d["skipped"] == pytest.approx(6 / 16)


def test_density_padding_depends_on_batch():
    v = variant(padding(), heads=2)
    ins = {"q_lens": np.array([64, 0], np.int32), "kv_lens": np.array([128, 128], np.int32)}
    d = density(v, Sizes(2, 128, 128), ins, 64, 64)
    # batch 0: q rows 0..63 see everything (2 tiles ALWAYS, 2 NEVER); batch 1: all NEVER; per head.
    assert (d["always"], d["never"], d["maybe"]) == (2 * 2, 6 * 2, 0)
    assert d["visible"] == pytest.approx(0.25)
