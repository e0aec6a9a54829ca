"""The decode family called from Python (stage: load + launch).

`compile_decode(v)` renders, compiles (cached) and loads a variant's split-KV and combine kernels;
the returned `DecodeKernel` checks its arrays like the forward `Kernel` (same helpers, same words),
picks the split kernel's CTAs and the partial slots for the call (`DecodePlan.schedule`), allocates
the fp32 workspace on the launch stream (none when one slot a row) and launches the plan's kernels
in order. `Dispatch` is what
`attngen.compile` returns for variants both families can run: each call goes to the family
`plan_decode.choose_family` picks for its Lq (decode for small Lq), compiling each family on
first use.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from attngen.ir import abi
from attngen.cuda.compile import compile_source
from attngen.ir.nodes import BLOCK_TABLE, CACHE_LENS, DType, Layout, Variant
from attngen.plan.decode import MAX_UNITS_TIMES_CTAS, DecodePlan, Family, choose_family
from attngen.cuda.render_decode import render_decode
from attngen.runtime.kernel import (
    NaNCheckError,
    _Arr,
    _check_dtype,
    _dtype_name_for_abi,
    _empty,
    _external_stream,
    _overlaps,
    _sm_count,
    _view,
    load_functions,
)
from attngen.plan.schedule import Arch


def _strides(var: Variant, a: _Arr, name: str, paged: bool = False) -> tuple[int, int, int]:
    """(batch, head, sequence) strides of a 4-D q/k/v/o view, or (page, head, slot) of a paged
    K/V cache [num_pages, page_size, Hkv, D], checked for the kernels' 16-byte copies."""
    if len(a.shape) != 4:
        raise ValueError(f"{name}: expected a 4-D array, got shape {a.shape}")
    if a.strides[-1] != 1:
        raise ValueError(f"{name}: expected the last dimension to be contiguous (stride 1), got strides {a.strides}")
    if paged:
        sb, ss, sh = a.strides[0], a.strides[1], a.strides[2]
    elif var.layout == Layout.BHSD:
        sb, sh, ss = a.strides[0], a.strides[1], a.strides[2]
    else:
        sb, ss, sh = a.strides[0], a.strides[1], a.strides[2]
    for s, what in ((sb, "batch"), (sh, "head"), (ss, "sequence")):
        if s % 8:
            raise ValueError(f"{name}: expected every stride to be a multiple of 8 elements (16 bytes); the {what} stride is {s}")
    if a.ptr % 16:
        raise ValueError(f"{name}: expected a 16-byte aligned data pointer")
    return sb, sh, ss


def _check_pages(table: Any, num_pages: int, lens: Any, Lq: int, Lk: int) -> None:
    """Refuse a block table with a page id outside [0, num_pages), and cache lengths outside
    [Lq, Lk] (small device reductions and a synchronisation: the price of never reading outside
    the cache and of rows that hold their new tokens)."""
    lo, hi = int(table.min()), int(table.max())
    if lo < 0 or hi >= num_pages:
        raise ValueError(f"block_table: expected page ids in [0, {num_pages}), got values from {lo} to {hi}")
    abi.check_cache_lens(int(lens.min()), int(lens.max()), Lq, Lk)


@dataclass
class DecodeKernel:
    """A variant's decode family, compiled for one architecture; call it like `Kernel`."""

    variant: Variant
    source: str
    plan: DecodePlan
    compile_seconds: float
    compiler: str
    cached: bool
    _module: Any = None
    _functions: tuple[Any, ...] = ()
    # Row-block counters for merging in the split kernel, one zeroed buffer a (device, stream):
    # every launch leaves them zero, so a stream's launches (and graph replays) share one buffer;
    # launches on different streams, which may overlap, never do. Outgrown buffers are kept (a
    # captured graph may still point at one).
    _counters: dict[tuple[int, int], Any] = field(default_factory=dict)
    _retired: list[Any] = field(default_factory=list)

    family = Family.DECODE
    # Whether calls merge in the split kernel by default (False: the combine kernel merges). On:
    # the H200 measured it 0.6-9% faster wherever a row block splits (benchmarks/README.md).
    fused_default = True

    def _counter_ptr(self, dev: int, stream: Any, n: int) -> int:
        """Device address of at least n zeroed int32 row-block counters for `stream`, or 0 when
        that would allocate during CUDA-graph capture (the call then merges with the combine
        kernel; as the forward's work counters, counters are never allocated under capture)."""
        import cupy

        key = (dev, int(stream.ptr))
        with _LOCK:
            buf = self._counters.get(key)
            if buf is not None and buf.size >= n:
                return int(buf.data.ptr)
            if cupy.cuda.runtime.streamIsCapturing(int(stream.ptr)) != 0:
                return 0
            new = cupy.zeros(max(n, 1024, 2 * buf.size if buf is not None else 0), dtype=cupy.int32)
            cupy.cuda.Device().synchronize()  # zeroed before any stream launches with them
            if buf is not None:
                self._retired.append(buf)
            self._counters[key] = new
            return int(new.data.ptr)

    def __call__(self, q: Any, k: Any, v: Any, *, out: Any = None, lse: Any = None, stream: Any = None,
                 splits: int | None = None, ctas: int | None = None, fused: bool | None = None, check_pages: bool = True,
                 **inputs: Any) -> Any:
        """Runs split-KV attention then the combine; returns `o`, or `(o, lse)` with `output lse`.
        `splits` overrides the launch-time schedule with that many equal splits of every row
        block, `ctas` with that many equal shares of the call's units (tests and benchmarks use
        them to cover other schedules). `fused=True` merges split partials in the split kernel's
        last CTA a row block instead of a combine launch (`fused_default`; benchmarks compare).
        `check_pages=False` skips the paged cache's checks of page ids and cache_lens, which
        synchronise the stream (for callers that validated their block table once; the kernel
        still reads an out-of-range page as zeros, never outside the cache, and clamps cache_lens
        to the capacity; a length below Lq is then the caller's contract)."""
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
        B, Lq, Lk = sizes.B, sizes.Lq, sizes.Lk
        paged = var.page_size is not None
        qs, ks, vs = _strides(var, aq, "q"), _strides(var, ak, "k", paged), _strides(var, av, "v", paged)
        if paged and check_pages:
            _check_pages(given[BLOCK_TABLE].obj, ak.shape[0], given[CACHE_LENS].obj, Lq, Lk)
        xp_torch = aq.is_torch
        o_shape = abi.o_shape(var, B, Lq)
        if out is None:
            out = _empty(o_shape, var.dtype, xp_torch, aq.obj)
        ao = _view(out, "out")
        _check_dtype(ao, var.dtype, "out")
        if ao.shape != o_shape:
            raise ValueError(f"out: expected shape {o_shape}, got {ao.shape}")
        for name, a in (("q", aq), ("k", ak), ("v", av)):
            if _overlaps(ao, a):
                raise ValueError(f"out: expected memory separate from the inputs, but it overlaps {name}")
        os_ = _strides(var, ao, "out")
        lse_ptr = 0
        if var.lse or lse is not None:
            if not var.lse:
                raise ValueError("lse: this variant does not compute the LSE (add `output lse` to the spec)")
            if lse is None:
                lse = _empty(abi.lse_shape(var, B, Lq), DType.FP32, xp_torch, aq.obj)
            al = _view(lse, "lse")
            if al.dtype != "float32" or al.shape != (B, var.heads, Lq) or al.strides != (var.heads * Lq, Lq, 1):
                raise ValueError(f"lse: expected a contiguous float32 array of shape {(B, var.heads, Lq)}, got {al.dtype} {al.shape} strides {al.strides}")
            lse_ptr = al.ptr
        if stream is None:
            if xp_torch:
                import torch

                stream = _external_stream(torch.cuda.current_stream().cuda_stream)
            else:
                stream = cupy.cuda.get_current_stream()
        elif not isinstance(stream, (cupy.cuda.Stream, cupy.cuda.ExternalStream)):
            stream = _external_stream(int(getattr(stream, "cuda_stream", stream)))
        dp = self.plan
        n_chunks = max(1, -(-Lk // dp.chunk))
        units = dp.units(B, Lq, Lk)
        if splits is not None and ctas is not None:
            raise ValueError("splits, ctas: expected at most one of the two schedule overrides")
        if splits is not None:
            if not 1 <= splits <= n_chunks:
                raise ValueError(f"splits: expected 1 to {n_chunks} (chunks of {dp.chunk} keys), got {splits}")
            n_ctas = dp.split_ctas(B, Lq, Lk, splits)
            n_split = dp.slots(B, Lq, n_ctas)
        elif ctas is not None:
            if not 1 <= ctas <= units:
                raise ValueError(f"ctas: expected 1 to {units} (row blocks x chunks of {dp.chunk} keys), got {ctas}")
            n_ctas, n_split = ctas, dp.slots(B, Lq, ctas)
        else:
            n_split, n_ctas = dp.schedule(B, Lq, Lk, _sm_count(dev))
        if units * n_ctas >= MAX_UNITS_TIMES_CTAS:
            raise ValueError(f"B, Lq, Lk: {units} work units over {n_ctas} CTAs overflow the kernels' share arithmetic")
        # The workspace grows with B * H * Lq * splits (never with Lk), allocated in the launch
        # stream's order, so dropping it when this call returns is safe while the kernels run.
        # One slot a row: the split kernel writes O itself and reads no workspace.
        ws_o = ws_lse = None
        if n_split > 1:
            ws_o_shape, ws_lse_shape = dp.workspace_shapes(B, Lq, n_split)
            ws_o = _empty(ws_o_shape, DType.FP32, xp_torch, aq.obj, stream)
            ws_lse = _empty(ws_lse_shape, DType.FP32, xp_torch, aq.obj, stream)
        flag = None
        if var.nan_check:
            with stream:
                flag = cupy.zeros(1, dtype=cupy.int32)
        merge = self.fused_default if fused is None else bool(fused)
        count_ptr = self._counter_ptr(dev, stream, dp.row_blocks(B, Lq)) if merge and n_split > 1 else 0
        args: list[Any] = [
            np.uint64(aq.ptr), np.uint64(ak.ptr), np.uint64(av.ptr), np.uint64(ao.ptr), np.uint64(lse_ptr),
            np.uint64(flag.data.ptr if flag is not None else 0),
            np.uint64(0 if ws_o is None else _view(ws_o, "ws_o").ptr),
            np.uint64(0 if ws_lse is None else _view(ws_lse, "ws_lse").ptr), np.uint64(count_ptr),
            np.int32(B), np.int32(Lq), np.int32(Lk), np.int32(0), np.int32(0), np.int32(Lq), np.int32(Lk),
            np.int32(n_split), np.int32(n_ctas),
            *((np.int32(ak.shape[0]),) if paged else ()),
            *(np.int64(s) for s in (*qs, *ks, *vs, *os_)),
        ]
        for d in var.runtime_inputs():
            a = given[d.name]
            _check_dtype(a, d.dtype, d.name)
            args.append(np.uint64(a.ptr))
            args.extend(np.int32(n) for n in a.shape)
            args.extend(np.int64(s) for s in a.strides)
        targs = tuple(args)
        for launch, fn in zip(dp.launches(B, Lq, n_split, n_ctas, merged=bool(count_ptr)), self._functions):
            fn(launch.grid, (launch.threads,), targs, shared_mem=launch.smem_bytes, stream=stream)
        if flag is not None and int(flag.get(stream=stream)[0]) != 0:
            raise NaNCheckError(f"variant {var.name}: the output holds NaN or Inf (nan_check)")
        return (out, lse) if var.lse else out


_DECODE: dict[tuple[Variant, Arch, int, tuple[int, int] | None], DecodeKernel] = {}
_LOCK = threading.Lock()


def compile_decode(v: Variant, arch: Arch, *, verbose: bool = False, tile: tuple[int, int] | None = None) -> DecodeKernel:
    """Render, compile (cached) and load a variant's decode kernels for the current device
    (`tile` overrides the schedule, for sweeps)."""
    import cupy

    dev = cupy.cuda.Device().id
    key = (v, arch, dev, tile)
    with _LOCK:
        if key in _DECODE:
            return _DECODE[key]
    t0 = time.perf_counter()
    src, dp = render_decode(v, arch, tile)
    binary = compile_source(src, arch)
    module, by_name = load_functions(binary.cubin, {dp.kernel_name: dp.smem_bytes, dp.combine_name: 0})
    fns = (by_name[dp.kernel_name], by_name[dp.combine_name])
    k = DecodeKernel(v, src, dp, binary.seconds, binary.compiler, binary.cached, module, fns)
    if verbose:
        what = "cache hit" if binary.cached else f"compiled in {binary.seconds:.2f} s"
        print(f"attngen: {v.name} (decode) for {arch.value} with {binary.compiler}: {what}; load {time.perf_counter() - t0:.3f} s total")
    with _LOCK:
        return _DECODE.setdefault(key, k)


def _lq_of(var: Variant, q: Any) -> int:
    """Lq of a q argument (its layout's sequence dim), before any checks (those come in the
    kernel the call goes to); None-safe for odd inputs, which the forward then refuses."""
    shape = tuple(getattr(q, "shape", ()))
    if len(shape) != 4:
        return -1
    return int(shape[2] if var.layout == Layout.BHSD else shape[1])


class Dispatch:
    """The forward kernel plus the decode family: calls with small Lq go to decode (see
    `choose_family`), others to the forward kernel. Attributes are the forward kernel's."""

    def __init__(self, forward: Any, arch: Arch, verbose: bool = False) -> None:
        self.forward = forward
        self._arch = arch
        self._verbose = verbose
        self._decode: DecodeKernel | None = None

    @property
    def decode(self) -> DecodeKernel:
        """The decode kernels (compiled on first use)."""
        if self._decode is None:
            self._decode = compile_decode(self.forward.variant, self._arch, verbose=self._verbose)
        return self._decode

    def family_for(self, Lq: int) -> Family:
        return choose_family(self.forward.variant, Lq)

    def __call__(self, q: Any, k: Any, v: Any, **kw: Any) -> Any:
        lq = _lq_of(self.forward.variant, q)
        # Calls placed in a longer sequence (q_offset, kv_offset, Lq_total, Lk_total) run on the
        # forward family, the one whose ABI carries positions.
        placed = any(kw.get(n) for n in ("q_offset", "kv_offset", "Lq_total", "Lk_total"))
        if lq >= 1 and not placed and self.family_for(lq) == Family.DECODE:
            if "check_inputs" in kw:  # the forward's name for the promise checks; decode's is the page check
                kw.setdefault("check_pages", kw.pop("check_inputs"))
            return self.decode(q, k, v, **kw)
        return self.forward(q, k, v, **kw)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.forward, name)


__all__ = ["DecodeKernel", "Dispatch", "compile_decode"]
