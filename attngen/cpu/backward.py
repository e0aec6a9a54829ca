"""The CPU backward called from Python (stage: load + launch): `backward(kernel, q, k, v, dO, ...)`
returns (dq, dk, dv), the gradients of sum(dO * O) for O = kernel(q, k, v, ...), as
`attngen.runtime.bwd.backward` does on the GPU (which hands a CPU kernel to this module).

Arrays are NumPy arrays or torch CPU tensors (one kind a call); the gradients come back in that
kind, contiguous, in the shapes and dtypes of q, k, v. Without `o` and `lse` the forward of the
variant with `output lse` runs first (`attngen.runtime.bwd.training_variant`: with `norm o` it
stops before the norm and the residual, and `o` is O', as on the GPU). A call signature is validated once, as
the forward's: wrong arrays are a ValueError saying what was expected, before any launch.
"""

from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from attngen.check.reference import dtype_of
from attngen.cpu import render_bwd
from attngen.cpu.compile import compile_source
from attngen.cpu.arrays import _arr, _Arr, _check_values, _qkv_strides, params_struct
from attngen.ir import abi
from attngen.ir.nodes import Layout, Variant
from attngen.plan.bwd import o_norm_inputs, training_variant

if TYPE_CHECKING:
    from attngen.cpu.kernel import CpuKernel

def _struct(v: Variant) -> type[ctypes.Structure]:
    """A ctypes mirror of the params struct, from the same field list the C text is built from."""
    return params_struct(f"{v.name}_cpu_bwd_params", render_bwd.fields(v))


def _dense(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(s // 1 for s in np.empty(shape, dtype=np.uint8).strides)


@dataclass
class _Binding:
    sizes: abi.Sizes
    params: ctypes.Structure
    o_shape: tuple[int, ...]
    lse_shape: tuple[int, ...]


class CpuBackward:
    """The backward of one variant built for this CPU (`backward` calls it)."""

    def __init__(self, v: Variant, source: str, lib_path: str) -> None:
        self.variant = v
        self.source = source
        self._lib = ctypes.CDLL(lib_path)
        self._fn = getattr(self._lib, render_bwd.bwd_symbol(v) + "_launch")
        self._fn.restype = ctypes.c_int
        self._struct = _struct(v)
        self._fn.argtypes = [ctypes.POINTER(self._struct)]
        self._bindings: dict[tuple, _Binding] = {}
        self._names = tuple(d.name for d in v.runtime_inputs())
        self.grad_names = (*render_bwd.derivative.learnable_tensors(v.scores), *render_bwd.plan_bwd.norm_params(v))

    def _bind(self, arrs: dict[str, _Arr], pos: abi.Positions) -> _Binding:
        var = self.variant
        want = abi.DTYPE_NAMES[var.dtype]
        for n in ("q", "k", "v", "dO", "o"):
            if arrs[n].dtype != want:
                raise ValueError(f"{n}: expected dtype {want} ({var.dtype.value}), got {arrs[n].dtype}")
        given = {n: (arrs[n].shape, arrs[n].dtype) for n in self._names}
        sizes = abi.bind_sizes(var, arrs["q"].shape, arrs["k"].shape, arrs["v"].shape, given, positions=pos)
        o_shape = tuple(abi.o_shape(var, sizes.B, sizes.Lq))
        lse_shape = tuple(abi.lse_shape(var, sizes.B, sizes.Lq))
        for n in ("o", "dO"):
            if arrs[n].shape != o_shape:
                raise ValueError(f"{n}: expected the output's shape {o_shape}, got {arrs[n].shape}")
        for n in ("lse", "dlse"):
            a = arrs.get(n)
            if a is None:
                continue
            if a.shape != lse_shape or a.dtype != "float32" or a.strides != _dense(lse_shape):
                raise ValueError(f"{n}: expected a contiguous float32 array of shape {lse_shape}, got {a.dtype} {a.shape} "
                                 f"strides {a.strides}")
        for n in ("q", "k", "v", "o", "dO"):
            a = arrs[n]
            if a.strides and a.strides[-1] != 1 and a.shape[-1] > 1:
                raise ValueError(f"{n}: expected a contiguous last dimension (stride 1), got strides {a.strides} (elements)")
        p = self._struct()
        p.B, p.Lq, p.Lk = sizes.B, sizes.Lq, sizes.Lk
        if var.layout == Layout.VARLEN:
            p.q_offset, p.kv_offset, p.Lq_total, p.Lk_total = 0, 0, sizes.Lq, sizes.Lk
            p.lse_sh = sizes.Lq
        else:
            r = pos.resolve(sizes.Lq, sizes.Lk)
            p.q_offset, p.kv_offset, p.Lq_total, p.Lk_total = r.q_offset, r.kv_offset, int(r.Lq_total), int(r.Lk_total)
        for n in ("q", "k", "v", "o", "dO"):
            for s, val in zip(("sb", "sh", "ss"), _qkv_strides(var, "o" if n == "dO" else n, arrs[n])):
                setattr(p, f"{n}_{s}", val)
        for n, like in (("dq", "q"), ("dk", "k"), ("dv", "v")):
            dense = _Arr(None, 0, arrs[like].shape, _dense(arrs[like].shape), "", False)
            for s, val in zip(("sb", "sh", "ss"), _qkv_strides(var, like, dense)):
                setattr(p, f"{n}_{s}", val)
        for d in var.runtime_inputs():
            a = arrs[d.name]
            for i in range(len(d.shape)):
                setattr(p, f"in_{d.name}_n{i}", a.shape[i])
                setattr(p, f"in_{d.name}_s{i}", a.strides[i])
        return _Binding(sizes, p, o_shape, lse_shape)

    def __call__(self, q: Any, k: Any, v: Any, o: Any, lse: Any, dO: Any, *, dlse: Any = None, wrt: tuple[str, ...] = (),
                 num_threads: int = 0, positions: abi.Positions | None = None, two_pass: bool = False,
                 **inputs: Any) -> tuple[Any, ...]:
        """(dq, dk, dv[, {name: gradient}]) from the forward's o and LSE. `two_pass`: the dQ pass of
        its own even where the fused pass would run (both schedules are tested)."""
        var = self.variant
        for name in wrt:
            if name not in self.grad_names:
                raise ValueError(f"wrt: expected names of score inputs or norm weights with a gradient ({', '.join(self.grad_names) or 'none in this variant'}), "
                                 f"got {name!r}")
        unexpected = sorted(set(inputs) - set(self._names))
        missing = [n for n in self._names if n not in inputs]
        if missing or unexpected:
            abi.bind_sizes_inputs(var, abi.Sizes(1, 1, 1), {n: ((), "") for n in inputs}, False)
        arrs = {"q": _arr("q", q), "k": _arr("k", k), "v": _arr("v", v), "o": _arr("o", o), "dO": _arr("dO", dO),
                "lse": _arr("lse", lse), **{n: _arr(n, inputs[n]) for n in self._names}}
        if dlse is not None:
            arrs["dlse"] = _arr("dlse", dlse)
        kinds = {a.is_torch for a in arrs.values()}
        if len(kinds) > 1:
            raise ValueError("backward: expected NumPy arrays or torch CPU tensors, not a mix of the two")
        pos = positions or abi.Positions()
        sig = (tuple((n, a.shape, a.strides, a.dtype, a.is_torch) for n, a in arrs.items()), pos)
        b = self._bindings.get(sig)
        if b is None:
            b = self._bind(arrs, pos)
            if len(self._bindings) < 256:
                self._bindings[sig] = b
        _check_values(var, arrs, b.sizes)
        is_torch = arrs["q"].is_torch
        grads = [_zeros(arrs[n].shape, var.dtype, is_torch) for n in ("q", "k", "v")]
        pgrads = {n: _zeros(arrs[n].shape, None, is_torch) for n in wrt}
        p = self._struct.from_buffer_copy(b.params)
        for n in ("q", "k", "v", "o", "dO", "lse"):
            setattr(p, n, arrs[n].ptr)
        p.dlse = arrs["dlse"].ptr if "dlse" in arrs else None
        p.dq, p.dk, p.dv = (_ptr(x, is_torch) for x in grads)
        for n in self._names:
            setattr(p, f"in_{n}", arrs[n].ptr)
        for n in self.grad_names:
            setattr(p, f"grad_{n}", _ptr(pgrads[n], is_torch) if n in pgrads else None)
        p.num_threads = int(num_threads)
        p.two_pass = int(bool(two_pass))
        rc = self._fn(ctypes.byref(p))
        if rc != 0:
            raise RuntimeError(f"{render_bwd.bwd_symbol(var)}_launch returned {rc} ({'out of memory' if rc == 2 else 'invalid arguments'})")
        return (*grads, pgrads) if wrt else tuple(grads)


def _zeros(shape: tuple[int, ...], dt, is_torch: bool) -> Any:
    """A zeroed gradient (rows no sequence covers stay 0): the element type, or fp32 (dt None)."""
    if is_torch:
        import torch

        tdt = torch.float32 if dt is None else {"float32": torch.float32, "float16": torch.float16,
                                                 "bfloat16": torch.bfloat16}[abi.DTYPE_NAMES[dt]]
        return torch.zeros(shape, dtype=tdt)
    return np.zeros(shape, dtype=np.float32 if dt is None else dtype_of(dt))


def _ptr(x: Any, is_torch: bool) -> int:
    return x.data_ptr() if is_torch else x.ctypes.data


_BWD: dict[Variant, CpuBackward] = {}
_LOCK = threading.Lock()


def compile_backward_cpu(v: Variant) -> CpuBackward:
    """Render, build (cached on disk) and load the CPU backward of `v` (ValueError naming a
    construct it does not differentiate); one a variant a process."""
    with _LOCK:
        if v in _BWD:
            return _BWD[v]
    src = render_bwd.render(v)
    lib = compile_source(src)
    bk = CpuBackward(v, src, lib.path)
    with _LOCK:
        return _BWD.setdefault(v, bk)


def backward(kernel: CpuKernel, q: Any, k: Any, v: Any, dO: Any, *, o: Any = None, lse: Any = None, wrt: tuple[str, ...] = (),
             dlse: Any = None, q_offset: int = 0, kv_offset: int = 0, Lq_total: int | None = None, Lk_total: int | None = None,
             num_threads: int = 0, variant: Variant | None = None, **inputs: Any) -> tuple[Any, ...]:
    """(dq, dk, dv) for a CPU forward `kernel` (`attngen.compile(..., device="cpu")`); with `wrt`
    naming learnable score inputs or norm weights, (dq, dk, dv, {name: fp32 gradient}). `o` and `lse`: the
    forward's saved output and LSE (both or neither; without them the LSE-writing forward runs
    first). `dlse`: a gradient at the LSE too. Positions as in the forward call. `variant`: the
    variant to differentiate when `kernel` is its training forward."""
    var = kernel.variant if variant is None else variant
    bk = compile_backward_cpu(var)  # refuses unsupported constructs first
    if (o is None) != (lse is None):
        raise ValueError("o, lse: expected both (the forward's saved output and LSE) or neither, got one")
    placed = (q_offset, kv_offset, Lq_total, Lk_total)
    where = dict(q_offset=q_offset, kv_offset=kv_offset, Lq_total=Lq_total, Lk_total=Lk_total)
    if o is None:
        tv = training_variant(var)
        fwd = kernel.sibling(tv)
        fwd_inputs = {n: a for n, a in inputs.items() if n not in o_norm_inputs(var)}
        o, lse = fwd(q, k, v, num_threads=num_threads, **where, **fwd_inputs)
    pos = abi.Positions(*placed)
    return bk(q, k, v, o, lse, dO, dlse=dlse, wrt=tuple(wrt), num_threads=num_threads, positions=pos, **inputs)


__all__ = ["CpuBackward", "backward", "compile_backward_cpu"]
