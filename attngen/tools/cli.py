"""The `attngen` command line: check, fmt, explain, compile, fuzz, bench.

Exit codes: 0 ok, 1 a spec error (rendered compiler-style on stderr), 2 a usage error (bad
arguments, a missing file, an unknown variant, a package that is not installed), 3 an internal error
(a bug: one line, no traceback unless ATTNGEN_TRACEBACK=1). A user error never
shows a Python traceback: every path that reads user input catches what it can raise.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from pathlib import Path
from typing import Callable, Sequence

from attngen import __version__

from attngen.tools.exit_codes import EXIT_INTERNAL, EXIT_OK, EXIT_SPEC, EXIT_USAGE
from attngen.tools.shape import SHAPE_HELP


class UsageError(Exception):
    """A usage problem the CLI reports in one line and exits 2 for."""


def _err(msg: str) -> None:
    print(f"attngen: error: {msg}", file=sys.stderr)


def _read(path: str) -> str:
    """The text of `path`, or a UsageError naming the path and what went wrong."""
    p = Path(path)
    if p.is_dir():
        raise UsageError(f"{path}: is a directory, expected a .attn file")
    try:
        return p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UsageError(f"{path}: no such file") from None
    except UnicodeDecodeError as e:
        raise UsageError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except OSError as e:
        raise UsageError(f"{path}: cannot read ({e.strerror or e})") from None


def _parse_arch(value: str | None):
    """The schedule.Arch for a `--arch` value (None: the default)."""
    from attngen.plan.schedule import DEFAULT_ARCH, Arch

    if value is None:
        return DEFAULT_ARCH
    for a in Arch:
        if value in (a.value, a.value.removeprefix("sm_"), a.name.lower()):
            return a
    choices = ", ".join(a.value for a in Arch)
    raise UsageError(f"unknown --arch {value!r}; choose one of: {choices}")


# --------------------------------------------------------------------------------------------
# check


def cmd_check(args: argparse.Namespace) -> int:
    """Validate each file; one summary line per variant (or, with --json, one JSON document on
    stdout); exit 1 if any file has errors."""
    from attngen.tools import explain, json_out

    arch = _parse_arch(args.arch)
    status = EXIT_OK
    files = []
    for path in args.files:
        text = _read(path)
        diagnostics, variants = _check_text(text, path, arch)
        if any(d.severity == "error" for d in diagnostics):
            status = EXIT_SPEC
        if args.json:
            files.append(json_out.check_file(path, diagnostics, variants, arch))
            continue
        for d in diagnostics:
            print(d.render(text), file=sys.stderr)
        for v in variants:
            print(f"{path}: ok: {explain.summary(v, arch)}")
    if args.json:
        sys.stdout.write(json_out.dump(json_out.document("check", arch, files=files)))
    return status


def _check_text(text: str, path: str, arch) -> tuple[list, list]:
    """(diagnostics in order, the variants that check out) of one file: its spec errors, or per
    variant a no-kernel error or a tile warning (a warned variant still checks out)."""
    from attngen.lang.diagnostics import Diagnostic, SpecError
    from attngen.plan import validate
    from attngen.plan.tile_advice import tile_warning

    try:
        # The plan stage checks tiles and limits against the target arch (after lowering).
        program = validate.loads(text, path, arch)
    except SpecError as e:
        return list(e.diagnostics), []
    diagnostics, ok = [], []
    from attngen.plan.decode import fp8_kv

    for v in program.variants:
        if v.quantized and not fp8_kv(v):  # an FP8 KV cache runs on the decode family
            # The language, the reference and the CPU backend run it; say where CUDA does not.
            from attngen.plan.quant_fwd import cuda_problem

            why = cuda_problem(v, arch)
            if why is not None:
                diagnostics.append(Diagnostic(f"`{v.name}` has no CUDA kernel yet", v.quants[0].span or v.span,
                                              why, severity="warning"))
            ok.append(v)
            continue
        why = _no_kernel(v)
        if why is not None:
            diagnostics.append(Diagnostic(f"variant `{v.name}` has no kernel: {why}", v.span,
                                          "the NumPy reference runs it; drop `kv_cache paged` to run it on the forward "
                                          "kernels with contiguous K/V"))
            continue
        warning = tile_warning(v, arch)
        if warning is not None:  # a valid tile, so still "ok" and exit 0
            diagnostics.append(warning)
        ok.append(v)
    return diagnostics, ok


def _no_kernel(v) -> str | None:
    """Why no kernel family can run `v`: a paged cache (decode family only) that the decode family
    cannot take (fp32, head dims other than 64, 128 and 256 with Dv == D, ...); None otherwise."""
    from attngen.plan import decode as plan_decode

    if plan_decode.forward_unsupported(v) is None:
        return None
    why = plan_decode.decode_unsupported(v)
    return None if why is None else f"`kv_cache paged` runs on the decode family, and {why}"


# --------------------------------------------------------------------------------------------
# fmt


def cmd_fmt(args: argparse.Namespace) -> int:
    """Print the canonical form; `--check` reports files that are not canonical; `--write` fixes."""
    from attngen.lang import frontend as fe
    from attngen.lang.diagnostics import SpecError

    if args.diff and args.write:
        raise UsageError("--diff shows what --write would change; give it with --check (or alone), not with --write")
    check = args.check or args.diff
    status = EXIT_OK
    unformatted: list[str] = []
    for path in args.files:
        text = _read(path)
        try:
            formatted = fe.format_source(text, path)
        except SpecError as e:
            print(e.render(), file=sys.stderr)
            status = EXIT_SPEC
            continue
        if check:
            if formatted != text:
                unformatted.append(path)
                print(f"{path}: not formatted (run `attngen fmt --write {path}`)", file=sys.stderr)
                if args.diff:
                    sys.stdout.writelines(_unified_diff(text, formatted, path))
            continue
        if args.write:
            if formatted != text:
                try:
                    Path(path).write_text(formatted, encoding="utf-8")
                except OSError as e:
                    raise UsageError(f"{path}: cannot write ({e.strerror or e})") from None
                print(f"{path}: reformatted", file=sys.stderr)
            continue
        sys.stdout.write(formatted)
    if unformatted and status == EXIT_OK:
        # --check is a lint: "would change" is the spec-level failure, exit 1.
        status = EXIT_SPEC
    return status


def _unified_diff(before: str, after: str, path: str) -> list[str]:
    """`fmt --check --diff`: what `fmt --write` would change, as a unified diff (a last line
    without a newline gets one, so the diff stays line-structured)."""
    import difflib

    a = before.splitlines(keepends=True)
    lines = list(difflib.unified_diff(a, after.splitlines(keepends=True), f"{path}", f"{path} (formatted)"))
    return [ln if ln.endswith("\n") else ln + "\n" for ln in lines]


# --------------------------------------------------------------------------------------------
# explain


def cmd_explain(args: argparse.Namespace) -> int:
    """Describe a variant in plain words (every variant of the file without --variant)."""
    from attngen.tools import explain
    from attngen.lang.diagnostics import SpecError
    from attngen.plan import validate

    from attngen.tools.shape import ShapeError, parse_shape

    arch = _parse_arch(args.arch)
    try:
        shape = parse_shape(args.shape) if args.shape is not None else None
    except ShapeError as e:
        raise UsageError(str(e)) from None
    text = _read(args.file)
    try:
        program = validate.loads(text, args.file, arch)
    except SpecError as e:
        if args.json:
            from attngen.tools import json_out

            diags = [json_out.diagnostic(d, args.file) for d in e.diagnostics]
            sys.stdout.write(json_out.dump(json_out.document("explain", arch, diagnostics=diags, variants=[])))
        else:
            print(e.render(), file=sys.stderr)
        return EXIT_SPEC
    try:
        variants = list(program.select(args.variant))
    except KeyError as e:
        raise UsageError(str(e.args[0]) if e.args else str(e)) from None
    for v in variants:
        if shape is not None:
            try:
                shape.check(v.name, v.kind.value == "self", v.heads, v.head_dim)
            except ShapeError as e:
                raise UsageError(str(e)) from None
    sizes = None if shape is None else (shape.B, shape.Lq, shape.Lk)
    chunks = [explain.explain(v, shape=sizes, arch=arch, seed=args.seed) for v in variants]
    if args.json:
        from attngen.tools import json_out

        at = sizes or explain.DEFAULT_SHAPE
        docs = [json_out.explain_variant(v, arch, at, c) for v, c in zip(variants, chunks)]
        sys.stdout.write(json_out.dump(json_out.document("explain", arch, diagnostics=[], variants=docs)))
        return EXIT_OK
    print("\n\n".join(chunks))
    return EXIT_OK


# --------------------------------------------------------------------------------------------
# compile / fuzz / bench: delegated to the modules that implement them


def _delegate(module: str, what: str) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        try:
            mod = importlib.import_module(module)  # lazily: `attngen check` never loads CuPy or hypothesis
        except ModuleNotFoundError as e:
            raise UsageError(_missing(e, f"`attngen {what}`")) from None
        rc = mod.main(args)
        return EXIT_OK if rc is None else int(rc)

    run.__doc__ = f"Run `attngen {what}` through {module}.main(args)."
    return run


cmd_compile = _delegate("attngen.tools.cmd_compile", "compile")
cmd_fuzz = _delegate("attngen.tools.cmd_fuzz", "fuzz")
cmd_bench = _delegate("attngen.tools.bench", "bench")


def _missing(e: ModuleNotFoundError, needed_by: str) -> str:
    """One line for a module that is not installed: the extra that brings it and its install line."""
    from attngen.runtime.extras import MissingExtra, extra_for_module, install_line

    if isinstance(e, MissingExtra):
        return str(e)
    extra = extra_for_module(e.name)
    how = f": {install_line(extra)}" if extra is not None else ""
    return f"{needed_by} needs a package that is not installed: {e.name}{how}"


# --------------------------------------------------------------------------------------------
# the parser


class _Parser(argparse.ArgumentParser):
    """argparse, but usage errors exit 2 with our one-line prefix and a hint (never a traceback)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)


ARCH_HELP = ("target GPU: sm_75, sm_80, sm_86, sm_89, sm_90 (Hopper, mma.sync), sm_90a (Hopper, wgmma; the default), "
             "sm_100 or sm_120")


def build_parser() -> argparse.ArgumentParser:
    """The argparse tree for every subcommand."""
    p = _Parser(
        prog="attngen",
        description="Compile declarative .attn attention specs into fused, verified CUDA kernels.",
        epilog="exit codes: 0 ok, 1 spec error, 2 usage error, 3 internal error (a bug)",
    )
    p.add_argument("--version", action="version", version=f"attngen {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    c = sub.add_parser("check", help="validate specs; print a summary line per variant")
    c.add_argument("files", nargs="+", metavar="FILE")
    c.add_argument("--arch", help=ARCH_HELP)
    c.add_argument("--json", action="store_true", help="one JSON document on stdout instead of text (docs/JSON.md)")
    c.set_defaults(func=cmd_check)

    f = sub.add_parser("fmt", help="print specs in canonical form")
    f.add_argument("files", nargs="+", metavar="FILE")
    g = f.add_mutually_exclusive_group()
    g.add_argument("--check", action="store_true", help="exit 1 if a file is not canonically formatted")
    g.add_argument("--write", "-w", action="store_true", help="rewrite files in place")
    f.add_argument("--diff", action="store_true", help="print a unified diff of what formatting would change (implies --check)")
    f.set_defaults(func=cmd_fmt)

    e = sub.add_parser("explain", help="describe in plain words what a spec computes and how")
    e.add_argument("file", metavar="FILE")
    e.add_argument("--variant", help="the variant to explain (default: every variant)")
    e.add_argument("--shape", help=f"sample sizes for shapes and mask density (default B=1,L=4096): {SHAPE_HELP}; "
                   "self attention with Lq < Lk shows a decode step")
    e.add_argument("--arch", help=ARCH_HELP)
    e.add_argument("--seed", type=int, default=0, help="seed of the random runtime inputs used for density")
    e.add_argument("--json", action="store_true", help="one JSON document on stdout instead of text (docs/JSON.md)")
    e.set_defaults(func=cmd_explain)

    from attngen.backend import BACKENDS

    k = sub.add_parser("compile", help="render CUDA (or CPU C++) for a variant (and build it)",
                       description="Render a variant's kernel source. --target cuda (default) writes CUDA for "
                       "--arch; --target cpu writes one self-contained C++17 file (FlashAttention on the CPU, OpenMP) "
                       "whose extern \"C\" NAME_cpu_launch(params) a C++ engine links with no CUDA; --emit header "
                       "writes either target's C header; --pass backward writes either target's backward source. --arch "
                       "and the GPU-only options (--family, --deterministic, --resources, --emit ptx/cubin) are refused "
                       "with --target cpu.")
    k.add_argument("file", metavar="FILE")
    k.add_argument("-o", "--output", help="output path (default: stdout)")
    k.add_argument("--variant", help="the variant to compile (needed when the file has several)")
    k.add_argument("--arch", help=ARCH_HELP + " (--target cuda only)")
    k.add_argument("--target", choices=list(BACKENDS), default="cuda",
                   help="cuda (default): a .cu for --arch; cpu: a .cpp for the host C++ compiler (no CUDA needed)")
    k.add_argument("--prefix", help="start every exported symbol with this C identifier instead of `attngen` "
                   "(link two variants, or two arches of one, into one binary)")
    k.add_argument("--emit", choices=["cu", "ptx", "cubin", "header"], default="cu",
                   help="what to write: cu (default) the source (.cu, or the .cpp with --target cpu), header the C header")
    k.add_argument("--resources", action="store_true", help="print ptxas registers, shared memory, spills")
    k.add_argument("--verbose", "-v", action="store_true", help="print compile times and cache use")
    k.add_argument("--family", choices=["auto", "forward", "decode"], default="auto",
                   help="kernel family: decode (split-KV, Lq up to ~16, paged caches) or forward; "
                   "auto (default): decode for a `kv_cache paged` variant, else forward")
    k.add_argument("--pass", dest="pass_", choices=["forward", "backward"], default="forward",
                   help="the forward kernel (default) or the backward kernels (dq, dk, dv)")
    k.add_argument("--deterministic", action="store_true", help="backward: dQ without float atomics (bitwise reproducible)")
    k.set_defaults(func=cmd_compile)

    z = sub.add_parser("fuzz", help="fuzz a kernel against the NumPy reference (or the compiler, --specs)")
    fuzz_arguments(z)
    z.set_defaults(func=cmd_fuzz)

    b = sub.add_parser("bench", help="time a kernel, side by side with torch peers when available")
    bench_arguments(b)
    b.set_defaults(func=cmd_bench)
    return p


def fuzz_arguments(z: argparse.ArgumentParser) -> None:
    """`attngen fuzz`'s arguments (their one definition: also attngen.tools.cmd_fuzz's own parser)."""
    z.add_argument("file", nargs="?", metavar="FILE", help="the spec whose kernels are fuzzed (or --specs)")
    z.add_argument("--variant", help="the variant to fuzz (default: every variant of FILE)")
    z.add_argument("--shape", default=None,
                   help=f"FILE: every case at these sizes (inputs, distributions and seeds still drawn): {SHAPE_HELP}; "
                   "for self attention Lq < Lk is a decode step; not for `layout varlen`")
    z.add_argument("--specs", action="store_true", help="fuzz the compiler with generated and mutated specs")
    z.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto",
                   help="where kernels run: cuda (the GPU), cpu (the CPU backend: needs a C++ compiler) or auto "
                   "(default: the GPU when one is usable, else the CPU backend)")
    z.add_argument("--reference-only", action="store_true",
                   help="run no kernel: check the front end and the reference only (without it, a run in which no "
                   "kernel ran exits 1)")
    z.add_argument("--max-examples", type=int, default=None,
                   help="examples a variant (--specs: generated specs; default 100 on a GPU, 30 otherwise; --specs 200 / 300)")
    z.add_argument("--seconds", type=float, default=None, help="stop after about this many seconds (shared by the variants)")
    z.add_argument("--seed", type=int, default=None, help="hypothesis seed (default: from the clock; printed at the start)")
    z.add_argument("--out", default=None, help="where failing cases are written (default fuzz-failures/)")
    z.add_argument("--nvcc", dest="nvcc", action="store_true", default=None,
                   help="--specs: compile every accepted spec with nvcc (sm_90a and sm_80); the default when nvcc is on the PATH")
    z.add_argument("--no-nvcc", dest="nvcc", action="store_false", help="--specs: skip the nvcc step")
    z.add_argument("--jobs", type=int, default=None, help="parallel nvcc compiles (default: the CPU count)")
    z.add_argument("--pass", dest="pass_", choices=["forward", "backward", "both"], default=None,
                   help="FILE: the forward kernel (default) or the backward kernels' gradients; --specs: both (default)")


def bench_arguments(b: argparse.ArgumentParser) -> None:
    """`attngen bench`'s arguments (their one definition: also attngen.tools.bench's own parser)."""
    from attngen.tools.bench_timing import MIN_REPEATS  # light: no NumPy, no CuPy

    b.add_argument("file", metavar="FILE")
    b.add_argument("--variant")
    b.add_argument("--shape", action="append", default=None, help=f"{SHAPE_HELP} (repeatable)")
    b.add_argument("--json", default=None, help="write results as JSON here")
    b.add_argument("--plot", default=None, help="write a TFLOP/s plot here (needs matplotlib)")
    b.add_argument("--peers", action=argparse.BooleanOptionalAction, default=True, help="time torch peers too")
    b.add_argument("--repeats", type=int, default=30, help=f"timed launches per implementation (>= {MIN_REPEATS})")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `attngen` console script; returns the exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help, --version, or a usage error already printed
        return int(e.code) if isinstance(e.code, int) else EXIT_USAGE
    try:
        return args.func(args)
    except UsageError as e:
        _err(str(e))
        return EXIT_USAGE
    except KeyboardInterrupt:
        _err("interrupted")
        return 130
    except BrokenPipeError:
        # `attngen explain x | head`: the reader went away; nothing to report.
        return EXIT_OK
    except Exception as e:
        from attngen.runtime.extras import extra_for_module

        if isinstance(e, ModuleNotFoundError) and extra_for_module(e.name) is not None:
            # An extra a command reached for only while it ran (CuPy at compile, torch for a peer).
            _err(_missing(e, f"`attngen {args.command}`"))
            return EXIT_USAGE
        # Whatever the input, the user sees one line, not a traceback; developers opt back in.
        if os.environ.get("ATTNGEN_TRACEBACK"):
            raise
        _err(f"internal error: {type(e).__name__}: {e} (a bug in attngen; set ATTNGEN_TRACEBACK=1 for details)")
        return EXIT_INTERNAL


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
