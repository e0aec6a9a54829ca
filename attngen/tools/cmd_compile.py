"""`attngen compile`: a spec file → CUDA source, a C header, PTX or a cubin (and a resource table).

    attngen compile FILE [-o OUT] [--variant NAME] [--arch ARCH] [--prefix NAME]
                         [--emit cu|ptx|cubin|header] [--family auto|forward|decode]
                         [--pass forward|backward] [--resources] [--verbose]
    attngen compile FILE --target cpu [-o OUT] [--variant NAME] [--prefix NAME] [--emit cu|header] [--pass forward|backward]

`--target cpu` writes the CPU backend's self-contained C++17 file (`attngen.cpu.render`; `--emit
cu`, the default, is the target's source) or its C header; the GPU options are refused with it.
`--pass backward` with it writes the CPU backward's C++17 file (`attngen.cpu.render_bwd`).

`cu` (the default) is the self-contained `.cu` (kernel + `extern "C"` host launcher); `header` is a
plain C header declaring the launcher's parameter struct and prototype for a C++ engine; `ptx` and
`cubin` run nvcc. Without `-o` (or with `-o -`) the result goes to stdout (not for `cubin`).
`--resources` runs ptxas and prints a table (registers, spills, stack, static and dynamic shared
memory) to stdout, or to stderr when the artifact itself goes to stdout. `--verbose` prints stage
timings to stderr. `--prefix NAME` starts every exported symbol with NAME instead of `attngen`
(NAME_variant, NAME_variant_launch, ...), so that two variants, or one variant built for two
arches, link into one binary. `--family decode` emits the split-KV decode family (kernel, combine
kernel, workspace and split-policy functions, launcher); `auto`, the default, picks it for a
`kv_cache paged` variant and the forward family otherwise.

Exit codes (as for every subcommand): 0 ok; 1 a spec error, or a tile that does not fit the chosen
arch; 2 a usage error (unknown arch or variant, several variants and no --variant, an unwritable
output path, nvcc missing); 3 nvcc rejected the generated source (a bug in attngen). Never a
traceback. `compile_cuda` stays a pure compile stage; this module is only the command.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import time
from pathlib import Path

from attngen.cuda.header import render_decode_header, render_header  # (render_header: public here too)
from attngen.tools.exit_codes import EXIT_INTERNAL, EXIT_OK, EXIT_SPEC, EXIT_USAGE


class _Usage(Exception):
    pass


# --------------------------------------------------------------------------------------------
# resources


def resource_table(res, kp) -> str:
    """ptxas's figures per kernel plus the plan's dynamic shared memory, as aligned columns."""
    head = ("kernel", "arch", "regs", "spill st", "spill ld", "stack", "static smem", "dyn smem", "threads")
    from attngen.cuda.render import PREP_THREADS

    rows = [
        (r.kernel, kp.arch.value, str(r.registers), str(r.spill_stores), str(r.spill_loads), str(r.stack_bytes), str(r.static_smem),
         str(kp.smem_bytes if r.kernel == kp.kernel_name else 0), str(kp.threads if r.kernel == kp.kernel_name else PREP_THREADS))
        for r in res
    ]
    widths = [max(len(x) for x in col) for col in zip(head, *rows)]
    fmt = lambda row: "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))  # noqa: E731
    out = [fmt(head)] + [fmt(r) for r in rows]
    if not rows:
        out.append("(ptxas reported no kernels)")
    budget = kp.arch.smem_budget
    out.append(f"dynamic shared memory {kp.smem_bytes} of {budget} bytes available on {kp.arch.value}; "
               f"tile {kp.tile.block_m}x{kp.tile.block_n}, {kp.tile.warps} warps, {kp.tile.stages} stages")
    return "\n".join(out) + "\n"


def _decode_resource_table(res, op) -> str:
    """ptxas's figures for the decode family's two kernels."""
    from attngen.plan.decode import COMBINE_THREADS

    dp = op.split
    head = ("kernel", "arch", "regs", "spill st", "spill ld", "stack", "static smem", "dyn smem", "threads")
    main = lambda r: r.kernel == op.kernel_name  # noqa: E731
    rows = [(r.kernel, op.arch.value, str(r.registers), str(r.spill_stores), str(r.spill_loads), str(r.stack_bytes),
             str(r.static_smem), str(op.smem_bytes if main(r) else 0), str(op.threads if main(r) else COMBINE_THREADS))
            for r in res]
    widths = [max(len(x) for x in col) for col in zip(head, *rows)]
    fmt = lambda row: "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))  # noqa: E731
    out = [fmt(head)] + [fmt(r) for r in rows]
    out.append(f"decode family: {dp.block_m} packed query rows a CTA, {dp.block_n} keys a warp a chunk, "
               f"{dp.warps} warps, {dp.stages} stages; dynamic shared memory {op.smem_bytes} bytes")
    return "\n".join(out) + "\n"


def _render_backward(v, arch, text: str, path: str, deterministic: bool, emit: str, prefix: str):
    """`--pass backward`: the backward kernels' source and plan; a construct they do not support
    yet is a located spec error (never silently wrong code)."""
    from attngen.plan import bwd as plan_bwd
    from attngen.cuda import render_bwd
    from attngen.lang.diagnostics import SpecError

    if emit == "header":
        raise _Usage("--emit header is for the forward pass; the backward's Params are in the .cu's header comment")
    bad = plan_bwd.unsupported(v)
    if bad:
        raise SpecError(bad, text, path)
    return render_bwd.render_with_plan(v, arch, deterministic=deterministic, prefix=prefix)


def _bwd_resource_table(res, op) -> str:
    """ptxas's figures for the backward kernels, with each kernel's dynamic shared memory."""
    by_name = {k.name: k for k in op.kernels}
    bp = op.backward
    head = ("kernel", "arch", "regs", "spill st", "spill ld", "stack", "dyn smem", "threads")
    rows = [(r.kernel, op.arch.value, str(r.registers), str(r.spill_stores), str(r.spill_loads), str(r.stack_bytes),
             str(by_name[r.kernel].smem.bytes if r.kernel in by_name else 0), str(by_name[r.kernel].threads if r.kernel in by_name else 0))
            for r in res]
    widths = [max(len(x) for x in col) for col in zip(head, *rows)]
    fmt = lambda row: "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))  # noqa: E731
    tc = f"; tensor-core dK/dV tile {bp.tc_block_m}x{bp.tc_block_n} (mma.sync)" if bp.tc_block_n else ""
    return "\n".join([fmt(head)] + [fmt(r) for r in rows]) + f"\nbackward tile {bp.block_m}x{bp.block_n}{tc}\n"


# --------------------------------------------------------------------------------------------
# the command


def _check_output(path: str | None) -> None:
    """Fail early (before nvcc) on an output path that cannot be written."""
    if path is None or path == "-":
        return
    p = Path(path)
    if p.is_dir():
        raise _Usage(f"{path}: is a directory; -o takes a file path")
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        raise _Usage(f"{path}: cannot write: directory {str(parent)!r} does not exist")
    if not os.access(parent, os.W_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise _Usage(f"{path}: cannot write: permission denied")


def _write(path: str | None, data: bytes) -> None:
    if path is None or path == "-":
        buf = getattr(sys.stdout, "buffer", None)
        if buf is not None:
            sys.stdout.flush()
            buf.write(data)
            buf.flush()
        else:  # a text-only stream (e.g. a test's capture)
            sys.stdout.write(data.decode("utf-8"))
        return
    try:
        Path(path).write_bytes(data)
    except OSError as e:
        raise _Usage(f"{path}: cannot write ({e.strerror or e})") from None


def _need_nvcc(what: str) -> None:
    if shutil.which("nvcc") is None:
        raise _Usage(f"{what} needs nvcc, which is not on the PATH (install the CUDA toolkit, or use --emit cu and build elsewhere)")


def _prefix(args: argparse.Namespace) -> str:
    """`--prefix`, a C identifier ("attngen" by default: render_cuda.DEFAULT_PREFIX, without importing jinja2 yet)."""
    prefix = getattr(args, "prefix", None) or "attngen"
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", prefix):
        raise _Usage(f"--prefix {prefix!r} is not a C identifier (letters, digits and _, not starting with a digit)")
    return prefix


def _pick_variant(program, name: str | None, path: str):
    """The variant `--variant` names, or the file's only one."""
    if name is None and len(program.variants) != 1:
        names = ", ".join(v.name for v in program.variants)
        raise _Usage(f"{path} defines {len(program.variants)} variants ({names}); pick one with --variant NAME")
    try:
        return program.get(name)
    except KeyError as e:
        raise _Usage(str(e.args[0]) if e.args else str(e)) from None


def _render_forward(v, arch, text: str, path: str, decode: bool, prefix: str):
    """The forward pass's source and plan, of the decode family or the forward family; a variant
    the family cannot run is a located spec error."""
    from attngen.lang.diagnostics import Diagnostic, SpecError

    if decode:
        from attngen.cuda.render_decode import render_decode
        from attngen.plan.decode import decode_unsupported

        why = decode_unsupported(v)
        if why is not None:
            raise SpecError([Diagnostic(f"the decode family cannot run `{v.name}`", v.span, why)], text, path)
        return render_decode(v, arch, prefix=prefix)
    if v.quantized:
        from attngen.plan.quant_fwd import cuda_problem

        why = cuda_problem(v, arch)
        if why is not None:
            raise SpecError([Diagnostic(f"the cuda target cannot run `{v.name}`", v.quants[0].span or v.span, why)], text, path)
    if v.page_size is not None:
        # The forward kernels read contiguous K/V.
        raise SpecError([Diagnostic(
            "--family forward does not read a `kv_cache paged` cache",
            v.span, "a paged cache runs on the decode family: --family decode (or auto, the default)")],
            text, path)
    from attngen.cuda import render as render_cuda

    return render_cuda.render_with_plan(v, arch, prefix=prefix)


def _run(args: argparse.Namespace) -> int:
    from attngen.tools import cli
    from attngen.lang.diagnostics import SpecError
    from attngen.plan import validate

    t_start = time.perf_counter()
    timings: list[tuple[str, float]] = []
    emit = getattr(args, "emit", None) or "cu"
    if emit not in ("cu", "ptx", "cubin", "header"):
        raise _Usage(f"unknown --emit {emit!r}; choose one of: cu, ptx, cubin, header")
    out_path = getattr(args, "output", None)
    want_res = bool(getattr(args, "resources", False))
    verbose = bool(getattr(args, "verbose", False))
    from attngen.backend import CudaBackend

    backend = _backend(getattr(args, "target", None) or "cuda")
    if not isinstance(backend, CudaBackend):  # the CUDA command's own options need its plans; others run on the protocol
        return _run_backend(args, backend, emit, out_path)
    try:
        arch = cli._parse_arch(getattr(args, "arch", None))
        text = cli._read(args.file)
    except cli.UsageError as e:
        raise _Usage(str(e)) from None
    prefix = _prefix(args)
    if emit == "cubin" and out_path in (None, "-"):
        raise _Usage("--emit cubin writes a binary file: give it a path with -o")
    _check_output(out_path)
    if emit in ("ptx", "cubin"):
        _need_nvcc(f"--emit {emit}")
    if want_res:
        _need_nvcc("--resources")

    t0 = time.perf_counter()
    try:
        program = validate.loads(text, args.file, arch)
    except SpecError as e:
        print(e.render(), file=sys.stderr)
        return EXIT_SPEC
    timings.append(("check", time.perf_counter() - t0))
    v = _pick_variant(program, getattr(args, "variant", None), args.file)

    from attngen.cuda import compile as compile_cuda

    backward = getattr(args, "pass_", "forward") == "backward"
    if getattr(args, "deterministic", False) and not backward:
        raise _Usage("--deterministic is an option of the backward pass: add --pass backward")
    family = getattr(args, "family", None) or "auto"
    if backward and family == "decode":
        raise _Usage("--family decode has no backward pass (the backward follows the forward family)")
    # A paged cache runs on the decode family only; everything else defaults to the forward family
    # (one kernel for every Lq; the decode family is the choice for Lq up to ~16).
    decode = not backward and (family == "decode" or (family == "auto" and v.page_size is not None))
    t0 = time.perf_counter()
    try:
        if backward:
            source, kp = _render_backward(v, arch, text, args.file, bool(getattr(args, "deterministic", False)), emit, prefix)
        else:
            source, kp = _render_forward(v, arch, text, args.file, decode, prefix)
    except SpecError as e:
        print(e.render(), file=sys.stderr)
        return EXIT_SPEC
    except ValueError as e:  # resolve_tile: the tile does not fit this arch
        print(f"{args.file}: error: {e}", file=sys.stderr)
        return EXIT_SPEC
    timings.append(("render", time.perf_counter() - t0))

    try:
        if emit == "cu":
            data = source.encode("utf-8")
        elif emit == "header":
            data = (render_decode_header if decode else render_header)(v, arch, prefix).encode("utf-8")
        else:
            t0 = time.perf_counter()
            data, _log = compile_cuda.nvcc(source, arch, emit)
            timings.append((f"nvcc --{emit}", time.perf_counter() - t0))
        res = None
        if want_res:
            t0 = time.perf_counter()
            res = compile_cuda.resources(source, arch)
            timings.append(("nvcc -Xptxas -v", time.perf_counter() - t0))
    except compile_cuda.CompileError as e:
        print(f"attngen: error: {e}", file=sys.stderr)
        print("attngen: error: nvcc rejected the generated source: a bug in attngen, please report it", file=sys.stderr)
        return EXIT_INTERNAL

    t0 = time.perf_counter()
    _write(out_path, data)
    timings.append(("write", time.perf_counter() - t0))

    to_stdout = out_path in (None, "-")
    if res is not None:
        table = (_bwd_resource_table(res, kp) if backward else _decode_resource_table(res, kp) if decode
                 else resource_table(res, kp))
        print(table, end="", file=sys.stderr if to_stdout else sys.stdout)
    if verbose:
        where = "stdout" if to_stdout else out_path
        kname = kp.base_name if backward else kp.kernel_name
        print(f"attngen: {v.name} ({kname}) for {arch.value}: {emit}, {len(data)} bytes to {where}", file=sys.stderr)
        for stage, dt in timings:
            print(f"attngen:   {stage:<16} {dt * 1000:9.1f} ms", file=sys.stderr)
        print(f"attngen:   {'total':<16} {(time.perf_counter() - t_start) * 1000:9.1f} ms", file=sys.stderr)
    return EXIT_OK


def _backend(name: str):
    """The registered backend `--target` names (attngen.backend.BACKENDS)."""
    from attngen.backend import BACKENDS

    if name not in BACKENDS:
        raise _Usage(f"unknown --target {name!r}; choose one of: {', '.join(BACKENDS)}")
    return BACKENDS[name]


def _run_backend(args: argparse.Namespace, backend, emit: str, out_path: str | None) -> int:
    """`--target NAME` for a backend other than CUDA (the CPU's): its source (`--emit cu`, the
    default) or its C header, through the Backend protocol (attngen.backend)."""
    from attngen.backend import Options
    from attngen.tools import cli
    from attngen.lang.diagnostics import Diagnostic, SpecError
    from attngen.lang.frontend import loads

    gpu_only = [f"--{n}" for n, given in (("arch", getattr(args, "arch", None)), ("resources", getattr(args, "resources", False)),
                                          ("deterministic", getattr(args, "deterministic", False)))
                if given]
    if (getattr(args, "family", None) or "auto") != "auto":
        gpu_only.append("--family")
    backward = (getattr(args, "pass_", None) or "forward") == "backward"
    if backward and backend.name != "cpu":
        gpu_only.append(f"--pass backward (the {backend.name} target has the forward pass only)")
    if backward and emit == "header":
        raise _Usage("--emit header is for the forward pass; the backward's params struct and launcher are in the .cpp's "
                     "extern \"C\" block")
    if emit in ("ptx", "cubin"):
        gpu_only.append(f"--emit {emit}")
    if gpu_only:
        raise _Usage(f"{', '.join(gpu_only)}: GPU options; --target {backend.name} takes --emit cu|header, --variant, --prefix, -o")
    options = Options(prefix=_prefix(args))
    _check_output(out_path)
    try:
        text = cli._read(args.file)
    except cli.UsageError as e:
        raise _Usage(str(e)) from None
    t0 = time.perf_counter()
    try:
        program = loads(text, args.file)
        v = _pick_variant(program, getattr(args, "variant", None), args.file)
        if backward:  # the CPU backward (attngen.cpu.render_bwd)
            from attngen.cpu import render_bwd as cpu_bwd

            why = cpu_bwd.unsupported(v)
            if why:
                raise SpecError([Diagnostic(f"the {backend.name} backward cannot differentiate `{v.name}`", v.span,
                                            why.removeprefix("--pass backward: "))], text, args.file)
            data = cpu_bwd.render(v, options.prefix).encode("utf-8")
        else:
            why = backend.unsupported(v)
            if why:
                raise SpecError([Diagnostic(f"the {backend.name} target cannot run `{v.name}`", v.span, why)], text, args.file)
            data = (backend.header(v, options) if emit == "header" else backend.render(v, options)).encode("utf-8")
    except SpecError as e:
        print(e.render(), file=sys.stderr)
        return EXIT_SPEC
    _write(out_path, data)
    if getattr(args, "verbose", False):
        where = "stdout" if out_path in (None, "-") else out_path
        print(f"attngen: {v.name} for {backend.name}: {emit}, {len(data)} bytes to {where} in {(time.perf_counter() - t0) * 1000:.1f} ms",
              file=sys.stderr)
    return EXIT_OK


def main(args: argparse.Namespace) -> int:
    """The `compile` subcommand (args as built by attngen.tools.cli); returns the exit code."""
    try:
        return _run(args)
    except _Usage as e:
        print(f"attngen: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:
        return EXIT_OK


__all__ = ["main", "render_header", "resource_table"]
