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

Without a GPU (no CuPy, or no device) the kernel cannot run: FILE mode then checks the reference's
invariants and cross-checks it against FlexAttention on the CPU (when torch is importable), and
renders CUDA source when a renderer is present; it says so at the start and in the summary.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import sys
import textwrap
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from attngen.ir import abi
from attngen.check import tolerance
from attngen.ir.nodes import (
    PADDING_KV_LENS,
    PADDING_Q_LENS,
    AttnKind,
    Builtin,
    BuiltinName,
    DType,
    Layout,
    TensorRef,
    Variant,
    walk,
)

# Lengths where tiles begin and end (block sizes are multiples of 16 up to 256): off-by-one bugs
# live here, so the strategies draw them far more often than uniform integers would.
BOUNDARY_LENGTHS = (1, 2, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129, 255, 256, 257, 1000, 2000)

# Work cap per example (B·H·Lq·Lk score elements): keeps the float64 reference well under a second.
MAX_SCORE_ELEMENTS = 1 << 22

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2


# --------------------------------------------------------------------------------------------
# The device: CuPy / torch arrays in and out, and whether there is one at all


def gpu_status() -> tuple[bool, str]:
    """(True, device name) when a CUDA device is usable through CuPy, else (False, why not)."""
    try:
        import cupy
    except Exception as e:
        return False, f"CuPy is not importable ({type(e).__name__}: {e})"
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:
        return False, f"the CUDA runtime reports no device ({type(e).__name__})"
    if n < 1:
        return False, "the CUDA runtime reports 0 devices"
    try:
        props = cupy.cuda.runtime.getDeviceProperties(0)
        name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    except Exception:
        name = "CUDA device 0"
    return True, name


def _torch_or_none():
    try:
        import torch

        return torch if torch.cuda.is_available() else None
    except Exception:
        return None


def to_device(a: np.ndarray) -> Any:
    """A device copy of a host array: a torch CUDA tensor when torch has CUDA (the only way to hold
    bf16 with a real dtype), otherwise a CuPy array (bf16 as its uint16 bit pattern)."""
    a = np.ascontiguousarray(a)
    torch = _torch_or_none()
    if torch is not None:
        if a.dtype.name == "bfloat16":
            return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16).cuda()
        return torch.from_numpy(a).cuda()
    import cupy

    if a.dtype.name == "bfloat16":
        return cupy.asarray(a.view(np.uint16))
    return cupy.asarray(a)


def empty_device(shape: Sequence[int], dtype: DType | str, fill: float = math.nan) -> Any:
    """A device array filled with `fill` (NaN by default: poison, so unwritten elements fail)."""
    name = abi.DTYPE_NAMES[dtype] if isinstance(dtype, DType) else str(dtype)
    torch = _torch_or_none()
    if torch is not None:
        tdt = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[name]
        return torch.full(tuple(shape), fill, dtype=tdt, device="cuda")
    import cupy

    if name == "bfloat16":
        # 0x7FC0 is a bf16 quiet NaN; any other fill goes through float32's top half.
        bits = np.array([fill], dtype=np.float32).view(np.uint32)[0] >> 16
        return cupy.full(tuple(shape), int(bits), dtype=cupy.uint16)
    return cupy.full(tuple(shape), fill, dtype=name)


def to_host(x: Any, dtype: DType | None = None) -> np.ndarray:
    """A host NumPy copy of a device array (bf16 comes back as ml_dtypes.bfloat16)."""
    import ml_dtypes

    if hasattr(x, "detach"):  # torch
        import torch

        t = x.detach()
        if t.dtype == torch.bfloat16:
            return t.view(torch.int16).cpu().numpy().view(ml_dtypes.bfloat16)
        return t.cpu().numpy()
    import cupy

    a = cupy.asnumpy(x)
    if dtype == DType.BF16 and a.dtype == np.uint16:
        a = a.view(ml_dtypes.bfloat16)
    return a


def synchronize() -> None:
    import cupy

    cupy.cuda.Device().synchronize()


# --------------------------------------------------------------------------------------------
# Cases: a shape, a distribution and runtime-input overrides for one variant


@dataclass
class Case:
    """One fuzz example: sizes, distribution, seed, and how runtime inputs are overridden."""

    B: int
    Lq: int
    Lk: int
    dist: str = "normal"
    seed: int = 0
    q_lens: tuple[int, ...] | None = None
    kv_lens: tuple[int, ...] | None = None
    docs: str = "default"  # default | single | per_token
    blocks: str = "default"  # default | empty | full

    def describe(self) -> str:
        extra = []
        if self.q_lens is not None:
            extra.append(f"q_lens={list(self.q_lens)}")
        if self.kv_lens is not None:
            extra.append(f"kv_lens={list(self.kv_lens)}")
        if self.docs != "default":
            extra.append(f"docs={self.docs}")
        if self.blocks != "default":
            extra.append(f"blocks={self.blocks}")
        return f"B={self.B} Lq={self.Lq} Lk={self.Lk} dist={self.dist} seed={self.seed}" + (
            " " + " ".join(extra) if extra else ""
        )


def tensor_roles(v: Variant) -> dict[str, str]:
    """Which builtin each runtime tensor feeds ('document', 'block_sparse', ...)."""
    roles: dict[str, str] = {}
    for e in (v.mask, *v.scores):
        for n in walk(e):
            if isinstance(n, Builtin):
                for a in n.args:
                    if isinstance(a, TensorRef):
                        roles.setdefault(a.name, n.name.value)
    return roles


def case_strategy(v: Variant, *, max_len: int = 2048, max_work: int = MAX_SCORE_ELEMENTS):
    """A hypothesis strategy of `Case`s for a variant (shapes capped to `max_work` score elements)."""
    from hypothesis import strategies as st

    bounds = [x for x in BOUNDARY_LENGTHS if x <= max_len]

    @st.composite
    def lengths(draw) -> int:
        # A flag picks a boundary value or any integer; it shrinks to False, so a failure shrinks
        # to the smallest failing integer rather than the smallest failing boundary value.
        if draw(st.booleans()):
            return draw(st.sampled_from(bounds))
        return draw(st.integers(1, max_len))

    names = {d.name for d in v.runtime_inputs()}
    roles = tensor_roles(v)
    has_docs = any(r == BuiltinName.DOCUMENT.value for r in roles.values())
    has_blocks = any(r == BuiltinName.BLOCK_SPARSE.value for r in roles.values())

    @st.composite
    def build(draw) -> Case:
        B = draw(st.integers(1, 4))
        Lq = draw(lengths())
        Lk = Lq if v.kind == AttnKind.SELF else draw(lengths())
        # Keep the reference cheap: shrink the batch first, then the key length (cross only).
        per = v.heads * Lq * Lk
        B = max(1, min(B, max_work // max(per, 1)))
        if B * per > max_work and v.kind == AttnKind.CROSS:
            Lk = max(1, max_work // (B * v.heads * Lq))
        if B * v.heads * Lq * Lk > max_work and v.kind == AttnKind.SELF:
            Lq = Lk = max(1, int(math.isqrt(max_work // (B * v.heads))))
        dist = draw(st.sampled_from(["normal", "normal", "large", "uniform"]))
        seed = draw(st.integers(0, 2**31 - 1))

        def lens(L: int):
            return st.lists(st.one_of(st.sampled_from([0, L, 1, L - 1 if L > 1 else L]), st.integers(0, L)),
                            min_size=B, max_size=B).map(tuple)

        q_lens = draw(st.one_of(st.none(), lens(Lq))) if PADDING_Q_LENS in names else None
        kv_lens = draw(st.one_of(st.none(), lens(Lk))) if PADDING_KV_LENS in names else None
        docs = draw(st.sampled_from(["default", "single", "per_token"])) if has_docs else "default"
        blocks = draw(st.sampled_from(["default", "default", "empty", "full"])) if has_blocks else "default"
        return Case(B, Lq, Lk, dist, seed, q_lens, kv_lens, docs, blocks)

    return build()


def case_inputs(v: Variant, case: Case) -> dict[str, np.ndarray]:
    """q, k, v and every runtime input for a case: `workload.make_inputs`, then the overrides."""
    from attngen.check import workload

    rng = np.random.default_rng(case.seed)
    arrays = workload.make_inputs(v, case.B, case.Lq, case.Lk, rng, dist=case.dist)
    if case.q_lens is not None and PADDING_Q_LENS in arrays:
        arrays[PADDING_Q_LENS] = np.asarray(case.q_lens, dtype=arrays[PADDING_Q_LENS].dtype)
    if case.kv_lens is not None and PADDING_KV_LENS in arrays:
        arrays[PADDING_KV_LENS] = np.asarray(case.kv_lens, dtype=arrays[PADDING_KV_LENS].dtype)
    for name, role in tensor_roles(v).items():
        if name not in arrays:
            continue
        a = arrays[name]
        if role == BuiltinName.DOCUMENT.value and case.docs != "default":
            if case.docs == "single":
                arrays[name] = np.zeros_like(a) + 3  # one document (any id; 3 is not 0)
            else:  # every token its own document: ids 0, 1, 2, ... along the sequence
                arrays[name] = np.broadcast_to(np.arange(a.shape[-1]), a.shape).astype(a.dtype).copy()
        elif role == BuiltinName.BLOCK_SPARSE.value and case.blocks != "default":
            arrays[name] = (np.zeros_like(a) if case.blocks == "empty" else np.ones_like(a))
    return arrays


# --------------------------------------------------------------------------------------------
# Running and comparing


def split_inputs(arrays: Mapping[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """(q, k, v, runtime inputs) from one dict of arrays."""
    rest = {n: a for n, a in arrays.items() if n not in ("q", "k", "v")}
    return arrays["q"], arrays["k"], arrays["v"], rest


def run_kernel(kernel: Any, v: Variant, arrays: Mapping[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray | None]:
    """Launch a compiled kernel on device copies of `arrays` into NaN-poisoned outputs; host O, LSE."""
    q, k, vv, rest = split_inputs(arrays)
    B = q.shape[0]
    Lq = q.shape[2] if (v.layout == Layout.BHSD and q.ndim == 4) else q.shape[1]
    out = empty_device(abi.o_shape(v, B, Lq), v.dtype)
    lse = empty_device(abi.lse_shape(v, B, Lq), DType.FP32) if v.lse else None
    dev = {n: to_device(a) for n, a in rest.items()}
    kwargs: dict[str, Any] = {"out": out}
    if lse is not None:
        kwargs["lse"] = lse
    res = kernel(to_device(q), to_device(k), to_device(vv), **kwargs, **dev)
    synchronize()
    if isinstance(res, tuple):
        o_dev, lse_dev = res[0], res[1]
    else:
        o_dev, lse_dev = res, lse
    return to_host(o_dev, v.dtype), (to_host(lse_dev, DType.FP32) if lse_dev is not None else None)


def compare(v: Variant, arrays: Mapping[str, np.ndarray], out: np.ndarray, lse: np.ndarray | None,
            ref: tuple[np.ndarray, np.ndarray] | None = None) -> list[tolerance.Report]:
    """Reports for O (and LSE when the variant returns it) against the reference."""
    from attngen.check import reference

    q, k, vv, rest = split_inputs(arrays)
    if ref is None:
        ref = reference.attention(v, q, k, vv, rest)
    o_ref, lse_ref = ref
    se = reference.score_error(v, q, k, rest)
    reps = [tolerance.check(out, o_ref, v.dtype, "O", score_err=se)]
    if v.lse and lse is not None:
        reps.append(tolerance.check_lse(lse, lse_ref, v.dtype, "LSE", score_err=se))
    return reps


def reference_invariants(v: Variant, arrays: Mapping[str, np.ndarray]) -> list[str]:
    """Problems with the reference's own output (CPU fuzzing): NaN, or O/LSE disagreeing on which
    rows are empty. Returns the reference output too through the cache in `_last_ref`."""
    from attngen.check import reference

    q, k, vv, rest = split_inputs(arrays)
    o, lse = reference.attention(v, q, k, vv, rest)
    probs = []
    of = np.asarray(o).astype(np.float64)
    if np.isnan(of).any():
        probs.append(f"reference O has {int(np.isnan(of).sum())} NaN")
    if np.isnan(lse).any() or np.isposinf(lse).any():
        probs.append("reference LSE has NaN or +inf")
    if lse.shape != abi.lse_shape(v, q.shape[0], lse.shape[2]):
        probs.append(f"reference LSE shape {lse.shape}")
    if not v.norms and not v.residual:
        # An empty row must be exactly 0 (without a post-norm or residual changing it).
        o4 = of if v.layout == Layout.BHSD else of.transpose(0, 2, 1, 3)
        empty = np.isneginf(lse)
        if empty.any() and np.abs(o4[empty]).max() != 0:
            probs.append("reference O is not 0 on rows whose LSE is -inf")
    _last_ref[0] = (o, lse)
    return probs


_last_ref: list[Any] = [None]


def flex_crosscheck(v: Variant, arrays: Mapping[str, np.ndarray]) -> tolerance.Report | None:
    """The reference against FlexAttention on the CPU (fp32 compute on the same rounded inputs);
    None when torch is not importable."""
    try:
        import torch  # noqa: F401
    except Exception:
        return None
    import warnings

    from attngen.check import flex

    q, k, vv, rest = split_inputs(arrays)
    if v.page_size is not None:
        # Flex reads a contiguous cache: gather the pages (as the reference does) first.
        import dataclasses

        from attngen.ir.nodes import BLOCK_TABLE
        from attngen.check.reference import _unpage

        table = np.asarray(rest[BLOCK_TABLE]).astype(np.int64)
        k, vv = _unpage(k, table), _unpage(vv, table)
        if v.layout == Layout.BSHD:
            k, vv = k.transpose(0, 2, 1, 3), vv.transpose(0, 2, 1, 3)
        rest = {n: a for n, a in rest.items() if n != BLOCK_TABLE}
        v = dataclasses.replace(v, page_size=None)
    o_ref, _ = _last_ref[0] if _last_ref[0] is not None else (None, None)
    if o_ref is None:
        from attngen.check import reference

        o_ref, _ = reference.attention(v, q, k, vv, rest)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        o, _ = flex.run_flex(v, q, k, vv, rest, compiled=False, upcast=True)
    o_np = to_host_cpu(o)
    from attngen.check import reference

    se = reference.score_error(v, q, k, rest)
    return tolerance.check(o_np, o_ref, v.dtype, "O (flex on CPU vs reference)", score_err=se)


def to_host_cpu(t: Any) -> np.ndarray:
    """A CPU torch tensor as NumPy (bf16 as ml_dtypes.bfloat16)."""
    import ml_dtypes
    import torch

    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


# --------------------------------------------------------------------------------------------
# Reproducers


REPRO_TEST = '''\
"""Reproducer written by `attngen fuzz` ({when}).

{message}

Run: pytest -q {test_path}
Case: {case}
"""

import json
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent


def _arrays():
    import ml_dtypes

    data = np.load(HERE / "inputs.npz")
    meta = json.loads(str(data["__meta__"]))
    out = {{}}
    for name in meta["names"]:
        a = data[name]
        if meta["dtypes"][name] == "bfloat16":
            a = a.view(ml_dtypes.bfloat16)
        out[name] = a
    return meta, out


@pytest.mark.gpu
def test_kernel_matches_reference():
    import attngen
    from attngen.check import fuzz, reference, tolerance

    meta, arrays = _arrays()
    v = attngen.load(HERE / "spec.attn").get(meta["variant"])
    kernel = attngen.compile(v)
    out, lse = fuzz.run_kernel(kernel, v, arrays)
    reports = fuzz.compare(v, arrays, out, lse)
    bad = [r.summary() for r in reports if not r.ok]
    assert not bad, "\\n".join(bad)


def test_reference_is_sane():
    # Runs without a GPU: the reference itself must not produce NaN on this case.
    import attngen
    from attngen.check import fuzz

    meta, arrays = _arrays()
    v = attngen.load(HERE / "spec.attn").get(meta["variant"])
    assert fuzz.reference_invariants(v, arrays) == []
'''


def write_reproducer(out_dir: str | os.PathLike, spec_text: str, v: Variant, arrays: Mapping[str, np.ndarray] | None,
                     case: Case | None, message: str) -> Path:
    """Write spec.attn, inputs.npz, test_repro.py and FAILURE.txt into a fresh directory; return it."""
    key = hashlib.sha1((spec_text + v.name + (case.describe() if case else "") + message).encode()).hexdigest()[:10]
    d = Path(out_dir) / f"{v.name}-{key}"
    d.mkdir(parents=True, exist_ok=True)
    (d / "spec.attn").write_text(spec_text, encoding="utf-8")
    (d / "FAILURE.txt").write_text(message + "\n", encoding="utf-8")
    if arrays is not None:
        store: dict[str, np.ndarray] = {}
        dtypes: dict[str, str] = {}
        for n, a in arrays.items():
            a = np.ascontiguousarray(a)
            dtypes[n] = a.dtype.name
            store[n] = a.view(np.uint16) if a.dtype.name == "bfloat16" else a
        meta = {"variant": v.name, "names": list(arrays), "dtypes": dtypes, "case": case.describe() if case else None}
        np.savez(d / "inputs.npz", __meta__=np.array(json.dumps(meta)), **store)
        test = REPRO_TEST.format(when=time.strftime("%Y-%m-%d %H:%M"), message=textwrap.indent(message, "    ").strip(),
                                 test_path=d / "test_repro.py", case=case.describe() if case else "-")
        (d / "test_repro.py").write_text(test, encoding="utf-8")
    return d


# --------------------------------------------------------------------------------------------
# Progress


class Progress:
    """examples run / failures / elapsed on the terminal: tqdm when importable, else plain lines."""

    def __init__(self, total: int | None, label: str, quiet: bool = False):
        self.total, self.label, self.quiet = total, label, quiet
        self.n = 0
        self.failures = 0
        self.t0 = time.monotonic()
        self._last = 0.0
        self._bar = None
        if not quiet:
            try:
                from tqdm import tqdm

                self._bar = tqdm(total=total, desc=label, unit="ex", file=sys.stderr, dynamic_ncols=True)
            except Exception:
                self._bar = None

    def step(self, failed: bool = False) -> None:
        self.n += 1
        self.failures += int(failed)
        if self.quiet:
            return
        if self._bar is not None:
            self._bar.update(1)
            self._bar.set_postfix(failures=self.failures)
            return
        now = time.monotonic()
        if now - self._last > 2.0 or (self.total and self.n == self.total):
            self._last = now
            tot = f"/{self.total}" if self.total else ""
            print(f"  {self.label}: {self.n}{tot} examples, {self.failures} failing, {now - self.t0:.0f}s",
                  file=sys.stderr, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.t0


# --------------------------------------------------------------------------------------------
# Hypothesis driver: chunks (so --seconds can stop between them), shrinking, the minimal failure


@dataclass
class Outcome:
    """What one fuzz target ended with."""

    label: str
    examples: int = 0
    failure: str | None = None
    reproducer: Path | None = None
    notes: list[str] = field(default_factory=list)


def _drive(test_body: Callable[[Any], None], strategy: Any, *, max_examples: int, seconds: float | None, seed: int,
           progress: Progress, first_failure_dir: str | None = None) -> tuple[int, BaseException | None, Any]:
    """Run `test_body(example)` under hypothesis in chunks until max_examples or the time budget.
    Returns (examples run, the exception of the minimal failure or None, that example).

    The first failure is reported at once, before hypothesis shrinks it (on stderr, and as
    FIRST_FAILURE.txt in `first_failure_dir`): shrinking recompiles kernels and can outlast a
    time-limited run, which must still leave evidence behind."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hseed

    state = {"n": 0, "last_fail": None}
    t0 = time.monotonic()
    chunk = 25 if seconds else max_examples
    done = 0
    i = 0
    while done < max_examples and (seconds is None or time.monotonic() - t0 < seconds):
        want = min(chunk, max_examples - done)
        before = state["n"]

        @hseed(seed + i)
        @settings(max_examples=want, deadline=None, database=None, derandomize=False, report_multiple_bugs=False,
                  phases=(Phase.explicit, Phase.generate, Phase.shrink), print_blob=False,
                  suppress_health_check=list(HealthCheck))
        @given(strategy)
        def run(example):
            state["n"] += 1
            try:
                test_body(example)
            except Exception as e:
                if type(e).__module__.startswith("hypothesis"):
                    raise  # hypothesis' own control flow (an assumption, an overrun), not a failure
                if state["last_fail"] is None:
                    _report_first_failure(e, first_failure_dir)
                state["last_fail"] = example
                progress.step(failed=True)
                raise
            progress.step()

        try:
            run()
        except KeyboardInterrupt:
            raise
        except BaseException as e:  # the minimal failing example's exception, after shrinking
            return state["n"], e, state["last_fail"]
        done += state["n"] - before
        i += 1
        if state["n"] == before:
            break  # the strategy is exhausted
    return state["n"], None, None


def _report_first_failure(e: BaseException, out_dir: str | None) -> None:
    text = _fmt_exc(e)
    print(f"\nattngen fuzz: first failure (before shrinking):\n{text[:4000]}\n", file=sys.stderr, flush=True)
    if out_dir:
        try:
            Path(out_dir).mkdir(parents=True, exist_ok=True)
            with open(Path(out_dir) / "FIRST_FAILURE.txt", "a", encoding="utf-8") as f:
                f.write(text + "\n\n")
        except OSError:
            pass


def _fmt_exc(e: BaseException) -> str:
    if isinstance(e, AssertionError):
        return str(e)
    return "".join(traceback.format_exception(type(e), e, e.__traceback__)).rstrip()


# --------------------------------------------------------------------------------------------
# FILE mode


def fuzz_variant(v: Variant, spec_text: str, *, gpu: bool, max_examples: int, seconds: float | None, seed: int,
                 out_dir: str, quiet: bool = False) -> Outcome:
    """Fuzz one variant: kernel vs reference on the GPU, reference sanity (+ flex, render) without."""
    outcome = Outcome(v.name)
    kernel = None
    if gpu:
        from attngen.runtime import kernel as runtime

        try:
            kernel = runtime.compile(v)
        except Exception as e:
            outcome.failure = f"compile failed: {_fmt_exc(e)}"
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
            outcome.failure = f"render failed: {_fmt_exc(e)}"
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
        n, exc, example = _drive(body, strategy, max_examples=max_examples, seconds=seconds, seed=seed,
                                 progress=progress, first_failure_dir=out_dir)
    finally:
        progress.close()
    outcome.examples = n
    if exc is not None:
        outcome.failure = _fmt_exc(exc)
        arrays = case_inputs(v, example) if isinstance(example, Case) else last_arrays[0]
        outcome.reproducer = write_reproducer(out_dir, spec_text, v, arrays, example if isinstance(example, Case) else None,
                                              outcome.failure)
    return outcome


# --------------------------------------------------------------------------------------------
# --specs: generated valid specs and mutated invalid ones


def spec_strategy(name: str = "fuzzed"):
    """Random valid spec text: one variant drawing dtype, dims, heads, kind, layout, scale, a mask
    built from builtins and custom expressions, score modifications, norms, residual, nan_check,
    LSE and tile; the inputs each construct needs are declared. Returns (text, description)."""
    from hypothesis import strategies as st

    from attngen.ir.nodes import TileConfig
    from attngen.plan.schedule import SUPPORTED_HEAD_DIMS, WIDE_HEAD_DIMS, validate_tile

    @st.composite
    def build(draw) -> str:
        dtype = draw(st.sampled_from(["fp32", "fp16", "bf16"]))
        D = draw(st.sampled_from(SUPPORTED_HEAD_DIMS))
        Dv = D
        if draw(st.integers(0, 5)) == 0:
            Dv = draw(st.sampled_from(SUPPORTED_HEAD_DIMS))
        ratio = draw(st.sampled_from([1, 2, 4, 8]))
        Hkv = draw(st.sampled_from([1, 2]))
        H = ratio * Hkv
        kind = draw(st.sampled_from(["self", "cross"]))
        layout = draw(st.sampled_from(["bhsd", "bshd"]))
        lines = [f"dtype {dtype}", f"head_dim {D}" + (f" value {Dv}" if Dv != D else ""),
                 f"heads {H}" + (f" kv {Hkv}" if Hkv != H else ""), f"kind {kind}", f"layout {layout}"]
        scale = draw(st.sampled_from(["auto", "auto", "0.125", "0.05", "1.0", "0.3"]))
        if scale != "auto" or draw(st.booleans()):
            lines.append(f"scale {scale}")
        inputs: list[str] = []
        used_names: set[str] = set()

        def fresh(base: str) -> str:
            i = 0
            while f"{base}{i}" in used_names:
                i += 1
            used_names.add(f"{base}{i}")
            return f"{base}{i}"

        lq_dim = "Lq"

        def mask_atom() -> str:
            choice = draw(st.sampled_from(["causal", "window", "padding", "document", "prefix", "prefix_t",
                                           "block_sparse", "dilated", "keep", "block_causal", "band"]))
            if choice == "causal":
                return "causal"
            if choice == "window":
                return f"window({draw(st.integers(0, 300))}, {draw(st.integers(0, 300))})"
            if choice == "padding":
                return "padding"
            if choice == "document":
                if kind == "self":
                    n = fresh("doc")
                    srt = " sorted" if draw(st.booleans()) else ""
                    inputs.append(f"input {n}: i32[B, Lk]{srt}")
                    return f"document({n})"
                a, b = fresh("qdoc"), fresh("kdoc")
                inputs.append(f"input {a}: i32[B, {lq_dim}] sorted")
                inputs.append(f"input {b}: i32[B, Lk] sorted")
                return f"document({a}, {b})"
            if choice == "prefix":
                return f"prefix({draw(st.integers(0, 200))})"
            if choice == "prefix_t":
                n = fresh("plen")
                inputs.append(f"input {n}: i32[B]")
                return f"prefix({n}[b])"
            if choice == "block_sparse":
                n = fresh("blk")
                rank = draw(st.sampled_from([2, 3, 4]))
                dims = {2: "QB, KB", 3: "H, QB, KB", 4: "B, H, QB, KB"}[rank]
                qb, kb = fresh("QB"), fresh("KB")
                dims = dims.replace("QB", qb).replace("KB", kb)
                dt = draw(st.sampled_from(["u8", "i32"]))
                inputs.append(f"input {n}: {dt}[{dims}]")
                if draw(st.booleans()):
                    bq, bk = draw(st.sampled_from([64, 128, 256])), draw(st.sampled_from([64, 128, 256]))
                    return f"block_sparse({n}, {bq}, {bk})"
                return f"block_sparse({n})"
            if choice == "dilated":
                return f"(q - kv) % {draw(st.integers(2, 5))} == 0"
            if choice == "keep":
                n = fresh("keep")
                inputs.append(f"input {n}: u8[B, Lk]")
                return f"{n}[b, kv] != 0"
            if choice == "block_causal":
                blk = draw(st.sampled_from([16, 64, 100]))
                return f"q / {blk} >= kv / {blk}"
            return f"kv >= q - {draw(st.integers(0, 64))} && kv <= q + {draw(st.integers(0, 64))}"

        n_atoms = draw(st.integers(0, 3))
        mask = ""
        for i in range(n_atoms):
            atom = mask_atom()
            if atom == "padding" and "padding" in mask:
                atom = "causal"
            if draw(st.integers(0, 6)) == 0:
                atom = f"!({atom})"
            elif " " in atom and not atom.startswith("("):
                atom = f"({atom})"
            mask = atom if not mask else f"{mask} {draw(st.sampled_from(['&&', '&&', '||']))} {atom}"
        if mask:
            lines.append(f"mask {mask}")

        def score_line() -> str:
            choice = draw(st.sampled_from(["softcap", "alibi", "alibi_t", "bias", "rel_bias", "scale_s", "min_s",
                                           "where_s", "tanh_s"]))
            if choice == "softcap":
                return f"softcap({draw(st.sampled_from(['5.0', '20.0', '30.0', '50.0']))})"
            if choice == "alibi":
                return "alibi"
            if choice == "alibi_t":
                n = fresh("slopes")
                inputs.append(f"input {n}: fp32[H]")
                return f"alibi({n})"
            if choice == "bias":
                n = fresh("bias")
                dims = draw(st.sampled_from(["Lq, Lk", "H, Lq, Lk", "B, H, Lq, Lk"]))
                dt = draw(st.sampled_from(["fp32", "fp32", "fp16", "bf16"]))
                inputs.append(f"input {n}: {dt}[{dims}]")
                return f"bias({n})"
            if choice == "rel_bias":
                n = fresh("rel")
                m = draw(st.sampled_from([4, 16, 128]))
                inputs.append(f"input {n}: fp32[H, {2 * m + 1}]")
                return f"rel_bias({n}, {m})"
            if choice == "scale_s":
                return f"s * {draw(st.sampled_from(['0.5', '2.0', '1.5']))}"
            if choice == "min_s":
                return f"min(s, {draw(st.sampled_from(['4.0', '0.0', '10.0']))})"
            if choice == "where_s":
                return "where(kv % 2 == 0, s, s - 1.0)"
            return "tanh(s) * 3.0"

        for _ in range(draw(st.integers(0, 2))):
            lines.append(f"score {score_line()}")

        eps = draw(st.sampled_from(["1e-5", "1e-6"]))
        qn = draw(st.sampled_from(["none", "none", "head", "token"]))
        if qn == "token" and layout != "bshd":
            qn = "head"
        if qn != "none":
            kind_n = draw(st.sampled_from(["layernorm", "rmsnorm"]))
            aff = "" if draw(st.integers(0, 3)) else " affine false"
            lines.append(f"norm q {kind_n}({eps}) scope {qn}{aff}")
        if draw(st.integers(0, 3)) == 0:
            kind_n = draw(st.sampled_from(["layernorm", "rmsnorm"]))
            lines.append(f"norm k {kind_n}({eps}) scope head")
        if draw(st.integers(0, 4)) == 0:
            kind_n = draw(st.sampled_from(["layernorm", "rmsnorm"]))
            lines.append(f"norm o {kind_n}({eps})")
        if Dv == D and draw(st.integers(0, 3)) == 0:
            lines.append("residual")
        if draw(st.integers(0, 4)) == 0:
            lines.append("nan_check")
        if draw(st.booleans()):
            lines.append("output lse")
        if draw(st.booleans()):
            dt = {"fp32": DType.FP32, "fp16": DType.FP16, "bf16": DType.BF16}[dtype]
            bm = draw(st.sampled_from([16, 32, 64, 128]))
            bn = draw(st.sampled_from([16, 32, 64, 128]))
            warps = draw(st.sampled_from([1, 2, 4, 8]))
            stages = draw(st.integers(1, 3))
            t = TileConfig(bm, bn, warps, stages)
            if not validate_tile(dt, D, Dv, t):
                lines.append(f"tile block_m {bm} block_n {bn} warps {warps} stages {stages}")
        # Drawn last so that the draws above (and the CI examples they give) stay as they were.
        if draw(st.integers(0, 5)) == 0:
            n = fresh("sinks")
            inputs.append(f"input {n}: fp32[H]")
            lines.append(f"sink {n}")
        decodable = dtype != "fp32" and D == Dv and D in (64, 128) and not any(x.startswith(("norm", "residual")) for x in lines) \
            and not any(x.endswith(" sorted") for x in inputs)  # (plan.decode.decode_unsupported)
        if kind == "cross" and decodable and draw(st.integers(0, 3)) == 0:
            lines.append(f"kv_cache paged({draw(st.sampled_from([8, 16, 64, 256]))})")
        # The wide head dims (tensor-core dtypes only), drawn last for the same reason: they replace
        # the drawn pair where nothing drawn refuses them (a token-scope q norm, a residual at Dv !=
        # D, a paged cache), and any tile hint, which was validated for the narrow pair.
        if dtype != "fp32" and not any(x.startswith(("kv_cache", "residual")) or "scope token" in x for x in lines) \
                and draw(st.integers(0, 7)) == 0:
            D, Dv = draw(st.sampled_from(WIDE_HEAD_DIMS))
            lines[1] = f"head_dim {D}" + (f" value {Dv}" if Dv != D else "")
            lines = [x for x in lines if not x.startswith("tile ")]
        body = "\n".join(f"  {x}" for x in lines[:5] + inputs + lines[5:])
        return f"attention {name} {{\n{body}\n}}\n"

    return build()


# Tokens a mutation may insert: keywords, builtins, punctuation, odd numbers and names, junk.
MUTATION_TOKENS = (
    "attention", "dtype", "head_dim", "heads", "kv", "kind", "layout", "scale", "input", "mask", "score", "norm",
    "residual", "nan_check", "output", "tile", "auto", "block_m", "block_n", "warps", "stages", "value", "sorted",
    "scope", "affine", "causal", "window", "padding", "document", "prefix", "block_sparse", "softcap", "alibi",
    "bias", "rel_bias", "tanh", "exp", "log", "sqrt", "abs", "min", "max", "where", "s", "q", "kv", "b", "h",
    "B", "H", "Hkv", "Lq", "Lk", "D", "Dv", "fp32", "fp16", "bf16", "i32", "u8", "bhsd", "bshd", "self", "cross",
    "layernorm", "rmsnorm", "head", "token", "lse", "true", "false", "{", "}", "(", ")", "[", "]", ";", ",", ":",
    "&&", "||", "!", "==", "!=", "<", "<=", ">", ">=", "+", "-", "*", "/", "%", "0", "-1", "1", "7", "16", "3.5",
    "1e999", "1e-999", "99999999999999999999999999", "2147483648", "0.0", "nan", "inf", "1.2.3", "12x8", "0x10",
    "__import__", "os", "#", "\n", "\t", "é", "∞", "\x00", '"', "'", "/*", "*/", "\\", "`", "$", "@",
    "((((((((((((((((((((", "))))))))))))", "q_lens", "kv_lens", "q_norm_weight", "attention x {", "}}",
    "sink", "kv_cache", "paged", "paged(16)", "block_table",
    # Hostile values (issue 19): names on the mangling's reserved suffixes, values fp32 flushes to
    # 0, heads past the grid, an over-long literal, odd line breaks.
    "x_n0", "q_lens_n0", "q_norm_weight_s0", "a_launch", "1e-50", "1e-45", "65536", "0" * 300 + "8", "\r", "\f",
    "\u2028", "t[t[t[t[t[kv]]]]]",
)


def mutate(text: str, rng: np.random.Generator) -> str:
    """1–4 random edits of spec text: deletions, duplications, insertions of tokens, number swaps,
    line swaps, truncation."""
    for _ in range(int(rng.integers(1, 5))):
        n = len(text)
        op = int(rng.integers(0, 7))
        if n == 0:
            op = 2
        if op == 0:  # delete a span
            i = int(rng.integers(0, n))
            j = min(n, i + int(rng.integers(1, 12)))
            text = text[:i] + text[j:]
        elif op == 1:  # duplicate a span
            i = int(rng.integers(0, n))
            j = min(n, i + int(rng.integers(1, 30)))
            text = text[:j] + text[i:j] + text[j:]
        elif op == 2:  # insert a token
            i = int(rng.integers(0, n + 1))
            tok = MUTATION_TOKENS[int(rng.integers(0, len(MUTATION_TOKENS)))]
            text = text[:i] + " " + tok + " " + text[i:]
        elif op == 3:  # replace a number
            import re

            nums = list(re.finditer(r"\d+(\.\d+)?", text))
            if nums:
                m = nums[int(rng.integers(0, len(nums)))]
                rep = ["0", "-1", "1e999", "3", "17", "256", "4096", "99999999999", "0.0", "-0.5", "1e-9"][
                    int(rng.integers(0, 11))]
                text = text[: m.start()] + rep + text[m.end():]
        elif op == 4:  # swap two lines
            lines = text.split("\n")
            if len(lines) > 2:
                a, b = (int(x) for x in rng.integers(0, len(lines), size=2))
                lines[a], lines[b] = lines[b], lines[a]
                text = "\n".join(lines)
        elif op == 5:  # truncate
            text = text[: int(rng.integers(0, n + 1))]
        else:  # replace a word by another token
            import re

            words = list(re.finditer(r"[A-Za-z_][A-Za-z0-9_]*", text))
            if words:
                m = words[int(rng.integers(0, len(words)))]
                tok = MUTATION_TOKENS[int(rng.integers(0, len(MUTATION_TOKENS)))]
                text = text[: m.start()] + tok + text[m.end():]
    return text


def check_front_end(text: str) -> tuple[Any | None, str | None]:
    """Load text: (Program, None) on success, (None, None) on a SpecError with a located or plain
    rendered message, (None, problem) for anything else (a traceback would reach the user)."""
    from attngen.lang import frontend
    from attngen.lang.diagnostics import SpecError

    try:
        prog = frontend.loads(text, "<fuzz>")
    except SpecError as e:
        try:
            msg = e.render()
        except Exception as e2:
            return None, f"SpecError.render() raised {type(e2).__name__}: {e2}"
        if not isinstance(msg, str) or not msg.strip():
            return None, "SpecError with an empty message"
        return None, None
    except RecursionError:
        return None, "RecursionError escaped the front end"
    except Exception as e:
        return None, f"{type(e).__name__} escaped the front end (expected SpecError):\n{_fmt_exc(e)}"
    return prog, None


def check_round_trip(prog: Any) -> str | None:
    """loads(print_program(p)) == p, or what went wrong."""
    from attngen.lang import frontend

    try:
        text = frontend.print_program(prog)
    except Exception as e:
        return f"print_program raised {type(e).__name__}: {e}"
    back, problem = check_front_end(text)
    if problem:
        return f"the printed program does not load cleanly: {problem}\n--- printed ---\n{text}"
    if back is None:
        return f"the printed program is rejected with a SpecError\n--- printed ---\n{text}"
    if back != prog:
        return f"round trip changed the program\n--- printed ---\n{text}"
    return None


def fuzz_specs(*, gpu: bool, max_examples: int, seconds: float | None, seed: int, out_dir: str,
               quiet: bool = False, nvcc: Any = None) -> list[Outcome]:
    """Generated valid specs (load, round trip, verify) and mutated specs (SpecError or success);
    with `nvcc` (an `nvcc_check.NvccChecker`) every accepted spec must also compile."""
    from hypothesis import strategies as st

    outcomes: list[Outcome] = []
    kernels: dict[Any, Any] = {}
    half = None if seconds is None else seconds / 2

    # 1. Generated valid specs: must load, print and reload equal, and verify on random shapes.
    gen = Outcome("generated specs")
    if not gpu:
        gen.notes.append("no GPU: generated specs are loaded, round-tripped and run through the reference only")

    def gen_body(example: tuple[str, Any]) -> None:
        text, data = example
        prog, problem = check_front_end(text)
        if problem:
            raise AssertionError(f"front end failure on a generated spec:\n{problem}\n--- spec ---\n{text}")
        if prog is None:
            from attngen.lang import frontend
            from attngen.lang.diagnostics import SpecError

            try:
                frontend.loads(text, "<generated>")
            except SpecError as e:
                raise AssertionError(f"a generated (valid) spec was rejected:\n{e.render()}\n--- spec ---\n{text}") from None
        rt = check_round_trip(prog)
        if rt:
            raise AssertionError(f"{rt}\n--- original ---\n{text}")
        if nvcc is not None:
            nvcc.submit(text, prog.variants)
        v = prog.variants[0]
        case = data.draw(case_strategy(v, max_len=600 if gpu else 96, max_work=(1 << 20) if gpu else (1 << 14)))
        arrays = case_inputs(v, case)
        if gpu:
            from attngen.runtime import kernel as runtime

            if v not in kernels:
                kernels[v] = runtime.compile(v)
            out, lse = run_kernel(kernels[v], v, arrays)
            bad = [r.summary() for r in compare(v, arrays, out, lse) if not r.ok]
            if bad:
                raise AssertionError(f"at {case.describe()}:\n" + "\n".join(bad) + f"\n--- spec ---\n{text}")
        else:
            probs = reference_invariants(v, arrays)
            if probs:
                raise AssertionError(f"at {case.describe()}: " + "; ".join(probs) + f"\n--- spec ---\n{text}")
            from attngen.cuda.render_decode import render_family

            render_family(v)

    progress = Progress(max_examples, "generated specs", quiet)
    try:
        n, exc, ex = _drive(gen_body, st.tuples(spec_strategy(), st.data()), max_examples=max_examples,
                            seconds=half, seed=seed, progress=progress, first_failure_dir=out_dir)
    finally:
        progress.close()
    gen.examples = n
    if exc is not None:
        gen.failure = _fmt_exc(exc)
        text = ex[0] if isinstance(ex, tuple) else ""
        d = Path(out_dir) / f"spec-{hashlib.sha1(text.encode()).hexdigest()[:10]}"
        d.mkdir(parents=True, exist_ok=True)
        (d / "spec.attn").write_text(text, encoding="utf-8")
        (d / "FAILURE.txt").write_text(gen.failure + "\n", encoding="utf-8")
        gen.reproducer = d
    outcomes.append(gen)

    # 2. Mutated specs: only success or SpecError; successes must also round-trip.
    mut = Outcome("mutated specs")
    seeds_text: list[str] = []
    for p in sorted(Path(__file__).resolve().parent.parent.parent.glob("examples/*.attn")):
        try:
            seeds_text.append(p.read_text(encoding="utf-8"))
        except OSError:
            pass

    @st.composite
    def mutated(draw) -> str:
        base = draw(st.one_of(spec_strategy(), st.sampled_from(seeds_text))) if seeds_text else draw(spec_strategy())
        rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
        return mutate(base, rng)

    verdicts = {"loaded": 0, "SpecError": 0}

    def mut_body(text: str) -> None:
        prog, problem = check_front_end(text)
        if problem:
            raise AssertionError(f"{problem}\n--- spec ---\n{text}")
        verdicts["loaded" if prog is not None else "SpecError"] += 1
        if prog is not None:
            rt = check_round_trip(prog)
            if rt:
                raise AssertionError(f"{rt}\n--- original ---\n{text}")
            if nvcc is not None:
                nvcc.submit(text, prog.variants)

    n_mut = max_examples * 5 if not gpu else max_examples * 2
    progress = Progress(n_mut, "mutated specs", quiet)
    try:
        n, exc, ex = _drive(mut_body, mutated(), max_examples=n_mut, seconds=half, seed=seed + 7919, progress=progress,
                            first_failure_dir=out_dir)
    finally:
        progress.close()
    mut.examples = n
    mut.notes.append(f"mutated specs: {verdicts['loaded']} loaded, {verdicts['SpecError']} rejected with a SpecError")
    if exc is not None:
        mut.failure = _fmt_exc(exc)
        text = ex if isinstance(ex, str) else ""
        d = Path(out_dir) / f"mutated-{hashlib.sha1(text.encode()).hexdigest()[:10]}"
        d.mkdir(parents=True, exist_ok=True)
        (d / "spec.attn").write_text(text, encoding="utf-8")
        (d / "FAILURE.txt").write_text(mut.failure + "\n", encoding="utf-8")
        mut.reproducer = d
    outcomes.append(mut)
    if nvcc is not None:
        outcomes.append(_nvcc_outcome(nvcc, out_dir, quiet))
    return outcomes


def _nvcc_outcome(nvcc: Any, out_dir: str, quiet: bool) -> Outcome:
    """Wait for the background compiles of the accepted specs; each failure gets a reproducer."""
    if not quiet and nvcc.pending:
        print(f"attngen fuzz: waiting for {nvcc.pending} nvcc compiles", file=sys.stderr, flush=True)
    nvcc.wait()
    out = Outcome("nvcc compiles", examples=nvcc.specs)
    out.notes.append(nvcc.summary())
    if nvcc.out_dir is None:
        nvcc.out_dir = out_dir
        for f in nvcc.failures:
            nvcc._write(f)
    if nvcc.failures:
        out.reproducer = nvcc.reproducer_dir(nvcc.failures[0])
        first = nvcc.failures[0]
        out.failure = (f"{len(nvcc.failures)} accepted spec(s) do not compile; first: variant {first.variant} "
                       f"on {first.arch.value}:\n{first.message}\n--- spec ---\n{first.spec_text}")
    return out


# --------------------------------------------------------------------------------------------
# The command


def build_parser() -> argparse.ArgumentParser:
    """The `attngen fuzz` arguments (also used when this module runs on its own)."""
    p = argparse.ArgumentParser(prog="attngen fuzz", description=__doc__.split("\n\n")[0])
    p.add_argument("file", nargs="?", metavar="FILE")
    p.add_argument("--variant")
    p.add_argument("--specs", action="store_true", help="fuzz the compiler with generated and mutated specs")
    p.add_argument("--max-examples", type=int, default=None)
    p.add_argument("--seconds", type=float, default=None)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--out", default=None, help="where failing cases are written (default fuzz-failures/)")
    p.add_argument("--nvcc", dest="nvcc", action="store_true", default=None,
                   help="--specs: compile every accepted spec with nvcc (sm_90a and sm_80); the default when nvcc is on the PATH")
    p.add_argument("--no-nvcc", dest="nvcc", action="store_false", help="--specs: skip the nvcc step")
    p.add_argument("--jobs", type=int, default=None, help="parallel nvcc compiles (default: the CPU count)")
    return p


def main(args: argparse.Namespace | Sequence[str] | None = None) -> int:
    """Run `attngen fuzz`; returns 0 when nothing failed, 1 on a failure, 2 on a usage error."""
    if args is None or not isinstance(args, argparse.Namespace):
        args = build_parser().parse_args(list(args) if args is not None else None)
    out_dir = args.out or "fuzz-failures"
    seed = args.seed if args.seed is not None else int(time.time()) % (2**31)
    gpu, why = gpu_status()
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
        outcomes = fuzz_specs(gpu=gpu, max_examples=n, seconds=args.seconds, seed=seed, out_dir=out_dir,
                              nvcc=checker)
    else:
        if not args.file:
            print("attngen fuzz: error: expected FILE (or --specs)", file=sys.stderr)
            return EXIT_USAGE
        from attngen.lang import frontend
        from attngen.lang.diagnostics import SpecError

        try:
            text = Path(args.file).read_text(encoding="utf-8")
        except OSError as e:
            print(f"attngen fuzz: error: {args.file}: {e.strerror or e}", file=sys.stderr)
            return EXIT_USAGE
        try:
            prog = frontend.loads(text, args.file)
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
        outcomes = [fuzz_variant(v, text, gpu=gpu, max_examples=n, seconds=per, seed=seed, out_dir=out_dir)
                    for v in variants]
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
