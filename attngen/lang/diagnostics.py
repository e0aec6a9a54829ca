"""Compiler-style diagnostics: `path:line:col: error: message`, the source line, a caret.

Every stage that rejects user input raises `SpecError` holding one or more `Diagnostic`s; the CLI
prints `SpecError.render()` and exits 1. No lark exception or traceback reaches a user.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from attngen.ir.nodes import Span

__all__ = ["Diagnostic", "SpecError", "normalize_newlines", "split_lines"]

# The one line-break rule of the tool chain, what editors count: LF, CRLF and a lone CR. Python's
# str.splitlines also breaks at form feed, vertical tab, U+001C-U+001E, U+0085, U+2028 and U+2029,
# which editors and the lexer (it counts LFs after `normalize_newlines`) do not.
_LINE_BREAK = re.compile(r"\r\n|\r|\n")
# Characters a terminal may show as a line break; the displayed source line shows them as spaces.
_SHOWN_AS_BREAK = str.maketrans({c: " " for c in "\v\f\x1c\x1d\x1e\x85\u2028\u2029"})


def split_lines(text: str) -> list[str]:
    """`text` split at LF, CRLF and CR (never at other characters str.splitlines breaks at)."""
    lines = _LINE_BREAK.split(text)
    if lines and lines[-1] == "":
        lines.pop()  # a final line break ends the last line; it does not start another
    return lines


def normalize_newlines(text: str) -> str:
    """`text` with every CRLF and lone CR made an LF: line numbers by counting LFs then agree with
    `split_lines`, and columns do not change."""
    return _LINE_BREAK.sub("\n", text) if "\r" in text else text


@dataclass(frozen=True)
class Diagnostic:
    message: str
    span: Span | None = None
    help: str | None = None  # e.g. "did you mean `causal`?" or "expected one of: ..."
    severity: str = "error"

    def render(self, source: str | None) -> str:
        """Render like a compiler; `source` is the full text of the span's file (or None)."""
        if self.span is None:
            head = f"{self.severity}: {self.message}"
            return head + (f"\n  = help: {self.help}" if self.help else "")
        sp = self.span
        out = [f"{sp.path}:{sp.line}:{sp.col}: {self.severity}: {self.message}"]
        lines = split_lines(source) if source is not None else []
        if 1 <= sp.line <= len(lines):
            text = lines[sp.line - 1].expandtabs(1).translate(_SHOWN_AS_BREAK)
            gutter = f"{sp.line:>4} | "
            out.append(gutter + text)
            width = (sp.end_col - sp.col) if sp.end_line == sp.line and sp.end_col > sp.col else 1
            width = max(1, min(width, max(1, len(text) - sp.col + 1)))
            out.append(" " * (len(gutter) - 2) + "| " + " " * (sp.col - 1) + "^" * width)
        if self.help:
            out.append(f"     = help: {self.help}")
        return "\n".join(out)


@dataclass
class SpecError(Exception):
    """One or more diagnostics against one source file, in source order."""

    diagnostics: list[Diagnostic]
    source: str | None = None
    path: str = "<string>"
    _sorted: bool = field(default=False, repr=False)

    def __post_init__(self) -> None:
        self.diagnostics = sorted(
            self.diagnostics,
            key=lambda d: (d.span.line, d.span.col) if d.span else (1 << 30, 0),
        )
        Exception.__init__(self, self.render())

    def render(self) -> str:
        return "\n".join(d.render(self.source) for d in self.diagnostics)

    def __str__(self) -> str:
        return self.render()
