"""`attngen fuzz`'s device side: host arrays to CuPy / torch device arrays and back, NaN-poisoned
outputs, and whether a CUDA device is usable at all."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from attngen.ir import abi
from attngen.ir.dtypes import by_numpy_name, by_torch_name, ml_dtype
from attngen.ir.nodes import DType


def gpu_status() -> tuple[bool, str]:
    """(True, device name) when a CUDA device is usable through CuPy, else (False, why not): the
    missing `cuda` extra with its install line, a driver problem, or no GPU, told apart
    (attngen.runtime.extras), so that a machine with a GPU but no CuPy is never called GPU-less."""
    from attngen.runtime.extras import gpu_check

    report = gpu_check()
    return (True, report.detail) if report.ok else (False, report.message("running kernels on the GPU"))


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
    row = by_numpy_name(a.dtype.name)
    torch = _torch_or_none()
    if torch is not None:
        if row is not None and row.foreign:
            return torch.from_numpy(a.view(row.bits)).view(getattr(torch, row.torch)).cuda()
        return torch.from_numpy(a).cuda()
    import cupy

    if row is not None and row.foreign:
        return cupy.asarray(a.view(row.storage))
    return cupy.asarray(a)


def empty_device(shape: Sequence[int], dtype: DType | str, fill: float = math.nan) -> Any:
    """A device array filled with `fill` (NaN by default: poison, so unwritten elements fail)."""
    name = abi.DTYPE_NAMES[dtype] if isinstance(dtype, DType) else str(dtype)
    row = by_numpy_name(name)
    if row is None:
        raise ValueError(f"no element type is named {name!r}")
    torch = _torch_or_none()
    if torch is not None:
        return torch.full(tuple(shape), fill, dtype=getattr(torch, row.torch), device="cuda")
    import cupy

    if row.foreign:  # CuPy holds the bit pattern of the fill rounded to the type
        bits = np.array([fill]).astype(ml_dtype(row.dtype)).view(row.storage)[0]
        return cupy.full(tuple(shape), bits, dtype=row.storage)
    return cupy.full(tuple(shape), fill, dtype=name)


def to_host(x: Any, dtype: DType | None = None) -> np.ndarray:
    """A host NumPy copy of a device array (bf16 comes back as ml_dtypes.bfloat16)."""
    if hasattr(x, "detach"):  # torch
        return to_host_cpu(x)
    import cupy

    a = cupy.asnumpy(x)
    if dtype is not None and dtype.info.foreign and a.dtype.name == dtype.info.storage:
        a = a.view(ml_dtype(dtype))
    return a


def synchronize() -> None:
    import cupy

    cupy.cuda.Device().synchronize()


def to_host_cpu(t: Any) -> np.ndarray:
    """A torch tensor as host NumPy (bf16 as ml_dtypes.bfloat16)."""
    import torch

    t = t.detach()
    row = by_torch_name(str(t.dtype))
    if row is not None and row.foreign:
        return t.view(getattr(torch, row.bits)).cpu().numpy().view(ml_dtype(row.dtype))
    return t.cpu().numpy()
