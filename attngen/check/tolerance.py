"""The tolerance policy: how close a kernel's output must be to the NumPy reference, per dtype.

The reference (`attngen.reference`) computes in float64 from the very inputs the kernel sees
(rounded to the spec dtype), then rounds O to the spec dtype. What is left to compare is the
kernel's own arithmetic error, which this policy bounds with two numbers per dtype:

* relative L2 error  ``‖out − ref‖₂ / ‖ref‖₂``  — the overall accuracy of the output, and
* max-abs error      ``max |out − ref|  ≤  max_abs · max|ref|`` — no single element far off, with
  the bound scaled to the output's magnitude (attention outputs are weighted averages of V, so
  their scale is V's scale, not 1).

| dtype | rel L2 | max-abs (× max abs(ref)) | why |
|---|---|---|---|
| fp32 | 1e-5 | 1e-4 | FFMA path, fp32 accumulation: error ~ sqrt(Lk)·2⁻²⁴ plus exp2 ulps |
| fp16 | 2e-3 | 1e-2 | P is rounded to fp16 (2⁻¹¹) before P·V, O rounded to fp16 |
| bf16 | 1.6e-2 | 6.25e-2 | P rounded to bf16 (2⁻⁸) before P·V, O rounded to bf16 |

Scores of large magnitude (the `large` input distribution) magnify the absolute fp32 error of
q·k, which the exponent turns into relative error of P: `score_error(q, k, scale)` estimates that
error δ from the inputs and `check(..., score_err=δ)` adds 4δ to the relative L2 bound and 8δ to the
max-abs factor (2δ to the LSE's absolute bound). For unit-normal inputs δ is ~1e-6: the table rules.
With a pre-norm on q or k, `reference.score_error` adds the effect of one rounding flip per
normalised operand: the kernel normalises in fp32, the reference in float64, and both round the
result to the spec dtype, so an element near a rounding midpoint can land one ulp apart
(tests/gpu/regressions/knorm_lse_rounding_*.attn are the fuzz cases that showed it).

Rules that never bend: a NaN in the output (or the reference) never passes; an Inf in the output
fails unless the reference has the same Inf at that place; an all-zero reference (every row fully
masked) demands an all-zero output. For the LSE, only entries where the reference is finite are
compared (with an absolute + relative bound); where the reference is −inf (a fully masked row) the
output must be exactly −inf.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from attngen.ir.nodes import DType


@dataclass(frozen=True)
class Tolerance:
    """Bounds for one dtype. `max_abs` is relative to max|ref| (see the module docstring)."""

    rel_l2: float
    max_abs: float
    lse_abs: float  # LSE: |out − ref| ≤ lse_abs + lse_rel · |ref|
    lse_rel: float


# Each output dtype's bounds (their figures: attngen.ir.dtypes, the dtype's row).
POLICY: dict[DType, Tolerance] = {
    d: Tolerance(rel_l2=t.rel_l2, max_abs=t.max_abs, lse_abs=t.lse_abs, lse_rel=t.lse_rel)
    for d in DType if (t := d.info.tolerances) is not None
}


def tolerance_for(dtype: DType | str) -> Tolerance:
    """The policy row for an IR dtype (or its spelling: 'fp32', 'fp16', 'bf16')."""
    d = dtype if isinstance(dtype, DType) else DType(str(dtype))
    if d not in POLICY:
        names = [x.value for x in POLICY]
        raise ValueError(f"no tolerance policy for dtype {d.value}; expected {', '.join(names[:-1])} or {names[-1]}")
    return POLICY[d]


EPS32 = 2.0**-24


def score_error(q: object, k: object, scale: float) -> float:
    """An estimate of the absolute fp32 error in one score s = scale·q·k for these inputs.

    fp32 accumulation of a dot product errs by about 2⁻²⁴·scale·‖q‖·‖k‖ (random-walk rounding of
    the partial sums), and the exponent turns an absolute error δ in s into a relative error δ in
    exp(s); the bound uses the largest row norms of q and k (Cauchy–Schwarz), doubled for the
    rounding of s itself and of the running max."""
    qf = np.asarray(q).astype(np.float64)
    kf = np.asarray(k).astype(np.float64)
    if qf.size == 0 or kf.size == 0:
        return 0.0
    qn = float(np.sqrt((qf * qf).sum(axis=-1)).max())
    kn = float(np.sqrt((kf * kf).sum(axis=-1)).max())
    err = 2.0 * EPS32 * abs(scale) * qn * kn
    return err if math.isfinite(err) else 0.0


def bounds(dtype: DType | str, score_err: float = 0.0) -> tuple[float, float]:
    """(relative L2 bound, max-abs factor of max|ref|) for a dtype and a score error estimate."""
    tol = tolerance_for(dtype)
    se = max(0.0, float(score_err))
    return tol.rel_l2 + 4.0 * se, tol.max_abs + 8.0 * se


@dataclass(frozen=True)
class Report:
    """The outcome of one comparison; `ok` says whether it passed, `summary()` says how."""

    what: str
    dtype: str
    ok: bool
    rel_l2: float
    max_abs: float
    rel_l2_bound: float
    max_abs_bound: float
    n: int
    n_nan: int
    n_bad: int  # elements whose error exceeds the max-abs bound (or mismatched inf/NaN)
    worst_index: tuple[int, ...] | None
    worst_out: float
    worst_ref: float
    reasons: tuple[str, ...]

    def summary(self) -> str:
        """One or two readable lines: verdict, errors against bounds, worst element."""
        head = (
            f"{self.what} [{self.dtype}]: {'ok' if self.ok else 'MISMATCH'} "
            f"rel_l2={self.rel_l2:.3g} (bound {self.rel_l2_bound:.3g}), "
            f"max_abs={self.max_abs:.3g} (bound {self.max_abs_bound:.3g}), "
            f"{self.n_bad}/{self.n} elements out of bounds, {self.n_nan} NaN"
        )
        if self.worst_index is not None:
            head += f"; worst at {self.worst_index}: out={self.worst_out!r} ref={self.worst_ref!r}"
        if self.reasons:
            head += "\n  " + "; ".join(self.reasons)
        return head

    def __str__(self) -> str:
        return self.summary()


def _f64(a: object) -> np.ndarray:
    # bf16 arrays (ml_dtypes) convert through float32 exactly; everything else directly.
    arr = np.asarray(a)
    if arr.dtype.kind not in "fiub":
        arr = arr.astype(np.float32)
    return arr.astype(np.float64)


def _dtype_name(dtype: DType | str) -> str:
    return dtype.value if isinstance(dtype, DType) else str(dtype)


def check(out: object, ref: object, dtype: DType | str, what: str = "O", *, score_err: float = 0.0,
          extra_abs: float = 0.0, extra_rel_l2: float = 0.0) -> Report:
    """Compare an output with the reference under the policy for `dtype` (see module docstring).

    `score_err` (from `score_error`) widens the bounds for inputs with large scores; `extra_abs`
    (absolute) and `extra_rel_l2` add error a kernel may make beyond them (a quantized P's
    rounding against a running max: attngen.check.quant.reports)."""
    tol = tolerance_for(dtype)
    o = _f64(out)
    r = _f64(ref)
    with np.errstate(invalid="ignore", over="ignore"):
        return _check(o, r, tol, dtype, what, score_err, extra_abs, extra_rel_l2)


def _check(o: np.ndarray, r: np.ndarray, tol: Tolerance, dtype: DType | str, what: str, score_err: float,
           extra_abs: float = 0.0, extra_rel_l2: float = 0.0) -> Report:
    rel_bound, abs_factor = bounds(dtype, score_err)
    rel_bound += max(0.0, extra_rel_l2)
    reasons: list[str] = []
    if o.shape != r.shape:
        return Report(what, _dtype_name(dtype), False, math.inf, math.inf, rel_bound, math.inf,
                      int(r.size), 0, int(r.size), None, math.nan, math.nan,
                      (f"shape {o.shape} != reference shape {r.shape}",))
    n = int(r.size)
    nan_out = np.isnan(o)
    n_nan = int(nan_out.sum())
    if n_nan:
        reasons.append(f"{n_nan} NaN in the output")
    n_ref_nan = int(np.isnan(r).sum())
    if n_ref_nan:
        reasons.append(f"{n_ref_nan} NaN in the reference (a reference bug: it never produces NaN)")
    # Infinities must agree exactly in place and sign; elsewhere they are errors.
    inf_o, inf_r = np.isinf(o), np.isinf(r)
    inf_mismatch = (inf_o | inf_r) & ~((inf_o & inf_r) & (np.sign(o) == np.sign(r)))
    n_inf_bad = int(inf_mismatch.sum())
    if n_inf_bad:
        reasons.append(f"{n_inf_bad} infinities that the reference does not have at the same place")
    finite = np.isfinite(o) & np.isfinite(r)
    diff = np.where(finite, np.abs(o - r), 0.0)
    rf = np.where(np.isfinite(r), r, 0.0)
    ref_norm = float(np.sqrt((rf * rf).sum()))
    err_norm = float(np.sqrt((diff * diff).sum()))
    ref_max = float(np.abs(rf).max()) if n else 0.0
    if ref_norm > 0:
        rel = err_norm / ref_norm
    else:
        rel = 0.0 if err_norm == 0 else math.inf  # all-zero reference: only exact zeros pass
    max_abs = float(diff.max()) if n else 0.0
    abs_bound = abs_factor * ref_max + max(0.0, extra_abs)
    bad = (diff > abs_bound) | nan_out | np.isnan(r) | inf_mismatch
    n_bad = int(bad.sum())
    if rel > rel_bound:
        reasons.append(f"relative L2 error {rel:.3g} exceeds {rel_bound:.3g}")
    if max_abs > abs_bound:
        reasons.append(f"max abs error {max_abs:.3g} exceeds {abs_bound:.3g} (= {abs_factor:.3g} x max|ref| {ref_max:.3g})")
    worst = None
    wo = wr = math.nan
    if n:
        score = np.where(bad, math.inf, diff) if n_bad else diff
        flat = int(np.argmax(score))
        worst = tuple(int(i) for i in np.unravel_index(flat, r.shape))
        wo, wr = float(o[worst]), float(r[worst])
    ok = not reasons
    return Report(what, _dtype_name(dtype), ok, rel, max_abs, rel_bound, abs_bound, n, n_nan, n_bad,
                  worst, wo, wr, tuple(reasons))


def check_lse(out: object, ref: object, dtype: DType | str, what: str = "LSE", *, score_err: float = 0.0) -> Report:
    """Compare LSE: finite reference entries within abs + rel bounds; −inf exactly where ref is −inf."""
    tol = tolerance_for(dtype)
    o = np.asarray(out, dtype=np.float64)
    r = np.asarray(ref, dtype=np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        return _check_lse(o, r, tol, dtype, what, max(0.0, float(score_err)))


def _check_lse(o: np.ndarray, r: np.ndarray, tol: Tolerance, dtype: DType | str, what: str, se: float) -> Report:
    reasons: list[str] = []
    if o.shape != r.shape:
        return Report(what, _dtype_name(dtype), False, math.inf, math.inf, 0.0, 0.0, int(r.size), 0,
                      int(r.size), None, math.nan, math.nan, (f"shape {o.shape} != reference shape {r.shape}",))
    n = int(r.size)
    nan_out = np.isnan(o)
    n_nan = int(nan_out.sum())
    if n_nan:
        reasons.append(f"{n_nan} NaN in the output")
    ref_masked = np.isneginf(r)
    miss_masked = ref_masked & ~np.isneginf(o)
    if miss_masked.any():
        reasons.append(f"{int(miss_masked.sum())} fully masked rows (reference -inf) are not -inf in the output")
    fin = np.isfinite(r)
    bad_fin = fin & ~np.isfinite(o)
    if bad_fin.any():
        reasons.append(f"{int(bad_fin.sum())} rows with a finite reference are not finite in the output")
    if (np.isposinf(r) | np.isnan(r)).any():
        reasons.append("the reference LSE has +inf or NaN (a reference bug)")
    both = fin & np.isfinite(o)
    diff = np.where(both, np.abs(o - r), 0.0)
    lse_abs = tol.lse_abs + 2.0 * se
    bound = lse_abs + tol.lse_rel * np.abs(np.where(fin, r, 0.0))
    over = both & (diff > bound)
    if over.any():
        reasons.append(f"{int(over.sum())} finite entries exceed |out - ref| <= {lse_abs:.2g} + {tol.lse_rel:.2g}|ref|")
    bad = over | miss_masked | bad_fin | nan_out
    n_bad = int(bad.sum())
    max_abs = float(diff.max()) if n else 0.0
    rf = np.where(fin, r, 0.0)
    ref_norm = float(np.sqrt((rf * rf).sum()))
    err_norm = float(np.sqrt((diff * diff).sum()))
    rel = err_norm / ref_norm if ref_norm > 0 else (0.0 if err_norm == 0 else math.inf)
    worst = None
    wo = wr = math.nan
    if n:
        score = np.where(bad, math.inf, diff) if n_bad else diff
        worst = tuple(int(i) for i in np.unravel_index(int(np.argmax(score)), r.shape))
        wo, wr = float(o[worst]), float(r[worst])
    return Report(what, _dtype_name(dtype), not reasons, rel, max_abs, math.nan,
                  float(bound.max()) if n else 0.0, n, n_nan, n_bad, worst, wo, wr, tuple(reasons))


# Gradients (the backward pass; tests/gpu/test_gpu_backward.py measured these on the H200): the
# max error over max|ref| per dtype -- fp32 sums in every engine, so half-precision inputs, the
# rounded O that enters delta = rowsum(dO * O) and the rounded gradients dominate -- plus an
# absolute floor `grad_atol` for gradients that cancel to ~0 (one visible key: dS = 0 exactly).
GRAD_MAX_ABS: dict[DType, float] = {d: t.grad_max_abs for d in DType if (t := d.info.tolerances) is not None}


def grad_atol(dtype: DType | str, *, q_max: float, k_max: float, v_max: float, do_max: float, value_head_dim: int,
              scale: float, residual: bool = False) -> float:
    """The absolute floor of the gradient bound: delta = rowsum(dO * O) reads O rounded to the
    dtype (with a residual O = O' + q, rounded), so dS carries |dO| |O| ulp sqrt(Dv), times scale
    |q|, |k| in dk, dq; plus fp32 roundoff of the same products."""
    d = dtype if isinstance(dtype, DType) else DType(str(dtype))
    o_max = v_max + (q_max if residual else 0.0)
    return (1e-5 + 2 * d.info.unit_roundoff * math.sqrt(value_head_dim)) * do_max * (1 + o_max) * (1 + abs(scale) * (q_max + k_max))


def param_grad_atol(*, do_max: float, o_max: float, contributions: float, dtype: DType | str = DType.FP32,
                    value_head_dim: int = 1) -> float:
    """The absolute floor of a learnable input's gradient: each element is a sum of dS terms
    (fp32 atomics, `contributions` of them on average) that can cancel in the reference (one
    visible key: dS = 0; a bias summed over batches and heads), while each kernel term carries the
    error of dO.v - rowsum(dO * O): fp32 roundoff (~1e-5 |dO| (1 + |O|)), plus the rounding of O
    to the element type inside delta = rowsum(dO * O) (ulp sqrt(Dv) |dO| |O|; the H200's backward
    fuzz found a bf16 bias gradient summed over 32 batch-heads 0.23 off under large inputs), summed
    like a random walk."""
    d = dtype if isinstance(dtype, DType) else DType(str(dtype))
    ulp = d.info.rounding_beyond_fp32
    per_term = (1e-5 + ulp * math.sqrt(max(1, value_head_dim))) * do_max * (1 + o_max)
    return per_term * math.sqrt(max(1.0, contributions))


def check_grad(out: object, ref: object, dtype: DType | str, what: str, *, atol: float = 0.0) -> Report:
    """Compare a gradient with the float64 reference backward: every element within
    GRAD_MAX_ABS[dtype] x max|ref| + atol; NaN or Inf never pass. The relative L2 error is
    reported, not bounded (its bound is inf)."""
    d = dtype if isinstance(dtype, DType) else DType(str(dtype))
    o, r = _f64(out), _f64(ref)
    reasons: list[str] = []
    if o.shape != r.shape:
        return Report(what, _dtype_name(d), False, math.inf, math.inf, math.inf, 0.0, int(r.size), 0, int(r.size),
                      None, math.nan, math.nan, (f"shape {o.shape} != reference shape {r.shape}",))
    n = int(r.size)
    with np.errstate(invalid="ignore", over="ignore"):
        bad_out = ~np.isfinite(o)
        n_nan = int(np.isnan(o).sum())
        if bad_out.any():
            reasons.append(f"{int(bad_out.sum())} NaN/Inf in the gradient")
        if not np.isfinite(r).all():
            reasons.append("the reference gradient is not finite (a reference bug)")
        diff = np.where(bad_out, math.inf, np.abs(o - r))
        ref_max = float(np.abs(r).max()) if n else 0.0
        bound = GRAD_MAX_ABS[d] * ref_max + atol
        over = diff > bound
        fin = np.where(np.isfinite(diff), diff, 0.0)
        ref_norm = float(np.sqrt((r * r).sum())) if n else 0.0
        err_norm = float(np.sqrt((fin * fin).sum()))
    rel = err_norm / ref_norm if ref_norm > 0 else (0.0 if err_norm == 0 else math.inf)
    max_abs = float(diff.max()) if n else 0.0
    if over.any() and not bad_out.any():
        reasons.append(f"max abs error {max_abs:.3g} exceeds {bound:.3g} (= {GRAD_MAX_ABS[d]:.3g} x max|ref| {ref_max:.3g} + {atol:.3g})")
    worst = None
    wo = wr = math.nan
    if n:
        worst = tuple(int(i) for i in np.unravel_index(int(np.argmax(diff)), r.shape))
        wo, wr = float(o[worst]), float(r[worst])
    return Report(what, _dtype_name(d), not reasons, rel, max_abs, math.inf, bound, n, n_nan, int(over.sum()),
                  worst, wo, wr, tuple(reasons))


def assert_close(out: object, ref: object, dtype: DType | str, what: str = "O", *, score_err: float = 0.0) -> Report:
    """`check` (or `check_lse` when `what` starts with 'LSE'), raising AssertionError with the
    summary when the comparison fails; returns the report when it passes."""
    fn = check_lse if what.upper().startswith("LSE") else check
    rep = fn(out, ref, dtype, what, score_err=score_err)
    if not rep.ok:
        raise AssertionError(rep.summary())
    return rep
