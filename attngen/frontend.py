"""The front end's public entry points: text or file → `Program`, and back to text.

    loads(text)            parse + lower; raises SpecError (never a lark error or a traceback)
    load(path)             the same for a file
    format_source(text)    canonical layout of a spec, keeping its comments
    print_program(p)       IR → canonical .attn text; loads(print_program(p)) == p
    print_expr(e)          one expression
"""

from __future__ import annotations

import os

from attngen import fmt as _fmt
from attngen import printer as _printer
from attngen.diagnostics import Diagnostic, SpecError
from attngen.ir import Expr, Program
from attngen.lower import lower
from attngen.parse_attn import parse
from attngen.schedule import DEFAULT_ARCH, Arch

__all__ = ["loads", "load", "format_source", "print_program", "print_expr", "SpecError"]


def loads(text: str, path: str = "<string>", arch: Arch = DEFAULT_ARCH) -> Program:
    """Parse and check .attn source; raises SpecError listing every problem in source order."""
    if not isinstance(text, str):
        raise SpecError([Diagnostic(f"a spec must be text (str), got {type(text).__name__}")], path=path)
    try:
        return lower(parse(text, path), source=text, arch=arch)
    except RecursionError:
        # Parsing caps nesting, so this is a backstop for pathological input, never a traceback.
        raise SpecError([Diagnostic("the spec is nested too deeply to check")], source=text, path=path) from None


def load(path: str | os.PathLike, arch: Arch = DEFAULT_ARCH) -> Program:
    """Read and check a .attn file; an unreadable file is a SpecError too."""
    p = os.fspath(path)
    try:
        with open(p, encoding="utf-8") as f:
            text = f.read()
    except UnicodeDecodeError as e:
        raise SpecError([Diagnostic(f"{p} is not UTF-8 text (byte {e.start}: {e.reason})")], path=str(p)) from None
    except OSError as e:
        reason = e.strerror or type(e).__name__
        raise SpecError([Diagnostic(f"cannot read {p}: {reason}")], path=str(p)) from None
    return loads(text, path=str(p), arch=arch)


def format_source(text: str, path: str = "<string>") -> str:
    """The spec in canonical layout, comments kept; needs only valid syntax, not valid meaning."""
    return _fmt.format_file(parse(text, path), text)


def print_program(program: Program) -> str:
    """IR → canonical .attn text."""
    return _printer.print_program(program)


def print_expr(e: Expr) -> str:
    """One IR expression as canonical .attn text."""
    return _printer.print_expr(e)
