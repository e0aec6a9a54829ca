"""The shape of the house stays within its bars: no Python file of the attngen package over 800
lines, no function (or method) in it over 120 lines, no template under backends/ over 900 lines.
Read from the source (lines counted as the editor shows them, functions measured with ast from
their `def` line, decorators excluded, to their last line); nothing is imported but the package's
location. A file or function past its bar fails with its size, so a split is due where it grew."""

from __future__ import annotations

import ast
from pathlib import Path

import attngen

PKG = Path(attngen.__file__).resolve().parent
BACKENDS = PKG.parent / "backends"

MAX_FILE_LINES = 800
MAX_FUNCTION_LINES = 120
MAX_TEMPLATE_LINES = 900


def _lines(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def _python_files() -> list[Path]:
    return sorted(PKG.rglob("*.py"))


def long_functions(source: str, limit: int = MAX_FUNCTION_LINES) -> list[tuple[str, int]]:
    """(qualified name, lines) of every function or method in `source` longer than `limit` lines."""
    out: list[tuple[str, int]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    n = child.end_lineno - child.lineno + 1  # type: ignore[operator]
                    if n > limit:
                        out.append((name, n))
                visit(child, name + ".")
            else:
                visit(child, prefix)

    visit(ast.parse(source), "")
    return out


def test_the_scan_sees_the_package():
    files = _python_files()
    assert len(files) > 50 and PKG / "lang" / "lower.py" in files
    assert len(list(BACKENDS.rglob("*.j2"))) > 10


def test_no_python_file_over_the_bar():
    big = {str(p.relative_to(PKG.parent)): n for p in _python_files() if (n := _lines(p)) > MAX_FILE_LINES}
    assert not big, f"Python files over {MAX_FILE_LINES} lines (split them along a seam): {big}"


def test_no_function_over_the_bar():
    big = {f"{p.relative_to(PKG.parent)}:{name}": n for p in _python_files()
           for name, n in long_functions(p.read_text(encoding="utf-8"))}
    assert not big, f"functions over {MAX_FUNCTION_LINES} lines (split them into named steps): {big}"


def test_no_template_over_the_bar():
    big = {str(p.relative_to(BACKENDS.parent)): n for p in sorted(BACKENDS.rglob("*")) if p.is_file()
           and (n := _lines(p)) > MAX_TEMPLATE_LINES}
    assert not big, f"templates over {MAX_TEMPLATE_LINES} lines: {big}"


def test_the_function_measure_fails_a_long_function():
    """The measure itself: nested functions and methods count on their own, each from def to end."""
    body = "\n".join(f"    x{i} = {i}" for i in range(121))
    src = f"def ok():\n    pass\n\n\nclass C:\n    def long(self):\n{body.replace('    ', '        ')}\n\n\ndef outer():\n    def inner():\n{body.replace('    ', '        ')}\n"
    assert sorted(long_functions(src)) == [("C.long", 122), ("outer", 123), ("outer.inner", 122)]
    assert long_functions("def f():\n" + "\n".join(f"    x{i} = {i}" for i in range(119))) == []
