"""Compiled kernels called from Python (stage: load + launch).

`compile(spec)` renders, compiles (cached) and loads one variant; the returned `Kernel` accepts
CuPy arrays or torch CUDA tensors without copies, checks every array before launch, and launches on
the caller's current stream. One compiled kernel serves every batch size and sequence length.

CuPy has no bfloat16 dtype: with CuPy, pass bf16 data as a uint16 array holding the bit patterns
(`x.view(cupy.uint16)`); outputs come back the same way. torch tensors keep their own dtypes.
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attngen import abi
from attngen.compile_cuda import compile_source
from attngen.ir import DType, Layout, NormScope, NormTarget, Program, TileConfig, Variant, norm_bias_name, norm_weight_name
from attngen.render_cuda import PREP_THREADS, KernelPlan, render_with_plan
from attngen.schedule import Arch, persistent, uses_tensor_cores


class NaNCheckError(FloatingPointError):
    """A `nan_check` variant found NaN or Inf in its output."""


_CC_TO_ARCH = {80: Arch.SM80, 86: Arch.SM86, 87: Arch.SM86, 89: Arch.SM89, 90: Arch.SM90A}


def device_arch(device_id: int | None = None) -> Arch:
    """The attngen target for a CUDA device (newer chips run the closest older target's code)."""
    import cupy

    dev = cupy.cuda.Device(device_id) if device_id is not None else cupy.cuda.Device()
    cc = int(dev.compute_capability)
    if cc in _CC_TO_ARCH:
        return _CC_TO_ARCH[cc]
    if cc < 80:
        raise RuntimeError(f"attngen kernels need compute capability 8.0 or newer; device {dev.id} is {cc // 10}.{cc % 10}")
    # Later chips (sm_100, sm_120): sm_90a code does not run there, sm_80 code does.
    return Arch.SM80


_SM_COUNTS: dict[int, int] = {}
COUNTER_BLOCK = 64  # persistent kernels' work counters allocated at a time (one a stream)


def _sm_count(device_id: int) -> int:
    """Multiprocessors of a device (sizes the persistent kernels' grids), looked up once."""
    n = _SM_COUNTS.get(device_id)
    if n is None:
        import cupy

        n = _SM_COUNTS[device_id] = int(cupy.cuda.Device(device_id).attributes["MultiProcessorCount"])
    return n


# ---------------------------------------------------------------------------------------------
# Arrays: a uniform view of CuPy arrays and torch tensors


_TORCH_NAMES = {"torch.float32": "float32", "torch.float16": "float16", "torch.bfloat16": "bfloat16",
                "torch.int32": "int32", "torch.uint8": "uint8", "torch.int64": "int64", "torch.bool": "bool"}


@dataclass(frozen=True)
class _Arr:
    obj: Any
    ptr: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]  # elements
    dtype: str  # numpy-style name; "uint16" CuPy arrays may stand for bfloat16
    itemsize: int
    device: int
    is_torch: bool


def _view(x: Any, name: str) -> _Arr:
    mod = type(x).__module__
    if mod.startswith("torch"):
        if not x.is_cuda:
            raise ValueError(f"{name}: expected a CUDA tensor, got a tensor on {x.device}")
        dt = _TORCH_NAMES.get(str(x.dtype), str(x.dtype))
        return _Arr(x, x.data_ptr(), tuple(x.shape), tuple(x.stride()), dt, x.element_size(), x.device.index, True)
    if mod.startswith("cupy"):
        size = x.dtype.itemsize
        return _Arr(x, x.data.ptr, tuple(x.shape), tuple(s // size for s in x.strides), x.dtype.name, size, x.device.id, False)
    if mod.startswith("numpy"):
        raise ValueError(f"{name}: expected a device array (CuPy or torch CUDA), got a NumPy array on the host")
    raise ValueError(f"{name}: expected a CuPy array or torch CUDA tensor, got {type(x).__name__}")


def _dtype_ok(a: _Arr, want: DType) -> bool:
    name = abi.DTYPE_NAMES[want]
    if a.dtype == name:
        return True
    return want == DType.BF16 and not a.is_torch and a.dtype == "uint16"


def _check_dtype(a: _Arr, want: DType, name: str) -> None:
    if not _dtype_ok(a, want):
        extra = " (with CuPy, bf16 travels as uint16 bit patterns)" if want == DType.BF16 and not a.is_torch else ""
        raise ValueError(f"{name}: expected dtype {abi.DTYPE_NAMES[want]}{extra}, got {a.dtype}")


def _byte_range(a: _Arr) -> tuple[int, int]:
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


def _overlaps(a: _Arr, b: _Arr) -> bool:
    """Whether two views can share memory (conservative: by byte ranges)."""
    a0, a1 = _byte_range(a)
    b0, b1 = _byte_range(b)
    return a0 < b1 and b0 < a1


def _dtype_name_for_abi(a: _Arr, want: DType) -> str:
    return abi.DTYPE_NAMES[want] if _dtype_ok(a, want) else a.dtype


# ---------------------------------------------------------------------------------------------


@dataclass
class Kernel:
    """One variant, compiled for one device architecture; call it like a function."""

    variant: Variant
    source: str
    plan: KernelPlan
    compile_seconds: float
    compiler: str
    cached: bool
    _module: Any = None
    _function: Any = None
    _preps: tuple[Any, ...] = ()
    _counters: dict[int, int] = field(default_factory=dict)  # stream handle → counter address
    _counter_blocks: list[Any] = field(default_factory=list)

    def _work_counter(self, stream: Any) -> int:
        """Device address of the persistent kernel's work-tile counter for `stream`. Every launch
        leaves its counter 0 again, so launches queued on one stream share one; streams get their
        own. Counters come from blocks of COUNTER_BLOCK zeroed ints allocated ahead of time (the
        first at load), so a launch being captured into a CUDA graph never allocates."""
        addr = self._counters.get(stream.ptr)
        if addr is None:
            n = len(self._counters)
            if n == COUNTER_BLOCK * len(self._counter_blocks):
                import cupy

                self._counter_blocks.append(cupy.zeros(COUNTER_BLOCK, dtype=cupy.int32))
                cupy.cuda.Device().synchronize()
            block = self._counter_blocks[n // COUNTER_BLOCK]
            addr = self._counters[stream.ptr] = block.data.ptr + 4 * (n % COUNTER_BLOCK)
        return addr

    @property
    def tile(self) -> TileConfig:
        return self.plan.tile

    def __call__(self, q: Any, k: Any, v: Any, *, out: Any = None, lse: Any = None, stream: Any = None, **inputs: Any) -> Any:
        """Runs the kernel; returns `o`, or `(o, lse)` when the spec asks for the LSE."""
        import cupy
        import numpy as np

        var = self.variant
        aq, ak, av = _view(q, "q"), _view(k, "k"), _view(v, "v")
        for a, n in ((aq, "q"), (ak, "k"), (av, "v")):
            _check_dtype(a, var.dtype, n)
        given = {name: _view(x, name) for name, x in inputs.items()}
        sizes = abi.bind_sizes(
            var, aq.shape, ak.shape, av.shape,
            {n: (a.shape, _dtype_name_for_abi(a, next((d.dtype for d in var.runtime_inputs() if d.name == n), DType.I32)))
             for n, a in given.items()},
        )
        dev = cupy.cuda.Device().id
        for name, a in (("q", aq), ("k", ak), ("v", av), *given.items()):
            if a.device != dev:
                raise ValueError(f"{name}: expected an array on the current device cuda:{dev}, got cuda:{a.device}")
        # The norms read their weights and biases as one flat row (no strides in the kernels).
        for n in var.norms:
            for name in (norm_weight_name(n.target), norm_bias_name(n.target)):
                a = given.get(name)
                if a is not None and len(a.shape) == 1 and a.shape[0] > 1 and a.strides[0] != 1:
                    raise ValueError(f"{name}: expected a contiguous array (stride 1), got strides {a.strides}")
        B, Lq, Lk = sizes.B, sizes.Lq, sizes.Lk
        align = 8 if uses_tensor_cores(var.dtype) else 4  # elements per 16 bytes

        def strides4(a: _Arr, name: str) -> tuple[int, int, int]:
            if a.strides[-1] != 1:
                raise ValueError(f"{name}: expected the last dimension to be contiguous (stride 1), got strides {a.strides}")
            if len(a.shape) == 3:  # flat [B, L, H*D] hidden state
                sb, ss = a.strides[0], a.strides[1]
                sh = var.head_dim
            elif var.layout == Layout.BHSD:
                sb, sh, ss = a.strides[0], a.strides[1], a.strides[2]
            else:
                sb, ss, sh = a.strides[0], a.strides[1], a.strides[2]
            for s, what in ((sb, "batch"), (sh, "head"), (ss, "sequence")):
                if s % align:
                    raise ValueError(f"{name}: expected every stride to be a multiple of {align} elements (16 bytes); the {what} stride is {s}")
            if a.ptr % 16:
                raise ValueError(f"{name}: expected a 16-byte aligned data pointer")
            return sb, sh, ss

        qs, ks, vs = strides4(aq, "q"), strides4(ak, "k"), strides4(av, "v")
        qn = var.norm(NormTarget.Q)
        if qn is not None and qn.scope == NormScope.TOKEN and qs[1] != var.head_dim:
            raise ValueError(f"q: a token-scope norm reads whole hidden rows, so heads must be contiguous (head stride {var.head_dim}), got {qs[1]}")

        xp_torch = aq.is_torch
        o_shape = abi.o_shape(var, B, Lq)
        if out is None:
            out = _empty(o_shape, var.dtype, xp_torch, aq.obj)
        ao = _view(out, "out")
        _check_dtype(ao, var.dtype, "out")
        if ao.shape != o_shape:
            raise ValueError(f"out: expected shape {o_shape}, got {ao.shape}")
        # Other CTAs read q (whole hidden rows under a token-scope norm), k and v while this one
        # writes: an output that shares memory with an input would be silently wrong.
        for name, a in (("q", aq), ("k", ak), ("v", av)):
            if _overlaps(ao, a):
                raise ValueError(f"out: expected memory separate from the inputs, but it overlaps {name}")
        os_ = strides4(ao, "out")
        lse_ptr = 0
        if var.lse or lse is not None:
            if lse is None:
                lse = _empty(abi.lse_shape(var, B, Lq), DType.FP32, xp_torch, aq.obj)
            al = _view(lse, "lse")
            if al.dtype != "float32" or al.shape != (B, var.heads, Lq) or al.strides != (var.heads * Lq, Lq, 1):
                raise ValueError(f"lse: expected a contiguous float32 array of shape {(B, var.heads, Lq)}, got {al.dtype} {al.shape} strides {al.strides}")
            lse_ptr = al.ptr
            if not var.lse:
                raise ValueError("lse: this variant does not compute the LSE (add `output lse` to the spec)")
        if stream is None:
            if xp_torch:
                import torch

                stream = _external_stream(torch.cuda.current_stream().cuda_stream)
            else:
                stream = cupy.cuda.get_current_stream()
        elif not isinstance(stream, cupy.cuda.Stream) and not isinstance(stream, cupy.cuda.ExternalStream):
            ptr = getattr(stream, "cuda_stream", stream)
            stream = _external_stream(int(ptr))
        flag = None
        if var.nan_check:
            with stream:  # zeroed in the launch stream's order, before the kernel can set it
                flag = cupy.zeros(1, dtype=cupy.int32)
        args: list[Any] = [
            np.uint64(aq.ptr), np.uint64(ak.ptr), np.uint64(av.ptr), np.uint64(ao.ptr), np.uint64(lse_ptr),
            np.uint64(flag.data.ptr if flag is not None else 0),
            *((np.uint64(self._work_counter(stream)),) if persistent(self.plan.engine) else ()),
            np.int32(B), np.int32(Lq), np.int32(Lk),
            *(np.int64(s) for s in (*qs, *ks, *vs, *os_)),
        ]
        # Workspace for the prep kernels (grows with B*L, never with Lq*Lk), in the caller's library,
        # allocated on the launch stream: both allocators reuse a freed block only in that stream's
        # order, so dropping it when this call returns is safe while the kernels still run.
        workspace = [_empty(pr.workspace_shape(B, Lq, Lk), pr.dtype, xp_torch, aq.obj, stream) for pr in self.plan.preps]
        args.extend(np.uint64(_view(ws, pr.field.name).ptr) for ws, pr in zip(workspace, self.plan.preps))
        for d in var.runtime_inputs():
            a = given[d.name]
            _check_dtype(a, d.dtype, d.name)
            args.append(np.uint64(a.ptr))
            args.extend(np.int32(n) for n in a.shape)
            args.extend(np.int64(s) for s in a.strides)
        for pr, fn in zip(self.plan.preps, self._preps):
            fn((self.plan.prep_grid(pr.rows(B, Lq, Lk)),), (PREP_THREADS,), tuple(args), stream=stream)
        grid = self.plan.grid(var.heads, B, Lq, _sm_count(dev))
        self._function(grid, (self.plan.threads,), tuple(args), shared_mem=self.plan.smem_bytes, stream=stream)
        if flag is not None:
            if int(flag.get(stream=stream)[0]) != 0:
                raise NaNCheckError(f"variant {var.name}: the output holds NaN or Inf (nan_check)")
        return (out, lse) if var.lse else out


class _StreamHandle:
    """A raw cudaStream_t in the CUDA stream protocol (`__cuda_stream__`: version 0, handle)."""

    def __init__(self, ptr: int) -> None:
        self.ptr = ptr

    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, self.ptr)


def _external_stream(ptr: int) -> Any:
    """A CuPy stream object for a stream CuPy did not create (torch's, a caller's handle):
    `Stream.from_external` through the stream protocol where CuPy has it (it deprecates
    `ExternalStream`, which older CuPy releases need)."""
    import cupy

    from_external = getattr(cupy.cuda.Stream, "from_external", None)
    if from_external is not None:
        try:
            s = from_external(_StreamHandle(ptr))
            if int(s.ptr) == ptr:
                return s
        except (TypeError, ValueError, AttributeError):
            pass
    return cupy.cuda.ExternalStream(ptr)


def _empty(shape: tuple[int, ...], d: DType, torch_like: bool, like: Any, stream: Any = None) -> Any:
    """An uninitialised array in the caller's library; with `stream` (a CuPy stream object),
    allocated in that stream's order."""
    if torch_like:
        import torch

        tdt = {DType.FP32: torch.float32, DType.FP16: torch.float16, DType.BF16: torch.bfloat16}[d]
        if stream is None or stream.ptr == torch.cuda.current_stream(like.device).cuda_stream:
            return torch.empty(shape, dtype=tdt, device=like.device)
        with torch.cuda.stream(torch.cuda.ExternalStream(stream.ptr, device=like.device)):
            return torch.empty(shape, dtype=tdt, device=like.device)
    import cupy

    cdt = {DType.FP32: cupy.float32, DType.FP16: cupy.float16, DType.BF16: cupy.uint16}[d]
    if stream is None:
        return cupy.empty(shape, dtype=cdt)
    with stream:
        return cupy.empty(shape, dtype=cdt)


_KERNELS: dict[tuple[Variant, Arch, int], Kernel] = {}
_KERNELS_LOCK = threading.Lock()


def _resolve(spec: Any, variant: str | None) -> Variant:
    if isinstance(spec, Variant):
        return spec
    if isinstance(spec, Program):
        return spec.get(variant)
    from attngen.frontend import load, loads

    if isinstance(spec, os.PathLike) or (isinstance(spec, str) and "{" not in spec):
        return load(spec).get(variant)
    return loads(str(spec)).get(variant)


def compile(spec: Any, variant: str | None = None, *, arch: str | Arch | None = None, verbose: bool = False) -> Kernel:
    """Parse (if needed), render, compile and load one variant for the current CUDA device.

    `spec` is a Variant, a Program, a path to a `.attn` file, or `.attn` source text."""
    import cupy

    v = _resolve(spec, variant)
    a = Arch(arch) if isinstance(arch, str) else (arch or device_arch())
    dev = cupy.cuda.Device().id
    key = (v, a, dev)
    with _KERNELS_LOCK:
        if key in _KERNELS:
            return _KERNELS[key]
    t0 = time.perf_counter()
    src, kp = render_with_plan(v, a)
    binary = compile_source(src, a)
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(binary.cubin)
        path = f.name
    try:
        module = cupy.RawModule(path=path)
        fn = module.get_function(kp.kernel_name)
        preps = tuple(module.get_function(pr.kernel) for pr in kp.preps)
    finally:
        Path(path).unlink(missing_ok=True)
    if kp.smem_bytes > 48 * 1024:
        fn.max_dynamic_shared_size_bytes = kp.smem_bytes
    k = Kernel(v, src, kp, binary.seconds, binary.compiler, binary.cached, module, fn, preps)
    if persistent(kp.engine):
        k._counter_blocks.append(cupy.zeros(COUNTER_BLOCK, dtype=cupy.int32))
        cupy.cuda.Device().synchronize()  # zeroed before any stream can launch with one
    if verbose:
        what = "cache hit" if binary.cached else f"compiled in {binary.seconds:.2f} s"
        print(f"attngen: {v.name} for {a.value} with {binary.compiler}: {what}; load {time.perf_counter() - t0:.3f} s total")
    with _KERNELS_LOCK:
        _KERNELS.setdefault(key, k)
        return _KERNELS[key]
