#!/usr/bin/env python3
"""sha256 of everything attngen renders, for proving a refactor changes no output byte.

    python tools/render_hashes.py [--cli] [--arch sm_80 --arch sm_90a] [FILE_OR_DIR ...] > hashes.txt

For every variant of every `.attn` under examples/ and tests/ (or the paths given) and each arch
(sm_80 and sm_90a unless --arch is given), it runs the public commands
    attngen compile FILE --variant V --arch A --emit E -o -   (E: cu, header and any other textual
                                                              kind `attngen compile --help` lists;
                                                              any other option with choices, each)
    attngen check FILE --arch A                                    (summaries, or the spec errors)
    attngen explain FILE --variant V                               (once a variant)
and prints `sha256  file:variant:arch:what` lines, sorted, then a `# N outputs` count. A spec that
does not check clean contributes the hash of its error text, so diagnostics are compared too.

It uses only the command line's interface, so it runs unchanged before and after a move: in
process through whichever of attngen.tools.cli / attngen.cli exists (fast), or with --cli as
`python -m attngen` subprocesses (slow, the literal public path). Run from the repository root
with the tree to hash first on PYTHONPATH.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib
import io
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ARCHES = ("sm_80", "sm_90a")
HOST_TARGET = ("--target", "cpu")  # a backend without GPU arches


def _cli_main():
    for name in ("attngen.tools.cli", "attngen.cli"):
        try:
            return importlib.import_module(name).main
        except ModuleNotFoundError as e:
            if e.name not in (name, name.rpartition(".")[0]):
                raise
    raise SystemExit("render_hashes: no attngen command line found (attngen.tools.cli or attngen.cli)")


class Runner:
    def __init__(self, subprocesses: bool):
        self.sub = subprocesses
        self.main = None if subprocesses else _cli_main()

    def __call__(self, *argv: str) -> bytes:
        """rc, stdout and stderr of `attngen ARGV`, as one byte string."""
        if self.sub:
            env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
            p = subprocess.run([sys.executable, "-m", "attngen", *argv], cwd=ROOT, capture_output=True, env=env)
            return b"rc=%d\n" % p.returncode + p.stdout + b"\n--stderr--\n" + p.stderr
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = self.main(list(argv))
            except SystemExit as e:  # argparse
                rc = e.code if isinstance(e.code, int) else 1
        return (f"rc={rc}\n" + out.getvalue() + "\n--stderr--\n" + err.getvalue()).encode("utf-8")


def compile_choices(run: Runner) -> tuple[list[str], dict[str, list[str]]]:
    """From `attngen compile --help`: the textual --emit kinds, and any other option with choices
    (a kernel family or pass a later CLI may add), so new outputs are hashed without editing this."""
    import re

    text = run("compile", "--help").decode("utf-8", "replace")
    opts = {m[1]: m[2].split(",") for m in re.finditer(r"(--[\w-]+) \{([\w,.-]+)\}", text)}
    emits = [e for e in opts.pop("--emit", ["cu", "header"]) if e not in ("ptx", "cubin")]  # binaries need nvcc
    opts.pop("--arch", None)
    return emits, opts


def spec_files(paths: list[str]) -> list[str]:
    found: set[Path] = set()
    for p in paths or ["examples", "tests"]:
        q = ROOT / p
        found |= set(q.rglob("*.attn")) if q.is_dir() else {q}
    return sorted(str(f.relative_to(ROOT)) for f in found)


def variants(path: str) -> list[str] | None:
    import attngen

    try:
        return [v.name for v in attngen.load(ROOT / path).variants]
    except attngen.SpecError:
        return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("paths", nargs="*", help="files or folders (default: examples tests)")
    ap.add_argument("--arch", action="append", choices=["sm_80", "sm_86", "sm_89", "sm_90a"])
    ap.add_argument("--cli", action="store_true", help="python -m attngen subprocesses instead of in process")
    args = ap.parse_args(argv)
    os.chdir(ROOT)
    run = Runner(args.cli)
    arches = args.arch or list(ARCHES)
    lines: list[str] = []
    clean = bad = 0

    def add(key: str, data: bytes) -> None:
        lines.append(f"{hashlib.sha256(data).hexdigest()}  {key}")

    emits, extra = compile_choices(run)
    for f in spec_files(args.paths):
        names = variants(f)
        for a in arches:
            add(f"{f}::{a}:check", run("check", f, "--arch", a))
        if names is None:
            bad += 1
            continue
        clean += 1
        for v in names:
            add(f"{f}:{v}::explain", run("explain", f, "--variant", v))
            for a in arches:
                for e in emits:
                    add(f"{f}:{v}:{a}:{e}", run("compile", f, "--variant", v, "--arch", a, "--emit", e, "-o", "-"))
                for opt, choices in extra.items():
                    for c in choices:
                        if (opt, c) != HOST_TARGET:
                            add(f"{f}:{v}:{a}:cu{opt}={c}", run("compile", f, "--variant", v, "--arch", a, opt, c, "-o", "-"))
            if HOST_TARGET[1] in extra.get(HOST_TARGET[0], ()):
                # the CPU backend takes no --arch: its source and header once a variant
                for e in ("cu", "header"):
                    add(f"{f}:{v}:cpu:{e}", run("compile", f, "--variant", v, *HOST_TARGET, "--emit", e, "-o", "-"))
                for c in extra.get("--pass", ())[1:]:  # (the first is the default: the source above)
                    add(f"{f}:{v}:cpu:cu--pass={c}", run("compile", f, "--variant", v, *HOST_TARGET, "--pass", c, "-o", "-"))
    lines.sort(key=lambda s: s.split("  ", 1)[1])
    sys.stdout.write("\n".join(lines) + "\n")
    n_cu = sum(1 for s in lines if s.endswith(":cu"))
    print(f"# {len(lines)} outputs: {n_cu} .cu renders, {clean} specs clean, {bad} with spec errors, arches {' '.join(arches)}, "
          f"compile --emit {','.join(emits)}" + "".join(f", {o} {','.join(c)}" for o, c in extra.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
