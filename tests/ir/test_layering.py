"""The front end imports no backend: attngen.lang and attngen.ir say what a spec means; what an
arch can run is the plan stage's (attngen.plan.validate). Checked on the source with ast, so a
late import inside a function counts as much as one at the top."""

from __future__ import annotations

import ast
from pathlib import Path

import attngen

PKG = Path(attngen.__file__).resolve().parent
FRONT = ("lang", "ir")
FORBIDDEN = ("attngen.plan", "attngen.cuda", "attngen.runtime", "attngen.check", "attngen.tools", "attngen.analysis",
             "backends")


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import in `path`, relative imports made absolute."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    package = "attngen." + ".".join(path.relative_to(PKG).with_suffix("").parts[:-1])
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                mod = f"{base}.{node.module}" if node.module else base
            else:
                mod = node.module or ""
            out.append((node.lineno, mod))
            out += [(node.lineno, f"{mod}.{a.name}") for a in node.names]
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module":
            if node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
                out.append((node.lineno, node.args[0].value))
    return out


def _violations(root: Path) -> list[str]:
    bad = []
    for sub in FRONT:
        for f in sorted((root / sub).rglob("*.py")):
            for line, mod in _imports(f):
                if any(mod == m or mod.startswith(m + ".") for m in FORBIDDEN):
                    bad.append(f"{f.relative_to(root)}:{line}: imports {mod}")
    return bad


def test_front_end_imports_no_backend():
    assert _violations(PKG) == []


def test_the_rule_catches_an_import(tmp_path):
    # The scan itself must be able to fail: a copy of ir/ with one backend import is caught,
    # whether the import is at the top, inside a function, relative, or through import_module.
    for sub in FRONT:
        (tmp_path / sub).mkdir()
    (tmp_path / "ir" / "ok.py").write_text("from attngen.ir.nodes import Span\n")
    (tmp_path / "ir" / "top.py").write_text("from attngen.plan.schedule import Arch\n")
    (tmp_path / "lang" / "late.py").write_text("def f():\n    import attngen.cuda.render\n")
    (tmp_path / "lang" / "rel.py").write_text("from ..plan import limits\n")
    (tmp_path / "lang" / "dyn.py").write_text("import importlib\nimportlib.import_module('attngen.runtime.kernel')\n")
    global PKG
    saved, PKG = PKG, tmp_path
    try:
        found = _violations(tmp_path)
    finally:
        PKG = saved
    assert {v.split(":")[0] for v in found} == {"ir/top.py", "lang/late.py", "lang/rel.py", "lang/dyn.py"}
