"""What a quantized spec's quantization costs: the reference emulation's error against the
unquantized float64 attention of the same inputs, on N(0,1) inputs and on inputs with outlier
channels (0.1% of the channels of q, k and v scaled by 20, as in real activations), beside the
error of the full-precision spec in its output type (what SDPA in bf16 would make).

`explain` reports it; a benchmark holds a kernel to the bar "error within 1.1x of the emulation's"
with `within_bar`, on inputs from `inputs`.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import numpy as np

from attngen.ir.dtypes import DType
from attngen.ir.nodes import Variant

OUTLIER_FRACTION = 0.001  # of the channels (heads x head dim) of q, k and v
OUTLIER_FACTOR = 20.0
BAR = 1.1  # a kernel's error may exceed its emulation's by this factor


@dataclass(frozen=True)
class Error:
    """Relative L2 error and max abs error over max|truth| of one output against the truth."""

    rel_l2: float
    max_abs: float

    def text(self) -> str:
        return f"rel L2 {self.rel_l2:.3g}, max abs {self.max_abs:.3g} (of max|O|)"


@dataclass(frozen=True)
class Accuracy:
    """The emulation's and the full-precision spec's errors, plain and with outliers."""

    shape: tuple[int, int, int]
    emulation: Error
    emulation_outliers: Error
    full_precision: Error  # the unquantized spec in its output type (`dtype`)
    full_precision_outliers: Error
    baseline: str  # the full-precision spec's type, e.g. "bf16"

    def as_dict(self) -> dict:
        return {"shape": {"B": self.shape[0], "Lq": self.shape[1], "Lk": self.shape[2]},
                "emulation": dataclasses.asdict(self.emulation), "emulation_outliers": dataclasses.asdict(self.emulation_outliers),
                "full_precision": dataclasses.asdict(self.full_precision),
                "full_precision_outliers": dataclasses.asdict(self.full_precision_outliers), "baseline": self.baseline}


def error(out: np.ndarray, truth: np.ndarray) -> Error:
    """`out` against `truth` (any float arrays of one shape)."""
    o, t = np.asarray(out, np.float64), np.asarray(truth, np.float64)
    tn = float(np.linalg.norm(t))
    d = o - t
    tm = float(np.abs(t).max()) if t.size else 0.0
    return Error(float(np.linalg.norm(d)) / tn if tn else 0.0, float(np.abs(d).max()) / tm if tm else 0.0)


def full_precision(v: Variant, dtype: DType | None = None) -> Variant:
    """The same attention without quantization, every tensor in `dtype` (default: the output's)."""
    return dataclasses.replace(v, quants=(), input_dtypes=None, dtype=dtype or v.dtype)


def inputs(v: Variant, B: int, Lq: int, Lk: int, seed: int = 0, outliers: bool = False) -> dict[str, np.ndarray]:
    """Float64 N(0,1) q, k, v (with outlier channels if `outliers`) and valid runtime inputs
    (no scales: `quantized_call` calibrates them)."""
    from attngen.check import workload

    rng = np.random.default_rng(seed)
    arrays = workload.make_inputs(full_precision(v, DType.FP32), B, Lq, Lk, rng)
    for name, heads in (("q", v.heads), ("k", v.kv_heads), ("v", v.kv_heads)):
        x = np.asarray(arrays[name], np.float64)
        if outliers:
            width = x.shape[-1] * (heads if x.shape[-2] == heads else 1)
            flat = x.reshape(*x.shape[:-2], -1) if x.shape[-2] == heads else x
            n = max(1, round(OUTLIER_FRACTION * width))
            chans = rng.choice(width, size=n, replace=False)
            flat[..., chans] *= OUTLIER_FACTOR
            x = flat.reshape(x.shape)
        arrays[name] = x
    return arrays


def quantized_call(v: Variant, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The arrays a quantized spec's call takes for float inputs `arrays`: q/k/v in the output's
    type (those stored quantized: quantized with calibrated scales), the scale inputs added."""
    from attngen.check import quant
    from attngen.check.reference_eval import dtype_of

    out = dict(arrays)
    for name in ("q", "k", "v"):
        out[name] = np.asarray(arrays[name]).astype(dtype_of(v.dtype))
    quant.store_inputs(v, out)
    return out


def truth(v: Variant, arrays: dict[str, np.ndarray]) -> np.ndarray:
    """The unquantized attention of `arrays` in float64 (fp32 inputs and output, float64 inside)."""
    from attngen.check import reference

    rest = {n: a for n, a in arrays.items() if n not in ("q", "k", "v")}
    o, _ = reference.attention(full_precision(v, DType.FP32), arrays["q"], arrays["k"], arrays["v"], rest)
    return np.asarray(o, np.float64)


def _errors(v: Variant, arrays: dict[str, np.ndarray]) -> tuple[Error, Error]:
    from attngen.check import reference

    t = truth(v, arrays)
    call = quantized_call(v, arrays)
    rest = {n: a for n, a in call.items() if n not in ("q", "k", "v")}
    emu, _ = reference.attention(v, call["q"], call["k"], call["v"], rest)
    fp = full_precision(v)
    rest_fp = {n: a for n, a in arrays.items() if n not in ("q", "k", "v")}
    base, _ = reference.attention(fp, arrays["q"], arrays["k"], arrays["v"], rest_fp)
    return error(emu, t), error(base, t)


@functools.lru_cache(maxsize=32)
def accuracy(v: Variant, shape: tuple[int, int, int] = (1, 256, 256), seed: int = 0) -> Accuracy:
    """The emulation's error against the float64 truth at `shape` (B, Lq, Lk), plain and with outliers."""
    B, Lq, Lk = shape
    with np.errstate(all="ignore"):
        plain = _errors(v, inputs(v, B, Lq, Lk, seed))
        out = _errors(v, inputs(v, B, Lq, Lk, seed, outliers=True))
    return Accuracy(shape, plain[0], out[0], plain[1], out[1], v.dtype.value)


def within_bar(kernel_out: np.ndarray, truth_out: np.ndarray, emulation_out: np.ndarray, factor: float = BAR) -> tuple[bool, Error, Error]:
    """Whether a kernel adds nothing beyond the declared quantization: its relative L2 error
    against the truth is within `factor` of the emulation's. Returns (ok, kernel's, emulation's)."""
    k, e = error(kernel_out, truth_out), error(emulation_out, truth_out)
    return k.rel_l2 <= factor * e.rel_l2, k, e


__all__ = ["Accuracy", "BAR", "Error", "accuracy", "error", "full_precision", "inputs", "quantized_call", "truth", "within_bar"]
