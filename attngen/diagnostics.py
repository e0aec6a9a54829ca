"""Compiler-style diagnostics: `path:line:col: error: message`, the source line, a caret.

Every stage that rejects user input raises `SpecError` holding one or more `Diagnostic`s; the CLI
prints `SpecError.render()` and exits 1. No lark exception or traceback reaches a user.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from attngen.ir import Span


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
        lines = source.splitlines() if source is not None else []
        if 1 <= sp.line <= len(lines):
            text = lines[sp.line - 1].expandtabs(1)
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
