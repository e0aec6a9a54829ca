"""Unit tests of the IR → C++ expression emitters (attngen.cuda.emit)."""

from __future__ import annotations

from attngen.ir.nodes import BinOp, Binary, Const, Index, IndexVar, ScalarType, Unary, UnOp
from attngen.cuda.emit import ElementEmitter, IntervalEmitter

I, B = ScalarType.INT, ScalarType.BOOL


def test_negated_negative_literal_is_not_a_decrement() -> None:
    # Regression: -(-1) was emitted as `(--1)`, a C++ pre-decrement that no compiler accepts. The
    # parser never builds negative literals, but IR built through the Python API can (and the
    # host harness in test_classify_host.py generated it).
    e = Unary(UnOp.NEG, Const(-1, I), I)
    assert ElementEmitter({}).emit(e) == "(-(-1))"
    f = Unary(UnOp.NEG, Const(-2.5, ScalarType.FLOAT), ScalarType.FLOAT)
    assert ElementEmitter({}).emit(f) == "(-(-2.5f))"
    mask = Binary(BinOp.LE, Index(IndexVar.KV), e, B)
    lines, _ = IntervalEmitter({}, {}).classify(mask)
    assert not any("--" in ln for ln in lines), lines


def test_integer_division_and_modulo_use_floor_helpers() -> None:
    q = Index(IndexVar.Q)
    assert ElementEmitter({}).emit(Binary(BinOp.DIV, q, Const(128, I), I)) == "ag_floordiv(q, 128)"
    assert ElementEmitter({}).emit(Binary(BinOp.MOD, q, Const(4, I), I)) == "ag_floormod(q, 4)"
