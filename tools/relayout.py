#!/usr/bin/env python3
"""Move attngen's flat modules and templates into the pipeline layout (issue 13, "The house").

    python tools/relayout.py [--dry-run] [--commit] [--map OLD=NEW ...]

Re-runnable: it moves only what is still at an old path, so a second run finds nothing to do and
changes nothing. Modules that the mapping names but the tree lacks are skipped; top-level modules
the mapping does not name are reported (map them with --map old=new.dotted and run again).

What one run does, in order:
1. `git mv attngen/OLD.py attngen/NEW/PATH.py` for every mapped module present (through a scratch
   folder, so an old module may share its name with a new package: runtime.py -> runtime/kernel.py);
   each new package gets an `__init__.py`.
2. A package that takes an old module's name (attngen.ir, attngen.runtime) forwards that module's
   public names lazily, so `attngen.runtime.NaNCheckError` keeps working. A moved module whose
   old path the README or docs document (`from attngen.workload import make_inputs`) keeps a
   thin alias module at the old path.
3. `git mv` of the templates: shared helpers to backends/cuda/common/, the forward kernel and its
   engines to backends/cuda/fwd/; includes and get_template names are rewritten to the new paths
   (the loader keeps backends/cuda as its root).
4. Rewrites every tracked .py/.sh/.toml/.md/.j2 file (and .ci/run): imports (`from attngen.x
   import`, `from attngen import x`, `import attngen.x`), dotted uses (`attngen.x.attr`, strings
   for importlib/monkeypatch/sys.modules, entry points, `-m attngen.x`), `attngen/x.py` paths,
   template paths, and `Path(__file__).parent...` chains in moved modules (one more `.parent`
   per level deeper).
5. pyproject.toml: the package list and the template folders the wheel carries.
6. With --commit: one commit, its message listing the mapping.
"""

from __future__ import annotations

import argparse
import ast
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "attngen"
TMP = PKG / "_relayout_tmp"

# old module (under attngen/) -> new dotted path (under attngen.). Entries whose file is absent are
# skipped, so modules other branches may add are listed beside today's.
MAPPING: dict[str, str] = {
    # lang: text -> AST -> semantic IR, and back to text
    "parse_attn": "lang.parse",
    "ast": "lang.ast",
    "lower": "lang.lower",
    "builtins": "lang.builtins",
    "printer": "lang.printer",
    "fmt": "lang.fmt",
    "diagnostics": "lang.diagnostics",
    "frontend": "lang.frontend",
    # ir: the semantic IR and the kernel ABI derived from it
    "ir": "ir.nodes",
    "abi": "ir.abi",
    # analysis: facts about expressions
    "intervals": "analysis.intervals",
    "derivative": "analysis.derivative",
    "density": "analysis.density",
    "roles": "analysis.roles",
    # plan: what runs (arch limits, engines, tiles, shared memory, OpPlan, family planners)
    "schedule": "plan.schedule",
    "limits": "plan.limits",
    "plan": "plan.op",  # were the OpPlan a module of its own: the package takes its name
    "op_plan": "plan.op",
    "opplan": "plan.op",
    "arch": "plan.arch",
    "plan_fwd": "plan.fwd",
    "plan_decode": "plan.decode",
    "plan_bwd": "plan.bwd",
    # cuda: IR -> CUDA C++, and C++ -> loadable code
    "lower_cuda": "cuda.emit",
    "render_cuda": "cuda.render",
    "render_decode": "cuda.render_decode",
    "render_bwd": "cuda.render_bwd",
    "compile_cuda": "cuda.compile",
    "header": "cuda.header",
    "launcher": "cuda.launcher",
    "cache": "cuda.cache",
    "nvcc_check": "cuda.nvcc_check",
    # runtime: arrays in, kernels launched
    "runtime": "runtime.kernel",
    "binder": "runtime.binder",
    "arrays": "runtime.arrays",
    "checks": "runtime.checks",
    "runtime_decode": "runtime.decode",
    "runtime_bwd": "runtime.bwd",
    "torch_op": "runtime.torch_op",
    "torch": "runtime.torch",
    "autograd": "runtime.autograd",
    "distributed": "runtime.distributed",
    # check: what a kernel is held against
    "reference": "check.reference",
    "tolerance": "check.tolerance",
    "workload": "check.workload",
    "flex": "check.flex",
    "fuzz": "check.fuzz",
    "reference_bwd": "check.reference_bwd",
    # tools: the commands
    "cli": "tools.cli",
    "explain": "tools.explain",
    "bench": "tools.bench",
    "cmd_compile": "tools.cmd_compile",
}

# Stay where they are: the package itself, `python -m attngen`, and the resource locator (it
# finds grammar/ and backends/ relative to the package root, for every stage).
KEEP = {"__init__", "__main__", "resources"}

# Old paths that stay importable as thin aliases even if no document names them.
PUBLIC_ALIASES = {"reference", "workload", "distributed"}

PACKAGE_DOCS = {
    "lang": "The language: .attn text -> AST -> semantic IR (parse, lower, builtins), printer, fmt, diagnostics.",
    "ir": "The semantic IR (frozen nodes) and the kernel ABI derived from it.",
    "analysis": "Facts about IR expressions: tile classification over intervals, score derivatives.",
    "plan": "What runs: arch limits, engines, tiles, shared memory; the plans of each kernel family.",
    "cuda": "The CUDA backend: IR -> C++ expressions, rendered kernels, NVRTC/nvcc compilation and cache.",
    "runtime": "Arrays in, kernels launched: argument binding, launches, and the front ends over them.",
    "check": "What kernels are held against: the NumPy reference, tolerances, workloads, FlexAttention, fuzzing.",
    "tools": "The commands: cli (`attngen ...`), explain, compile, bench.",
}

# templates under backends/cuda/ -> their folder. Shared: the language's integer semantics and
# fast math, runtime-input lookups, cp.async and the tensor-core primitives every family uses.
# Forward-only: the forward kernel and its three main loops (mma.sync, wgmma, FFMA).
TEMPLATES: dict[str, str] = {
    "_helpers.cu.j2": "common",
    "_lookups.cu.j2": "common",
    "_cp_async.cu.j2": "common",
    "_tc_helpers.cu.j2": "common",
    "_sink.cu.j2": "common",  # the sink epilogue, shared by the forward engines and the decode combine
    "checks.cu.j2": "common",  # the device input checks every family launches first
    "attention.cu.j2": "fwd",
    "_mma.cu.j2": "fwd",
    "_wgmma.cu.j2": "fwd",
    "_simt.cu.j2": "fwd",
}

ALIAS_MARK = "# relayout: alias of "
# Rewritten spellings are written with this in place of `attngen` and restored at the end, so that
# no pass rewrites what an earlier pass produced (attngen.ir -> attngen.ir.nodes, never .nodes.nodes).
NEW = "attngen\x01"
FORWARD_MARK = "# relayout: forwards "
# Not rewritten: this script, and the hash script, which must name both the old and the new paths.
SELF = {"tools/relayout.py", "tools/render_hashes.py"}
TEXT_SUFFIXES = {".py", ".sh", ".toml", ".md", ".j2", ".txt", ".cfg", ".ini", ".yml", ".yaml"}


def git(*args: str, check: bool = True) -> str:
    p = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
    if check and p.returncode != 0:
        sys.exit(f"git {' '.join(args)} failed:\n{p.stderr}")
    return p.stdout


def is_alias(path: Path) -> bool:
    try:
        return ALIAS_MARK in path.read_text(encoding="utf-8")
    except OSError:
        return False


# ----------------------------------------------------------------------------------------------
# the plan of the move


def plan_moves(mapping: dict[str, str]) -> tuple[dict[str, str], list[str]]:
    """(old -> new for the modules still at their old path, top-level modules nobody mapped)."""
    moves = {}
    for old, new in mapping.items():
        f = PKG / f"{old}.py"
        if f.is_file() and not is_alias(f):
            moves[old] = new
    unmapped = []
    for f in sorted(PKG.glob("*.py")):
        name = f.stem
        if name in KEEP or name in mapping or is_alias(f):
            continue
        unmapped.append(name)
    return moves, unmapped


def plan_templates() -> tuple[dict[str, str], list[str]]:
    tdir = ROOT / "backends" / "cuda"
    moves = {n: f"{d}/{n}" for n, d in TEMPLATES.items() if (tdir / n).is_file()}
    unmapped = [p.name for p in sorted(tdir.glob("*.j2")) if p.name not in TEMPLATES]
    unmapped += [p.name for p in sorted(tdir.glob("*.cuh"))]
    return moves, unmapped


def documented_aliases(moves: dict[str, str]) -> set[str]:
    """Moved modules that README/docs import by their old path, and whose old name is no package."""
    packages = {new.split(".")[0] for new in moves.values()}
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    text = "\n".join(p.read_text(encoding="utf-8") for p in docs if p.is_file())
    found = set(re.findall(r"(?<![\w.])attngen\.(\w+)", text))
    found |= {m for line in re.findall(r"from attngen import ([\w, ]+)", text) for m in re.split(r"[,\s]+", line)}
    names = (found | PUBLIC_ALIASES) & set(moves)
    return {n for n in names if n not in packages}


# ----------------------------------------------------------------------------------------------
# text rewriting


def _split_dotted(new: str) -> tuple[str, str]:
    parent, _, leaf = new.rpartition(".")
    return parent, leaf


class Rewriter:
    def __init__(self, moves: dict[str, str], keep_public: set[str], template_moves: dict[str, str]):
        self.moves = moves
        self.keep_public = keep_public  # old names that stay valid as attngen.NAME (aliases)
        self.tmoves = template_moves
        names = "|".join(sorted(map(re.escape, moves), key=len, reverse=True)) or r"(?!x)x"
        self.names = names
        self.tok = re.compile(r"(?<![\w.])attngen(\\?\.)(" + names + r")(?![\w])")
        self.quoted = re.compile(r"""(?P<q>["'])attngen\.(?P<m>""" + names + r""")(?P<rest>(?:[.:][\w.:]*)?)(?P=q)""")
        self.from_pkg = re.compile(
            r"^(?P<ind>[ \t]*)from attngen import (?P<body>\([^)]*\)|[^\n#]*?)(?P<tail>[ \t]*(?:#[^\n]*)?)$", re.M)
        self.from_inline = re.compile(r"(?<![\w.])from attngen import (\w+(?: as \w+)?(?:, *\w+(?: as \w+)?)*)")
        self.imp_line = re.compile(r"^(?P<ind>[ \t]*)(?P<kw>from|import)[ \t]+attngen\.(?P<m>" + names + r")(?![\w])", re.M)
        self.path = re.compile(r"(?<![\w.])attngen/(" + names + r")\.py\b")
        self.dash_m = re.compile(r"(-m[ \t]+)attngen\.(" + names + r")(?![\w])")
        if template_moves:
            tn = "|".join(map(re.escape, template_moves))
            self.tquoted = re.compile(r"""(?P<q>["'])(?P<n>""" + tn + r""")(?P=q)""")
            self.tpath = re.compile(r"backends/cuda/(" + tn + r")\b")
        else:
            self.tquoted = self.tpath = None

    # -- python-ish files --
    def _from_pkg(self, m: re.Match) -> str:
        ind, body, tail = m["ind"], m["body"], m["tail"]
        inner = body[1:-1] if body.startswith("(") else body
        inner = re.sub(r"#[^\n]*", "", inner)
        items = [s.strip() for s in inner.replace("\n", " ").split(",") if s.strip()]
        if not any(it.split()[0] in self.moves for it in items):
            return m.group(0)
        keep: list[str] = []
        groups: dict[str, list[str]] = {}
        for it in items:
            parts = it.split()
            name = parts[0]
            alias = parts[2] if len(parts) == 3 and parts[1] == "as" else None
            if name not in self.moves:
                keep.append(it)
                continue
            parent, leaf = _split_dotted(self.moves[name])
            local = alias or name
            groups.setdefault(parent, []).append(leaf if leaf == local else f"{leaf} as {local}")
        lines = []
        if keep:
            lines.append(f"{ind}from {NEW} import {', '.join(keep)}")
        for parent, names in groups.items():
            lines.append(f"{ind}from {NEW}.{parent} import {', '.join(names)}")
        if tail.strip():  # a trailing comment (# noqa: E402) holds for every line of the split
            lines = [ln + tail for ln in lines]
        return "\n".join(lines)

    def _from_inline(self, m: re.Match) -> str:
        """`from attngen import a, b` inside a line (a `python -c` string): statements joined by `; `."""
        items = [it.strip() for it in m[1].split(",")]
        if not any(it.split()[0] in self.moves for it in items):
            return m.group(0)
        keep, out = [], []
        for it in items:
            parts = it.split()
            if parts[0] not in self.moves:
                keep.append(it)
                continue
            parent, leaf = _split_dotted(self.moves[parts[0]])
            local = parts[2] if len(parts) == 3 else parts[0]
            out.append(f"from {NEW}.{parent} import " + (leaf if leaf == local else f"{leaf} as {local}"))
        if keep:
            out.insert(0, f"from {NEW} import {', '.join(keep)}")
        return "; ".join(out)

    def python(self, text: str) -> str:
        text = self.from_pkg.sub(self._from_pkg, text)
        text = self.from_inline.sub(self._from_inline, text)
        # import lines: every mapped name, public ones included (imports name real modules)
        text = self.imp_line.sub(lambda m: f"{m['ind']}{m['kw']} {NEW}.{self.moves[m['m']]}", text)
        # strings that are a dotted module path: importlib, monkeypatch, sys.modules, entry points
        text = self.quoted.sub(lambda m: f"{m['q']}{NEW}.{self.moves[m['m']]}{m['rest']}{m['q']}", text)
        text = self.dash_m.sub(lambda m: f"{m[1]}{NEW}.{self.moves[m[2]]}", text)
        # other dotted uses (code, docstrings, comments, regexes with \.); names that stay valid at
        # the top level (aliases) are left as written
        def tok(m: re.Match) -> str:
            if m[2] in self.keep_public:
                return m.group(0)
            sep = m[1]
            return NEW + sep + sep.join(self.moves[m[2]].split("."))
        text = self.tok.sub(tok, text)
        return self.common(text).replace(NEW, "attngen")

    def docs(self, text: str) -> str:
        # prose keeps the public spellings; commands and file paths follow the move
        text = self.dash_m.sub(lambda m: f"{m[1]}{NEW}.{self.moves[m[2]]}", text)
        return self.common(text).replace(NEW, "attngen")

    def common(self, text: str) -> str:
        text = self.path.sub(lambda m: NEW + "/" + self.moves[m[1]].replace(".", "/") + ".py", text)
        if self.tpath is not None:
            text = self.tpath.sub(lambda m: "backends/cuda/" + self.tmoves[m[1]], text)
        return text.replace(NEW, "attngen")

    def template_names(self, text: str) -> str:
        if self.tquoted is None:
            return text
        return self.tquoted.sub(lambda m: f"{m['q']}{self.tmoves[m['n']]}{m['q']}", text)


_PARENTS = re.compile(r"(Path\(__file__\)(?:\.resolve\(\))?)((?:\.parent)+)|(Path\(__file__\)(?:\.resolve\(\))?\.parents\[)(\d+)\]")


def deepen(text: str, delta: int, where: str, notes: list[str]) -> str:
    """A module moved `delta` levels deeper: repository-relative `__file__` chains get longer."""
    def sub(m: re.Match) -> str:
        if m[1] is not None:
            n = m[2].count(".parent")
            if n < 2:
                notes.append(f"{where}: `{m.group(0)}` names the module's own folder; check what it reads there")
                return m.group(0)
            return m[1] + ".parent" * (n + delta)
        n = int(m[4])
        if n < 1:
            notes.append(f"{where}: `{m.group(0)}]` names the module's own folder; check what it reads there")
            return m.group(0)
        return f"{m[3]}{n + delta}]"
    out = _PARENTS.sub(sub, text)
    for pat in (r"os\.path\.dirname\([^)]*__file__", r"\.\./"):
        if re.search(pat, out):
            notes.append(f"{where}: a `{pat}` path next to __file__ may need one more level; check it")
    return out


# ----------------------------------------------------------------------------------------------
# generated files


def public_names(path: Path) -> list[str]:
    """Top-level public names a module defines (defs, classes, assignments; not its imports)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out: list[str] = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.append(node.name)
        elif isinstance(node, ast.Assign):
            out += [t.id for t in node.targets if isinstance(t, ast.Name)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out.append(node.target.id)
    return sorted({n for n in out if not n.startswith("_")})


def package_init(pkg: str, forward_module: str | None, names: list[str]) -> str:
    doc = PACKAGE_DOCS.get(pkg, f"attngen.{pkg}.")
    if forward_module is None:
        return f'"""{doc}"""\n'
    lines = ",\n".join(f'    "{n}"' for n in names)
    return (
        f'"""{doc}\n\n'
        f"`attngen.{pkg}` was one module; its public names still resolve here (lazily, so importing a\n"
        f'sibling does not load attngen.{forward_module}).\n"""\n\n'
        f"{FORWARD_MARK}attngen.{forward_module}\n"
        "from __future__ import annotations\n\n"
        "import importlib\n"
        "from typing import Any\n\n"
        f"_FORWARDED = frozenset((\n{lines},\n))\n\n\n"
        "def __getattr__(name: str) -> Any:\n"
        "    if name not in _FORWARDED:\n"
        f"        raise AttributeError(f\"module 'attngen.{pkg}' has no attribute {{name!r}}\")\n"
        f'    return getattr(importlib.import_module("attngen.{forward_module}"), name)\n'
    )


def alias_module(old: str, new: str) -> str:
    parent, leaf = _split_dotted(new)
    return (
        f'"""`attngen.{old}`, the path the documentation uses; the module is `attngen.{new}`."""\n\n'
        f"{ALIAS_MARK}attngen.{new}\n"
        "import sys\n\n"
        f"from attngen.{parent} import {leaf} as _module\n\n"
        "sys.modules[__name__] = _module\n"
    )


def add_lazy_names(aliases: set[str], moves: dict[str, str], notes: list[str]) -> None:
    """`import attngen; attngen.workload...` keeps working: the aliases join attngen's lazy names."""
    init = PKG / "__init__.py"
    text = init.read_text(encoding="utf-8")
    m = re.search(r"^_LAZY\b[^=]*= \{\n(.*?)^\}", text, re.M | re.S)
    if m is None:
        notes.append(f"attngen/__init__.py: no `_LAZY = {{...}}` table; make {sorted(aliases)} reachable as attributes by hand")
        return
    entries = "".join(f'    "{a}": ("attngen.{moves[a]}", None),\n' for a in sorted(aliases)
                      if not re.search(rf'^\s*"{a}"\s*:', m[1], re.M))
    if entries:
        init.write_text(text[: m.end(1)] + entries + text[m.end(1):], encoding="utf-8")


def update_pyproject(text: str, packages: list[str], template_dirs: list[str], notes: list[str]) -> str:
    m = re.search(r"^packages = \[([^\]]*)\]", text, re.M)
    if m is None:
        notes.append("pyproject.toml: no `packages = [...]` line; add the new packages by hand: " + ", ".join(packages))
    else:
        have = re.findall(r'"([^"]+)"', m[1])
        want = list(have)
        for p in packages:
            if p not in want:
                want.append(p)
        extras = [p for p in want if not p.startswith("attngen.backends.cuda.")]
        tpk = [f"attngen.backends.cuda.{d}" for d in template_dirs]
        want = extras + [p for p in tpk if p not in extras]
        if want != have:
            text = text[: m.start()] + "packages = [" + ", ".join(f'"{p}"' for p in want) + "]" + text[m.end():]
    for d in template_dirs:
        key = f'"attngen.backends.cuda.{d}"'
        if key + " = " not in text:
            m2 = re.search(r'^"attngen\.backends\.cuda" = \[[^\]]*\]\n', text, re.M)
            if m2 is None:
                notes.append(f"pyproject.toml: add package-data for attngen.backends.cuda.{d} by hand")
                continue
            text = text[: m2.end()] + f'{key} = ["*.cu.j2", "*.cuh"]\n' + text[m2.end():]
    return text


# ----------------------------------------------------------------------------------------------


def tracked_text_files() -> list[Path]:
    out = []
    for rel in git("ls-files", "-z").split("\0"):
        if not rel:
            continue
        p = ROOT / rel
        if not p.is_file() or rel in SELF:
            continue
        if p.suffix in TEXT_SUFFIXES or rel in (".ci/run",) or p.name.endswith(".cu.j2"):
            out.append(p)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dry-run", action="store_true", help="print the plan, change nothing")
    ap.add_argument("--commit", action="store_true", help="commit the result (one commit)")
    ap.add_argument("--map", action="append", default=[], metavar="OLD=NEW",
                    help="add or override a mapping entry, e.g. --map plan=plan.op")
    args = ap.parse_args(argv)

    mapping = dict(MAPPING)
    for item in args.map:
        old, _, new = item.partition("=")
        if not old or not new:
            ap.error(f"--map {item!r}: want OLD=NEW (e.g. plan=plan.op)")
        mapping[old.strip()] = new.strip()

    if git("status", "--porcelain", "--untracked-files=no").strip() and not args.dry_run:
        sys.exit("relayout: the work tree has uncommitted changes to tracked files; commit or stash them first")

    moves, unmapped = plan_moves(mapping)
    tmoves, tunmapped = plan_templates()
    notes: list[str] = []
    for name in unmapped:
        notes.append(f"UNMAPPED module attngen/{name}.py stays where it is (its imports are rewritten); "
                     f"map it with --map {name}=PACKAGE.{name}")
    for name in tunmapped:
        notes.append(f"UNMAPPED template backends/cuda/{name} stays where it is (its includes are rewritten)")
    new_packages = {new.split(".")[0] for new in moves.values()}
    clash = [f"{o} -> {n}" for o, n in moves.items() if "." not in n]
    if clash:
        sys.exit(f"relayout: every new path must be PACKAGE.MODULE: {clash}")
    for name in unmapped:
        if name in new_packages:
            sys.exit(f"relayout: attngen/{name}.py is unmapped but a new package takes its name; map it (--map {name}=...)")
    targets = {}
    for o, n in moves.items():
        if n in targets:
            sys.exit(f"relayout: {targets[n]} and {o} both map to {n}")
        targets[n] = o

    aliases = documented_aliases(moves)
    print("modules:")
    for o, n in moves.items():
        print(f"  attngen/{o}.py -> attngen/{n.replace('.', '/')}.py" + ("   (alias kept at the old path)" if o in aliases else ""))
    print("templates:")
    for o, n in tmoves.items():
        print(f"  backends/cuda/{o} -> backends/cuda/{n}")
    if not moves and not tmoves:
        print("  nothing to move: the layout is already in place")
    if args.dry_run:
        for n in notes:
            print("note:", n)
        return 0

    # 1. modules, through a scratch folder (an old module may share its name with a new package)
    forward_names: dict[str, tuple[str, list[str]]] = {}
    for old, new in moves.items():
        if new.split(".")[0] == old:
            forward_names[old] = (new, public_names(PKG / f"{old}.py"))
    if moves:
        TMP.mkdir(exist_ok=True)
        for old in moves:
            git("mv", f"attngen/{old}.py", f"attngen/_relayout_tmp/{old}.py")
        for old, new in moves.items():
            dst = PKG / (new.replace(".", "/") + ".py")
            dst.parent.mkdir(parents=True, exist_ok=True)
            git("mv", f"attngen/_relayout_tmp/{old}.py", str(dst.relative_to(ROOT)))
        TMP.rmdir()
    for pkg in sorted(new_packages):
        init = PKG / pkg / "__init__.py"
        if pkg in forward_names:
            init.write_text(package_init(pkg, *forward_names[pkg]), encoding="utf-8")
        elif not init.exists():
            init.write_text(package_init(pkg, None, []), encoding="utf-8")
    for old in sorted(aliases):
        (PKG / f"{old}.py").write_text(alias_module(old, moves[old]), encoding="utf-8")

    # 2. templates
    for name, new in tmoves.items():
        (ROOT / "backends" / "cuda" / new).parent.mkdir(exist_ok=True)
        git("mv", f"backends/cuda/{name}", f"backends/cuda/{new}")

    # 3. text
    git("add", "-A", "attngen", "backends")
    rw = Rewriter(moves, aliases, tmoves)
    moved_files = {PKG / (n.replace(".", "/") + ".py"): n.count(".") for n in moves.values()}
    changed = 0
    for p in tracked_text_files():
        rel = str(p.relative_to(ROOT))
        try:
            text = p.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        if rel.startswith("attngen/") and (ALIAS_MARK in text or FORWARD_MARK in text):
            continue
        if p.suffix == ".md":
            out = rw.docs(text)
        elif p.name.endswith(".j2"):
            out = rw.common(rw.template_names(text))
        elif p.suffix in (".py", ".sh", ".toml") or rel == ".ci/run":
            out = rw.python(text)
            if p.suffix == ".py":
                out = rw.template_names(out)
        else:
            out = rw.common(text)
        if p in moved_files:
            out = deepen(out, moved_files[p], rel, notes)
        if p.suffix == ".py" and rel.startswith("attngen/") and re.search(r"^\s*from \.", out, re.M):
            notes.append(f"{rel}: relative imports; check they still resolve after the move")
        for m in re.finditer(r"""["']attngen\.\{""", out):
            notes.append(f"{rel}: builds a module name at run time ({out[m.start():m.start() + 40]!r}); check it")
        if out != text:
            p.write_text(out, encoding="utf-8")
            changed += 1

    # after the rewrite, which must not see new spellings (attngen.plan.x, were plan.py mapped)
    if aliases:
        add_lazy_names(aliases, moves, notes)

    # 4. pyproject: packages and template folders
    pp = ROOT / "pyproject.toml"
    if pp.is_file():
        pkgs = sorted("attngen." + str(d.relative_to(PKG)).replace("/", ".")
                      for d in PKG.rglob("*") if d.is_dir() and (d / "__init__.py").is_file())
        tdirs = sorted(d.name for d in (ROOT / "backends" / "cuda").iterdir()
                       if d.is_dir() and (any(d.glob("*.j2")) or any(d.glob("*.cuh"))))
        text = pp.read_text(encoding="utf-8")
        out = update_pyproject(text, pkgs, tdirs, notes)
        if out != text:
            pp.write_text(out, encoding="utf-8")
            changed += 1
    print(f"rewrote {changed} files")
    for n in notes:
        print("note:", n)

    if args.commit and (moves or tmoves or changed):
        git("add", "-A", "attngen", "backends")
        git("add", "-u")
        lines = [f"attngen/{o}.py -> attngen/{n.replace('.', '/')}.py" for o, n in moves.items()]
        lines += [f"backends/cuda/{o} -> backends/cuda/{n}" for o, n in tmoves.items()]
        lines += [f"alias kept: attngen/{o}.py (documented path)" for o in sorted(aliases)]
        msg = ("Layout: modules into lang/ ir/ analysis/ plan/ cuda/ runtime/ check/ tools/, templates into "
               "backends/cuda/common/ and fwd/ (made by tools/relayout.py; renders byte-identical)\n\n" + "\n".join(lines) + "\n")
        git("commit", "-q", "-m", msg)
        print("committed:", git("rev-parse", "--short", "HEAD").strip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
