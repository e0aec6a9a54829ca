"""`attngen fuzz`'s runner: a kernel launched on device copies of a case's arrays, compared with
the reference under the tolerance policy; without a GPU, the reference's own invariants and its
cross-check with FlexAttention on the CPU."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from attngen.check import tolerance
from attngen.check.fuzz_device import empty_device, synchronize, to_device, to_host, to_host_cpu
from attngen.ir import abi
from attngen.ir.nodes import DType, Layout, Variant


def split_inputs(arrays: Mapping[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """(q, k, v, runtime inputs) from one dict of arrays."""
    rest = {n: a for n, a in arrays.items() if n not in ("q", "k", "v")}
    return arrays["q"], arrays["k"], arrays["v"], rest


def positions_of(v: Variant, arrays: Mapping[str, np.ndarray]) -> dict[str, int]:
    """The call positions the arrays imply: for self attention with fewer query rows than key rows,
    a decode step (`fuzz_cases.decode_positions`); else none. Read from the arrays, so a written
    reproducer places its call the same way."""
    from attngen.check.fuzz_cases import decode_positions

    if v.layout == Layout.VARLEN or v.page_size is not None:
        return {}
    q, k = arrays["q"], arrays["k"]
    bhsd = v.layout == Layout.BHSD
    Lq = q.shape[2] if (bhsd and q.ndim == 4) else q.shape[1]
    Lk = k.shape[2] if bhsd else k.shape[1]
    return decode_positions(v, int(Lq), int(Lk))


def run_kernel(kernel: Any, v: Variant, arrays: Mapping[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray | None]:
    """Launch a compiled kernel on device copies of `arrays` into NaN-poisoned outputs; host O, LSE.
    A CPU-backend kernel (`attngen.cpu.kernel.CpuKernel`) runs on the host arrays themselves."""
    if getattr(kernel, "target", None) == "cpu":
        return _run_kernel_cpu(kernel, v, arrays)
    pos = positions_of(v, arrays)
    q, k, vv, rest = split_inputs(arrays)
    B = q.shape[0]
    Lq = q.shape[2] if (v.layout == Layout.BHSD and q.ndim == 4) else q.shape[1]
    if v.layout == Layout.VARLEN:
        B, Lq = len(rest[v.cu_seqlens_names[0]]) - 1, q.shape[0]
    out = empty_device(abi.o_shape(v, B, Lq), v.dtype)
    lse = empty_device(abi.lse_shape(v, B, Lq), DType.FP32) if v.lse else None
    dev = {n: to_device(a) for n, a in rest.items()}
    kwargs: dict[str, Any] = {"out": out}
    if lse is not None:
        kwargs["lse"] = lse
    res = kernel(to_device(q), to_device(k), to_device(vv), **kwargs, **pos, **dev)
    synchronize()
    if isinstance(res, tuple):
        o_dev, lse_dev = res[0], res[1]
    else:
        o_dev, lse_dev = res, lse
    return to_host(o_dev, v.dtype), (to_host(lse_dev, DType.FP32) if lse_dev is not None else None)


def _run_kernel_cpu(kernel: Any, v: Variant, arrays: Mapping[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray | None]:
    from attngen.check.reference import dtype_of

    q, k, vv, rest = split_inputs(arrays)
    B = q.shape[0]
    Lq = q.shape[2] if (v.layout == Layout.BHSD and q.ndim == 4) else q.shape[1]
    if v.layout == Layout.VARLEN:
        B, Lq = len(rest[v.cu_seqlens_names[0]]) - 1, q.shape[0]
    out = np.full(abi.o_shape(v, B, Lq), np.nan, dtype=dtype_of(v.dtype))
    lse = np.full(abi.lse_shape(v, B, Lq), np.nan, dtype=np.float32) if v.lse else None
    res = kernel(q, k, vv, out=out, **({"lse": lse} if lse is not None else {}), **positions_of(v, arrays), **rest)
    return (res[0], res[1]) if isinstance(res, tuple) else (res, lse)


def compare(v: Variant, arrays: Mapping[str, np.ndarray], out: np.ndarray, lse: np.ndarray | None,
            ref: tuple[np.ndarray, np.ndarray] | None = None) -> list[tolerance.Report]:
    """Reports for O (and LSE when the variant returns it) against the reference."""
    from attngen.check import reference

    q, k, vv, rest = split_inputs(arrays)
    if ref is None:
        ref = reference.attention(v, q, k, vv, rest, **positions_of(v, arrays))
    if v.quantized:  # the quantized product's operands and p's rounding (attngen.check.quant)
        from attngen.check import quant

        return quant.reports(v, arrays, out, lse, ref)
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
    o, lse = reference.attention(v, q, k, vv, rest, **positions_of(v, arrays))
    probs = []
    of = np.asarray(o).astype(np.float64)
    if np.isnan(of).any():
        probs.append(f"reference O has {int(np.isnan(of).sum())} NaN")
    if np.isnan(lse).any() or np.isposinf(lse).any():
        probs.append("reference LSE has NaN or +inf")
    varlen = v.layout == Layout.VARLEN
    if lse.shape != (abi.lse_shape(v, 1, q.shape[0]) if varlen else abi.lse_shape(v, q.shape[0], lse.shape[2])):
        probs.append(f"reference LSE shape {lse.shape}")
    if not v.norms and not v.residual:
        # An empty row must be exactly 0 (without a post-norm or residual changing it).
        if varlen:  # o [total, H, Dv], lse [H, total]
            o4, empty = of, np.isneginf(lse).T
        else:
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
    if positions_of(v, arrays):
        return None  # flex.run_flex runs whole sequences, not a decode step placed in one
    if v.layout == Layout.VARLEN:
        return None  # flex.run_flex takes padded batches; the reference's varlen path is tested against its dense one
    if v.page_size is not None:
        # Flex reads a contiguous cache: gather the pages (as the reference does) first; the
        # lengths then bound the mask (`reference.unpaged`).
        from attngen.ir.nodes import BLOCK_TABLE
        from attngen.check.reference import _unpage, unpaged

        table = np.asarray(rest[BLOCK_TABLE]).astype(np.int64)
        k, vv = _unpage(k, table), _unpage(vv, table)
        if v.layout == Layout.BSHD:
            k, vv = k.transpose(0, 2, 1, 3), vv.transpose(0, 2, 1, 3)
        rest = {n: a for n, a in rest.items() if n != BLOCK_TABLE}
        v = unpaged(v)
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
