"""`attngen fuzz`'s device side: host arrays to CuPy / torch device arrays and back, NaN-poisoned
outputs, and whether a CUDA device is usable at all."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from attngen.ir import abi
from attngen.ir.nodes import DType


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


def to_host_cpu(t: Any) -> np.ndarray:
    """A CPU torch tensor as NumPy (bf16 as ml_dtypes.bfloat16)."""
    import ml_dtypes
    import torch

    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()
