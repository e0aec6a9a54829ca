"""Compiled kernels called from Python (stage: load + launch).

`compile(spec)` renders, compiles (cached) and loads one variant; the returned `Kernel` accepts
CuPy arrays or torch CUDA tensors without copies, checks every array before launch, and launches on
the caller's current stream. One compiled kernel serves every batch size and sequence length.

CuPy has no bfloat16 dtype: with CuPy, pass bf16 data as a uint16 array holding the bit patterns
(`x.view(cupy.uint16)`); outputs come back the same way. torch tensors keep their own dtypes.

A call validates and packs its arguments once per signature (`attngen.runtime.binder`), then launches
through the CUDA driver (ctypes `cuLaunchKernel`; docs/DECISIONS.md#cupys-launch-path). Variants with `sorted` inputs run a device check first (`attngen.runtime.checks`);
its result and a `nan_check` flag live in device status words that the call reads back (a sync),
except under CUDA-graph capture, where `raise_pending()` reports them later.
"""

from __future__ import annotations

import os
import threading
import time
import functools
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, Union

from attngen.cuda.compile import compile_source
from attngen.ir.dtypes import INPUT_DTYPES
from attngen.ir.nodes import DType, Layout, Program, TileConfig, Variant
from attngen.runtime.binder import (CALL_SCALARS, MAX_BINDINGS, call_outputs, call_signature, POOL, SIG_FNS, Binding, InputCheckError, NaNCheckError, bind_forward,
                                    capturing, driver, launch_driver, load_functions, sig_fn,
                                    stream_ptr, torch_current_stream, torch_sig)
from attngen.runtime.extras import require_cupy
from attngen.runtime.inputs import positional_inputs_message
from attngen.runtime.checks import NO_ERROR, check_kernel_name, flat_to_index, render_checks
from attngen.cuda.render import OpPlan, render_plan, render_with_plan
from attngen.plan.schedule import Arch, WgmmaSoftmax, arch_for_cc, persistent


if TYPE_CHECKING:
    from attngen.runtime.decode import DecodeKernel, Dispatch

__all__ = [
    "COUNTER_BLOCK", "CallResult", "DeviceArray", "InputCheckError", "Kernel", "NaNCheckError", "compile",
    "device_arch", "raise_pending",
]


class DeviceArray(Protocol):
    """What a kernel takes and returns: a CuPy array or a torch CUDA tensor (checked at the call)."""

    @property
    def shape(self) -> tuple[int, ...]: ...


# `o`, or `(o, lse)` when the spec declares `output lse`
CallResult = Union[DeviceArray, tuple[DeviceArray, DeviceArray]]



def device_arch(device_id: int | None = None) -> Arch:
    """The attngen target for a CUDA device: its own arch's code (schedule.arch_for_cc), or a
    RuntimeError naming the device where attngen has none."""
    import cupy

    dev = cupy.cuda.Device(device_id) if device_id is not None else cupy.cuda.Device()
    try:
        return arch_for_cc(int(dev.compute_capability))
    except ValueError as e:
        raise RuntimeError(f"device {dev.id}: {e}") from None


COUNTER_BLOCK = 64  # persistent kernels' work counters allocated at a time (one a stream)


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
    _routed: OrderedDict = field(default_factory=OrderedDict)  # the short-loop kernel's bindings its calls through this one took
    _check_shapes: tuple[tuple[int, ...], ...] = ()  # the sorted inputs' shapes in the latest launch
    # The plan's short-loop kernel (`OpPlan.short`), for calls whose key loop is short (Lk <= short_max_lk).
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

    def __call__(self, q: DeviceArray, k: DeviceArray, v: DeviceArray, *positional: object, out: DeviceArray | None = None,
                 lse: DeviceArray | None = None, stream: object = None, check_inputs: bool = True, q_offset: int = 0,
                 kv_offset: int = 0, Lq_total: int | None = None, Lk_total: int | None = None,
                 **inputs: DeviceArray) -> CallResult:
        """Runs the kernel; returns `o`, or `(o, lse)` when the spec asks for the LSE.

        Runtime inputs go by name (`q_lens=..., kv_lens=...`); positional ones are refused (a
        TypeError naming the inputs), since two inputs of one shape and dtype would swap silently.

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
        if positional:
            raise TypeError(positional_inputs_message(f"kernel {self.variant.name}", self._input_names, len(positional)))
        pos = (q_offset, kv_offset, Lq_total, Lk_total)
        return self._run(q, k, v, out, lse, stream, check_inputs, inputs, False, None if pos == (0, 0, None, None) else pos)

    def _run(self, q: Any, k: Any, v: Any, out: Any, lse: Any, stream: Any, check_inputs: bool,
             inputs: dict[str, Any], defer: bool, positions: tuple | None = None) -> Any:
        """`__call__`; with `defer`, the status words (input checks, nan_check) are not read back:
        an error stays on the device until `raise_pending()` or the next call that reads them."""
        scalars = {n: int(inputs.pop(n, d)) for n, d in CALL_SCALARS.items()} if CALL_SCALARS else None
        names = self._input_names
        arrays = (q, k, v, *[inputs[n] for n in names if n in inputs]) if names else (q, k, v)
        if len(arrays) != 3 + len(names) or len(inputs) != len(names):
            self._build(arrays, inputs, out, lse, stream, check_inputs, positions=positions)  # raises the precise error
        sig = call_signature(arrays)
        if sig is None:
            self._build(arrays, inputs, out, lse, stream, check_inputs, positions=positions)  # raises the precise error
        sigs, ptrs = sig
        fns = SIG_FNS
        is_torch = fns.get(type(q)) is torch_sig
        if stream is None:
            if is_torch:
                sp = torch_current_stream(self.device)
            else:
                import cupy

                sp = cupy.cuda.get_current_stream().ptr
        else:
            sp = stream_ptr(stream)
        out_sig = lse_sig = None
        op = 0
        if out is not None:
            fo = sig_fn(out)
            if fo is not None:
                out_sig, op = fo(out)
            else:
                out_sig = type(out)
        if lse is not None:
            fl = sig_fn(lse)
            lse_sig = fl(lse)[0] if fl is not None else type(lse)
        key = (sigs, out_sig, lse_sig, sp, bool(check_inputs), positions)
        b = self._bindings.get(key) or self._routed.get(key)
        if b is None:
            # Calls with short key loops run the plan's short-loop kernel: its binding, kept in
            # both kernels (k's shape is in the key, so the choice is made once a signature)
            short = self.short is not None and _seq_len(self.variant, k) <= self.short_max_lk
            b = (self.short if short else self)._build(arrays, inputs, out, lse, stream, check_inputs, key, sp, positions)
            if short:
                self._routed[key] = b
                while len(self._routed) > MAX_BINDINGS:
                    self._routed.popitem(last=False)
        out, op, lse, lp = call_outputs(b, self.variant.dtype, ptrs, out, op, lse, is_torch)
        ws: Any = ()
        if b.ws_specs:
            # Workspaces from the pool, shared by this stream's calls (fresh under graph capture)
            ws = ([b.alloc((n,), dt) for n, dt in b.ws_specs] if capturing(sp) else POOL.take(b.pool_keys, b.ws_specs, b.alloc))
        # Calls on one stream that share pool workspaces queue their launches one call at a time.
        with POOL.stream_lock(sp) if ws else b.lock:
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
                if ptrs[tm.array] != tm.last:
                    tm.update(ptrs[tm.array], "qkv"[tm.array])
            for ci, ai in b.check_slots:
                b.checks[ci].args.vals[0] = ptrs[ai]
            for ln in b.checks:
                launch_driver(ln, sp)
            for ln in b.main:
                launch_driver(ln, sp)
        if b.readback:
            kern = b.owner or self  # (the short-loop kernel's own status words)
            if b.checks:
                kern._check_shapes = b.check_shapes
            if not defer and not driver().capturing(sp):
                # Under CUDA-graph capture no sync is allowed: the status words keep any error
                # for raise_pending() or the next call that reads them.
                kern._read_status(sp)
        return (out, lse) if b.lse_shape is not None else out

    def for_variant(self, v: Variant) -> Any:
        """`compile(v)` for this kernel's arch (the backward's training forward compiles through it)."""
        return compile(v, arch=self.plan.arch)

    def backward(self, q: Any, k: Any, v: Any, dO: Any, **kwargs: Any) -> Any:
        """Gradients of sum(dO * O) (dq, dk, dv, and the inputs named in `wrt=`), with the same
        argument checks as a call; see `attngen.runtime.bwd.backward`."""
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
            sp = stream_ptr(stream)
        self._read_status(sp)
        if self.short is not None:  # (the short-loop kernel's calls leave errors in its own words)
            self.short._read_status(sp)

    # -----------------------------------------------------------------------------------------
    # building a binding: the full validation, once per signature

    def _build(self, arrays: tuple[Any, ...], inputs: dict[str, Any], out: Any, lse: Any, stream: Any,
               check_inputs: bool, key: Any = None, sp: int | None = None, positions: tuple | None = None) -> Binding:
        """The full validation and packing of one signature (`binder.bind_forward`), kept per key."""
        b = bind_forward(self, arrays, inputs, out, lse, stream, check_inputs, sp, positions)
        b.key, b.owner = key, self
        if key is not None:
            self._bindings[key] = b
            while len(self._bindings) > MAX_BINDINGS:
                self._bindings.popitem(last=False)
        return b


_CHECK_MODULES: dict[tuple[Arch, int], Any] = {}


def _check_function(arch: Arch, dtype: DType) -> Any:
    """The sortedness check kernel for `dtype` on the current device (the module compiled once)."""
    import cupy

    dev = cupy.cuda.Device().id
    mod = _CHECK_MODULES.get((arch, dev))
    if mod is None:
        binary = compile_source(render_checks(), arch)
        names = {check_kernel_name(d): 0 for d in INPUT_DTYPES}
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



_KERNELS: dict[tuple, Kernel] = {}  # (variant, arch, device[, softmax schedule override])
_KERNELS_LOCK = threading.Lock()


def _resolve(spec: Any, variant: str | None) -> Variant:
    from attngen.plan.validate import resolve

    return resolve(spec, variant)


def _load(v: Variant, a: Arch, kp: OpPlan, src: str, dev: int) -> tuple[Kernel, Any]:
    """The Kernel of one plan of `v` from its rendered source (compiled through the cache), and
    the compile's record."""
    import cupy

    binary = compile_source(src, a)
    module, fns = load_functions(binary.cubin, {kp.kernel_name: kp.smem_bytes, **{pr.kernel: 0 for pr in kp.preps}})
    fn = fns[kp.kernel_name]
    preps = tuple(fns[pr.kernel] for pr in kp.preps)
    k = Kernel(v, src, kp, binary.seconds, binary.compiler, binary.cached, module, fn, preps, device=dev)
    if persistent(kp.engine):
        k._counter_blocks.append(cupy.zeros(COUNTER_BLOCK, dtype=cupy.int32))
    sorted_inputs = kp.problem.sorted_inputs
    if v.nan_check or sorted_inputs:
        # Allocated at load, never during a call, so that a call captured into a CUDA graph
        # allocates nothing: word 0 the nan flag (an int), then a check's first bad index each.
        k._status = cupy.array([0] + [NO_ERROR] * len(sorted_inputs), dtype=cupy.int64)
        k._check_fns = tuple(_check_function(a, d.dtype) for d in sorted_inputs)
    return k, binary


def compile(spec: Variant | Program | str | os.PathLike[str], variant: str | None = None, *,
            arch: str | Arch | None = None, verbose: bool = False, family: str = "auto",
            softmax: WgmmaSoftmax | None = None, device: str = "cuda") -> Kernel | DecodeKernel | Dispatch:
    """Parse (if needed), render, compile and load one variant for the current CUDA device.

    `spec` is a Variant, a Program, a path to a `.attn` file, or `.attn` source text. `family`:
    "forward" gives the forward `Kernel`; "decode" forces the split-KV decode family
    (`runtime_decode.DecodeKernel`); "auto" (default) gives the forward kernel, wrapped so that
    calls with small Lq run the decode family where the variant supports it. `softmax` replaces
    the wgmma softmax schedule the plan picks (`render.plan`; benchmarks time the two side by side).
    Without CuPy, a MissingExtra (a ModuleNotFoundError) naming `pip install 'attngen[cuda]'`.
    This is the CUDA backend's compile (`attngen.backend.CudaBackend.load`); `attngen.compile`
    picks the backend by `device` (attngen.backend.compile), so `device` here takes "cuda" only."""
    if device != "cuda":
        raise ValueError(f"attngen.runtime.kernel.compile builds CUDA kernels, not device={device!r}: "
                         "attngen.compile(..., device=...) picks the backend")
    cupy = require_cupy("attngen.compile")

    from attngen.plan import decode as plan_decode
    from attngen.runtime import decode as runtime_decode

    v = _resolve(spec, variant)
    if v.quantized and plan_decode.forward_unsupported(v) and plan_decode.decode_unsupported(v) is not None:
        # neither family reads these quantized operands: refused, never run in full precision
        raise ValueError(f"variant {v.name}: {plan_decode.forward_unsupported(v)}")
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
    k, binary = _load(v, a, kp, src, dev)
    if kp.short is not None:
        # Calls with short key loops launch the plan's short-loop kernel (a second module).
        k.short = _load(v, a, kp.short, render_plan(v, kp.short), dev)[0]
        k.short_max_lk = kp.short_max_lk
    cupy.cuda.Device().synchronize()  # zeroed before any stream can launch with them
    if verbose:
        what = "cache hit" if binary.cached else f"compiled in {binary.seconds:.2f} s"
        print(f"attngen: {v.name} for {a.value} with {binary.compiler}: {what}; load {time.perf_counter() - t0:.3f} s total")
    with _KERNELS_LOCK:
        _KERNELS.setdefault(key, k)
        return _KERNELS[key]
