"""The formatter: a parsed file → canonical layout, keeping every comment.

One statement a line, two-space indent, minimal parentheses, literals exactly as written (the
formatter never changes what a spec means, and works on specs that do not check yet). A comment
alone on its line stays before the statement (or variant, or `}`) that follows it; a comment after
code stays at the end of that code's line. Single blank lines between statements are kept.
Formatting formatted text changes nothing.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from attngen.lang import ast as A
from attngen.lang.diagnostics import split_lines
from attngen.lang.printer import ATOM_PREC, PRECEDENCE, UNARY_PREC

INDENT = "  "


def _prec(e: A.AExpr) -> int:
    if isinstance(e, A.BinaryE):
        return PRECEDENCE[e.op]
    if isinstance(e, A.UnaryE):
        return UNARY_PREC
    return ATOM_PREC


def format_expr(e: A.AExpr) -> str:
    """An AST expression with canonical spacing and minimal parentheses (same rules as the printer)."""
    if isinstance(e, A.NumE):
        return e.text
    if isinstance(e, A.BoolE):
        return "true" if e.value else "false"
    if isinstance(e, A.NameE):
        return e.name
    if isinstance(e, A.LookupE):
        return f"{e.tensor.text}[{', '.join(format_expr(i) for i in e.indices)}]"
    if isinstance(e, A.CallE):
        return f"{e.func.text}({', '.join(format_expr(a) for a in e.args)})"
    if isinstance(e, A.UnaryE):
        inner = format_expr(e.operand)
        return f"{e.op}({inner})" if _prec(e.operand) < UNARY_PREC else f"{e.op}{inner}"
    if isinstance(e, A.BinaryE):
        p = PRECEDENCE[e.op]
        lhs, rhs = format_expr(e.lhs), format_expr(e.rhs)
        if _prec(e.lhs) < p:
            lhs = f"({lhs})"
        if _prec(e.rhs) <= p:
            rhs = f"({rhs})"
        return f"{lhs} {e.op} {rhs}"
    raise TypeError(f"not an expression: {e!r}")


def _num(n: A.Num) -> str:
    return ("-" if n.negative else "") + n.text


def format_stmt(st: A.Stmt) -> str:
    """One statement on one line."""
    if isinstance(st, A.WordStmt):
        return f"{st.kind.value} {st.value.text}"
    if isinstance(st, A.PairStmt):
        text = f"{st.kind.value} {_num(st.first)}"
        if st.second is not None:
            text += (" value " if st.kind == A.StmtKind.HEAD_DIM else " kv ") + _num(st.second)
        return text
    if isinstance(st, A.ScaleStmt):
        return "scale " + ("auto" if st.value is None else _num(st.value))
    if isinstance(st, A.InputStmt):
        dims = ", ".join(_num(d) if isinstance(d, A.Num) else d.text for d in st.dims)
        return f"input {st.name.text}: {st.dtype.text}[{dims}]" + (" sorted" if st.sorted else "")
    if isinstance(st, A.ExprStmt):
        return f"{st.kind.value} {format_expr(st.expr)}"
    if isinstance(st, A.NormStmt):
        text = f"norm {st.target.text} {st.norm_kind.text}({_num(st.eps)})"
        return text + "".join(f" {o.key} {o.value.text}" for o in st.options)
    if isinstance(st, A.DTypeStmt):
        return f"dtype {st.value.text}" + "".join(f" {t.text} {w.text}" for t, w in st.overrides)
    if isinstance(st, A.QuantStmt):
        text = f"quant {st.operand.text} {st.qtype.text} {st.source.text}" + (f"({_num(st.source_arg)})" if st.source_arg else "")
        if st.per is not None:
            text += f" per {st.per.text}" + (f"({_num(st.per_arg)})" if st.per_arg else "")
        return text + (f" smooth {st.smooth.text}" if st.smooth is not None else "")
    if isinstance(st, A.FlagStmt):
        return st.kind.value
    if isinstance(st, A.KvCacheStmt):
        return f"kv_cache {st.layout.text}({_num(st.page_size)})"
    if isinstance(st, A.TileStmt):
        if not st.fields:
            return "tile auto"
        return "tile " + " ".join(f"{f.key.text} {_num(f.value)}" for f in st.fields)
    raise TypeError(f"not a statement: {st!r}")


@dataclass
class _Item:
    """Something that prints as one line: a variant header, a statement, or a closing brace."""

    line: int
    col: int
    end_line: int
    text: str
    indent: str
    leading: list[A.Comment] = field(default_factory=list)
    trailing: list[A.Comment] = field(default_factory=list)
    first_of_variant: bool = False


def _items(f: A.File) -> list[_Item]:
    out: list[_Item] = []
    for v in f.variants:
        h = v.header_span
        out.append(_Item(h.line, h.col, h.end_line, f"attention {v.name.text} {{", "", first_of_variant=True))
        for st in v.stmts:
            s = st.span
            out.append(_Item(s.line, s.col, s.end_line, format_stmt(st), INDENT))
        c = v.close_span
        out.append(_Item(c.line, c.col, c.end_line, "}", ""))
    return out


def format_file(f: A.File, source: str) -> str:
    """Canonical text of a parsed file; `source` is the text it was parsed from."""
    items = _items(f)
    src_lines = split_lines(source)
    tail: list[A.Comment] = []
    # Items are in source order, so the items around a comment are found by bisection (a scan per
    # comment made formatting quadratic in the size of commented files).
    starts = [(it.line, it.col) for it in items]
    for c in f.comments:
        i = bisect.bisect_left(starts, (c.line, c.col))  # items[:i] begin before the comment
        prev = items[i - 1] if i > 0 else None
        # After code on its line, a comment belongs to the item that code is part of: the last
        # item begun before it (a multi-line expression included).
        if prev is not None and src_lines[c.line - 1][: c.col - 1].strip():
            prev.trailing.append(c)
            continue
        j = bisect.bisect_right(starts, (c.line, c.col))  # items[j:] begin after it
        if j < len(items):
            items[j].leading.append(c)
        else:
            tail.append(c)

    lines: list[str] = []
    prev_end: int | None = None  # last source line of what was printed last
    for it in items:
        first_line = it.leading[0].line if it.leading else it.line
        if it.first_of_variant and lines:
            lines.append("")  # exactly one blank line between variants
        elif prev_end is not None and first_line - prev_end > 1 and lines and lines[-1] != "":
            lines.append("")
        last = None
        for c in it.leading:
            if last is not None and c.line - last > 1:
                lines.append("")
            lines.append(it.indent + c.text if it.text != "}" else INDENT + c.text)
            last = c.line
        if last is not None and it.line - last > 1:
            lines.append("")
        text = it.indent + it.text
        if it.trailing:
            text += "  " + " ".join(c.text for c in it.trailing)
        lines.append(text)
        prev_end = max([it.end_line, *(c.line for c in it.trailing)])
    last = prev_end
    for c in tail:
        if last is not None and c.line - last > 1:
            lines.append("")
        lines.append(c.text)
        last = c.line
    return "\n".join(lines) + "\n" if lines else ""
