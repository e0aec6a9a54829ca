"""Arrays, streams and modules as the binder sees them (stage: launch): a uniform view of CuPy
arrays and torch tensors, their call signatures, the caller's stream, loaded cubins.

Every runtime module reaches these through `attngen.runtime.binder`, which re-exports them.
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attngen.ir import abi
from attngen.ir.dtypes import DTYPES
from attngen.ir.nodes import DType



class NaNCheckError(FloatingPointError):
    """A `nan_check` variant found NaN or Inf in its output."""


_SM_COUNTS: dict[int, int] = {}


def sm_count(device_id: int) -> int:
    """Multiprocessors of a device (sizes the persistent kernels' grids), looked up once."""
    n = _SM_COUNTS.get(device_id)
    if n is None:
        import cupy

        n = _SM_COUNTS[device_id] = int(cupy.cuda.Device(device_id).attributes["MultiProcessorCount"])
    return n




_TORCH_NAMES = {**{f"torch.{r.torch}": r.numpy for r in DTYPES.values()}, "torch.int64": "int64", "torch.bool": "bool"}


@dataclass(frozen=True)
class ArrayView:
    obj: Any
    ptr: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]  # elements
    dtype: str  # numpy-style name; "uint16" CuPy arrays may stand for bfloat16
    itemsize: int
    device: int
    is_torch: bool


def view(x: Any, name: str) -> ArrayView:
    mod = type(x).__module__
    if mod.startswith("torch"):
        if not x.is_cuda:
            raise ValueError(f"{name}: expected a CUDA tensor, got a tensor on {x.device}")
        dt = _TORCH_NAMES.get(str(x.dtype), str(x.dtype))
        return ArrayView(x, x.data_ptr(), tuple(x.shape), tuple(x.stride()), dt, x.element_size(), x.device.index, True)
    if mod.startswith("cupy"):
        size = x.dtype.itemsize
        return ArrayView(x, x.data.ptr, tuple(x.shape), tuple(s // size for s in x.strides), x.dtype.name, size, x.device.id, False)
    if mod.startswith("numpy"):
        raise ValueError(f"{name}: expected a device array (CuPy or torch CUDA), got a NumPy array on the host")
    raise ValueError(f"{name}: expected a CuPy array or torch CUDA tensor, got {type(x).__name__}")


def dtype_ok(a: ArrayView, want: DType) -> bool:
    name = abi.DTYPE_NAMES[want]
    if a.dtype == name:
        return True
    return want.info.foreign and not a.is_torch and a.dtype == want.info.storage


def check_dtype(a: ArrayView, want: DType, name: str) -> None:
    if not dtype_ok(a, want):
        extra = f" (with CuPy, {want.value} travels as {want.info.storage} bit patterns)" if want.info.foreign and not a.is_torch else ""
        raise ValueError(f"{name}: expected dtype {abi.DTYPE_NAMES[want]}{extra}, got {a.dtype}")


def byte_range(a: ArrayView) -> tuple[int, int]:
    """[first, last) bytes an array view can touch (strides may be any sign; size-0 dims touch none)."""
    if any(n == 0 for n in a.shape):
        return a.ptr, a.ptr
    lo = hi = 0
    for n, s in zip(a.shape, a.strides):
        if s >= 0:
            hi += (n - 1) * s
        else:
            lo += (n - 1) * s
    return a.ptr + lo * a.itemsize, a.ptr + (hi + 1) * a.itemsize


def overlaps(a: ArrayView, b: ArrayView) -> bool:
    """Whether two views can share memory (conservative: by byte ranges)."""
    a0, a1 = byte_range(a)
    b0, b1 = byte_range(b)
    return a0 < b1 and b0 < a1


def dtype_name_for_abi(a: ArrayView, want: DType) -> str:
    return abi.DTYPE_NAMES[want] if dtype_ok(a, want) else a.dtype



class InputCheckError(ValueError):
    """A runtime input broke a promise the kernel trusts (e.g. a `sorted` input that decreases)."""


def torch_sig(x: Any) -> tuple[Any, int]:
    return (x.dtype, x.shape, x.stride(), x.get_device()), x.data_ptr()


def cupy_sig(x: Any) -> tuple[Any, int]:
    return (x.dtype, x.shape, x.strides, x.device.id), x.data.ptr


SIG_FNS: dict[type, Any] = {}


def sig_fn(x: Any) -> Any:
    """The signature function for an array's type (None for a type the runtime does not take)."""
    t = type(x)
    f = SIG_FNS.get(t)
    if f is None:
        mod = t.__module__
        f = torch_sig if mod.startswith("torch") else cupy_sig if mod.startswith("cupy") else None
        if f is not None:
            SIG_FNS[t] = f
    return f


def call_signature(arrays: Sequence[Any]) -> tuple[tuple[Any, ...], list[int]] | None:
    """(signatures, data pointers) of a call's arrays; None when one is not a CuPy array or torch
    tensor (the full validation then says what is wrong)."""
    sigs, ptrs = [], []
    fns = SIG_FNS
    for x in arrays:
        f = fns.get(type(x)) or sig_fn(x)
        if f is torch_sig:  # torch_sig's own lines, without its call (most calls' arrays are tensors)
            sigs.append((x.dtype, x.shape, x.stride(), x.get_device()))
            ptrs.append(x.data_ptr())
            continue
        if f is None:
            return None
        sg, p = f(x)
        sigs.append(sg)
        ptrs.append(p)
    return tuple(sigs), ptrs


_TORCH_STREAM: Any = None


def torch_current_stream(device: int) -> int:
    """torch's current raw stream on `device` (the C entry point: no Stream object built)."""
    global _TORCH_STREAM
    if _TORCH_STREAM is None:
        import torch

        _TORCH_STREAM = getattr(torch._C, "_cuda_getCurrentRawStream", None) or (lambda d: torch.cuda.current_stream(d).cuda_stream)
    return _TORCH_STREAM(device)


def stream_ptr(stream: Any) -> int:
    if isinstance(stream, int):
        return stream
    ptr = getattr(stream, "cuda_stream", None)
    if ptr is None:
        ptr = getattr(stream, "ptr", None)
    if ptr is None:
        raise ValueError(f"stream: expected a CuPy or torch stream or a raw cudaStream_t (int), got {type(stream).__name__}")
    return int(ptr)


class StreamHandle:
    """A raw cudaStream_t in the CUDA stream protocol (`__cuda_stream__`: version 0, handle)."""

    def __init__(self, ptr: int) -> None:
        self.ptr = ptr

    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, self.ptr)


def external_stream(ptr: int) -> Any:
    """A CuPy stream object for a stream CuPy did not create (torch's, a caller's handle):
    `Stream.from_external` through the stream protocol where CuPy has it (it deprecates
    `ExternalStream`, which older CuPy releases need)."""
    import cupy

    from_external = getattr(cupy.cuda.Stream, "from_external", None)
    if from_external is not None:
        try:
            s = from_external(StreamHandle(ptr))
            if int(s.ptr) == ptr:
                return s
        except (TypeError, ValueError, AttributeError):
            pass
    return cupy.cuda.ExternalStream(ptr)


def load_functions(cubin: bytes, smem: Mapping[str, int]) -> tuple[Any, dict[str, Any]]:
    """Load a cubin on the current device (stage: load): the CuPy module and its entry points
    named in `smem`, each opted in to that many bytes of dynamic shared memory where that is past
    the 48 KiB every kernel gets without asking. CuPy loads modules from files, on first use, so
    every entry point is taken while the temporary file exists."""
    import cupy

    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin)
        path = f.name
    try:
        module = cupy.RawModule(path=path)
        fns = {name: module.get_function(name) for name in smem}
    finally:
        Path(path).unlink(missing_ok=True)
    for name, n in smem.items():
        if n > 48 * 1024:
            fns[name].max_dynamic_shared_size_bytes = n
    return module, fns
