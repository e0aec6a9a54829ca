"""The printer: canonical text, minimal parentheses by precedence, exact floats, builtins by name."""

from __future__ import annotations

import pytest

from attngen.lang.frontend import loads, print_expr, print_program
from attngen.ir.nodes import BinOp, Binary, Const, Index, IndexVar, ScalarType, Score, Unary, UnOp, fp32_literal
from attngen.lang.printer import format_number

I, F, B = ScalarType.INT, ScalarType.FLOAT, ScalarType.BOOL
q, kv = Index(IndexVar.Q), Index(IndexVar.KV)


def c(v):
    return Const(v, I)


@pytest.mark.parametrize(
    "e, text",
    [
        (Binary(BinOp.SUB, Binary(BinOp.SUB, q, kv, I), c(1), I), "q - kv - 1"),
        (Binary(BinOp.SUB, q, Binary(BinOp.SUB, kv, c(1), I), I), "q - (kv - 1)"),
        (Binary(BinOp.MUL, Binary(BinOp.ADD, q, kv, I), c(2), I), "(q + kv) * 2"),
        (Binary(BinOp.ADD, q, Binary(BinOp.MUL, kv, c(2), I), I), "q + kv * 2"),
        (Unary(UnOp.NEG, Binary(BinOp.ADD, q, kv, I), I), "-(q + kv)"),
        (Unary(UnOp.NEG, Unary(UnOp.NEG, q, I), I), "--q"),
        (Binary(BinOp.SUB, q, Unary(UnOp.NEG, c(1), I), I), "q - -1"),
        (
            Binary(BinOp.AND, Binary(BinOp.OR, Const(True, B), Const(False, B), B), Const(True, B), B),
            "(true || false) && true",
        ),
        (
            Binary(BinOp.EQ, Binary(BinOp.LT, q, kv, B), Binary(BinOp.GE, q, c(3), B), B),
            "q < kv == q >= 3",
        ),
        (Unary(UnOp.NOT, Binary(BinOp.LT, q, kv, B), B), "!(q < kv)"),
        (Binary(BinOp.DIV, Score(), Const(0.1, F), F), "s / 0.1"),
    ],
)
def test_minimal_parentheses(e, text):
    assert print_expr(e) == text


@pytest.mark.parametrize("value", [0.1, 1e-5, 1e16, 123456789.123456789, 5e-324, 3.4028234663852886e38, 2.0])
def test_floats_round_trip_exactly(value):
    text = format_number(value)
    # A scale that fp32 flushes to 0 is refused (tests/hostile), so 5e-324 round-trips in a score only.
    scale = f"scale {text}; " if fp32_literal(value) > 0 else ""
    p = loads(f"attention a {{ dtype bf16; head_dim 64; heads 1; {scale}score s * {text} }}")
    v = p.get()
    assert v.scale == (value if scale else None) and v.scores[0].rhs == Const(value, F)


def test_int_and_float_literals_keep_their_type():
    assert format_number(3) == "3" and format_number(3.0) == "3.0" and format_number(True) == "true"


def test_builtins_print_as_written():
    src = (
        "attention a {\n  dtype bf16\n  head_dim 64\n  heads 4\n  input ids: i32[B, Lk]\n  input rb: fp32[H, 5]\n"
        "  mask causal && window(16, 0) || padding && document(ids) || prefix(ids[b, 0])\n"
        "  score softcap(30.0)\n  score alibi\n  score rel_bias(rb, 2)\n}\n"
    )
    assert print_program(loads(src)) == src


def test_defaults_left_out_and_non_defaults_printed():
    p = loads("attention a { dtype fp16; head_dim 64; heads 4; kind self; layout bhsd; scale auto; tile auto; mask true }")
    assert print_program(p) == "attention a {\n  dtype fp16\n  head_dim 64\n  heads 4\n}\n"
    p = loads(
        "attention a { dtype fp16; head_dim 64 value 32; heads 4 kv 2; kind cross; layout bshd; scale 0.5\n"
        "norm q rmsnorm(1e-5) scope token affine false; nan_check; output lse; tile warps 4 }"
    )
    text = print_program(p)
    for line in ("head_dim 64 value 32", "heads 4 kv 2", "kind cross", "layout bshd", "scale 0.5",
                 "norm q rmsnorm(1e-05) scope token affine false", "nan_check", "output lse", "tile warps 4"):
        assert line in text
    assert loads(text) == p


def test_multiple_variants_separated_by_blank_line():
    p = loads("attention a { dtype fp16; head_dim 64; heads 4 } attention b { dtype bf16; head_dim 32; heads 1 }")
    assert print_program(p).count("\n\nattention b {") == 1
