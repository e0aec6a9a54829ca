"""`attngen fuzz`, the command: its arguments, its summary and exit codes. The fuzzing itself is
attngen.check.fuzz (forward) and attngen.check.fuzz_bwd (`--pass backward`); see the former for
what each mode draws and checks."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from collections.abc import Sequence

from attngen.check import fuzz
from attngen.ir.nodes import AttnKind, Layout, Variant
from attngen.tools.exit_codes import EXIT_FAIL, EXIT_OK, EXIT_USAGE
from attngen.tools.shape import SHAPE_HELP, Shape, ShapeError, parse_shape


def build_parser() -> argparse.ArgumentParser:
    """The `attngen fuzz` arguments on their own (when this module runs by itself); defined once,
    in the command line (attngen.tools.cli.fuzz_arguments)."""
    from attngen.tools.cli import fuzz_arguments

    p = argparse.ArgumentParser(prog="attngen fuzz", description=(fuzz.__doc__ or "").split("\n\n")[0])
    fuzz_arguments(p)
    return p


def _pick_device(args: argparse.Namespace) -> tuple[str | None, str]:
    """The device kernels run on ('cuda', 'cpu', or None: none) and a line saying so; raises
    ValueError for a device that cannot be had."""
    gpu, why = fuzz.gpu_status()
    if getattr(args, "reference_only", False):
        return None, (f"GPU present ({why})" if gpu else f"GPU kernels unavailable ({why})") + \
            "; --reference-only: fuzzing the front end and reference only, no kernels run"
    dev = getattr(args, "device", None) or "auto"
    if dev == "cuda" or (dev == "auto" and gpu):
        if not gpu:
            raise ValueError(f"--device cuda: {why}")
        return "cuda", f"GPU: {why}"
    from attngen.cpu.compile import CompilerNotFound, compiler_version, find_compiler

    try:
        cxx = compiler_version(tuple(find_compiler()))
    except CompilerNotFound as e:
        if dev == "cpu":
            raise ValueError(f"--device cpu: {e}") from None
        return None, f"GPU kernels unavailable ({why}) and no CPU backend ({e}): no kernels run"
    return "cpu", f"CPU backend ({cxx})" + ("" if dev == "cpu" else f"; GPU kernels unavailable: {why}")


def _pinned_sizes(shape: Shape | None, variants: Sequence[Variant], which: str | None) -> tuple[int, int, int] | None:
    """(B, Lq, Lk) for every case, checked against each variant as `explain --shape` checks it;
    ShapeError where a variant cannot take it."""
    if shape is None:
        return None
    for v in variants:
        shape.check(v.name, v.kind == AttnKind.SELF, v.heads, v.head_dim)
        if v.layout == Layout.VARLEN:
            raise ShapeError(f"--shape: {v.name} is `layout varlen`, whose lengths are per sequence (drawn by the "
                             "fuzzer); fuzz it without --shape")
        decode = v.kind == AttnKind.SELF and shape.Lq < shape.Lk
        if decode and v.page_size is not None:
            raise ShapeError(f"--shape: {v.name} is self attention on a paged cache: give Lq = Lk")
        if decode and which in ("backward", "both"):
            raise ShapeError(f"--shape: Lq < Lk is a decode step of self attention, which the backward fuzz does not "
                             f"place; give Lq = Lk for {v.name} or --pass forward")
    return shape.B, shape.Lq, shape.Lk


def _hypothesis_home() -> None:
    """Hypothesis keeps its files (example database, caches) under the attngen cache directory,
    not in the current directory."""
    try:
        from hypothesis.configuration import set_hypothesis_home_dir

        from attngen.resources import cache_dir

        set_hypothesis_home_dir(cache_dir() / "hypothesis")
    except Exception:  # an older hypothesis without the setter: its default stays
        pass


def main(args: argparse.Namespace | Sequence[str] | None = None) -> int:
    """Run `attngen fuzz`; returns 0 when nothing failed, 1 on a failure (or when no kernel ran
    without --reference-only), 2 on a usage error."""
    if args is None or not isinstance(args, argparse.Namespace):
        args = build_parser().parse_args(list(args) if args is not None else None)
    out_dir = args.out or "fuzz-failures"
    seed = args.seed if args.seed is not None else int(time.time()) % (2**31)
    _hypothesis_home()
    if args.specs and getattr(args, "shape", None) is not None:
        print("attngen fuzz: error: --shape pins the sizes of FILE's variants; --specs draws its own specs and shapes",
              file=sys.stderr)
        return EXIT_USAGE
    try:
        shape = None if getattr(args, "shape", None) is None else parse_shape(args.shape)
    except ShapeError as e:
        print(f"attngen fuzz: error: {e}\n  --shape: {SHAPE_HELP}", file=sys.stderr)
        return EXIT_USAGE
    try:
        device, mode = _pick_device(args)
    except ValueError as e:
        print(f"attngen fuzz: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    gpu, cpu = device == "cuda", device == "cpu"
    print(f"attngen fuzz: {mode}; seed {seed}", file=sys.stderr, flush=True)
    t0 = time.monotonic()
    if args.specs:
        if args.file:
            print("attngen fuzz: error: give either FILE or --specs, not both", file=sys.stderr)
            return EXIT_USAGE
        n = args.max_examples or (200 if gpu else 300)
        from attngen.cuda import nvcc_check

        use_nvcc = nvcc_check.available() if args.nvcc is None else args.nvcc
        if use_nvcc and not nvcc_check.available():
            print("attngen fuzz: error: --nvcc needs nvcc on the PATH", file=sys.stderr)
            return EXIT_USAGE
        checker = (nvcc_check.NvccChecker(jobs=args.jobs or nvcc_check.default_jobs(), out_dir=out_dir, report_every=50)
                   if use_nvcc else None)
        which = getattr(args, "pass_", None) or "both"
        # With both passes, --seconds is shared: three quarters forward, a quarter backward.
        fwd_seconds = args.seconds * 3 / 4 if (args.seconds and which == "both") else args.seconds
        outcomes = [] if which == "backward" else fuzz.fuzz_specs(gpu=gpu, max_examples=n, seconds=fwd_seconds, seed=seed,
                                                             out_dir=out_dir, nvcc=checker, cpu=cpu)
        if which != "forward":  # the backward pass: attngen.check.fuzz_bwd
            from attngen.check import fuzz_bwd

            outcomes += fuzz_bwd.fuzz_specs_backward(gpu=gpu, max_examples=max(1, n // 4), seconds=args.seconds and args.seconds / 4,
                                                     seed=seed, out_dir=out_dir, nvcc_jobs=(args.jobs or nvcc_check.default_jobs()) if use_nvcc else 0,
                                                     cpu=cpu)
    else:
        if not args.file:
            print("attngen fuzz: error: expected FILE (or --specs)", file=sys.stderr)
            return EXIT_USAGE
        from attngen.plan import validate
        from attngen.lang.diagnostics import SpecError

        try:
            text = Path(args.file).read_text(encoding="utf-8")
        except OSError as e:
            print(f"attngen fuzz: error: {args.file}: {e.strerror or e}", file=sys.stderr)
            return EXIT_USAGE
        try:
            prog = validate.loads(text, args.file)
        except SpecError as e:
            print(e.render(), file=sys.stderr)
            return EXIT_FAIL
        try:
            variants = list(prog.select(args.variant))
        except KeyError as e:
            print(f"attngen fuzz: error: {e.args[0] if e.args else e}", file=sys.stderr)
            return EXIT_USAGE
        try:
            sizes = _pinned_sizes(shape, variants, getattr(args, "pass_", None))
        except ShapeError as e:
            print(f"attngen fuzz: error: {e}", file=sys.stderr)
            return EXIT_USAGE
        n = args.max_examples or (100 if gpu else 30)
        per = None if args.seconds is None else args.seconds / len(variants)
        if getattr(args, "pass_", None) in ("backward", "both"):  # attngen.check.fuzz_bwd
            from attngen.check import fuzz_bwd

            outcomes = [fuzz_bwd.fuzz_backward_variant(v, text, gpu=gpu, max_examples=n, seconds=per, seed=seed, out_dir=out_dir,
                                                     shape=sizes, cpu=cpu)
                        for v in variants]
        else:
            outcomes = []
        if getattr(args, "pass_", None) != "backward":
            outcomes = [fuzz.fuzz_variant(v, text, gpu=gpu, max_examples=n, seconds=per, seed=seed, out_dir=out_dir, cpu=cpu,
                                          shape=sizes)
                        for v in variants] + outcomes
    failed = [o for o in outcomes if o.failure]
    for o in failed:
        print(f"\nFAIL {o.label} after {o.examples} examples:\n{o.failure}", file=sys.stderr)
        if o.reproducer:
            print(f"  reproducer written to {o.reproducer}/ (spec.attn, inputs.npz, test_repro.py)", file=sys.stderr)
    notes = sorted({n for o in outcomes for n in o.notes})
    total = sum(o.examples for o in outcomes)
    runs = sum(o.kernel_runs for o in outcomes)
    parts = ", ".join(f"{o.label}: {o.examples}" for o in outcomes)
    where = {"cuda": "GPU", "cpu": "the CPU backend"}.get(device or "", "CPU only (no kernels ran)")
    print(f"attngen fuzz: {total} examples ({parts}), {runs} kernel runs, on {where} in {time.monotonic() - t0:.1f}s, "
          f"{len(failed)} failing" + (f"; written to {out_dir}/" if failed else "") + (f" [{'; '.join(notes)}]" if notes else ""))
    if failed:
        return EXIT_FAIL
    if runs == 0 and not getattr(args, "reference_only", False):
        # A run that launched nothing tested no kernel: never green (CI without a GPU or compiler).
        print(f"attngen fuzz: error: no kernel ran ({mode}); pass --reference-only to check only the front end and "
              "the reference", file=sys.stderr)
        return EXIT_FAIL
    return EXIT_OK


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
