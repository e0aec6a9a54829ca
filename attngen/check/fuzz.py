"""`attngen fuzz`: hypothesis-driven differential testing of generated kernels, and of the compiler.

    attngen fuzz FILE [--variant NAME] [--max-examples N] [--seconds S] [--seed K] [--out DIR]
    attngen fuzz --specs [--max-examples N] [--seconds S] [--seed K] [--out DIR] [--nvcc | --no-nvcc] [--jobs N]

FILE mode draws shapes (B, Lq, Lk from 1 upwards, tile-boundary values favoured), input
distributions (normal, and large magnitudes that overflow a naive fp16 softmax) and runtime inputs
(padding lengths including 0 and full, single-document / one-token-per-document ids, empty and full
block masks, so some rows end up fully masked), runs the kernel on outputs poisoned with NaN, and
compares with `attngen.reference` under `attngen.check.tolerance`. Hypothesis shrinks a failure to a small
case, which is written to --out as a reproducer (spec, .npz of the inputs, a ready-to-run pytest
file); the command exits 1 and says where.

`--specs` fuzzes the compiler: it generates random *valid* spec text (masks, scores, norms, dtypes,
heads, tiles), which must load and then verify on random shapes, and feeds *mutated* spec text to
the front end, where the only acceptable outcomes are success or a `SpecError` (never a traceback).
When nvcc is on the PATH (or with `--nvcc`; `--no-nvcc` skips it) every accepted spec, generated or
mutated, is also rendered and compiled for sm_90a and sm_80 (`--jobs` at a time, in the background,
`attngen.cuda.nvcc_check`): an accepted spec whose `.cu` does not compile is a failure.

`--device` picks where kernels run: cuda (the GPU), cpu (the CPU backend, `attngen.cpu`: a C++
compiler is all it needs) or auto (the default: the GPU when one is usable, else the CPU
backend). A run in which no kernel ran exits 1 saying so, unless `--reference-only` asks for the
checks that need no kernel: FILE mode then checks the reference's invariants and cross-checks it
against FlexAttention on the CPU (when torch is importable), and renders CUDA source. With the CPU
backend, `--specs` compiles and runs a sample of the accepted generated specs (every
`fuzz_specs.CPU_SAMPLE`-th, the first included). Hypothesis keeps its files under the attngen cache
directory.

The work lives in focused modules: fuzz_cases (shapes and inputs), fuzz_device (device arrays),
fuzz_run (kernel vs reference), fuzz_driver (hypothesis), fuzz_report (outcomes, reproducers),
fuzz_specs (--specs). This module is the command and re-exports their public names, which
reproducers and benchmarks import as `attngen.check.fuzz.X`.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from collections.abc import Sequence
from typing import Any

from attngen.check.fuzz_cases import BOUNDARY_LENGTHS, MAX_SCORE_ELEMENTS, Case, case_inputs, case_strategy, tensor_roles
from attngen.check.fuzz_device import empty_device, gpu_status, synchronize, to_device, to_host, to_host_cpu
from attngen.check.fuzz_driver import drive
from attngen.check.fuzz_report import Outcome, Progress, fmt_exc, write_reproducer
from attngen.check.fuzz_run import compare, flex_crosscheck, reference_invariants, run_kernel, split_inputs
from attngen.check.fuzz_specs import check_front_end, check_round_trip, fuzz_specs, mutate, spec_strategy
from attngen.ir.nodes import Variant
from attngen.tools.exit_codes import EXIT_FAIL, EXIT_OK, EXIT_USAGE

__all__ = [
    "BOUNDARY_LENGTHS", "MAX_SCORE_ELEMENTS", "Case", "Outcome", "build_parser", "case_inputs", "case_strategy",
    "check_front_end", "check_round_trip", "compare", "empty_device", "flex_crosscheck", "fuzz_specs", "fuzz_variant",
    "gpu_status", "main", "mutate", "reference_invariants", "run_kernel", "spec_strategy", "split_inputs",
    "synchronize", "tensor_roles", "to_device", "to_host", "to_host_cpu", "write_reproducer",
]


# --------------------------------------------------------------------------------------------
# FILE mode


def fuzz_variant(v: Variant, spec_text: str, *, gpu: bool, max_examples: int, seconds: float | None, seed: int,
                 out_dir: str, quiet: bool = False, cpu: bool = False) -> Outcome:
    """Fuzz one variant: kernel vs reference on the GPU (or, `cpu`, the CPU backend's kernel),
    reference sanity (+ flex, render) without either."""
    outcome = Outcome(v.name)
    kernel = None
    if gpu or cpu:
        from attngen.runtime import kernel as runtime

        try:
            kernel = runtime.compile(v, device="cpu" if cpu else "cuda")
        except Exception as e:
            outcome.failure = f"compile failed: {fmt_exc(e)}"
            outcome.reproducer = write_reproducer(out_dir, spec_text, v, None, None, outcome.failure)
            return outcome
    else:
        from attngen.cuda.render_decode import render_family as render  # jinja2 only: works without a GPU

        try:
            src = render(v)
            if not isinstance(src, str) or not src.strip():
                raise AssertionError(f"the renderer returned {type(src).__name__}, not CUDA source")
            if render(v) != src:
                raise AssertionError("rendering is not deterministic: two renders of one variant differ")
            outcome.notes.append("rendered CUDA source")
        except Exception as e:
            outcome.failure = f"render failed: {fmt_exc(e)}"
            outcome.reproducer = write_reproducer(out_dir, spec_text, v, None, None, outcome.failure)
            return outcome
        try:
            import torch  # noqa: F401

            do_flex = True
            outcome.notes.append("reference cross-checked with FlexAttention on the CPU")
        except Exception:
            do_flex = False
    # Without a GPU the reference (and CPU flex) is the cost: smaller shapes.
    strategy = case_strategy(v, max_len=2048 if gpu else 300, max_work=MAX_SCORE_ELEMENTS if gpu else 1 << 18)
    last_arrays: list[Any] = [None]

    def body(case: Case) -> None:
        arrays = case_inputs(v, case)
        last_arrays[0] = arrays
        if kernel is not None:
            out, lse = run_kernel(kernel, v, arrays)
            outcome.kernel_runs += 1
            bad = [r.summary() for r in compare(v, arrays, out, lse) if not r.ok]
            if bad:
                raise AssertionError(f"{v.name} at {case.describe()}:\n" + "\n".join(bad))
            return
        probs = reference_invariants(v, arrays)
        if probs:
            raise AssertionError(f"{v.name} at {case.describe()}: " + "; ".join(probs))
        if do_flex and case.B * v.heads * case.Lq * case.Lk <= 1 << 17:
            rep = flex_crosscheck(v, arrays)
            if rep is not None and not rep.ok:
                raise AssertionError(f"{v.name} at {case.describe()}: reference and FlexAttention disagree:\n{rep.summary()}")

    progress = Progress(max_examples, v.name, quiet)
    try:
        n, exc, example = drive(body, strategy, max_examples=max_examples, seconds=seconds, seed=seed,
                                 progress=progress, first_failure_dir=out_dir)
    finally:
        progress.close()
    outcome.examples = n
    if exc is not None:
        outcome.failure = fmt_exc(exc)
        arrays = case_inputs(v, example) if isinstance(example, Case) else last_arrays[0]
        outcome.reproducer = write_reproducer(out_dir, spec_text, v, arrays, example if isinstance(example, Case) else None,
                                              outcome.failure)
    return outcome


# --------------------------------------------------------------------------------------------
# The command


def build_parser() -> argparse.ArgumentParser:
    """The `attngen fuzz` arguments on their own (when this module runs by itself); defined once,
    in the command line (attngen.tools.cli.fuzz_arguments)."""
    from attngen.tools.cli import fuzz_arguments

    p = argparse.ArgumentParser(prog="attngen fuzz", description=__doc__.split("\n\n")[0])
    fuzz_arguments(p)
    return p


def _pick_device(args: argparse.Namespace) -> tuple[str | None, str]:
    """The device kernels run on ('cuda', 'cpu', or None: none) and a line saying so; raises
    ValueError for a device that cannot be had."""
    gpu, why = gpu_status()
    if getattr(args, "reference_only", False):
        return None, (f"GPU present ({why})" if gpu else f"no GPU ({why})") + \
            "; --reference-only: fuzzing the front end and reference only, no kernels run"
    dev = getattr(args, "device", None) or "auto"
    if dev == "cuda" or (dev == "auto" and gpu):
        if not gpu:
            raise ValueError(f"--device cuda: no usable GPU ({why})")
        return "cuda", f"GPU: {why}"
    from attngen.cpu.compile import CompilerNotFound, compiler_version, find_compiler

    try:
        cxx = compiler_version(tuple(find_compiler()))
    except CompilerNotFound as e:
        if dev == "cpu":
            raise ValueError(f"--device cpu: {e}") from None
        return None, f"no GPU ({why}) and no CPU backend ({e}): no kernels run"
    return "cpu", f"CPU backend ({cxx})" + ("" if dev == "cpu" else f"; no GPU: {why}")


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
    try:
        device, mode = _pick_device(args)
    except ValueError as e:
        print(f"attngen fuzz: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    gpu, cpu = device == "cuda", device == "cpu"
    if getattr(args, "device", None) == "cpu" and getattr(args, "pass_", None) == "backward":
        print("attngen fuzz: error: the CPU backend has the forward pass only: --pass forward or both (the backward "
              "then checks the reference), or --device cuda", file=sys.stderr)
        return EXIT_USAGE
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
        outcomes = [] if which == "backward" else fuzz_specs(gpu=gpu, max_examples=n, seconds=fwd_seconds, seed=seed,
                                                             out_dir=out_dir, nvcc=checker, cpu=cpu)
        if which != "forward":  # the backward pass: attngen.check.fuzz_bwd
            from attngen.check import fuzz_bwd

            outcomes += fuzz_bwd.fuzz_specs_backward(gpu=gpu, max_examples=max(1, n // 4), seconds=args.seconds and args.seconds / 4,
                                                     seed=seed, out_dir=out_dir, nvcc_jobs=(args.jobs or nvcc_check.default_jobs()) if use_nvcc else 0)
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
        n = args.max_examples or (100 if gpu else 30)
        per = None if args.seconds is None else args.seconds / len(variants)
        if getattr(args, "pass_", None) in ("backward", "both"):  # attngen.check.fuzz_bwd
            from attngen.check import fuzz_bwd

            outcomes = [fuzz_bwd.fuzz_backward_variant(v, text, gpu=gpu, max_examples=n, seconds=per, seed=seed, out_dir=out_dir)
                        for v in variants]
        else:
            outcomes = []
        if getattr(args, "pass_", None) != "backward":
            outcomes = [fuzz_variant(v, text, gpu=gpu, max_examples=n, seconds=per, seed=seed, out_dir=out_dir, cpu=cpu)
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
