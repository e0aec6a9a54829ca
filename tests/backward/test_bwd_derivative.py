"""Symbolic score derivatives (attngen.analysis.derivative) against central finite differences in float64.

The derivative is evaluated with the reference's own expression evaluator, so these tests pin the
rule table to what the forward computes: d(score)/d(s) for random expression trees and for every
score builtin, and d(score)/d(element) for the learnable lookups (bias, alibi slopes, rel_bias)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "reference"))
import _irb as T  # noqa: E402

from attngen.analysis import derivative as dv  # noqa: E402
from attngen.ir.nodes import Const, Expr, IndexVar, Load, ScalarType, SizeSym, walk  # noqa: E402
from attngen.check.reference import Env, evaluate  # noqa: E402

F = ScalarType.FLOAT
LQ, LK, H, NB = 5, 7, 3, 2


def _env(score: np.ndarray, tensors: dict[str, np.ndarray]) -> Env:
    return Env(
        {
            IndexVar.B: np.arange(NB)[:, None, None, None],
            IndexVar.H: np.arange(H)[None, :, None, None],
            IndexVar.Q: np.arange(LQ)[None, None, :, None],
            IndexVar.KV: np.arange(LK)[None, None, None, :],
        },
        {SizeSym.B: NB, SizeSym.H: H, SizeSym.HKV: H, SizeSym.LQ: LQ, SizeSym.LK: LK, SizeSym.D: 8, SizeSym.DV: 8},
        tensors,
        score,
    )


SHAPE = (NB, H, LQ, LK)


def _eval(e: Expr, s: np.ndarray, tensors) -> np.ndarray:
    with np.errstate(all="ignore"):
        return np.broadcast_to(np.asarray(evaluate(e, _env(s, tensors)), dtype=np.float64), SHAPE)


def _tensors(rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {
        "bt": rng.normal(size=(NB, H, LQ, LK)),
        "b2": rng.normal(size=(LQ, LK)),
        "slopes": rng.uniform(0.1, 1.0, size=(H,)),
        "rel": rng.normal(size=(H, 9)),
    }


def _check_ds(e: Expr, s: np.ndarray, tensors, *, rtol: float = 1e-5, atol: float = 1e-6) -> int:
    """Compare d(e)/ds with central differences where the function is smooth; returns the number
    of points compared (points at kinks, where differences at two step sizes disagree, are left)."""
    d = _eval(dv.diff(e), s, tensors)
    h1, h2 = 1e-5, 2e-6
    fd1 = (_eval(e, s + h1, tensors) - _eval(e, s - h1, tensors)) / (2 * h1)
    fd2 = (_eval(e, s + h2, tensors) - _eval(e, s - h2, tensors)) / (2 * h2)
    ok = np.isfinite(fd1) & np.isfinite(fd2) & (np.abs(fd1 - fd2) <= 1e-4 * (1 + np.abs(fd1))) & (np.abs(fd1) < 1e6)
    np.testing.assert_allclose(d[ok], fd1[ok], rtol=1e-4, atol=1e-4)
    return int(ok.sum())


def _scores(rng, n=SHAPE):
    return rng.normal(scale=3.0, size=n)


def test_every_builtin_score_derivative():
    rng = np.random.default_rng(0)
    tensors = _tensors(rng)
    cases = [
        T.softcap(5.0),
        T.softcap(50.0),
        T.alibi(heads=H),
        T.alibi(slopes="slopes"),
        T.bias("bt", 4),
        T.bias("b2", 2),
        T.rel_bias("rel", 4),
    ]
    for e in cases:
        assert _check_ds(e, _scores(rng), tensors) == np.prod(SHAPE)
    # Builtins that add to s have derivative exactly 1, and the simplifier says so.
    for e in cases[2:]:
        assert dv.diff(e) == dv.ONE


def test_composition_chains_scores():
    rng = np.random.default_rng(1)
    tensors = _tensors(rng)
    scores = (T.alibi(slopes="slopes"), T.softcap(5.0), T.mul(T.call("tanh", T.s), T.cf(3.0)))
    composed = dv.compose_scores(scores)
    s = _scores(rng)
    # The composition computes what applying the scores one by one computes.
    step = s
    for sc in scores:
        step = _eval(sc, step, tensors)
    np.testing.assert_array_equal(_eval(composed, s, tensors), step)
    assert _check_ds(composed, s, tensors) == np.prod(SHAPE)
    assert dv.compose_scores(()) == dv.SCORE and dv.score_derivative(()) == dv.ONE


def _check_param(scores, name: str, tensors, rng) -> None:
    """The scattered derivative of the final score w.r.t. tensor `name`, contracted with a random
    cotangent g, against central differences of sum(g * score) in each element."""
    composed = dv.compose_scores(scores)
    s = _scores(rng)
    g = rng.normal(size=SHAPE)
    grad = np.zeros_like(tensors[name])
    for ld, de in dv.param_derivatives(scores):
        if ld.tensor != name:
            continue
        val = g * _eval(de, s, tensors)
        env = _env(s, tensors)
        idx = [np.broadcast_to(np.asarray(evaluate(i, env), dtype=np.int64), SHAPE) for i in ld.indices]
        inside = np.ones(SHAPE, bool)
        for n, i in zip(grad.shape, idx):
            inside &= (i >= 0) & (i < n)
        np.add.at(grad, tuple(i[inside] for i in idx), val[inside])
    fd = np.zeros_like(grad)
    eps = 1e-6
    for pos in np.ndindex(grad.shape):
        tp, tm = dict(tensors), dict(tensors)
        tp[name] = tensors[name].copy()
        tm[name] = tensors[name].copy()
        tp[name][pos] += eps
        tm[name][pos] -= eps
        fd[pos] = np.sum(g * (_eval(composed, s, tp) - _eval(composed, s, tm))) / (2 * eps)
    np.testing.assert_allclose(grad, fd, rtol=1e-6, atol=1e-6)
    assert np.abs(grad).max() > 0  # the check is not vacuous


def test_learnable_bias_every_rank():
    rng = np.random.default_rng(2)
    tensors = _tensors(rng)
    _check_param((T.bias("bt", 4), T.softcap(5.0)), "bt", tensors, rng)
    _check_param((T.softcap(5.0), T.bias("b2", 2)), "b2", tensors, rng)
    tensors["b3"] = rng.normal(size=(H, LQ, LK))
    _check_param((T.bias("b3", 3), T.softcap(3.0)), "b3", tensors, rng)


def test_learnable_alibi_slopes_and_rel_bias():
    rng = np.random.default_rng(3)
    tensors = _tensors(rng)
    _check_param((T.alibi(slopes="slopes"), T.softcap(5.0)), "slopes", tensors, rng)
    # A window of 2 (m = 4, table 9 wide) with Lk = 7 clips both ends: clipped entries collect sums.
    _check_param((T.rel_bias("rel", 4), T.softcap(8.0)), "rel", tensors, rng)
    assert dv.learnable_tensors((T.alibi(slopes="slopes"), T.rel_bias("rel", 4))) == ("slopes", "rel")
    assert dv.learnable_tensors((T.alibi(heads=H),)) == ()


def test_float_loads_read_a_builtins_body_not_its_arguments():
    # The IR's one children() walks a builtin's arguments and its body; the learnable lookups are
    # those the body computes with (the arguments are its spelling only), in first-appearance order.
    from attngen.ir.nodes import Binary, BinOp, Builtin, BuiltinName, Score

    F = ScalarType.FLOAT
    spelled = Load("only_in_args", (T.kv,), F)
    used = Load("used", (T.kv,), F)
    other = Load("other", (T.q,), F)
    sugar = Builtin(BuiltinName.BIAS, (spelled,), Binary(BinOp.ADD, Score(), used, F))
    e = Binary(BinOp.MUL, sugar, Binary(BinOp.ADD, other, used, F), F)
    assert any(n == spelled for n in walk(e))  # the shared walk does reach the arguments
    assert dv.float_loads(e) == (used, other)


def test_simplifier_keeps_derivatives_lean():
    assert dv.diff(T.add(T.s, T.cf(1.0))) == dv.ONE
    assert dv.diff(T.mul(T.s, T.cf(2.0))) == T.cf(2.0)
    assert dv.diff(T.cf(3.0)) == dv.ZERO
    assert dv.diff(T.call("where", T.cmp("<", T.q, T.kv), T.s, T.add(T.s, T.cf(1.0)))) == dv.ONE
    # No x*1, x+0 or 0*x survives anywhere in the derivative of a builtin chain.
    e = dv.score_derivative((T.softcap(30.0), T.alibi(heads=4), T.softcap(5.0)))
    for n in walk(e):
        if hasattr(n, "op") and n.op.value in "+-*" and hasattr(n, "rhs"):
            assert not (isinstance(n.rhs, Const) and n.rhs.value in (0.0,) and n.op.value in "+-")
            assert not (isinstance(n.rhs, Const) and n.rhs.value == 1.0 and n.op.value == "*")
            assert not any(isinstance(x, Const) and x.value == 0.0 for x in (n.lhs, n.rhs) if n.op.value == "*")


# ---- random expression trees


def _exprs():
    s = T.s
    leaves = st.sampled_from(
        [
            s,
            T.cf(0.5),
            T.cf(2.0),
            T.cf(-1.5),
            T.mul(T.q, T.cf(0.25)),
            T.load("bt", T.b, T.h, T.q, T.kv, t=F),
            T.load("slopes", T.h, t=F),
        ]
    )

    def extend(children):
        bin_ = st.tuples(st.sampled_from(["add", "sub", "mul", "div"]), children, children).map(
            lambda t: getattr(T, t[0])(t[1], t[2]) if t[0] != "div" else T.div(t[1], T.add(T.call("abs", t[2]), T.cf(0.5)))
        )
        un = st.tuples(st.sampled_from(["tanh", "exp", "log", "sqrt", "abs", "neg"]), children).map(_unary)
        mm = st.tuples(st.sampled_from(["min", "max"]), children, children).map(lambda t: T.call(t[0], t[1], t[2]))
        wh = st.tuples(children, children, children).map(lambda t: T.call("where", T.cmp("<", t[0], T.cf(0.3)), t[1], t[2]))
        md = st.tuples(children).map(lambda t: T.mod(t[0], T.cf(1.75)))
        return st.one_of(bin_, un, mm, wh, md)

    return st.recursive(leaves, extend, max_leaves=8)


def _unary(t) -> Expr:
    name, x = t
    if name == "neg":
        return T.neg(x)
    if name == "exp":  # keep exp's argument bounded so differences stay finite
        return T.call("exp", T.call("tanh", x))
    if name in ("log", "sqrt"):
        return T.call(name, T.add(T.call("abs", x), T.cf(0.5)))
    return T.call(name, x)


@settings(max_examples=120)
@given(_exprs(), st.integers(0, 2**31))
def test_random_expressions_match_finite_differences(e, seed):
    rng = np.random.default_rng(seed)
    tensors = _tensors(rng)
    s = _scores(rng)
    n = _check_ds(e, s, tensors)
    # Most points are smooth (kinks are measure-zero; a where/min/max switch is rare at these steps).
    assert n >= 0.9 * np.prod(SHAPE)


@settings(max_examples=60)
@given(_exprs(), st.integers(0, 2**31))
def test_random_expressions_param_gradients(e, seed):
    rng = np.random.default_rng(seed)
    tensors = _tensors(rng)
    if not any(isinstance(n, Load) and n.tensor == "slopes" for n in walk(e)):
        e = T.add(e, T.mul(T.load("slopes", T.h, t=F), T.s))
    composed = dv.compose_scores((e,))
    s = _scores(rng)
    g = rng.normal(size=SHAPE)
    grad = np.zeros(H)
    for ld, de in dv.param_derivatives((e,)):
        if ld.tensor == "slopes":
            np.add.at(grad, np.arange(H), (g * _eval(de, s, tensors)).sum(axis=(0, 2, 3)))
    for hh in range(H):
        for eps in (1e-5,):
            tp, tm = dict(tensors), dict(tensors)
            tp["slopes"] = tensors["slopes"].copy()
            tm["slopes"] = tensors["slopes"].copy()
            tp["slopes"][hh] += eps
            tm["slopes"][hh] -= eps
            fp, fm = _eval(composed, s, tp), _eval(composed, s, tm)
            fd_pt = (fp - fm) / (2 * eps)
            de_all = sum(_eval(de, s, tensors) for ld, de in dv.param_derivatives((e,)) if ld.tensor == "slopes")
            ok = np.isfinite(fd_pt[:, hh]) & (np.abs(fd_pt[:, hh]) < 1e6)
            # Compare pointwise where smooth: the symbolic value must match the difference.
            close = np.abs(de_all[:, hh] - fd_pt[:, hh]) <= 1e-3 * (1 + np.abs(fd_pt[:, hh]))
            assert close[ok].mean() >= 0.9
