"""Arrays as the CPU backend's launchers see them: a NumPy array or torch CPU tensor's pointer,
shape, strides and dtype name (`_arr`), the value checks made before every launch and the q/k/v stride rules. Shared by the forward
(`attngen.cpu.kernel`) and the backward (`attngen.cpu.backward`) launchers."""

from __future__ import annotations

import ctypes
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from attngen.check.reference import cu_seqlens_values
from attngen.ir import abi
from attngen.ir.nodes import BLOCK_TABLE, Layout, Variant
from attngen.runtime.arrays import InputCheckError

_CTYPES = {"int": ctypes.c_int, "long long": ctypes.c_longlong}


def params_struct(name: str, fields: Iterable) -> type[ctypes.Structure]:
    """A ctypes mirror of a launcher's params struct, from the same field list its C text is
    built from (ints and long longs by their C type, every other field a pointer)."""
    fs = [(f.name, _CTYPES.get(f.ctype, ctypes.c_void_p)) for f in fields]
    return type(name, (ctypes.Structure,), {"_fields_": fs})

@dataclass(frozen=True, slots=True)
class _Arr:
    """What the kernel needs of one array: the object (kept alive), its address, shape, strides in
    elements and dtype name."""

    obj: Any
    ptr: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: str
    is_torch: bool


_TORCH_NAMES = {"torch.float32": "float32", "torch.float16": "float16", "torch.bfloat16": "bfloat16", "torch.int32": "int32",
                "torch.uint8": "uint8", "torch.int64": "int64", "torch.float64": "float64", "torch.bool": "bool",
                # the quantized types of q, k and v (docs/QUANT.md)
                "torch.float8_e4m3fn": "float8_e4m3fn", "torch.float8_e5m2": "float8_e5m2", "torch.int8": "int8"}


def _arr(name: str, x: Any) -> _Arr:
    if isinstance(x, np.ndarray):
        size = x.itemsize
        if any(s % size for s in x.strides):
            raise ValueError(f"{name}: expected strides that are whole elements, got byte strides {x.strides}")
        return _Arr(x, x.ctypes.data, tuple(x.shape), tuple(s // size for s in x.strides), x.dtype.name, False)
    mod = type(x).__module__
    if mod.startswith("torch"):
        if x.device.type != "cpu":
            raise ValueError(f"{name}: expected a CPU tensor for the cpu target, got a tensor on {x.device}")
        return _Arr(x, x.data_ptr(), tuple(x.shape), tuple(x.stride()), _TORCH_NAMES.get(str(x.dtype), str(x.dtype)), True)
    raise ValueError(f"{name}: expected a NumPy array or a torch CPU tensor, got {type(x).__name__}")


def _host(a: _Arr) -> np.ndarray:
    """A NumPy view of an array's values, for the per-call value checks."""
    if not a.is_torch:
        return a.obj
    t = a.obj
    return t.float().numpy() if a.dtype in ("bfloat16", "float16") else t.numpy()


def _check_values(v: Variant, arrs: dict[str, _Arr], sizes: abi.Sizes) -> None:
    """The promises the kernel trusts, checked before every launch (InputCheckError/ValueError)."""
    for d in v.runtime_inputs():
        if d.sorted and d.shape and d.name in arrs:
            x = _host(arrs[d.name])
            bad = np.argwhere(np.diff(x, axis=-1) < 0)
            if bad.size:
                i = tuple(int(t) for t in bad[0])
                at = (*i[:-1], i[-1] + 1)
                raise InputCheckError(f"{d.name}: declared sorted, but {d.name}{list(at)} = {x[at]} < {d.name}{list(i)} = {x[i]}")
    if v.layout == Layout.VARLEN:
        cu_seqlens_values(v, {n: _host(arrs[n]) for n in set(v.cu_seqlens_names)}, sizes.Lq, sizes.Lk)
    if v.page_size is not None:
        t = _host(arrs[BLOCK_TABLE])
        n = arrs["k"].shape[0]
        if t.size and (t.min() < 0 or t.max() >= n):
            raise ValueError(f"block_table: expected page ids in [0, {n}), got values from {t.min()} to {t.max()}")


def _qkv_strides(v: Variant, name: str, a: _Arr) -> tuple[int, int, int]:
    """(batch, head, sequence) strides of q, k, v or o in elements."""
    s = a.strides
    if v.page_size is not None and name in ("k", "v"):
        return s[0], s[2], s[1]
    if v.layout == Layout.VARLEN:
        return 0, s[1], s[0]
    if len(a.shape) == 3:  # q as a flat [B, L, H*D] hidden state
        return s[0], v.head_dim * s[2], s[1]
    return (s[0], s[1], s[2]) if v.layout == Layout.BHSD else (s[0], s[2], s[1])
