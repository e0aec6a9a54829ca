"""`attngen fuzz`: hypothesis-driven differential testing of generated kernels, and of the compiler.

    attngen fuzz FILE [--variant NAME] [--shape B=..,Lq=..,Lk=..] [--max-examples N] [--seconds S] [--seed K] [--out DIR]
    attngen fuzz --specs [--max-examples N] [--seconds S] [--seed K] [--out DIR] [--nvcc | --no-nvcc] [--jobs N]

FILE mode draws shapes (B, Lq, Lk from 1 upwards, tile-boundary values favoured; `--shape`
pins them, self attention's Lq < Lk being a decode step as in `explain`), input
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
fuzz_specs (--specs). This module fuzzes one variant and re-exports their public names, which
reproducers and benchmarks import as `attngen.check.fuzz.X`; the command line is
attngen.tools.cmd_fuzz.
"""

from __future__ import annotations

from typing import Any

from attngen.check.fuzz_cases import BOUNDARY_LENGTHS, MAX_SCORE_ELEMENTS, Case, case_inputs, case_strategy, tensor_roles
from attngen.check.fuzz_device import empty_device, gpu_status, synchronize, to_device, to_host, to_host_cpu
from attngen.check.fuzz_driver import drive
from attngen.check.fuzz_report import Outcome, Progress, fmt_exc, write_reproducer
from attngen.check.fuzz_run import compare, flex_crosscheck, reference_invariants, run_kernel, split_inputs
from attngen.check.fuzz_specs import check_front_end, check_round_trip, fuzz_specs, mutate, spec_strategy
from attngen.ir.nodes import Variant

__all__ = [
    "BOUNDARY_LENGTHS", "MAX_SCORE_ELEMENTS", "Case", "Outcome", "case_inputs", "case_strategy",
    "check_front_end", "check_round_trip", "compare", "empty_device", "flex_crosscheck", "fuzz_specs", "fuzz_variant",
    "gpu_status", "mutate", "reference_invariants", "run_kernel", "spec_strategy", "split_inputs",
    "synchronize", "tensor_roles", "to_device", "to_host", "to_host_cpu", "write_reproducer",
]


# --------------------------------------------------------------------------------------------
# FILE mode


def fuzz_variant(v: Variant, spec_text: str, *, gpu: bool, max_examples: int, seconds: float | None, seed: int,
                 out_dir: str, quiet: bool = False, cpu: bool = False, shape: tuple[int, int, int] | None = None) -> Outcome:
    """Fuzz one variant: kernel vs reference on the GPU (or, `cpu`, the CPU backend's kernel),
    reference sanity (+ flex, render) without either. `shape` = (B, Lq, Lk) pins every case's
    sizes (`case_strategy`)."""
    outcome = Outcome(v.name)
    kernel = None
    if gpu or cpu:
        from attngen import backend

        try:
            kernel = backend.compile(v, device="cpu" if cpu else "cuda")
        except Exception as e:
            outcome.failure = f"compile failed: {fmt_exc(e)}"
            outcome.reproducer = write_reproducer(out_dir, spec_text, v, None, None, outcome.failure)
            return outcome
    elif v.quantized:
        # No CUDA kernel reads quantized operands yet, and FlexAttention does not quantize: the
        # reference's own checks, and its CPU source rendered (`--device cpu` runs it).
        from attngen.cpu.render import render as render_cpu

        if render_cpu(v) != render_cpu(v):
            outcome.failure = "rendering is not deterministic: two renders of one variant differ"
            return outcome
        outcome.notes.append("rendered CPU source (quantized: no CUDA kernel yet)")
        do_flex = False
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
    strategy = case_strategy(v, max_len=2048 if gpu else 300, max_work=MAX_SCORE_ELEMENTS if gpu else 1 << 18, shape=shape)
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
