"""Compiled kernels called from Python (stage: load + launch).

`compile(spec)` renders, compiles (cached) and loads one variant; the returned `Kernel` accepts
CuPy arrays or torch CUDA tensors without copies, checks every array before launch, and launches on
the caller's current stream. One compiled kernel serves every batch size and sequence length.

CuPy has no bfloat16 dtype: with CuPy, pass bf16 data as a uint16 array holding the bit patterns
(`x.view(cupy.uint16)`); outputs come back the same way. torch tensors keep their own dtypes.

A call validates and packs its arguments once per signature (`attngen.runtime.binder`), then launches
through the CUDA driver (ctypes `cuLaunchKernel`; `ATTNGEN_LAUNCHER=cupy` selects CuPy's launch,
kept for comparison). Variants with `sorted` inputs run a device check first (`attngen.runtime.checks`);
its result and a `nan_check` flag live in device status words that the call reads back (a sync),
except under CUDA-graph capture, where `raise_pending()` reports them later.
"""

from __future__ import annotations

import dataclasses
import math
import os
import tempfile
import threading
import time
import functools
import types
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from attngen.ir import abi
from attngen.cuda.compile import compile_source
from attngen.ir.nodes import DType, Layout, NormScope, NormTarget, Program, TileConfig, TileHint, Variant, norm_bias_name, norm_weight_name
from attngen.runtime.binder import CALL_SCALARS, MAX_BINDINGS, ArgBuffer, Binding, Launch, TmaSlot, cu_function, driver, launch_cupy, launch_driver, slot_kind
from attngen.runtime.checks import CHECK_THREADS, NO_ERROR, check_args, check_grid, check_kernel_name, flat_to_index, render_checks
from attngen.cuda.render import OpPlan, TmaMap, render_with_plan, tma_maps
from attngen.plan.schedule import Arch, WgmmaSoftmax, arch_for_cc, persistent, short_tile, uses_tensor_cores


class NaNCheckError(FloatingPointError):
    """A `nan_check` variant found NaN or Inf in its output."""


def device_arch(device_id: int | None = None) -> Arch:
    """The attngen target for a CUDA device: its own arch's code (schedule.arch_for_cc), or a
    RuntimeError naming the device where attngen has none."""
    import cupy

    dev = cupy.cuda.Device(device_id) if device_id is not None else cupy.cuda.Device()
    try:
        return arch_for_cc(int(dev.compute_capability))
    except ValueError as e:
        raise RuntimeError(f"device {dev.id}: {e}") from None


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


class InputCheckError(ValueError):
    """A runtime input broke a promise the kernel trusts (e.g. a `sorted` input that decreases)."""


def _torch_sig(x: Any) -> tuple[Any, int]:
    return (x.dtype, x.shape, x.stride(), x.get_device()), x.data_ptr()


def _cupy_sig(x: Any) -> tuple[Any, int]:
    return (x.dtype, x.shape, x.strides, x.device.id), x.data.ptr


_SIG_FNS: dict[type, Any] = {}


def _sig_fn(x: Any) -> Any:
    """The signature function for an array's type (None for a type the runtime does not take)."""
    t = type(x)
    f = _SIG_FNS.get(t)
    if f is None:
        mod = t.__module__
        f = _torch_sig if mod.startswith("torch") else _cupy_sig if mod.startswith("cupy") else None
        if f is not None:
            _SIG_FNS[t] = f
    return f


_TORCH_STREAM: Any = None


def _torch_current_stream(device: int) -> int:
    """torch's current raw stream on `device` (the C entry point: no Stream object built)."""
    global _TORCH_STREAM
    if _TORCH_STREAM is None:
        import torch

        _TORCH_STREAM = getattr(torch._C, "_cuda_getCurrentRawStream", None) or (lambda d: torch.cuda.current_stream(d).cuda_stream)
    return _TORCH_STREAM(device)


def _stream_ptr(stream: Any) -> int:
    if isinstance(stream, int):
        return stream
    ptr = getattr(stream, "cuda_stream", None)
    if ptr is None:
        ptr = getattr(stream, "ptr", None)
    if ptr is None:
        raise ValueError(f"stream: expected a CuPy or torch stream or a raw cudaStream_t (int), got {type(stream).__name__}")
    return int(ptr)


@dataclass
class Kernel:
    """One variant, compiled for one device architecture; call it like a function.

    A call validates its arrays once per signature (shapes, strides, dtypes, devices, stream) and
    then launches from a prebuilt argument buffer (`attngen.runtime.binder`); see `__call__`."""

    variant: Variant
    source: str
    plan: OpPlan
    compile_seconds: float
    compiler: str
    cached: bool
    _module: Any = None
    _function: Any = None
    _preps: tuple[Any, ...] = ()
    _counters: dict[int, int] = field(default_factory=dict)  # stream handle → counter address
    _counter_blocks: list[Any] = field(default_factory=list)
    device: int = 0
    _status: Any = None  # device int64 words: [nan flag (int32), first bad index of each sorted input]
    _check_fns: tuple[Any, ...] = ()  # per sorted input: its check kernel
    _bindings: OrderedDict = field(default_factory=OrderedDict)
    _check_shapes: tuple[tuple[int, ...], ...] = ()  # the sorted inputs' shapes in the latest launch
    launcher: str = "driver"  # "driver" (ctypes cuLaunchKernel) or "cupy" (RawKernel, for comparison)
    # The same variant at schedule.short_tile's tile, for calls whose key loop is short (Lk <= short_max_lk).
    short: "Kernel | None" = None
    short_max_lk: int = 0

    def _work_counter(self, stream_ptr: int) -> int:
        """Device address of the persistent kernel's work-tile counter for a stream. Every launch
        leaves its counter 0 again, so launches queued on one stream share one; streams get their
        own. Counters come from blocks of COUNTER_BLOCK zeroed ints allocated ahead of time (the
        first at load), so a launch being captured into a CUDA graph never allocates."""
        addr = self._counters.get(stream_ptr)
        if addr is None:
            n = len(self._counters)
            if n == COUNTER_BLOCK * len(self._counter_blocks):
                import cupy

                self._counter_blocks.append(cupy.zeros(COUNTER_BLOCK, dtype=cupy.int32))
                cupy.cuda.Device().synchronize()
            block = self._counter_blocks[n // COUNTER_BLOCK]
            addr = self._counters[stream_ptr] = block.data.ptr + 4 * (n % COUNTER_BLOCK)
        return addr

    @property
    def tile(self) -> TileConfig:
        return self.plan.tile

    def __call__(self, q: Any, k: Any, v: Any, *, out: Any = None, lse: Any = None, stream: Any = None,
                 check_inputs: bool = True, q_offset: int = 0, kv_offset: int = 0, Lq_total: int | None = None,
                 Lk_total: int | None = None, **inputs: Any) -> Any:
        """Runs the kernel; returns `o`, or `(o, lse)` when the spec asks for the LSE.

        `check_inputs` (default True): before the launch, a small device kernel checks every
        promise the kernel trusts (the `sorted` inputs); a broken one raises InputCheckError (a
        ValueError) naming the input and the first offending index, after this call's kernels
        were queued (so `out` may hold garbage then). Reading the result back synchronises the
        stream, only for variants that have such inputs. `check_inputs=False` skips the check:
        a broken promise then gives a silently wrong answer. A `nan_check` variant also reads its
        flag back at the end of the call (a sync) and raises NaNCheckError.

        `q_offset`, `kv_offset`, `Lq_total`, `Lk_total` place q and k/v inside a longer sequence
        (`abi.Positions`: a context-parallel shard, a prefill chunk): masks and scores see global
        positions and lengths, and runtime inputs sized Lq or Lk hold the whole sequence. Each
        distinct placement is its own binding (validated once)."""
        pos = (q_offset, kv_offset, Lq_total, Lk_total)
        return self._run(q, k, v, out, lse, stream, check_inputs, inputs, False, None if pos == (0, 0, None, None) else pos)

    def _run(self, q: Any, k: Any, v: Any, out: Any, lse: Any, stream: Any, check_inputs: bool,
             inputs: dict[str, Any], defer: bool, positions: tuple | None = None) -> Any:
        """`__call__`; with `defer`, the status words (input checks, nan_check) are not read back:
        an error stays on the device until `raise_pending()` or the next call that reads them."""
        if self.short is not None and _seq_len(self.variant, k) <= self.short_max_lk:
            return self.short._run(q, k, v, out, lse, stream, check_inputs, inputs, defer, positions)
        scalars = {n: int(inputs.pop(n, d)) for n, d in CALL_SCALARS.items()} if CALL_SCALARS else None
        names = self._input_names
        arrays = (q, k, v, *(inputs[n] for n in names if n in inputs))
        if len(arrays) != 3 + len(names) or len(inputs) != len(names):
            self._build(arrays, inputs, out, lse, stream, check_inputs, positions=positions)  # raises the precise error
        sigs = []
        ptrs = []
        fns = _SIG_FNS
        for x in arrays:
            f = fns.get(type(x)) or _sig_fn(x)
            if f is None:
                self._build(arrays, inputs, out, lse, stream, check_inputs, positions=positions)
            sg, p = f(x)
            sigs.append(sg)
            ptrs.append(p)
        is_torch = fns.get(type(q)) is _torch_sig
        if stream is None:
            if is_torch:
                sp = (_TORCH_STREAM or _torch_current_stream)(self.device)
            else:
                import cupy

                sp = cupy.cuda.get_current_stream().ptr
        else:
            sp = _stream_ptr(stream)
        out_sig = lse_sig = None
        op = 0
        if out is not None:
            fo = _sig_fn(out)
            if fo is not None:
                out_sig, op = fo(out)
            else:
                out_sig = type(out)
        if lse is not None:
            fl = _sig_fn(lse)
            lse_sig = fl(lse)[0] if fl is not None else type(lse)
        key = (tuple(sigs), out_sig, lse_sig, sp, bool(check_inputs), positions)
        b = self._bindings.get(key)
        if b is None:
            b = self._build(arrays, inputs, out, lse, stream, check_inputs, key, sp, positions)
        if (ptrs[0] | ptrs[1] | ptrs[2]) & 15:
            for n, p in zip("qkv", ptrs):
                if p & 15:
                    raise ValueError(f"{n}: expected a 16-byte aligned data pointer")
        if out is None:
            out = b.alloc_out()
            op = out.data_ptr() if is_torch else out.data.ptr
        else:
            if op & 15:
                raise ValueError("out: expected a 16-byte aligned data pointer")
            o0, o1 = op + b.out_extent[0], op + b.out_extent[1]
            for n, p, (lo, hi) in zip("qkv", ptrs, b.extents):
                if o0 < p + hi and p + lo < o1:
                    raise ValueError(f"out: expected memory separate from the inputs, but it overlaps {n}")
        lp = 0
        if b.lse_shape is not None:
            if lse is None:
                lse = b.alloc_lse()  # type: ignore[misc]
            lp = _sig_fn(lse)(lse)[1]
        ws = [alloc() for alloc in b.alloc_ws]
        cupy_stream = None
        if self.launcher != "driver":
            cupy_stream = _external_stream(sp)
        with b.lock:
            main_vals = b.main[-1].args.vals
            for slot, p in zip(b.array_slots, ptrs):
                if slot >= 0:
                    main_vals[slot] = p
            main_vals[b.out_slot] = op
            main_vals[b.lse_slot] = lp
            for slot, w in zip(b.ws_slots, ws):
                main_vals[slot] = w.data_ptr() if is_torch else w.data.ptr
            if scalars:
                for slot, name in b.scalar_slots:
                    main_vals[slot] = scalars[name]
            for tm in b.tmaps:
                tm.update(ptrs[tm.array], "qkv"[tm.array])
            for ci, ai in b.check_slots:
                b.checks[ci].args.vals[0] = ptrs[ai]
            if cupy_stream is None:
                for ln in b.checks:
                    launch_driver(ln, sp)
                for ln in b.main:
                    launch_driver(ln, sp)
            else:
                for ln in b.checks:
                    launch_cupy(ln, cupy_stream)
                for ln in b.main:
                    launch_cupy(ln, cupy_stream)
        if b.readback:
            if b.checks:
                self._check_shapes = b.check_shapes
            if not defer and not driver().capturing(sp):
                # Under CUDA-graph capture no sync is allowed: the status words keep any error
                # for raise_pending() or the next call that reads them.
                self._read_status(sp)
        return (out, lse) if b.lse_shape is not None else out

    def backward(self, q: Any, k: Any, v: Any, dO: Any, **kwargs: Any) -> Any:
        """Gradients of sum(dO * O) (dq, dk, dv, and the inputs named in `wrt=`), with the same
        argument checks as a call; see `attngen.runtime_bwd.backward`."""
        from attngen.runtime.bwd import backward

        return backward(self, q, k, v, dO, **kwargs)

    @functools.cached_property
    def _input_names(self) -> tuple[str, ...]:
        return tuple(d.name for d in self.plan.problem.runtime_inputs)

    # -----------------------------------------------------------------------------------------
    # status words: input checks and nan_check

    def _status_words(self) -> int:
        return 1 + len(self.plan.problem.sorted_inputs)

    def _read_status(self, stream_ptr: int) -> None:
        """Reads the status words back (a stream sync) and raises the first error they hold,
        resetting them. Check errors come first: a broken promise explains a NaN."""
        if self._status is None:
            return
        import ctypes

        d = driver()
        n = self._status_words()
        host = (ctypes.c_int64 * n)()
        dev = self._status.data.ptr
        rc = d.dtoh(ctypes.addressof(host), dev, 8 * n, stream_ptr) or d.sync(stream_ptr)
        if rc:
            raise d.error(rc, "reading the status words")
        nan = host[0] & 0xFFFFFFFF
        bad = [host[1 + i] for i in range(n - 1)]
        if not nan and all(x == NO_ERROR for x in bad):
            return
        fresh = (ctypes.c_int64 * n)(0, *([NO_ERROR] * (n - 1)))
        rc = d.htod(dev, ctypes.addressof(fresh), 8 * n, stream_ptr) or d.sync(stream_ptr)
        if rc:
            raise d.error(rc, "resetting the status words")
        for i, (decl, x) in enumerate(zip(self.plan.problem.sorted_inputs, bad)):
            if x != NO_ERROR:
                shape = self._check_shapes[i] if i < len(self._check_shapes) else None
                where = f"{decl.name}[{', '.join(map(str, flat_to_index(int(x), shape)))}]" if shape else f"flat index {x} of {decl.name}"
                why = ("prefix sums of the sequence lengths of `layout varlen`" if decl.name in self.variant.cu_seqlens_names
                       else "the spec declares it `sorted`")
                raise InputCheckError(
                    f"{decl.name}: expected values that never decrease along the last dimension ({why}), but {where} is smaller than the element before it (variant {self.variant.name}; "
                    f"this call's output is not valid; check_inputs=False skips this check)")
        raise NaNCheckError(f"variant {self.variant.name}: the output holds NaN or Inf (nan_check)")

    def raise_pending(self, stream: Any = None) -> None:
        """Raises an error a deferred call left on the device (an input check or nan_check under
        CUDA-graph capture or in the torch op), synchronising `stream` (default: the current
        CuPy stream); does nothing when there is none."""
        if stream is None:
            import cupy

            sp = cupy.cuda.get_current_stream().ptr
        else:
            sp = _stream_ptr(stream)
        self._read_status(sp)

    # -----------------------------------------------------------------------------------------
    # building a binding: the full validation, once per signature

    def _build(self, arrays: tuple[Any, ...], inputs: dict[str, Any], out: Any, lse: Any, stream: Any,
               check_inputs: bool, key: Any = None, sp: int | None = None, positions: tuple | None = None) -> Binding:
        import cupy

        var = self.variant
        kp = self.plan
        q, k, v = arrays[:3]
        aq, ak, av = _view(q, "q"), _view(k, "k"), _view(v, "v")
        for a, n in ((aq, "q"), (ak, "k"), (av, "v")):
            _check_dtype(a, var.dtype, n)
        given = {name: _view(x, name) for name, x in inputs.items()}
        pos_given = abi.Positions(*positions) if positions is not None else abi.Positions()
        sizes = abi.bind_sizes(
            var, aq.shape, ak.shape, av.shape,
            {n: (a.shape, _dtype_name_for_abi(a, next((d.dtype for d in var.runtime_inputs() if d.name == n), DType.I32)))
             for n, a in given.items()},
            positions=pos_given,
        )
        pos = pos_given.resolve(sizes.Lq, sizes.Lk)
        dev = self.device
        for name, a in (("q", aq), ("k", ak), ("v", av), *given.items()):
            if a.device != dev:
                raise ValueError(f"{name}: expected an array on cuda:{dev}, where this kernel was loaded, got cuda:{a.device}")
            if a.is_torch != aq.is_torch:
                raise ValueError(f"{name}: expected a {'torch tensor' if aq.is_torch else 'CuPy array'} like q, got a "
                                 f"{'torch tensor' if a.is_torch else 'CuPy array'}")
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
            if var.layout == Layout.VARLEN:  # packed [total, H, D]: no batch stride (the kernel moves to each sequence's rows)
                sb, ss, sh = 0, a.strides[0], a.strides[1]
            elif len(a.shape) == 3:  # flat [B, L, H*D] hidden state
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
        if sp is None:
            sp = _stream_ptr(stream) if stream is not None else (
                _torch_current_stream(dev) if xp_torch else cupy.cuda.get_current_stream().ptr)
        current = _torch_current_stream(dev) if xp_torch else cupy.cuda.get_current_stream().ptr
        stream_obj = None if sp == current else _external_stream(sp)
        o_shape = abi.o_shape(var, B, Lq)
        # What allocations need of q (its device), without keeping q alive in the binding.
        like = types.SimpleNamespace(device=aq.obj.device) if xp_torch else None
        if out is None:
            # The output this call allocates: contiguous, aligned by the allocator.
            cs = [1] * len(o_shape)
            for i in range(len(o_shape) - 2, -1, -1):
                cs[i] = cs[i + 1] * o_shape[i + 1]
            ao = _Arr(None, 0, o_shape, tuple(cs), abi.DTYPE_NAMES[var.dtype], var.dtype.itemsize, dev, xp_torch)
            os_ = strides4(ao, "out")
        else:
            ao = _view(out, "out")
            _check_dtype(ao, var.dtype, "out")
            if ao.shape != o_shape:
                raise ValueError(f"out: expected shape {o_shape}, got {ao.shape}")
            if ao.is_torch != xp_torch or ao.device != dev:
                raise ValueError(f"out: expected a {'torch tensor' if xp_torch else 'CuPy array'} on cuda:{dev} like q")
            # Other CTAs read q (whole hidden rows under a token-scope norm), k and v while this one
            # writes: an output that shares memory with an input would be silently wrong.
            for name, a in (("q", aq), ("k", ak), ("v", av)):
                if _overlaps(ao, a):
                    raise ValueError(f"out: expected memory separate from the inputs, but it overlaps {name}")
            os_ = strides4(ao, "out")
        lse_shape = abi.lse_shape(var, B, Lq) if var.lse else None
        if lse is not None:
            if not var.lse:
                raise ValueError("lse: this variant does not compute the LSE (add `output lse` to the spec)")
            al = _view(lse, "lse")
            want = abi.lse_shape(var, B, Lq)
            contiguous = tuple(int(math.prod(want[i + 1:])) for i in range(len(want)))
            if al.dtype != "float32" or al.shape != want or al.strides != contiguous:
                raise ValueError(f"lse: expected a contiguous float32 array of shape {want}, got {al.dtype} {al.shape} strides {al.strides}")
            if al.is_torch != xp_torch or al.device != dev:
                raise ValueError(f"lse: expected a {'torch tensor' if xp_torch else 'CuPy array'} on cuda:{dev} like q")
        for d in var.runtime_inputs():
            _check_dtype(given[d.name], d.dtype, d.name)

        # Every ABI field, in order: a per-call pointer, a value fixed by this signature, or a
        # per-call scalar.
        fixed: dict[str, int] = {"B": B, "Lq": Lq, "Lk": Lk, "lse": 0, "q_offset": pos.q_offset, "kv_offset": pos.kv_offset,
                                 "Lq_total": pos.Lq_total, "Lk_total": pos.Lk_total,
                                 "nan_flag": self._status.data.ptr if (var.nan_check and self._status is not None) else 0}
        for t, st in (("q", qs), ("k", ks), ("v", vs), ("o", os_)):
            fixed.update({f"{t}_sb": st[0], f"{t}_sh": st[1], f"{t}_ss": st[2]})
        if var.layout == Layout.VARLEN:
            fixed["lse_sh"] = Lq  # the LSE is [H, total_q]
        if persistent(kp.engine):
            fixed["work_counter"] = self._work_counter(sp)
        per_call = {"q": 0, "k": 1, "v": 2}
        for i, d in enumerate(var.runtime_inputs()):
            a = given[d.name]
            per_call[f"in_{d.name}"] = 3 + i
            fixed.update({f"in_{d.name}_n{j}": n for j, n in enumerate(a.shape)})
            fixed.update({f"in_{d.name}_s{j}": s for j, s in enumerate(a.strides)})
        ws_names = [pr.field.name for pr in kp.workspaces]
        values: list[int] = []
        kinds: list[str] = []
        array_slots = [-1] * len(arrays)
        out_slot = lse_slot = -1
        ws_slots = [-1] * len(ws_names)
        scalar_slots: list[tuple[int, str]] = []
        for i, f in enumerate(kp.fields):
            kinds.append(slot_kind(f.ctype))
            values.append(fixed.get(f.name, 0))
            if f.name in per_call:
                array_slots[per_call[f.name]] = i
            elif f.name == "o":
                out_slot = i
            elif f.name == "lse":
                lse_slot = i
            elif f.name in ws_names:
                ws_slots[ws_names.index(f.name)] = i
            elif f.name in CALL_SCALARS:
                scalar_slots.append((i, f.name))
            elif f.name not in fixed:
                raise NotImplementedError(f"attngen.runtime.binder: no rule binds ABI field {f.name!r} ({f.ctype}) of {kp.kernel_name}")
        maps = tma_maps(kp)
        args = ArgBuffer(values, blobs=len(maps))
        tmaps: list[TmaSlot] = []
        if maps:
            lengths = {"Lq": Lq, "Lk": Lk}
            strides = {"q": qs, "k": ks, "v": vs}
            for j, m in enumerate(maps):
                dims = m.dims(B, lengths[m.length])
                sb, sh, ss = strides[m.tensor]
                tmaps.append(TmaSlot(args, j, per_call[m.tensor], var.dtype.value, dims,
                                     TmaMap.byte_strides(dims, (ss, sh, sb), var.dtype.itemsize), (64, m.rows, 1, 1)))
        sm = _sm_count(dev)
        main: list[Launch] = []
        fns = {ok.name: fn for ok, fn in zip(kp.prep_kernels, self._preps)}
        fns[kp.kernel_name] = self._function
        for ok in kp.kernels:
            fn = fns[ok.name]
            main.append(Launch(cu_function(fn), ok.launch_grid(var.heads, B, Lq, Lk, sm), ok.threads,
                               ok.smem.bytes, args, fn, tuple(kinds)))

        checks: list[Launch] = []
        check_slots: list[tuple[int, int]] = []
        check_shapes: list[tuple[int, ...]] = []
        names = [d.name for d in var.runtime_inputs()]
        for i, (d, fn) in enumerate(zip(kp.problem.sorted_inputs, self._check_fns)):
            a = given[d.name]
            check_shapes.append(a.shape)
            if not check_inputs or a.shape[-1] < 2 or any(n == 0 for n in a.shape):
                continue
            sc = check_args(a.shape, a.strides)
            pairs = sc[0] * sc[1] * sc[2] * (sc[3] - 1)
            vals = [0, *sc, self._status.data.ptr + 8 * (1 + i)]
            checks.append(Launch(cu_function(fn), (check_grid(pairs), 1, 1), CHECK_THREADS, 0, ArgBuffer(vals), fn,
                                 ("p", "i", "i", "i", "i", "q", "q", "q", "q", "p")))
            check_slots.append((len(checks) - 1, 3 + names.index(d.name)))

        def alloc(shape: tuple[int, ...], dt: DType) -> Callable[[], Any]:
            if xp_torch and stream_obj is None:
                import torch

                tdt = {DType.FP32: torch.float32, DType.FP16: torch.float16, DType.BF16: torch.bfloat16}[dt]
                tdev = like.device
                return lambda: torch.empty(shape, dtype=tdt, device=tdev)
            if not xp_torch and stream_obj is None:
                cdt = {DType.FP32: cupy.float32, DType.FP16: cupy.float16, DType.BF16: cupy.uint16}[dt]
                return lambda: cupy.empty(shape, dtype=cdt)
            # Another stream than the current one: allocate in that stream's order (both allocators
            # reuse a freed block only in its stream's order, so dropping it after the call is safe).
            return lambda: _empty(shape, dt, xp_torch, like, stream_obj)

        for ln in (*main, *checks):
            ln.bind_stream(sp)
        b = Binding(
            key=key, checks=checks, check_slots=check_slots, main=main, array_slots=array_slots,
            out_slot=out_slot, lse_slot=lse_slot, ws_slots=ws_slots, scalar_slots=scalar_slots, tmaps=tmaps,
            alloc_out=alloc(o_shape, var.dtype), alloc_lse=alloc(lse_shape, DType.FP32) if lse_shape else None,
            alloc_ws=[alloc(pr.workspace_shape(B, Lq, Lk), pr.dtype) for pr in kp.workspaces],
            out_shape=o_shape, lse_shape=lse_shape,
            extents=[(_byte_range(a)[0] - a.ptr, _byte_range(a)[1] - a.ptr) for a in (aq, ak, av)],
            out_extent=(_byte_range(ao)[0] - ao.ptr, _byte_range(ao)[1] - ao.ptr),
            readback=var.nan_check or bool(checks),
        )
        b.check_shapes = tuple(check_shapes)
        if key is not None:
            self._bindings[key] = b
            while len(self._bindings) > MAX_BINDINGS:
                self._bindings.popitem(last=False)
        return b


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


_CHECK_MODULES: dict[tuple[Arch, int], Any] = {}


def _check_function(arch: Arch, dtype: DType) -> Any:
    """The sortedness check kernel for `dtype` on the current device (the module compiled once)."""
    import cupy

    dev = cupy.cuda.Device().id
    mod = _CHECK_MODULES.get((arch, dev))
    if mod is None:
        binary = compile_source(render_checks(), arch)
        names = {check_kernel_name(d): 0 for d in (DType.I32, DType.U8, DType.FP32, DType.FP16, DType.BF16)}
        mod = _CHECK_MODULES[(arch, dev)] = load_functions(binary.cubin, names)[0]
    return mod.get_function(check_kernel_name(dtype))


def _seq_len(var: Variant, x: Any) -> int:
    """The sequence length of a dense q/k/v argument (its layout's sequence dim), before any
    checks (the kernel the call goes to makes them); -1 where the shape is not 4-D."""
    shape = tuple(getattr(x, "shape", ()))
    if len(shape) != 4:
        return -1
    return int(shape[2] if var.layout == Layout.BHSD else shape[1])


def raise_pending(stream: Any = None) -> None:
    """Raises the first error any loaded kernel's deferred calls left on the device (an input
    check or `nan_check` from a call in a CUDA graph or in the torch op), synchronising `stream`
    (default: the current CuPy stream). Call it where the program syncs anyway (after a step)."""
    with _KERNELS_LOCK:
        kernels = list(_KERNELS.values())
    for k in kernels:
        if k._status is not None:
            k.raise_pending(stream)


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


_KERNELS: dict[tuple, Kernel] = {}  # (variant, arch, device[, softmax schedule override])
_KERNELS_LOCK = threading.Lock()


def _resolve(spec: Any, variant: str | None) -> Variant:
    if isinstance(spec, Variant):
        return spec
    if isinstance(spec, Program):
        return spec.get(variant)
    from attngen.plan.validate import load, loads

    if isinstance(spec, os.PathLike) or (isinstance(spec, str) and "{" not in spec):
        return load(spec).get(variant)
    return loads(str(spec)).get(variant)


def compile(spec: Any, variant: str | None = None, *, arch: str | Arch | None = None, verbose: bool = False,
            family: str = "auto", softmax: WgmmaSoftmax | None = None, device: str = "cuda") -> Any:
    """Parse (if needed), render, compile and load one variant for the current CUDA device.

    `spec` is a Variant, a Program, a path to a `.attn` file, or `.attn` source text. `family`:
    "forward" gives the forward `Kernel`; "decode" forces the split-KV decode family
    (`runtime_decode.DecodeKernel`); "auto" (default) gives the forward kernel, wrapped so that
    calls with small Lq run the decode family where the variant supports it. `softmax` replaces
    the wgmma softmax schedule the plan picks (`render.plan`; benchmarks time the two side by side).
    `device="cpu"` builds the CPU backend instead (`attngen.cpu.kernel.CpuKernel`: NumPy arrays or
    torch CPU tensors; `arch`, `family` and `softmax` are the GPU's and are not taken there)."""
    if device == "cpu":
        from attngen.cpu.kernel import compile_cpu

        if arch is not None or family != "auto" or softmax is not None:
            raise ValueError("device='cpu': arch, family and softmax choose GPU kernels; leave them unset")
        return compile_cpu(_resolve(spec, variant), verbose=verbose)
    if device != "cuda":
        raise ValueError(f"device: expected 'cuda' or 'cpu', got {device!r}")
    import cupy

    from attngen.plan import decode as plan_decode
    from attngen.runtime import decode as runtime_decode

    v = _resolve(spec, variant)
    a = Arch(arch) if isinstance(arch, str) else (arch or device_arch())
    fam = plan_decode.Family(family)
    no_forward = plan_decode.forward_unsupported(v)
    if fam == plan_decode.Family.DECODE or (fam == plan_decode.Family.AUTO and no_forward):
        return runtime_decode.compile_decode(v, a, verbose=verbose)
    if no_forward:
        raise ValueError(f"variant {v.name}: {no_forward}")
    if fam == plan_decode.Family.AUTO and plan_decode.decode_unsupported(v, a) is None:
        # (targets without cp.async or m16n8k16 tensor cores, sm_75, or without the shared memory of
        # the head dim's ring, D256 on sm_86, keep every call on the forward family)
        return runtime_decode.Dispatch(compile(v, arch=a, verbose=verbose, family="forward", softmax=softmax), a, verbose)
    dev = cupy.cuda.Device().id
    key = (v, a, dev) if softmax is None else (v, a, dev, softmax)
    with _KERNELS_LOCK:
        if key in _KERNELS:
            return _KERNELS[key]
    t0 = time.perf_counter()
    src, kp = render_with_plan(v, a, softmax=softmax)
    binary = compile_source(src, a)
    module, fns = load_functions(binary.cubin, {kp.kernel_name: kp.smem_bytes, **{pr.kernel: 0 for pr in kp.preps}})
    fn = fns[kp.kernel_name]
    preps = tuple(fns[pr.kernel] for pr in kp.preps)
    launcher = os.environ.get("ATTNGEN_LAUNCHER", "driver")
    if launcher == "driver":
        try:
            driver()
        except OSError:  # no libcuda to load by name: CuPy's launch path still works
            launcher = "cupy"
    k = Kernel(v, src, kp, binary.seconds, binary.compiler, binary.cached, module, fn, preps, device=dev, launcher=launcher)
    if persistent(kp.engine):
        k._counter_blocks.append(cupy.zeros(COUNTER_BLOCK, dtype=cupy.int32))
    sorted_inputs = kp.problem.sorted_inputs
    if v.nan_check or sorted_inputs:
        # Allocated at load, never during a call, so that a call captured into a CUDA graph
        # allocates nothing: word 0 the nan flag (an int), then a check's first bad index each.
        k._status = cupy.array([0] + [NO_ERROR] * len(sorted_inputs), dtype=cupy.int64)
        k._check_fns = tuple(_check_function(a, d.dtype) for d in sorted_inputs)
    st = short_tile(v, a)
    if st is not None:
        # Calls with short key loops launch the same variant at the short tile (a second module).
        t = st.tile
        k.short = compile(dataclasses.replace(v, tile=TileHint(t.block_m, t.block_n, t.warps, t.stages)),
                          arch=a, verbose=verbose, family="forward", softmax=softmax)
        k.short_max_lk = st.max_lk
    cupy.cuda.Device().synchronize()  # zeroed before any stream can launch with them
    if verbose:
        what = "cache hit" if binary.cached else f"compiled in {binary.seconds:.2f} s"
        print(f"attngen: {v.name} for {a.value} with {binary.compiler}: {what}; load {time.perf_counter() - t0:.3f} s total")
    with _KERNELS_LOCK:
        _KERNELS.setdefault(key, k)
        return _KERNELS[key]
