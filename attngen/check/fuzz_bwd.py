"""`attngen fuzz --pass backward`: the backward kernels against the float64 reference backward.

    attngen fuzz FILE --pass backward [--variant NAME] [--max-examples N] [--seconds S] [--seed K] [--out DIR]
    attngen fuzz --specs [--pass both|forward|backward] ...

FILE mode draws the forward fuzzer's cases (`fuzz.case_strategy`: odd lengths and tile boundaries,
Lq != Lk for cross attention, padding lengths of 0 that leave whole rows or batches fully masked,
single-document and one-token-per-document ids, empty and full block masks) with a random dO and
the dQ mode (fp32 atomics or deterministic), asks for the gradient of every input the backward
kernels differentiate (bias, alibi slopes, rel_bias tables, float lookups, norm weights), and
compares dq, dk, dv and each of those with `attngen.check.reference_bwd` under
`tolerance.check_grad`; rows with nothing visible must give exactly zero. A failure is shrunk by
hypothesis and written as a reproducer (spec, inputs .npz with dO, FAILURE.txt).

On the CPU backend (`--device cpu`, or `auto` without a GPU) the CPU backward
(`attngen.cpu.backward`) runs instead, on smaller cases, against the same reference and tolerances.
With no kernel at all (`--reference-only`) the backward source is rendered in both dQ modes (and
must render the same bytes twice), and the reference backward is run on the drawn cases: its gradients must be
finite, shaped like their inputs, zero on fully masked rows, and match central differences of the
forward reference along a random direction (on the variant's fp32 twin, where rounding does not
swamp the difference).

`--specs` with the backward pass: generated valid specs (`fuzz.spec_strategy`) that the backward
kernels accept must render (and, with nvcc, compile for sm_90a with atomics and sm_80
deterministic); on a GPU, or on the CPU backend where its backward takes the spec, one drawn case
each runs against the reference. Specs the backward
refuses (`plan.bwd.unsupported`) are counted, not failed.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from attngen.check import tolerance
from attngen.check.fuzz_cases import Case, case_inputs, case_strategy
from attngen.check.fuzz_device import synchronize, to_device, to_host
from attngen.check.fuzz_driver import drive
from attngen.check.fuzz_report import Outcome, Progress, fmt_exc
from attngen.check.fuzz_run import split_inputs
from attngen.check.fuzz_specs import spec_strategy
from attngen.ir import abi
from attngen.ir.nodes import DType, Layout, Variant, norm_bias_name, norm_weight_name


def wrt_names(v: Variant) -> tuple[str, ...]:
    """The runtime inputs whose gradients the backward kernels return (and the fuzzer checks)."""
    from attngen.plan import bwd as plan_bwd

    names = set(plan_bwd.learnable(v)) | set(plan_bwd.norm_params(v))
    return tuple(d.name for d in v.runtime_inputs() if d.name in names)


def backward_inputs(v: Variant, case: Case) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """The case's arrays (norm weights and biases drawn away from 1 and 0, so their gradients and
    their effect are exercised) and a random dO in the output's shape and dtype."""
    from attngen.check import reference

    arrays = case_inputs(v, case)
    rng = np.random.default_rng(case.seed + 1)
    for n in v.norms:
        for name, base in ((norm_weight_name(n.target), 1.0), (norm_bias_name(n.target), 0.0)):
            if name in arrays:
                a = arrays[name]
                arrays[name] = (base + 0.3 * rng.normal(size=a.shape)).astype(a.dtype)
    B = arrays["q"].shape[0]
    dO = rng.normal(size=abi.o_shape(v, B, case.Lq)).astype(reference.dtype_of(v.dtype))
    return arrays, dO


def run_backward(kernel: Any, v: Variant, arrays: Mapping[str, np.ndarray], dO: np.ndarray, wrt: tuple[str, ...],
                 deterministic: bool) -> dict[str, np.ndarray]:
    """The backward kernels on device copies; host gradients (float64) by name."""
    from attngen.runtime.bwd import backward

    q, k, vv, rest = split_inputs(arrays)
    if getattr(kernel, "target", None) == "cpu":  # the CPU backward takes the host arrays as they are
        res = backward(kernel, q, k, vv, dO, wrt=wrt, **rest)
        got = {n: np.asarray(x).astype(np.float64) for n, x in zip(("dq", "dk", "dv"), res[:3])}
        if wrt:
            got.update({n: np.asarray(res[3][n]).astype(np.float64) for n in wrt})
        return got
    dev = {n: to_device(a) for n, a in rest.items()}
    res = backward(kernel, to_device(q), to_device(k), to_device(vv), to_device(dO),
                   deterministic=deterministic, wrt=wrt, **dev)
    synchronize()
    got = {n: to_host(x, v.dtype).astype(np.float64) for n, x in zip(("dq", "dk", "dv"), res[:3])}
    if wrt:
        got.update({n: to_host(res[3][n], DType.FP32).astype(np.float64) for n in wrt})
    return got


def _masked_rows(v: Variant, arrays: Mapping[str, np.ndarray]) -> np.ndarray:
    """[B, H, Lq] booleans: the query rows with nothing visible (reference LSE -inf); varlen
    [H, total_q]."""
    from attngen.check import reference

    q, k, vv, rest = split_inputs(arrays)
    lse = reference.attention(dataclasses.replace(v, lse=True), q, k, vv, rest)[1]
    return np.isneginf(lse)


def _rows_by_head(v: Variant, dq: np.ndarray) -> np.ndarray:
    """dq with its axes in the LSE's order ([B, H, Lq, D]; varlen [H, total_q, D])."""
    if v.layout == Layout.VARLEN:
        return np.swapaxes(dq, 0, 1)
    return dq if v.layout == Layout.BHSD else np.swapaxes(dq, 1, 2)


def compare_backward(v: Variant, arrays: Mapping[str, np.ndarray], dO: np.ndarray, got: Mapping[str, np.ndarray],
                     wrt: tuple[str, ...]) -> list[tolerance.Report]:
    """A report per gradient against `reference_bwd.attention_backward`; fully masked rows of dq
    must be exactly zero (a report of its own when they are not)."""
    from attngen.check import reference_bwd
    from attngen.plan import bwd as plan_bwd

    q, k, vv, rest = split_inputs(arrays)
    want = reference_bwd.attention_backward(v, q, k, vv, rest, dO.astype(np.float64), wrt=wrt)
    amax = lambda a: float(np.abs(np.asarray(a, dtype=np.float64)).max()) if np.size(a) else 0.0  # noqa: E731
    atol = tolerance.grad_atol(v.dtype, q_max=amax(q), k_max=amax(k), v_max=amax(vv), do_max=amax(dO.astype(np.float64)),
                               value_head_dim=v.value_head_dim, scale=v.effective_scale, residual=v.residual)
    B = 1 if v.layout == Layout.VARLEN else np.shape(q)[0]  # (varlen: the packed rows as one sequence)
    Lq, Lk = want["dq"].size // (B * v.heads * v.head_dim), want["dk"].size // (B * v.kv_heads * v.head_dim)
    o_max = amax(vv) + (amax(q) if v.residual else 0.0)

    def floor(n: str) -> float:
        if n in ("dq", "dk", "dv"):
            return atol
        f = tolerance.param_grad_atol(do_max=amax(dO.astype(np.float64)), o_max=o_max,
                                      contributions=B * v.heads * Lq * Lk / max(1, np.size(want[n])),
                                      dtype=v.dtype, value_head_dim=v.value_head_dim)
        if n in plan_bwd.norm_params(v):
            # A norm weight's or bias's gradient sums dq (or dk) over every token; where the math
            # cancels it (a k-norm bias shifts every score of a row alike: softmax ignores it, so
            # its gradient is 0), the kernel keeps dq / dk's own rounding floor summed over the
            # tokens (found by fuzz --specs --pass backward on the H200: fp16, `large` inputs).
            f = max(f, atol * float(np.sqrt(B * max(Lq, Lk) * v.heads)))
        return f

    reps = [tolerance.check_grad(got[n], want[n], v.dtype, n, atol=floor(n)) for n in ("dq", "dk", "dv", *wrt)]
    masked = _masked_rows(v, arrays)
    if masked.any() and not v.residual:
        leak = _rows_by_head(v, got["dq"])[masked]
        if np.any(leak != 0):
            reps.append(tolerance.Report("dq (fully masked rows)", v.dtype.value, False, float("inf"), float(np.abs(leak).max()),
                                         0.0, 0.0, int(leak.size), int(np.isnan(leak).sum()), int((leak != 0).sum()), None,
                                         float("nan"), 0.0, (f"{int((leak != 0).sum())} elements of rows with nothing visible are not 0",)))
    return reps


def reference_problems(v: Variant, arrays: Mapping[str, np.ndarray], dO: np.ndarray, wrt: tuple[str, ...]) -> list[str]:
    """The reference backward's own invariants (no GPU): finite, shaped, zero on fully masked
    rows, and a directional derivative that matches central differences of the forward on the
    variant's fp32 twin."""
    from attngen.check import reference, reference_bwd

    q, k, vv, rest = split_inputs(arrays)
    probs: list[str] = []
    want = reference_bwd.attention_backward(v, q, k, vv, rest, dO.astype(np.float64), wrt=wrt)
    shapes = {"dq": q.shape, "dk": k.shape, "dv": vv.shape, **{n: rest[n].shape for n in wrt}}
    for n, shp in shapes.items():
        if want[n].shape != tuple(shp):
            probs.append(f"{n}: shape {want[n].shape}, expected {tuple(shp)}")
        elif not np.all(np.isfinite(want[n])):
            probs.append(f"{n}: not finite")
    if probs:
        return probs
    masked = _masked_rows(v, arrays)
    if masked.any() and not v.residual and np.any(_rows_by_head(v, want["dq"])[masked] != 0):
        probs.append("dq: rows with nothing visible are not zero")
    # Central differences of f(x) = sum(dO * O(x)) along a random direction, fp32 twin (not for
    # scores as large as the `large` distribution draws, |s| <= 150 by Cauchy-Schwarz: a saturated
    # softmax is too curved for a finite step).
    qf, kf = np.asarray(q, dtype=np.float64), np.asarray(k, dtype=np.float64)
    if qf.size and kf.size and abs(v.effective_scale) * float(np.sqrt((qf * qf).sum(-1)).max()) * float(np.sqrt((kf * kf).sum(-1)).max()) > 150:
        return probs
    v32 = dataclasses.replace(v, dtype=DType.FP32)
    rng = np.random.default_rng(int(abs(float(np.asarray(q, dtype=np.float64).sum())) * 1e3) % (2**31))
    f32 = {n: np.asarray(a, dtype=np.float64).astype(np.float32) for n, a in arrays.items()}
    g32 = reference_bwd.attention_backward(v32, f32["q"], f32["k"], f32["v"], {n: f32[n] if f32[n].dtype.kind == "f" else rest[n]
                                                                                  for n in rest}, dO.astype(np.float64), wrt=wrt)
    for name, gname in (("q", "dq"), ("k", "dk"), ("v", "dv"), *((n, n) for n in wrt)):
        x = f32[name].astype(np.float64)
        d = rng.normal(size=x.shape)
        h = 1e-3 * max(1e-2, float(np.abs(x).max()))

        def f(t: float) -> float:
            a = {n: (f32[n] if f32[n].dtype.kind == "f" else rest.get(n, arrays[n])) for n in arrays}
            a[name] = (x + t * d).astype(np.float32)
            o = reference.attention(v32, a["q"], a["k"], a["v"], {n: a[n] for n in rest})[0]
            return float((np.asarray(o, dtype=np.float64) * dO.astype(np.float64)).sum())

        fd = (f(h) - f(-h)) / (2 * h)
        an = float((g32[gname] * d).sum())
        scale = float(np.abs(g32[gname]).sum() * np.abs(d).max()) + 1e-6
        if abs(fd - an) > 1e-2 * abs(an) + 5e-6 * scale:
            probs.append(f"{gname}: directional derivative {an:.6g} vs central difference {fd:.6g} (fp32 twin)")
    return probs


REPRO_TEST = '''\
"""Reproducer written by `attngen fuzz --pass backward` (run: pytest test_repro.py)."""
from pathlib import Path

import numpy as np

from attngen.check import fuzz, fuzz_bwd
from attngen.lang import frontend

HERE = Path(__file__).resolve().parent


def test_backward_matches_reference():
    v = frontend.load(HERE / "spec.attn").get("{variant}")
    data = dict(np.load(HERE / "inputs.npz"))
    dO = data.pop("dO")
    wrt = fuzz_bwd.wrt_names(v)
    gpu, why = fuzz.gpu_status()
    if not gpu:
        assert not fuzz_bwd.reference_problems(v, data, dO, wrt)
        return
    from attngen.runtime import kernel as runtime

    kern = runtime.compile(v, family="forward")
    for det in (False, True):
        got = fuzz_bwd.run_backward(kern, v, data, dO, wrt, det)
        bad = [r.summary() for r in fuzz_bwd.compare_backward(v, data, dO, got, wrt) if not r.ok]
        assert not bad, "\\n".join(bad)
'''


def _write_repro(out_dir: str, spec_text: str, v: Variant, arrays: Mapping[str, np.ndarray] | None, dO: np.ndarray | None,
                 case: Any, failure: str) -> Path | None:
    import hashlib

    d = Path(out_dir) / f"bwd-{v.name}-{hashlib.sha1((spec_text + failure[:200]).encode()).hexdigest()[:10]}"
    try:
        d.mkdir(parents=True, exist_ok=True)
        (d / "spec.attn").write_text(spec_text, encoding="utf-8")
        (d / "FAILURE.txt").write_text(f"variant {v.name}, backward pass"
                                       + (f", case {case.describe()}" if case is not None else "") + f":\n{failure}\n", encoding="utf-8")
        if arrays is not None:
            np.savez(d / "inputs.npz", **{n: np.asarray(a) for n, a in arrays.items()}, **({"dO": dO} if dO is not None else {}))
            (d / "test_repro.py").write_text(REPRO_TEST.format(variant=v.name), encoding="utf-8")
    except OSError:
        return None
    return d


def _refusal(v: Variant, cpu: bool = False) -> str | None:
    from attngen.plan import bwd as plan_bwd

    if cpu:
        from attngen.cpu import render_bwd as cpu_bwd

        why = cpu_bwd.unsupported(v)
        return why.removeprefix("--pass backward: ") if why else None
    bad = plan_bwd.unsupported(v)
    return "; ".join(d.message.removeprefix("--pass backward: ") for d in bad) if bad else None


def fuzz_backward_variant(v: Variant, spec_text: str, *, gpu: bool, max_examples: int, seconds: float | None, seed: int,
                          out_dir: str, quiet: bool = False, shape: tuple[int, int, int] | None = None,
                          cpu: bool = False) -> Outcome:
    """Fuzz one variant's backward (see the module doc). A variant the backward kernels refuse is
    a failure that says why (the user asked for that pass). `shape` = (B, Lq, Lk) pins every
    case's sizes (whole sequences only: the backward fuzz places no decode step). `cpu`: the CPU
    backend's backward (`attngen.cpu.backward`) runs instead of the GPU's, on the GPU's shapes'
    smaller cousins (its dQ mode is one: the drawn flag is ignored)."""
    from hypothesis import strategies as st

    outcome = Outcome(f"{v.name} (backward)")
    why = _refusal(v, cpu)
    if why:
        outcome.failure = f"the backward kernels refuse this variant: {why}"
        return outcome
    wrt = wrt_names(v)
    kernel = None
    try:
        if cpu:
            from attngen.cpu.backward import compile_backward_cpu
            from attngen.cpu.kernel import compile_cpu

            kernel = compile_cpu(v)
            compile_backward_cpu(v)
        elif gpu:
            from attngen.runtime import kernel as runtime
            from attngen.runtime.bwd import compile_backward

            kernel = runtime.compile(v, family="forward")
            for det in (False, True):
                compile_backward(v, kernel.plan.arch, deterministic=det)
        else:
            from attngen.cuda import render_bwd

            for det in (False, True):
                src = render_bwd.render(v, deterministic=det)
                if render_bwd.render(v, deterministic=det) != src:
                    raise AssertionError("rendering is not deterministic: two renders of the backward differ")
            outcome.notes.append("rendered the backward source (both dQ modes)")
    except Exception as e:
        outcome.failure = f"backward {'compile' if gpu or cpu else 'render'} failed: {fmt_exc(e)}"
        outcome.reproducer = _write_repro(out_dir, spec_text, v, None, None, None, outcome.failure)
        return outcome
    # The float64 reference backward is the cost: smaller shapes than the forward's fuzzing.
    cases = case_strategy(v, max_len=700 if gpu else 200 if cpu else 40, max_work=(1 << 20) if gpu else (1 << 16) if cpu else (1 << 12),
                          shape=shape)
    strategy = st.tuples(cases, st.booleans())
    last: list[Any] = [None, None]

    def body(example: tuple[Case, bool]) -> None:
        case, det = example
        arrays, dO = backward_inputs(v, case)
        last[:] = [arrays, dO]
        if kernel is not None:
            got = run_backward(kernel, v, arrays, dO, wrt, det)
            outcome.kernel_runs += 1
            bad = [r.summary() for r in compare_backward(v, arrays, dO, got, wrt) if not r.ok]
            if bad:
                raise AssertionError(f"{v.name} backward (deterministic={det}) at {case.describe()}:\n" + "\n".join(bad))
            return
        probs = reference_problems(v, arrays, dO, wrt)
        if probs:
            raise AssertionError(f"{v.name} reference backward at {case.describe()}: " + "; ".join(probs))

    progress = Progress(max_examples, outcome.label, quiet)
    try:
        n, exc, example = drive(body, strategy, max_examples=max_examples, seconds=seconds, seed=seed,
                                      progress=progress, first_failure_dir=out_dir)
    finally:
        progress.close()
    outcome.examples = n
    if exc is not None:
        outcome.failure = fmt_exc(exc)
        case = example[0] if isinstance(example, tuple) else None
        arrays, dO = backward_inputs(v, case) if case is not None else tuple(last)
        outcome.reproducer = _write_repro(out_dir, spec_text, v, arrays, dO, case, outcome.failure)
    return outcome


def fuzz_specs_backward(*, gpu: bool, max_examples: int, seconds: float | None, seed: int, out_dir: str,
                        quiet: bool = False, nvcc_jobs: int = 0, cpu: bool = False) -> list[Outcome]:
    """Generated valid specs through the backward pass (see the module doc); `nvcc_jobs` > 0
    compiles each accepted backward source in the background (sm_90a atomics, sm_80 deterministic).
    `cpu`: specs the CPU backward takes also run one drawn case each on it against the reference."""
    from hypothesis import strategies as st

    from attngen.cuda import nvcc_check, render_bwd
    from attngen.lang import frontend
    from attngen.plan.schedule import Arch

    out = Outcome("generated specs (backward)")
    refused: dict[str, int] = {}
    kernels: dict[Variant, Any] = {}
    pool = ThreadPoolExecutor(max_workers=nvcc_jobs) if nvcc_jobs > 0 else None
    futures: list[tuple[Future, str, str, Arch]] = []

    def body(example: tuple[tuple[str, Any], Any]) -> None:
        spec, data = example
        text = spec[0] if isinstance(spec, tuple) else spec
        prog = frontend.loads(text, "<generated>")  # the forward pass's fuzzing reports a rejection
        v = prog.variants[0]
        why = _refusal(v)
        if why:
            key = why.split(" is ")[0].split(":")[0]
            refused[key] = refused.get(key, 0) + 1
            return
        for arch, det in ((Arch.SM90A, False), (Arch.SM80, True)):
            try:
                src = render_bwd.render(v, arch, deterministic=det)
            except ValueError as e:
                if "does not fit" in str(e):
                    continue  # no backward tile fits this arch's shared memory: a located refusal
                raise
            if pool is not None:
                futures.append((pool.submit(nvcc_check.compile_check, src, arch), text, v.name, arch))
        if cpu:
            if _refusal(v, cpu=True):
                return
            from attngen.cpu.kernel import compile_cpu

            kernels.setdefault(v, compile_cpu(v))
            case = data.draw(case_strategy(v, max_len=100, max_work=1 << 14))
        elif not gpu:
            return
        else:
            from attngen.runtime import kernel as runtime

            if v not in kernels:
                kernels[v] = runtime.compile(v, family="forward")
            case = data.draw(case_strategy(v, max_len=300, max_work=1 << 18))
        det = data.draw(st.booleans())
        arrays, dO = backward_inputs(v, case)
        wrt = wrt_names(v)
        got = run_backward(kernels[v], v, arrays, dO, wrt, det)
        out.kernel_runs += 1
        bad = [r.summary() for r in compare_backward(v, arrays, dO, got, wrt) if not r.ok]
        if bad:
            raise AssertionError(f"backward (deterministic={det}) at {case.describe()}:\n" + "\n".join(bad) + f"\n--- spec ---\n{text}")

    progress = Progress(max_examples, out.label, quiet)
    try:
        n, exc, _example = drive(body, st.tuples(spec_strategy(), st.data()), max_examples=max_examples,
                                       seconds=seconds, seed=seed, progress=progress, first_failure_dir=out_dir)
    finally:
        progress.close()
    out.examples = n
    if exc is not None:
        out.failure = fmt_exc(exc)
    if refused:
        out.notes.append("refused by the backward kernels: " + ", ".join(f"{k} x{c}" for k, c in sorted(refused.items())))
    if cpu:
        out.notes.append("backward run on the CPU backend where it differentiates the spec")
    elif not gpu:
        out.notes.append("no GPU kernels: backward sources rendered only")
    if pool is not None:
        if not quiet and futures:
            print(f"attngen fuzz: waiting for {len(futures)} backward nvcc compiles", file=sys.stderr, flush=True)
        failed = []
        for f, text, name, arch in futures:
            problem = f.result()
            if problem is not None:
                failed.append(f"variant {name} on {arch.value}:\n{problem}\n--- spec ---\n{text}")
        pool.shutdown(wait=True)
        out.notes.append(f"backward nvcc: {len(futures) - len(failed)} of {len(futures)} sources compiled")
        if failed and out.failure is None:
            out.failure = f"{len(failed)} backward source(s) do not compile; first: {failed[0]}"
    return [out]


__all__ = ["backward_inputs", "compare_backward", "fuzz_backward_variant", "fuzz_specs_backward", "reference_problems",
           "run_backward", "wrt_names"]
