"""The attngen package's modules import each other without cycles. The import graph is built from
the source with ast (nothing is imported): `import a.b`, `from a import b` (b a module or a name in
a) and relative imports. Imports at module level are the graph's edges; imports inside a function
run late and are listed apart (a late import is how a cycle hides, so they are checked too, apart
from the allow-list's edges)."""

from __future__ import annotations

import ast
from pathlib import Path

import attngen

PKG = Path(attngen.__file__).resolve().parent

# Cycles still present, each listed as its sorted members (none: the runtime families' cycle
# went with the one binder). An entry that no longer occurs fails the test, so the list stays true.
ALLOWED_CYCLES: set[tuple[str, ...]] = set()


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PKG.rglob("*.py")):
        parts = path.relative_to(PKG.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_pkg: bool, known: set[str]) -> list[str]:
    """The attngen modules one import statement loads (by name; parent packages not counted)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name in known]
    if node.level:
        package = module if is_pkg else module.rsplit(".", 1)[0]
        for _ in range(node.level - 1):
            package = package.rsplit(".", 1)[0]
        base = f"{package}.{node.module}" if node.module else package
    else:
        base = node.module or ""
    out = []
    for a in node.names:
        if f"{base}.{a.name}" in known:  # `from pkg import submodule`
            out.append(f"{base}.{a.name}")
        elif base in known:
            out.append(base)
    return sorted(set(out))


def _type_checking_only(node: ast.AST) -> bool:
    """An `if TYPE_CHECKING:` block (plain or module-qualified) with no else: read by type checkers only."""
    if not isinstance(node, ast.If) or node.orelse:
        return False
    test = node.test
    name = test.attr if isinstance(test, ast.Attribute) else test.id if isinstance(test, ast.Name) else None
    return name == "TYPE_CHECKING"


def import_graph() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """(module-level edges, function-local edges) between attngen modules."""
    mods = _modules()
    known = set(mods)
    top: dict[str, set[str]] = {m: set() for m in mods}
    local: dict[str, set[str]] = {m: set() for m in mods}

    def visit(node: ast.AST, module: str, is_pkg: bool, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if _type_checking_only(child):
                continue  # `if TYPE_CHECKING:` imports never run
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                for t in _targets(child, module, is_pkg, known):
                    if t != module:
                        (local if in_function else top)[module].add(t)
            inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            visit(child, module, is_pkg, inner)

    for module, path in mods.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        visit(tree, module, path.name == "__init__.py", False)
    return top, local


def cycles(edges: dict[str, set[str]]) -> list[tuple[str, ...]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[tuple[str, ...]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(tuple(sorted(comp)))

    for v in sorted(edges):
        if v not in index:
            strong(v)
    return sorted(out)


def test_graph_sees_known_edges() -> None:
    # The walk must see what it is asked to judge: a top-level, a relative-free `from pkg import
    # module`, and a function-local import.
    top, local = import_graph()
    assert "attngen.ir.nodes" in top["attngen.cuda.emit"]
    assert "attngen.check.tolerance" in top["attngen.check.reference"]
    assert "attngen.backend" in local["attngen.check.fuzz"]


def test_cycle_finder_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [("a", "b", "c")]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_level_import_cycles() -> None:
    top, _ = import_graph()
    found = set(cycles(top))
    assert found <= ALLOWED_CYCLES, f"import cycles: {sorted(found - ALLOWED_CYCLES)}"


def test_no_cycles_through_late_imports() -> None:
    # A function-local import does not break a cycle, it defers it: a late import back into a
    # module that imports you is a cycle all the same.
    top, local = import_graph()
    both = {m: top[m] | local[m] for m in top}
    found = set(cycles(both))
    assert found <= ALLOWED_CYCLES, f"import cycles through function-local imports: {sorted(found - ALLOWED_CYCLES)}"


def test_allow_list_is_current() -> None:
    top, local = import_graph()
    stale = ALLOWED_CYCLES - set(cycles({m: top[m] | local[m] for m in top}))
    assert not stale, f"allowed cycles that no longer occur: {sorted(stale)}"


def test_check_imports_no_tools() -> None:
    top, local = import_graph()
    bad = sorted((m, t) for m in top if m.startswith("attngen.check")
                 for t in top[m] | local[m] if t.startswith("attngen.tools"))
    assert not bad, f"attngen.check imports attngen.tools: {bad}"


if __name__ == "__main__":
    t, loc = import_graph()
    print("module-level cycles:", cycles(t))
    print("cycles with function-local imports:", cycles({m: t[m] | loc[m] for m in t}))
