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
from attngen.tools.exit_codes import EXIT_FAIL, EXIT_OK, EXIT_USAGE


def build_parser() -> argparse.ArgumentParser:
    """The `attngen fuzz` arguments on their own (when this module runs by itself); defined once,
    in the command line (attngen.tools.cli.fuzz_arguments)."""
    from attngen.tools.cli import fuzz_arguments

    p = argparse.ArgumentParser(prog="attngen fuzz", description=(fuzz.__doc__ or "").split("\n\n")[0])
    fuzz_arguments(p)
    return p


def main(args: argparse.Namespace | Sequence[str] | None = None) -> int:
    """Run `attngen fuzz`; returns 0 when nothing failed, 1 on a failure, 2 on a usage error."""
    if args is None or not isinstance(args, argparse.Namespace):
        args = build_parser().parse_args(list(args) if args is not None else None)
    out_dir = args.out or "fuzz-failures"
    seed = args.seed if args.seed is not None else int(time.time()) % (2**31)
    gpu, why = fuzz.gpu_status()
    mode = f"GPU: {why}" if gpu else f"no GPU ({why}): fuzzing the front end and reference only, no kernels run"
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
                                                             out_dir=out_dir, nvcc=checker)
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
            outcomes = [fuzz.fuzz_variant(v, text, gpu=gpu, max_examples=n, seconds=per, seed=seed, out_dir=out_dir)
                        for v in variants] + outcomes
    failed = [o for o in outcomes if o.failure]
    for o in failed:
        print(f"\nFAIL {o.label} after {o.examples} examples:\n{o.failure}", file=sys.stderr)
        if o.reproducer:
            print(f"  reproducer written to {o.reproducer}/ (spec.attn, inputs.npz, test_repro.py)", file=sys.stderr)
    notes = sorted({n for o in outcomes for n in o.notes})
    total = sum(o.examples for o in outcomes)
    parts = ", ".join(f"{o.label}: {o.examples}" for o in outcomes)
    where = "GPU" if gpu else "CPU only (no kernels ran)"
    print(f"attngen fuzz: {total} examples ({parts}) on {where} in {time.monotonic() - t0:.1f}s, "
          f"{len(failed)} failing" + (f"; written to {out_dir}/" if failed else "") + (f" [{'; '.join(notes)}]" if notes else ""))
    return EXIT_FAIL if failed else EXIT_OK


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
