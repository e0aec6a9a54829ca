"""Mask semantics: `reference.mask_matrix` against plain loops, builtin by builtin."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import _brute as bf
from _irb import (
    add,
    and_,
    b,
    block_sparse,
    call,
    causal,
    ci,
    cmp,
    decl,
    div,
    document,
    h,
    kv,
    load,
    mod,
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
from attngen.check import reference as ref
from attngen.ir.abi import Sizes
from attngen.ir.nodes import AttnKind, DType, IndexVar, SizeSym


def brute_mask(B, H, Lq, Lk, fn):
    out = np.zeros((B, H, Lq, Lk), dtype=bool)
    for bb, hh, i, j in itertools.product(range(B), range(H), range(Lq), range(Lk)):
        out[bb, hh, i, j] = fn(bb, hh, i, j)
    return out


CROSS_SIZES = [(4, 4), (3, 7), (7, 3), (1, 5), (5, 1)]


@pytest.mark.parametrize("Lq,Lk", CROSS_SIZES)
def test_causal_bottom_right_alignment(Lq, Lk):
    v = variant(causal(), kind=AttnKind.CROSS)
    got = ref.mask_matrix(v, Sizes(1, Lq, Lk), None)
    want = brute_mask(1, 2, Lq, Lk, lambda bb, hh, i, j: j <= i + (Lk - Lq))
    np.testing.assert_array_equal(got, want)
    if Lq <= Lk:
        # The last query sees exactly every key.
        assert got[0, 0, -1].all()


@pytest.mark.parametrize("Lq,Lk", CROSS_SIZES)
@pytest.mark.parametrize("left,right", [(0, 0), (2, 0), (1, 3), (0, 2)])
def test_window(Lq, Lk, left, right):
    v = variant(window(left, right), kind=AttnKind.CROSS)
    got = ref.mask_matrix(v, Sizes(1, Lq, Lk), None)
    off = Lk - Lq
    want = brute_mask(1, 2, Lq, Lk, lambda bb, hh, i, j: i + off - left <= j <= i + off + right)
    np.testing.assert_array_equal(got, want)


def test_causal_and_window_self():
    v = variant(and_(causal(), window(2, 0)))
    got = ref.mask_matrix(v, Sizes(2, 6, 6), None)
    want = brute_mask(2, 2, 6, 6, lambda bb, hh, i, j: i - 2 <= j <= i)
    np.testing.assert_array_equal(got, want)


def test_padding_including_zero_length():
    v = variant(padding(), kind=AttnKind.CROSS)
    ql = np.array([3, 0, 5], dtype=np.int32)
    kl = np.array([0, 2, 6], dtype=np.int32)
    ins = {"q_lens": ql, "kv_lens": kl}
    got = ref.mask_matrix(v, Sizes(3, 5, 6), ins)
    want = brute_mask(3, 2, 5, 6, lambda bb, hh, i, j: i < ql[bb] and j < kl[bb])
    np.testing.assert_array_equal(got, want)
    assert not got[0].any() and not got[1].any()  # kv length 0, q length 0
    assert got[2].sum() == 2 * 5 * 6


def test_document_self_and_cross():
    ids = np.array([[0, 0, 1, 1, 1, 2], [5, 5, 5, 5, 5, 5]], dtype=np.int32)
    v = variant(document("ids"), inputs=(decl("ids", DType.I32, SizeSym.B, SizeSym.LK, sorted=True),))
    got = ref.mask_matrix(v, Sizes(2, 6, 6), {"ids": ids})
    want = brute_mask(2, 2, 6, 6, lambda bb, hh, i, j: ids[bb, i] == ids[bb, j])
    np.testing.assert_array_equal(got, want)

    qi = np.array([[0, 1, 1]], dtype=np.int32)
    ki = np.array([[0, 0, 1, 2, 2]], dtype=np.int32)
    vc = variant(
        document("qi", "ki"),
        kind=AttnKind.CROSS,
        inputs=(decl("qi", DType.I32, SizeSym.B, SizeSym.LQ), decl("ki", DType.I32, SizeSym.B, SizeSym.LK)),
    )
    got = ref.mask_matrix(vc, Sizes(1, 3, 5), {"qi": qi, "ki": ki})
    want = brute_mask(1, 2, 3, 5, lambda bb, hh, i, j: qi[bb, i] == ki[bb, j])
    np.testing.assert_array_equal(got, want)


def test_prefix_lm():
    plen = np.array([2, 0], dtype=np.int32)
    v = variant(or_(causal(), prefix(load("plen", b))), inputs=(decl("plen", DType.I32, SizeSym.B),))
    got = ref.mask_matrix(v, Sizes(2, 5, 5), {"plen": plen})
    want = brute_mask(2, 2, 5, 5, lambda bb, hh, i, j: j <= i or j < plen[bb])
    np.testing.assert_array_equal(got, want)
    assert got[0, 0, 0, 1] and not got[1, 0, 0, 1]


@pytest.mark.parametrize("rank", [2, 3, 4])
def test_block_sparse_ranks(rank):
    rng = np.random.default_rng(rank)
    B, H, Lq, Lk, bq, bk = 2, 3, 7, 9, 2, 4
    nq, nk = -(-Lq // bq), -(-Lk // bk)
    shape = {2: (nq, nk), 3: (H, nq, nk), 4: (B, H, nq, nk)}[rank]
    t = (rng.random(shape) < 0.5).astype(np.uint8)
    dims = {2: ("nq", "nk"), 3: (SizeSym.H, "nq", "nk"), 4: (SizeSym.B, SizeSym.H, "nq", "nk")}[rank]
    v = variant(block_sparse("blk", rank, bq, bk), heads=H, kind=AttnKind.CROSS, inputs=(decl("blk", DType.U8, *dims),))
    got = ref.mask_matrix(v, Sizes(B, Lq, Lk, (("nk", nk), ("nq", nq))), {"blk": t})

    def fn(bb, hh, i, j):
        lead = {2: (), 3: (hh,), 4: (bb, hh)}[rank]
        return t[lead + (i // bq, j // bk)] != 0

    np.testing.assert_array_equal(got, brute_mask(B, H, Lq, Lk, fn))


def test_block_sparse_default_block_is_128():
    t = np.array([[1, 0], [0, 1]], dtype=np.uint8)
    v = variant(block_sparse("blk", 2), inputs=(decl("blk", DType.U8, "nq", "nk"),))
    got = ref.mask_matrix(v, Sizes(1, 200, 200, (("nk", 2), ("nq", 2))), {"blk": t}, b=0, h=0)
    assert got[127, 127] and not got[127, 128] and not got[128, 127] and got[199, 199]


def test_custom_floor_division_of_negatives_and_lookups():
    tab = np.array([3, -1, 4, 0, -5], dtype=np.int32)
    # (q - kv) / 3 == tab[(kv - q) % 4]  ||  tab[kv - q + 2] > 0 (reads out of range for big gaps)
    e = or_(
        cmp("==", div(sub(q, kv), ci(3)), load("tab", mod(sub(kv, q), ci(4)))),
        cmp(">", load("tab", add(sub(kv, q), ci(2))), ci(0)),
    )
    v = variant(e, kind=AttnKind.CROSS, inputs=(decl("tab", DType.I32, 5),))
    got = ref.mask_matrix(v, Sizes(1, 6, 8), {"tab": tab})

    def fn(bb, hh, i, j):
        return bf.floordiv(i - j, 3) == bf.at(tab, bf.floormod(j - i, 4)) or bf.at(tab, j - i + 2) > 0

    np.testing.assert_array_equal(got, brute_mask(1, 2, 6, 8, fn))


def test_division_and_modulo_by_zero_give_zero():
    # kv / (q - 2) and kv % (q - 2) at q == 2 are 0.
    e = and_(cmp("==", div(kv, sub(q, ci(2))), ci(0)), cmp("==", mod(kv, sub(q, ci(2))), ci(0)))
    v = variant(e)
    got = ref.mask_matrix(v, Sizes(1, 5, 5), None, b=0, h=0)
    assert got[2].all()

    def fn(bb, hh, i, j):
        return bf.floordiv(j, i - 2) == 0 and bf.floormod(j, i - 2) == 0

    np.testing.assert_array_equal(got, brute_mask(1, 1, 5, 5, fn)[0, 0])


def test_head_dependent_mask_and_not():
    # Heads alternate: even heads causal, odd heads anti-causal (not causal).
    e = call("where", cmp("==", mod(h, ci(2)), ci(0)), causal(), not_(causal()))
    v = variant(e, heads=4)
    got = ref.mask_matrix(v, Sizes(1, 4, 4), None)
    want = brute_mask(1, 4, 4, 4, lambda bb, hh, i, j: (j <= i) if hh % 2 == 0 else not (j <= i))
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(ref.mask_matrix(v, Sizes(1, 4, 4), None, h=1), want[:, 1])


def test_unary_minus_and_abs_in_mask():
    e = cmp("<=", call("abs", neg(sub(q, kv))), ci(1))
    v = variant(e)
    got = ref.mask_matrix(v, Sizes(1, 5, 5), None, b=0, h=0)
    np.testing.assert_array_equal(got, brute_mask(1, 1, 5, 5, lambda bb, hh, i, j: abs(i - j) <= 1)[0, 0])


def test_evaluate_env_broadcasts():
    env = ref.Env(
        {IndexVar.B: 0, IndexVar.H: 0, IndexVar.Q: np.arange(3)[:, None], IndexVar.KV: np.arange(4)[None, :]},
        {SizeSym.LQ: 3, SizeSym.LK: 4},
    )
    out = ref.evaluate(sub(q, kv), env)
    assert out.shape == (3, 4) and out[2, 0] == 2 and out[0, 3] == -3


def test_mask_reading_score_is_rejected():
    from _irb import cf, s

    v = variant(cmp(">", s, cf(0.0)))
    with pytest.raises(ValueError, match="reads the score"):
        ref.mask_matrix(v, Sizes(1, 2, 2), None)


def test_float_literals_are_fp32_constants():
    # The kernel writes a literal as an fp32 constant: `1e-300f` is 0 and `2.5000000000000004f` is
    # 2.5, so the reference (and the interval rules, which must agree with it) do too.
    from _irb import cf, mul

    from attngen.analysis.intervals import Tri, classify

    tiny = variant(cmp("<", mul(q, cf(0.5)), cf(1e-300)))
    assert not ref.mask_matrix(tiny, Sizes(1, 3, 2), None, b=0, h=0).any()
    assert classify(tiny.mask, 0, 0, 0, 0, 0, 1, Sizes(1, 3, 2), variant=tiny) == Tri.NEVER
    tie = variant(cmp("<", mul(q, cf(0.5)), cf(2.5000000000000004)))
    np.testing.assert_array_equal(ref.mask_matrix(tie, Sizes(1, 7, 1), None, b=0, h=0)[:, 0], np.arange(7) < 5)
    assert classify(tie.mask, 0, 0, 5, 5, 0, 0, Sizes(1, 7, 1), variant=tie) == Tri.NEVER


def test_missing_input_rejected():
    v = variant(padding())
    with pytest.raises(ValueError, match="missing kv_lens, q_lens"):
        ref.attention(v, np.ones((1, 2, 3, 8)), np.ones((1, 2, 3, 8)), np.ones((1, 2, 3, 8)), {})

