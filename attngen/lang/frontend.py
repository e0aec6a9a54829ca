"""The front end's public entry points: text or file → `Program`, and back to text.

    loads(text)            parse + lower; raises SpecError (never a lark error or a traceback)
    load(path)             the same for a file

These stop after `lower`: what a spec means. What an arch can run (the tile, the kernel's limits)
is the plan stage's check, attngen.plan.validate.loads / load, which `attngen.load(s)` and the
command line use.
    format_source(text)    canonical layout of a spec, keeping its comments
    print_program(p)       IR → canonical .attn text; loads(print_program(p)) == p
    print_expr(e)          one expression
"""

from __future__ import annotations

import os
import sys

from attngen.lang import ast as A
from attngen.lang import fmt as _fmt
from attngen.lang import printer as _printer
from attngen.lang.diagnostics import Diagnostic, SpecError
from attngen.ir.nodes import Expr, Program, Span
from attngen.lang.lower import SEMANTIC, Target, lower
from attngen.lang.parse import MAX_NESTING, parse

__all__ = ["loads", "load", "format_source", "print_program", "print_expr", "SpecError", "Target"]


def loads(text: str, path: str = "<string>", target: Target = SEMANTIC) -> Program:
    """Parse and check .attn source; raises SpecError listing every problem in source order
    (`target`: backend facts to check as well, from attngen.plan.validate.target)."""
    if not isinstance(text, str):
        raise SpecError([Diagnostic(f"a spec must be text (str), got {type(text).__name__}")], path=path)
    file = parse(text, path)
    # Parsing caps expression nesting at MAX_NESTING levels; checking a level takes several Python
    # frames (a builtin's argument passes through its signature's checker), so lowering gets the
    # stack room that bound needs rather than the interpreter's default of 1000 frames.
    old_limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(old_limit, _LOWER_FRAMES))
    try:
        return lower(file, source=text, target=target)
    except RecursionError:
        # A backstop for pathological input, never a traceback: point at the deepest expression.
        raise SpecError(
            [Diagnostic("the spec is nested too deeply to check", _deepest_span(file),
                        f"expressions may nest at most {MAX_NESTING} levels")],
            source=text, path=path,
        ) from None
    finally:
        sys.setrecursionlimit(old_limit)


# Frames lowering may need at MAX_NESTING levels (about 8 a level through builtins), with room.
_LOWER_FRAMES = 12 * MAX_NESTING + 1000


def _deepest_span(file: A.File) -> Span | None:
    """The span of the most deeply nested expression in `file` (found without recursion)."""
    best: tuple[int, Span | None] = (-1, None)
    stack: list[tuple[A.AExpr, int]] = [
        (st.expr, 0) for v in file.variants for st in v.stmts if isinstance(st, A.ExprStmt)
    ]
    while stack:
        e, depth = stack.pop()
        if depth > best[0]:
            best = (depth, e.span)
        if isinstance(e, A.UnaryE):
            stack.append((e.operand, depth + 1))
        elif isinstance(e, A.BinaryE):
            stack.extend(((e.lhs, depth + 1), (e.rhs, depth + 1)))
        elif isinstance(e, A.LookupE):
            stack.extend((i, depth + 1) for i in e.indices)
        elif isinstance(e, A.CallE):
            stack.extend((a, depth + 1) for a in e.args)
    return best[1]


def load(path: str | os.PathLike, target: Target = SEMANTIC) -> Program:
    """Read and check a .attn file; an unreadable file is a SpecError too."""
    return loads(read_spec(path), path=os.fspath(path), target=target)


def read_spec(path: str | os.PathLike) -> str:
    """The text of a .attn file; an unreadable file is a SpecError."""
    p = os.fspath(path)
    try:
        with open(p, encoding="utf-8") as f:
            return f.read()
    except UnicodeDecodeError as e:
        raise SpecError([Diagnostic(f"{p} is not UTF-8 text (byte {e.start}: {e.reason})")], path=str(p)) from None
    except OSError as e:
        reason = e.strerror or type(e).__name__
        raise SpecError([Diagnostic(f"cannot read {p}: {reason}")], path=str(p)) from None


def format_source(text: str, path: str = "<string>") -> str:
    """The spec in canonical layout, comments kept; needs only valid syntax, not valid meaning."""
    return _fmt.format_file(parse(text, path), text)


def print_program(program: Program) -> str:
    """IR → canonical .attn text."""
    return _printer.print_program(program)


def print_expr(e: Expr) -> str:
    """One IR expression as canonical .attn text."""
    return _printer.print_expr(e)
