"""The CPU backend called from Python (stage: load + launch).

`compile(spec, device="cpu")` renders, builds (cached) and loads one variant; the `CpuKernel` it
returns takes NumPy arrays or torch CPU tensors without copying them. A call's arrays are
validated once per signature (types, dtypes, shapes, strides, positions): a wrong array is refused
before the launch with the words `abi.bind_sizes` uses on the GPU. Values the kernel trusts are
checked every call, as the GPU's device checks do: `sorted` inputs, cu_seqlens, block-table ids.
"""

from __future__ import annotations

import ctypes
import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from attngen.check.reference import dtype_of
from attngen.cpu import render as render_cpu
from attngen.cpu.arrays import _arr, _Arr, _check_values, _qkv_strides, params_struct
from attngen.cpu.compile import compile_source
from attngen.ir import abi
from attngen.ir.nodes import Layout, Variant
from attngen.runtime.arrays import NaNCheckError

def _struct(v: Variant) -> type[ctypes.Structure]:
    """A ctypes mirror of the params struct, from the same field list the C text is built from."""
    return params_struct(f"{v.name}_cpu_params", render_cpu.fields(v))


@dataclass
class _Binding:
    """What one call signature fixed: sizes, and the params with every non-pointer field set."""

    sizes: abi.Sizes
    params: ctypes.Structure
    o_shape: tuple[int, ...]
    lse_shape: tuple[int, ...]


class CpuKernel:
    """One variant built for this CPU; call it like a function (`__call__`)."""

    target = "cpu"  # (fuzz and tests tell it from the GPU's Kernel by this)

    def __init__(self, v: Variant, source: str, lib_path: str, compiler: str, flags: tuple[str, ...], openmp: bool,
                 seconds: float, cached: bool) -> None:
        self.variant = v
        self.source = source
        self.compiler = compiler
        self.flags = flags
        self.openmp = openmp
        self.compile_seconds = seconds
        self.cached = cached
        self._lib = ctypes.CDLL(lib_path)
        self._fn = getattr(self._lib, render_cpu.symbol(v) + "_launch")
        self._fn.restype = ctypes.c_int
        self._struct = _struct(v)
        self._fn.argtypes = [ctypes.POINTER(self._struct)]
        self._bindings: dict[tuple, _Binding] = {}
        self._names = tuple(d.name for d in v.runtime_inputs())

    def __call__(self, q: Any, k: Any, v: Any, *, out: Any = None, lse: Any = None, num_threads: int = 0,
                 q_offset: int = 0, kv_offset: int = 0, Lq_total: int | None = None, Lk_total: int | None = None,
                 **inputs: Any) -> Any:
        """Runs the kernel; returns `o`, or `(o, lse)` when the spec asks for the LSE. Arrays are
        NumPy arrays or torch CPU tensors (one kind for q, k, v and the outputs); `out` and `lse`
        may be given (else allocated like q). `num_threads` 0 takes the OpenMP default. Positions as
        on the GPU (`abi.Positions`). Raises NaNCheckError for a `nan_check` variant's bad output."""
        var = self.variant
        unexpected = sorted(set(inputs) - set(self._names))
        missing = [n for n in self._names if n not in inputs]
        if missing or unexpected:
            abi.bind_sizes_inputs(var, abi.Sizes(1, 1, 1), {n: ((), "") for n in inputs}, False)
        arrs = {"q": _arr("q", q), "k": _arr("k", k), "v": _arr("v", v), **{n: _arr(n, inputs[n]) for n in self._names}}
        pos = abi.Positions(q_offset, kv_offset, Lq_total, Lk_total)
        sig = (tuple((a.shape, a.strides, a.dtype, a.is_torch) for a in arrs.values()), pos)
        b = self._bindings.get(sig)
        if b is None:
            b = self._bind(arrs, pos)
            if len(self._bindings) < 256:
                self._bindings[sig] = b
        _check_values(var, arrs, b.sizes)
        o = self._output("out", out, b.o_shape, var.dtype, arrs["q"])
        lse_arr = self._output("lse", lse, b.lse_shape, None, arrs["q"]) if var.lse or lse is not None else None
        p = self._struct.from_buffer_copy(b.params)
        p.q, p.k, p.v, p.o = arrs["q"].ptr, arrs["k"].ptr, arrs["v"].ptr, o.ptr
        p.lse = lse_arr.ptr if lse_arr is not None else None
        flag = ctypes.c_int(0)
        p.nan_flag = ctypes.addressof(flag)
        p.num_threads = int(num_threads)
        for n in self._names:
            setattr(p, f"in_{n}", arrs[n].ptr)
        rc = self._fn(ctypes.byref(p))
        if rc != 0:
            raise RuntimeError(f"{render_cpu.symbol(var)}_launch returned {rc} ({'out of memory' if rc == 2 else 'invalid arguments'})")
        if flag.value:

            raise NaNCheckError(f"variant {var.name}: nan_check found NaN or Inf in the output")
        return (o.obj, lse_arr.obj) if var.lse else o.obj

    def sibling(self, v: Variant) -> CpuKernel:
        """This kernel when it is `v`'s, else `v`'s CPU kernel (the backward's training forward)."""
        return self if self.variant == v else compile_cpu(v)

    def backward(self, q: Any, k: Any, v: Any, dO: Any, **kwargs: Any) -> Any:
        """(dq, dk, dv) of sum(dO * O) for this kernel's O, on the CPU backward (`attngen.cpu.backward`;
        its `backward` names the keywords: o, lse, wrt, dlse, q_offset, kv_offset, Lq_total, Lk_total,
        num_threads and the runtime inputs)."""
        from attngen.cpu.backward import backward

        return backward(self, q, k, v, dO, **kwargs)

    def _bind(self, arrs: dict[str, _Arr], pos: abi.Positions) -> _Binding:
        """The full validation of one signature; the params without pointers."""
        var = self.variant
        for n, dt in (("q", var.q_dtype), ("k", var.k_dtype), ("v", var.v_dtype)):  # stored types (quantized specs differ)
            a = arrs[n]
            if a.dtype != abi.DTYPE_NAMES[dt]:
                raise ValueError(f"{n}: expected dtype {abi.DTYPE_NAMES[dt]} ({dt.value}), got {a.dtype}")
        given = {n: (arrs[n].shape, arrs[n].dtype) for n in self._names}
        sizes = abi.bind_sizes(var, arrs["q"].shape, arrs["k"].shape, arrs["v"].shape, given, positions=pos)
        for n in ("q", "k", "v"):
            a = arrs[n]
            if a.strides and a.strides[-1] != 1 and a.shape[-1] > 1:
                raise ValueError(f"{n}: expected a contiguous last dimension (stride 1), got strides {a.strides} (elements)")
        p = self._struct()
        p.B, p.Lq, p.Lk = sizes.B, sizes.Lq, sizes.Lk
        if var.layout == Layout.VARLEN:
            p.q_offset, p.kv_offset, p.Lq_total, p.Lk_total = 0, 0, sizes.Lq, sizes.Lk
        else:
            r = pos.resolve(sizes.Lq, sizes.Lk)
            p.q_offset, p.kv_offset, p.Lq_total, p.Lk_total = r.q_offset, r.kv_offset, int(r.Lq_total), int(r.Lk_total)
        if var.page_size is not None:
            p.num_pages = arrs["k"].shape[0]
        for n in ("q", "k", "v"):
            for s, val in zip(("sb", "sh", "ss"), _qkv_strides(var, n, arrs[n])):
                setattr(p, f"{n}_{s}", val)
        o_shape = abi.o_shape(var, sizes.B, sizes.Lq)
        lse_shape = abi.lse_shape(var, sizes.B, sizes.Lq)
        # O is written densely in its layout: strides of a contiguous array of o_shape.
        dense = np.empty(o_shape, dtype=np.uint8).strides
        o_arr = _Arr(None, 0, o_shape, dense, "", False)
        for s, val in zip(("sb", "sh", "ss"), _qkv_strides(var, "o", o_arr)):
            setattr(p, f"o_{s}", val)
        if var.layout == Layout.VARLEN:
            p.lse_sh = sizes.Lq
        for d in var.runtime_inputs():
            a = arrs[d.name]
            for i in range(len(d.shape)):
                setattr(p, f"in_{d.name}_n{i}", a.shape[i])
                setattr(p, f"in_{d.name}_s{i}", a.strides[i])
        return _Binding(sizes, p, o_shape, lse_shape)

    def _output(self, name: str, given: Any, shape: tuple[int, ...], dt, like: _Arr) -> _Arr:
        """`out` or `lse`: the caller's (checked: shape, dtype, contiguous) or a new array like q."""
        want = abi.DTYPE_NAMES[dt] if dt is not None else "float32"
        if given is None:
            if like.is_torch:
                import torch

                tdt = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[want]
                return _arr(name, torch.empty(shape, dtype=tdt))
            return _arr(name, np.empty(shape, dtype=dtype_of(dt) if dt is not None else np.float32))
        a = _arr(name, given)
        if a.shape != shape:
            raise ValueError(f"{name}: expected shape {shape}, got {a.shape}")
        if a.dtype != want:
            raise ValueError(f"{name}: expected dtype {want}, got {a.dtype}")
        dense = tuple(s // 1 for s in np.empty(shape, dtype=np.uint8).strides)
        if a.strides != dense:
            raise ValueError(f"{name}: expected a contiguous array, got strides {a.strides} (elements)")
        return a


_KERNELS: dict[tuple, CpuKernel] = {}
_LOCK = threading.Lock()


def compile_cpu(v: Variant, *, verbose: bool = False) -> CpuKernel:
    """Render, build (cached on disk) and load `v` for this CPU; one kernel per variant a process."""
    with _LOCK:
        if v in _KERNELS:
            return _KERNELS[v]
    t0 = time.perf_counter()
    src = render_cpu.render(v)
    lib = compile_source(src)
    k = CpuKernel(v, src, lib.path, lib.compiler, lib.flags, lib.openmp, lib.seconds, lib.cached)
    if verbose:
        what = "cache hit" if lib.cached else f"compiled in {lib.seconds:.2f} s"
        print(f"attngen: {v.name} for cpu with {lib.compiler}: {what}; load {time.perf_counter() - t0:.3f} s total")
    with _LOCK:
        return _KERNELS.setdefault(v, k)


__all__ = ["CpuKernel", "compile_cpu"]
