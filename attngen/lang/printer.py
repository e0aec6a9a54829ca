"""Printing: IR → canonical .attn text, such that `loads(print_program(p)) == p`.

Builtins print as their name and arguments (never their body); floats print with `repr` so they
read back bit for bit; parentheses appear only where precedence or associativity needs them.
"""

from __future__ import annotations

from attngen.lang.builtins import BUILTINS
from attngen.ir.nodes import (
    TRUE,
    AttnKind,
    Binary,
    Builtin,
    Call,
    Const,
    Dim,
    Expr,
    Index,
    Layout,
    Load,
    Norm,
    NormScope,
    Quant,
    ScaleGranularity,
    Program,
    ScalarType,
    Score,
    Size,
    SizeSym,
    TensorDecl,
    TensorRef,
    Unary,
    Variant,
)

# Binding strength of each binary operator (higher binds tighter); all are left-associative.
PRECEDENCE: dict[str, int] = {
    "||": 1,
    "&&": 2,
    "==": 3,
    "!=": 3,
    "<": 4,
    "<=": 4,
    ">": 4,
    ">=": 4,
    "+": 5,
    "-": 5,
    "*": 6,
    "/": 6,
    "%": 6,
}
UNARY_PREC = 7
ATOM_PREC = 8



def format_number(value: bool | int | float) -> str:
    """A literal that reads back as the same value and type (ints without a dot, floats with)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    text = repr(float(value))
    # repr gives `1e+16` or `1e-05` for some floats: valid .attn, but it must stay a float.
    if not any(ch in text for ch in ".eEn"):
        text += ".0"
    return text


def _prec(e: Expr) -> int:
    if isinstance(e, Binary):
        return PRECEDENCE[e.op.value]
    if isinstance(e, Unary):
        return UNARY_PREC
    return ATOM_PREC


def print_expr(e: Expr) -> str:
    """One expression in canonical form with minimal parentheses."""
    if isinstance(e, Const):
        if e.type == ScalarType.BOOL:
            return format_number(bool(e.value))
        if e.type == ScalarType.INT:
            return format_number(int(e.value))
        return format_number(float(e.value))
    if isinstance(e, Index):
        return e.var.value
    if isinstance(e, Size):
        return e.sym.value
    if isinstance(e, Score):
        return "s"
    if isinstance(e, TensorRef):
        return e.name
    if isinstance(e, Load):
        return f"{e.tensor}[{', '.join(print_expr(i) for i in e.indices)}]"
    if isinstance(e, Call):
        return f"{e.func.value}({', '.join(print_expr(a) for a in e.args)})"
    if isinstance(e, Builtin):
        if not e.args and 0 in BUILTINS[e.name].arities:  # written bare: `causal`, `alibi`
            return e.name.value
        return f"{e.name.value}({', '.join(print_expr(a) for a in e.args)})"
    if isinstance(e, Unary):
        inner = print_expr(e.operand)
        if _prec(e.operand) < UNARY_PREC:
            inner = f"({inner})"
        return f"{e.op.value}{inner}"
    if isinstance(e, Binary):
        p = PRECEDENCE[e.op.value]
        lhs, rhs = print_expr(e.lhs), print_expr(e.rhs)
        if _prec(e.lhs) < p:
            lhs = f"({lhs})"
        # Left-associative: an equal-precedence right operand was grouped on purpose.
        if _prec(e.rhs) <= p:
            rhs = f"({rhs})"
        return f"{lhs} {e.op.value} {rhs}"
    raise TypeError(f"not an expression: {e!r}")


def _dim(d: Dim) -> str:
    if isinstance(d, SizeSym):
        return d.value
    return str(d)


def _input(t: TensorDecl) -> str:
    text = f"input {t.name}: {t.dtype.value}[{', '.join(_dim(d) for d in t.shape)}]"
    return text + (" sorted" if t.sorted else "")


def _norm(n: Norm) -> str:
    text = f"norm {n.target.value} {n.kind.value}({format_number(float(n.eps))})"
    if n.scope != NormScope.HEAD:
        text += f" scope {n.scope.value}"
    if not n.affine:
        text += " affine false"
    return text


def _dtype(v: Variant) -> str:
    """`dtype T`, or with stored types: the q type first, then each tensor that differs from it."""
    first = v.q_dtype
    text = f"dtype {first.value}"
    for name, d in (("k", v.k_dtype), ("v", v.v_dtype), ("out", v.out_dtype)):
        if d != first:
            text += f" {name} {d.value}"
    return text


def _quant(qn: Quant) -> str:
    text = f"quant {qn.operand.value} {qn.dtype.value} {qn.source.value}"
    if qn.static is not None:
        text += f"({format_number(float(qn.static))})"
    if qn.granularity is not None:
        text += f" per {qn.granularity.value}" + (f"({qn.block})" if qn.granularity == ScaleGranularity.BLOCK else "")
    if qn.smooth is not None:
        text += f" smooth {qn.smooth.value}"
    return text


def quant_words(v: Variant) -> str:
    """The stored types and the `quant` statements in one phrase (summaries)."""
    return "; ".join([_dtype(v).removeprefix("dtype ")] + [_quant(qn).removeprefix("quant ") for qn in v.quants])


def variant_lines(v: Variant) -> list[str]:
    """The statements of a variant, one a line, in canonical order; defaults are left out."""
    lines = [_dtype(v)]
    lines.append(f"head_dim {v.head_dim}" + (f" value {v.value_head_dim}" if v.value_head_dim != v.head_dim else ""))
    lines.append(f"heads {v.heads}" + (f" kv {v.kv_heads}" if v.kv_heads != v.heads else ""))
    if v.kind != AttnKind.SELF:
        lines.append(f"kind {v.kind.value}")
    if v.layout != Layout.BHSD:
        lines.append(f"layout {v.layout.value}")
    if v.scale is not None:
        lines.append(f"scale {format_number(float(v.scale))}")
    lines.extend(_input(t) for t in v.inputs)
    if v.mask != TRUE:
        lines.append(f"mask {print_expr(v.mask)}")
    lines.extend(f"score {print_expr(s)}" for s in v.scores)
    lines.extend(_norm(n) for n in v.norms)
    lines.extend(_quant(qn) for qn in v.quants)
    if v.sink is not None:
        lines.append(f"sink {v.sink}")
    if v.page_size is not None:
        lines.append(f"kv_cache paged({v.page_size})")
    if v.residual:
        lines.append("residual")
    if v.nan_check:
        lines.append("nan_check")
    if v.lse:
        lines.append("output lse")
    if v.tile is not None:
        lines.append("tile " + " ".join(f"{k} {n}" for k, n in v.tile.given()))
    return lines


def print_variant(v: Variant) -> str:
    body = "".join(f"  {line}\n" for line in variant_lines(v))
    return f"attention {v.name} {{\n{body}}}\n"


def print_program(program: Program) -> str:
    """The whole program as canonical .attn text (variants separated by a blank line)."""
    return "\n".join(print_variant(v) for v in program.variants)
