"""The binder: a call's arrays → a launch, at almost no host cost (stage: launch).

Everything a launch needs that depends only on the call's *signature* (shapes, strides, dtypes,
devices of the arrays, the stream, whether inputs are checked) is validated and packed once, into
a `Binding`: every kernel argument sits in a prebuilt 8-byte slot, the `void**` array CUDA's
`cuLaunchKernel` reads points at those slots, grids are computed. A later call with the same
signature only reads its arrays' data pointers, patches the pointer slots and launches through the
CUDA driver with ctypes (no per-argument Python objects, no CuPy argument conversion).

This is the one binder of every family: the forward (`bind_forward`, here), the backward
(`runtime.bwd.bind_backward`: every engine and the deterministic mode) and the decode family
(`runtime.decode.bind_decode`: split-KV and combine, paged and varlen) build their bindings from
the pieces below, and the ring's per-step calls are forward calls. The argument list comes from
the plan's ABI fields, by name (`pack_fields`): each field is either a pointer patched per call, a
value fixed by the signature, or a per-call scalar in `CALL_SCALARS`. A field with no rule is an
error when the binding is built, so a new ABI field cannot be silently passed as garbage. Strides
follow one rule (`seq_strides`), runtime inputs' fields their names in `attngen.ir.names`.

Outputs (O, LSE, gradients) are allocated each call through the caller's allocator in the launch
stream's order: they are the caller's. Workspaces come from `POOL`, kept per (library, device,
stream, dtype, size): a stream runs its calls in order, so they may share them, and a per-stream
lock keeps one call's launches together. A call under CUDA-graph capture takes fresh workspaces
from the caller's allocator instead (a graph must own what it captured). Counters a kernel leaves
zero are zeroed once by an async memset on their stream (`zero_async`); errors found on the device
(input checks, page ids, nan_check) sit in status words read back only where a call asks for it.
"""

from __future__ import annotations

import ctypes
import functools
import math
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Callable

from attngen.cuda.render import TmaMap, tma_maps
from attngen.ir import abi, names
from attngen.ir.nodes import DType, Layout, NormScope, NormTarget, Variant, norm_bias_name, norm_weight_name
from attngen.plan.schedule import persistent
from attngen.runtime.arrays import (  # noqa: F401  (re-exported)
    NaNCheckError,
    InputCheckError,
    ArrayView,
    view,
    dtype_ok,
    check_dtype,
    byte_range,
    overlaps,
    dtype_name_for_abi,
    sm_count,
    torch_sig,
    cupy_sig,
    sig_fn,
    SIG_FNS,
    call_signature,
    torch_current_stream,
    stream_ptr,
    StreamHandle,
    external_stream,
    load_functions,
)
from attngen.runtime.checks import CHECK_THREADS, check_args, check_grid

# Per-call integer arguments a caller may pass by keyword (name → default); an ABI field with one of
# these names is filled from the call. Add a runtime scalar of the kernel ABI here.
CALL_SCALARS: dict[str, int] = {}

# Bindings kept per kernel; beyond this many signatures the oldest are dropped (rebuilt on demand).
MAX_BINDINGS = 256

# ---------------------------------------------------------------------------------------------
# The CUDA driver, through ctypes


class _Driver:
    """The few driver entry points the launch path needs (libcuda, loaded once)."""

    def __init__(self) -> None:
        lib = ctypes.CDLL("libcuda.so.1")
        self.launch = lib.cuLaunchKernel
        self.launch.restype = ctypes.c_int
        self.launch.argtypes = [ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint,
                                ctypes.c_uint, ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        # The same entry point without argtypes, for calls whose arguments are all prebuilt ctypes
        # objects (`Launch.call_args`): ctypes then converts nothing (H200: the launch's Python
        # cost is mostly per-argument conversion).
        self.launch_raw = lib["cuLaunchKernel"]
        self.launch_raw.restype = ctypes.c_int
        self.dtoh = lib.cuMemcpyDtoHAsync_v2
        self.dtoh.restype = ctypes.c_int
        self.dtoh.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t, ctypes.c_void_p]
        self.htod = lib.cuMemcpyHtoDAsync_v2
        self.htod.restype = ctypes.c_int
        self.htod.argtypes = [ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
        self.sync = lib.cuStreamSynchronize
        self.sync.restype = ctypes.c_int
        self.sync.argtypes = [ctypes.c_void_p]
        self._capturing = lib.cuStreamIsCapturing
        self._capturing.restype = ctypes.c_int
        self._capturing.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)]
        self._local = threading.local()
        # TMA descriptors (WgmmaLoads.TMA kernels): resolved on first use, so that a driver without
        # the entry point still launches every other kernel
        self._lib = lib
        self._encode: Any = None
        self._memset: Any = None
        self._err = lib.cuGetErrorString
        self._err.restype = ctypes.c_int
        self._err.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]

    def encode_tmap(self) -> Any:
        """cuTensorMapEncodeTiled (CUDA 12+ drivers)."""
        if self._encode is None:
            fn = self._lib.cuTensorMapEncodeTiled
            fn.restype = ctypes.c_int
            u32, u64p, u32p = ctypes.c_uint32, ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint32)
            fn.argtypes = [ctypes.c_void_p, ctypes.c_int, u32, ctypes.c_void_p, u64p, u64p, u32p, u32p,
                           ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
            self._encode = fn
        return self._encode

    def memset32(self, ptr: int, value: int, words: int, stream: int) -> int:
        """cuMemsetD32Async (resolved on first use)."""
        fn = self._memset
        if fn is None:
            fn = self._memset = self._lib.cuMemsetD32Async
            fn.restype = ctypes.c_int
            fn.argtypes = [ctypes.c_uint64, ctypes.c_uint, ctypes.c_size_t, ctypes.c_void_p]
        return fn(ptr, value, words, stream)

    def capturing(self, stream: int) -> bool:
        """Whether `stream` is being captured into a CUDA graph (a sync there would break it)."""
        word = getattr(self._local, "word", None)  # (a status word and its pointer made once a thread)
        if word is None:
            word = self._local.word = (lambda st: (st, ctypes.byref(st)))(ctypes.c_int(0))
        status, ref = word
        rc = self._capturing(stream, ref)
        if rc == CUDA_ERROR_INVALID_CONTEXT and self.bind_context():
            rc = self._capturing(stream, ref)
        if rc:
            raise self.error(rc, "cuStreamIsCapturing")
        return status.value != 0

    def bind_context(self) -> bool:
        """Makes the current device's primary context current on this thread, if none is. A thread
        the caller's library made but never used for a runtime call has none: torch's autograd
        worker runs a backward on such a thread, and every driver call there fails with
        CUDA_ERROR_INVALID_CONTEXT. Called on that error only, so the hot path pays nothing."""
        lib = self._lib
        ctx = ctypes.c_void_p()
        if lib.cuCtxGetCurrent(ctypes.byref(ctx)) == 0 and ctx.value:
            return False  # a context is current: the error was something else
        dev = ctypes.c_int()
        if lib.cuDeviceGet(ctypes.byref(dev), _runtime_device()) != 0:
            return False
        if lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) != 0:
            return False
        return lib.cuCtxSetCurrent(ctx) == 0

    def error(self, code: int, what: str) -> RuntimeError:
        msg = ctypes.c_char_p()
        self._err(code, ctypes.byref(msg))
        text = msg.value.decode() if msg.value else "unknown error"
        return RuntimeError(f"attngen: {what} failed: CUDA error {code} ({text})")


CUDA_ERROR_INVALID_CONTEXT = 201


def _runtime_device() -> int:
    """The calling thread's current device as the caller's library sees it (torch, else CuPy)."""
    import sys

    if "torch" in sys.modules:
        return int(sys.modules["torch"].cuda.current_device())
    import cupy

    return int(cupy.cuda.runtime.getDevice())


_DRIVER: _Driver | None = None
_DRIVER_LOCK = threading.Lock()


def driver() -> _Driver:
    """The CUDA driver bindings (loaded on first use)."""
    global _DRIVER
    if _DRIVER is None:
        with _DRIVER_LOCK:
            if _DRIVER is None:
                _DRIVER = _Driver()
    return _DRIVER


def cu_function(fn: Any) -> int:
    """The CUfunction handle of a CuPy kernel object (RawKernel or Function)."""
    k = getattr(fn, "kernel", fn)
    return int(k.ptr)


# ---------------------------------------------------------------------------------------------
# Argument buffers


class ArgBuffer:
    """One kernel's arguments as 8-byte slots plus the `void**` array that points at them. An int
    field reads the low 4 bytes of its slot (little endian), a pointer or long long all 8. After
    them come `blobs` 128-byte arguments (TMA descriptors), each 64-byte aligned."""

    __slots__ = ("vals", "ptrs", "n", "blobs", "blob_mem", "blob_base")

    def __init__(self, values: list[int], blobs: int = 0) -> None:
        self.n = len(values)
        self.blobs = blobs
        self.vals = (ctypes.c_int64 * max(1, self.n))(*values)
        base = ctypes.addressof(self.vals)
        self.blob_mem = (ctypes.c_uint8 * (TMAP_BYTES * blobs + 64))() if blobs else None
        self.blob_base = (ctypes.addressof(self.blob_mem) + 63) // 64 * 64 if blobs else 0
        addrs = [base + 8 * i for i in range(self.n)] + [self.blob_base + TMAP_BYTES * j for j in range(blobs)]
        self.ptrs = (ctypes.c_void_p * max(1, len(addrs)))(*addrs)

    def blob(self, j: int) -> int:
        """The address of 128-byte argument `j`."""
        return self.blob_base + TMAP_BYTES * j


# CUtensorMap: 16 opaque 64-bit words
TMAP_BYTES = 128
# CUtensorMapDataType, CUtensorMapSwizzle, CUtensorMapL2promotion of cuda.h
TMAP_DTYPES = {"bf16": 9, "fp16": 6, "fp32": 7}  # CUtensorMapDataType
TMAP_SWIZZLE_128B = 3
TMAP_L2_256B = 3


FORWARD_TMA_HINT = "; compile it with softmax=WgmmaSoftmax(loads=WgmmaLoads.CP_ASYNC), whose copies take any 16-byte strides"


class TmaSlot:
    """One TMA descriptor argument of a binding (`attngen.cuda.render.TmaMap`): everything but the
    tensor's address is fixed by the call's signature, so a call re-encodes it only when its
    pointer changed since the last one."""

    __slots__ = ("args", "blob", "array", "dtype", "dims", "strides", "box", "unit", "last", "hint")

    def __init__(self, args: ArgBuffer, blob: int, array: int, dtype: str, dims: tuple[int, ...], strides: tuple[int, ...],
                 box: tuple[int, ...], hint: str = FORWARD_TMA_HINT) -> None:
        # `array`: where the call's pointer comes from (the forward: its index among the call's
        # arrays; the backward: the slot of the ABI field holding it)
        self.args, self.blob, self.array, self.hint = args, blob, array, hint
        self.dtype = TMAP_DTYPES[dtype]
        self.dims = (ctypes.c_uint64 * 4)(*dims)
        self.strides = (ctypes.c_uint64 * 3)(*strides)
        self.box = (ctypes.c_uint32 * 4)(*box)
        self.unit = (ctypes.c_uint32 * 4)(1, 1, 1, 1)
        self.last = -1

    def update(self, ptr: int, what: str = "") -> None:
        """Encodes the descriptor for the tensor at `ptr` (nothing when it is the last one's)."""
        if ptr == self.last:
            return
        d = _DRIVER or driver()
        rc = d.encode_tmap()(self.args.blob(self.blob), self.dtype, 4, ptr, self.dims, self.strides, self.box, self.unit,
                             0, TMAP_SWIZZLE_128B, TMAP_L2_256B, 0)
        if rc:
            self.last = -1
            raise ValueError(f"{what}: the TMA descriptor of this kernel's copies cannot describe it (cuTensorMapEncodeTiled: "
                             f"CUDA error {rc}; dims {tuple(self.dims)}, byte strides {tuple(self.strides)})" + self.hint)
        self.last = ptr


@dataclass
class Launch:
    """One kernel launch of a binding: function, grid, block, shared memory, arguments."""

    function: int  # CUfunction
    grid: tuple[int, int, int]
    block: int
    smem: int
    args: ArgBuffer
    call_args: tuple[Any, ...] = ()  # cuLaunchKernel's arguments as ctypes objects, for `stream`
    stream: int = -1

    def bind_stream(self, stream: int) -> None:
        """Prebuilds every argument of cuLaunchKernel for launches on `stream`."""
        u = ctypes.c_uint
        g = self.grid
        self.call_args = (ctypes.c_void_p(self.function), u(g[0]), u(g[1]), u(g[2]), u(self.block), u(1), u(1),
                          u(self.smem), ctypes.c_void_p(stream), self.args.ptrs, None)
        self.stream = stream


@dataclass
class Binding:
    """What one call signature needs, built once: the launches (checks, preps, attention) with
    their argument buffers, where each call's pointers go, and how outputs are allocated."""

    key: Any
    checks: list[Launch]
    check_slots: list[tuple[int, int]]  # (check launch index, index of its input among the call's arrays)
    main: list[Launch]  # preps, then the attention kernel (all share one argument list)
    array_slots: list[int]  # per call array (q, k, v, runtime inputs): its pointer's slot, -1 if none
    out_slot: int
    lse_slot: int
    ws_slots: list[int]
    scalar_slots: list[tuple[int, str]]  # (slot, CALL_SCALARS name)
    tmaps: list[TmaSlot]  # the attention kernel's TMA descriptors (WgmmaLoads.TMA), else empty
    alloc: Callable[..., Any]  # alloc(shape, dtype, zero=False) in the caller's library, in the launch stream's order
    ws_specs: list[tuple[int, DType]]  # the preps' workspaces: (elements, dtype), from the pool
    pool_keys: tuple[tuple[Any, ...], ...]  # the workspaces' keys in the pool (`WorkspacePool.keys`)
    out_shape: tuple[int, ...]
    lse_shape: tuple[int, ...] | None
    extents: list[tuple[int, int]]  # per q, k, v: [lo, hi) byte offsets around its pointer
    out_extent: tuple[int, int]
    readback: bool  # whether this call reads the status words back (a sync)
    check_shapes: tuple[tuple[int, ...], ...] = ()  # the sorted inputs' shapes (for error messages)
    lock: threading.Lock = field(default_factory=threading.Lock)
    new_out: Callable[[], Any] | None = None  # `maker`s of the output and the LSE (the LSE's: None without one)
    new_lse: Callable[[], Any] | None = None
    owner: Any = None  # the Kernel that built it (whose status words a call reads back)


def launch_driver(ln: Launch, stream: int) -> None:
    """Launches `ln` on `stream` through the driver (prebuilt arguments when bound to it)."""
    d = _DRIVER or driver()
    if stream == ln.stream:
        rc = d.launch_raw(*ln.call_args)
    else:
        g = ln.grid
        rc = d.launch(ln.function, g[0], g[1], g[2], ln.block, 1, 1, ln.smem, stream, ln.args.ptrs, None)
    if rc == CUDA_ERROR_INVALID_CONTEXT and d.bind_context():
        launch_driver(ln, stream)
        return
    if rc:
        raise d.error(rc, "cuLaunchKernel")


def slot_kind(ctype: str) -> str:
    """'p' pointer, 'i' int, 'q' long long: the width CUDA reads from a field's slot."""
    t = ctype.replace("__restrict__", "").strip()
    if t.endswith("*"):
        return "p"
    if t == "long long":
        return "q"
    if t == "int":
        return "i"
    raise ValueError(f"binder: no slot kind for ABI field type {ctype!r}")


# ---------------------------------------------------------------------------------------------
# Binding by field name: every family's argument buffer


def seq_strides(var: Variant, a: ArrayView, name: str, *, paged: bool = False, align: int = 0) -> tuple[int, int, int]:
    """(batch, head, sequence) strides of a q/k/v/o-like view in elements, the one rule of every
    family: packed [total, H, D] under `layout varlen` (no batch stride), a flat [B, L, H*D]
    hidden state, [B, H, L, D] (bhsd), [B, L, H, D] (bshd), or a paged K/V cache
    [num_pages, page_size, Hkv, D] as (page, head, slot). With `align`, every stride must be a
    multiple of `align` elements and the pointer 16-byte aligned (the kernels' 16-byte copies)."""
    if a.strides[-1] != 1:
        raise ValueError(f"{name}: expected the last dimension to be contiguous (stride 1), got strides {a.strides}")
    st = a.strides
    if var.layout == Layout.VARLEN and not paged:
        sb, sh, ss = 0, st[1], st[0]
    elif len(a.shape) == 3 and not paged:
        sb, sh, ss = st[0], var.head_dim, st[1]
    elif len(a.shape) != 4:
        raise ValueError(f"{name}: expected a 4-dimensional array, got shape {a.shape}")
    elif paged or var.layout != Layout.BHSD:
        sb, sh, ss = st[0], st[2], st[1]
    else:
        sb, sh, ss = st[0], st[1], st[2]
    if align:
        for s, what in ((sb, "batch"), (sh, "head"), (ss, "sequence")):
            if s % align:
                raise ValueError(f"{name}: expected every stride to be a multiple of {align} elements (16 bytes); the {what} stride is {s}")
        if a.ptr % 16:
            raise ValueError(f"{name}: expected a 16-byte aligned data pointer")
    return sb, sh, ss


def stride_fields(tensor: str, strides: tuple[int, int, int]) -> dict[str, int]:
    """The `<t>_sb`, `<t>_sh`, `<t>_ss` ABI fields of one tensor."""
    return {f"{tensor}_sb": strides[0], f"{tensor}_sh": strides[1], f"{tensor}_ss": strides[2]}


def input_fields(var: Variant, given: Mapping[str, ArrayView]) -> tuple[dict[str, int], tuple[str, ...]]:
    """The runtime inputs' sizes and strides by ABI field name (fixed by a signature) and their
    pointer fields in ABI order (patched per call); names from `attngen.ir.names`."""
    fixed: dict[str, int] = {}
    ptrs: list[str] = []
    for d in var.runtime_inputs():
        a = given[d.name]
        check_dtype(a, d.dtype, d.name)
        ptrs.append(names.input_field(d.name))
        fixed.update({names.input_size_field(d.name, j): n for j, n in enumerate(a.shape)})
        fixed.update({names.input_stride_field(d.name, j): s for j, s in enumerate(a.strides)})
    return fixed, tuple(ptrs)


def pack_fields(fields: Sequence[Any], fixed: Mapping[str, int], patched: Sequence[str], what: str,
                blobs: int = 0) -> tuple[ArgBuffer, tuple[str, ...], dict[str, int]]:
    """Every ABI field in order as a slot of one ArgBuffer: a pointer patched per call (its slot
    comes back by name) or a value fixed by the signature. A field with neither rule is an error
    when the binding is built, so a new ABI field is never passed as garbage."""
    want = set(patched)
    slots: dict[str, int] = {}
    values: list[int] = []
    kinds: list[str] = []
    for i, f in enumerate(fields):
        kinds.append(slot_kind(f.ctype))
        if f.name in want:
            slots[f.name] = i
            values.append(0)
        elif f.name in fixed:
            values.append(int(fixed[f.name]))
        else:
            raise NotImplementedError(f"attngen.runtime.binder: no rule binds ABI field {f.name!r} ({f.ctype}) of {what}")
    return ArgBuffer(values, blobs), tuple(kinds), slots


def contiguous_view(shape: tuple[int, ...], dtype: DType, device: int, is_torch: bool) -> ArrayView:
    """The view of an array a call will allocate (contiguous; pointer unknown until then)."""
    cs = [1] * len(shape)
    for i in range(len(shape) - 2, -1, -1):
        cs[i] = cs[i + 1] * shape[i + 1]
    return ArrayView(None, 0, tuple(shape), tuple(cs), abi.DTYPE_NAMES[dtype], dtype.itemsize, device, is_torch)


def launch_stream(stream: Any, is_torch: bool, device: int) -> int:
    """The raw stream a call launches on: `stream`, else the caller library's current stream."""
    if stream is not None:
        return stream_ptr(stream)
    if is_torch:
        return torch_current_stream(device)
    import cupy

    return int(cupy.cuda.get_current_stream().ptr)


def data_ptr(x: Any) -> int:
    """The device address of a torch tensor or CuPy array."""
    d = getattr(x, "data", None)
    return int(d.ptr) if d is not None and hasattr(d, "ptr") else int(x.data_ptr())


_TORCH_DTYPES: dict[DType, Any] = {}


def allocator(is_torch: bool, device: Any, stream: int) -> Callable[[tuple[int, ...], DType, bool], Any]:
    """alloc(shape, dtype, zero) in the caller's library, in `stream`'s order (both libraries'
    allocators reuse a freed block only in its stream's order, so dropping it after the call is
    safe while the kernels run; torch's is also CUDA-graph aware)."""
    if is_torch:
        import torch

        if not _TORCH_DTYPES:
            _TORCH_DTYPES.update({DType.FP32: torch.float32, DType.FP16: torch.float16, DType.BF16: torch.bfloat16,
                                  DType.I32: torch.int32, DType.I8: torch.int8})  # (i8: INT8 Q·Kᵀ's prep workspaces)
        if torch_current_stream(device.index) == stream:
            def alloc(shape: tuple[int, ...], dt: DType, zero: bool = False) -> Any:
                return (torch.zeros if zero else torch.empty)(shape, dtype=_TORCH_DTYPES[dt], device=device)
            alloc.device, alloc.empty = device, torch.empty  # type: ignore[attr-defined]  # (`maker`'s)
            return alloc

        def alloc_on(shape: tuple[int, ...], dt: DType, zero: bool = False) -> Any:
            with torch.cuda.stream(torch.cuda.ExternalStream(stream, device=device)):
                return (torch.zeros if zero else torch.empty)(shape, dtype=_TORCH_DTYPES[dt], device=device)
        return alloc_on
    import cupy

    cdt = {DType.FP32: cupy.float32, DType.FP16: cupy.float16, DType.BF16: cupy.uint16, DType.I32: cupy.int32,
           DType.I8: "int8"}  # (i8: INT8 Q·Kᵀ's prep workspaces; numpy's name, which CuPy takes)
    current = int(cupy.cuda.get_current_stream().ptr) == stream
    ext = None if current else external_stream(stream)

    def alloc_cupy(shape: tuple[int, ...], dt: DType, zero: bool = False) -> Any:
        make = cupy.zeros if zero else cupy.empty
        if ext is None:
            return make(shape, dtype=cdt[dt])
        with ext:
            return make(shape, dtype=cdt[dt])
    return alloc_cupy


def maker(alloc: Callable[..., Any], shape: tuple[int, ...], dt: DType) -> Callable[[], Any]:
    """alloc(shape, dt) as a call of no arguments, built once a binding: on torch's current
    stream, torch.empty with its arguments bound (no Python frame between a call and the allocator)."""
    device = getattr(alloc, "device", None)
    if device is None:
        return functools.partial(alloc, shape, dt)
    return functools.partial(alloc.empty, shape, dtype=_TORCH_DTYPES[dt], device=device)


# ---------------------------------------------------------------------------------------------
# Workspaces, counters and status words


class WorkspacePool:
    """Workspaces kept between calls per (library, device, stream, dtype, n-th workspace of that
    dtype in a call), each as large as the largest request it met: a call whose workspace fits
    reuses the buffer, a larger one replaces it, so a stream holds a few buffers however many
    shapes it sees (sequence lengths of a varlen training run). A stream runs its calls in order,
    so calls on one stream may share a workspace; `stream_lock` keeps one call's launches together
    when threads share a stream. A call under CUDA-graph capture takes fresh buffers from the
    caller's allocator instead (a graph must own what it captured). A replaced or dropped buffer
    is freed in its stream's order by the allocators, so a running kernel keeps its memory."""

    def __init__(self) -> None:
        self._bufs: OrderedDict = OrderedDict()  # key -> (buffer, elements)
        self._lock = threading.Lock()
        self._stream_locks: dict[int, threading.Lock] = {}
        self.allocations = 0  # buffers allocated (tests read it)
        # id(keys) -> (keys, buffers `take` gave them), cleared whenever a buffer is allocated, replaced
        # or dropped: an entry names the pool's own buffers, which a repeated call takes lock-free
        self._memo: dict[int, tuple[Any, list[Any]]] = {}

    @staticmethod
    def keys(call: tuple[Any, ...], specs: Sequence[tuple[int, DType]]) -> tuple[tuple[Any, ...], ...]:
        """The pool keys of a call's workspaces (built once a binding): `call` is (library,
        device, stream); two workspaces of one dtype in a call get two buffers."""
        seen: dict[str, int] = {}
        out = []
        for _, dt in specs:
            j = seen[dt.value] = seen.get(dt.value, -1) + 1
            out.append((*call, dt.value, j))
        return tuple(out)

    def take(self, keys: Sequence[tuple[Any, ...]], specs: Sequence[tuple[int, DType]], alloc: Callable[..., Any]) -> list[Any]:
        """One buffer per key (`keys`, a binding's own: one keys object, one `specs`) of at least the
        elements of `specs`, allocated when none fits."""
        hit = self._memo.get(id(keys))
        if hit is not None and hit[0] is keys:
            return hit[1]
        out = []
        bufs = self._bufs
        with self._lock:
            fresh = False
            for k, (n, dt) in zip(keys, specs):
                got = bufs.get(k)
                if got is None or got[1] < n:
                    got = bufs[k] = (alloc((max(n, 1),), dt), n)
                    self.allocations += 1
                    fresh = True
                    while len(bufs) > MAX_WORKSPACES:
                        bufs.popitem(last=False)
                else:
                    bufs.move_to_end(k)
                out.append(got[0])
            memo = self._memo
            if fresh or len(memo) >= MAX_WORKSPACES:
                memo.clear()
            memo[id(keys)] = (keys, out)
        return out

    def stream_lock(self, stream: int) -> threading.Lock:
        lk = self._stream_locks.get(stream)
        if lk is None:
            with self._lock:
                lk = self._stream_locks.setdefault(stream, threading.Lock())
        return lk

    def clear(self) -> None:
        with self._lock:
            self._bufs.clear()
            self._memo.clear()


MAX_WORKSPACES = 64
POOL = WorkspacePool()


def zero_async(ptr: int, words: int, stream: int) -> None:
    """Zeroes `words` 32-bit words at `ptr` in `stream`'s order (cuMemsetD32Async: no host sync;
    launches queued after it on that stream see zeros)."""
    d = _DRIVER or driver()
    rc = d.memset32(ptr, 0, words, stream)
    if rc:
        raise d.error(rc, "cuMemsetD32Async")


def capturing(stream: int) -> bool:
    """Whether `stream` is being captured into a CUDA graph."""
    return (_DRIVER or driver()).capturing(stream)


def read_words(ptr: int, n: int, stream: int) -> list[int]:
    """`n` int64 device words at `ptr`, read after `stream`'s queued work (a sync)."""
    d = _DRIVER or driver()
    host = (ctypes.c_int64 * n)()
    rc = d.dtoh(ctypes.addressof(host), ptr, 8 * n, stream) or d.sync(stream)
    if rc:
        raise d.error(rc, "reading the status words")
    return list(host)


def write_words(ptr: int, values: Sequence[int], stream: int) -> None:
    """Writes int64 `values` to the device words at `ptr` in `stream`'s order, and waits."""
    d = _DRIVER or driver()
    host = (ctypes.c_int64 * len(values))(*values)
    rc = d.htod(ptr, ctypes.addressof(host), 8 * len(values), stream) or d.sync(stream)
    if rc:
        raise d.error(rc, "resetting the status words")


# ---------------------------------------------------------------------------------------------
# The forward family


def _forward_views(k: Any, arrays: tuple[Any, ...], inputs: dict[str, Any], positions: tuple | None) -> tuple[Any, ...]:
    """Views and sizes of a forward call, every array checked against the variant."""
    var = k.variant
    q, kk, v = arrays[:3]
    aq, ak, av = view(q, "q"), view(kk, "k"), view(v, "v")
    for a, n, want in ((aq, "q", var.q_dtype), (ak, "k", var.k_dtype), (av, "v", var.v_dtype)):
        check_dtype(a, want, n)  # an input stored quantized has its own type (docs/QUANT.md)
    given = {name: view(x, name) for name, x in inputs.items()}
    pos_given = abi.Positions(*positions) if positions is not None else abi.Positions()
    sizes = bind_sizes(var, aq, ak, av, given, pos_given)
    dev = k.device
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
    return aq, ak, av, given, sizes, pos_given.resolve(sizes.Lq, sizes.Lk)


def bind_sizes(var: Variant, aq: ArrayView, ak: ArrayView, av: ArrayView, given: Mapping[str, ArrayView],
               positions: abi.Positions | None = None) -> abi.Sizes:
    """B, Lq, Lk of a call from its views (`abi.bind_sizes`: every shape checked), for every family."""
    dtypes = {d.name: d.dtype for d in var.runtime_inputs()}
    return abi.bind_sizes(var, aq.shape, ak.shape, av.shape,
                          {n: (a.shape, dtype_name_for_abi(a, dtypes.get(n, DType.I32))) for n, a in given.items()},
                          **({"positions": positions} if positions is not None else {}))


def check_out(ao: ArrayView, aq: ArrayView, ak: ArrayView, av: ArrayView, dtype: DType, o_shape: tuple[int, ...]) -> None:
    """A caller's `out`: the output's dtype, shape, library and device, sharing no memory with q, k, v."""
    check_dtype(ao, dtype, "out")
    if ao.shape != o_shape:
        raise ValueError(f"out: expected shape {o_shape}, got {ao.shape}")
    if ao.is_torch != aq.is_torch or ao.device != aq.device:
        raise ValueError(f"out: expected a {'torch tensor' if aq.is_torch else 'CuPy array'} on cuda:{aq.device} like q")
    # Other CTAs read q (whole hidden rows under a token-scope norm), k and v while this one
    # writes: an output that shares memory with an input would be silently wrong.
    for name, a in (("q", aq), ("k", ak), ("v", av)):
        if overlaps(ao, a):
            raise ValueError(f"out: expected memory separate from the inputs, but it overlaps {name}")


def check_lse(al: ArrayView, aq: ArrayView, want: tuple[int, ...], name: str = "lse") -> None:
    """A caller's LSE-shaped fp32 array: contiguous, in want's shape, like q."""
    contiguous = tuple(int(math.prod(want[i + 1:])) for i in range(len(want)))
    if al.dtype != "float32" or al.shape != want or al.strides != contiguous:
        raise ValueError(f"{name}: expected a contiguous float32 array of shape {want}, got {al.dtype} {al.shape} strides {al.strides}")
    if al.is_torch != aq.is_torch or al.device != aq.device:
        raise ValueError(f"{name}: expected a {'torch tensor' if aq.is_torch else 'CuPy array'} on cuda:{aq.device} like q")


def bind_forward(k: Any, arrays: tuple[Any, ...], inputs: dict[str, Any], out: Any, lse: Any, stream: Any,
                 check_inputs: bool, sp: int | None = None, positions: tuple | None = None) -> Binding:
    """The binding of one forward call signature for `k` (a `runtime.kernel.Kernel`): the full
    validation, the argument buffer by field name, grids, the check launches."""
    var, kp = k.variant, k.plan
    aq, ak, av, given, sizes, pos = _forward_views(k, arrays, inputs, positions)
    B, Lq, Lk = sizes.B, sizes.Lq, sizes.Lk
    align = 16 // var.dtype.itemsize  # elements per 16-byte copy
    qs, ks, vs = (seq_strides(var, a, n, align=16 // t.itemsize)
                  for a, n, t in ((aq, "q", var.q_dtype), (ak, "k", var.k_dtype), (av, "v", var.v_dtype)))
    qn = var.norm(NormTarget.Q)
    if qn is not None and qn.scope == NormScope.TOKEN and qs[1] != var.head_dim:
        raise ValueError(f"q: a token-scope norm reads whole hidden rows, so heads must be contiguous (head stride {var.head_dim}), got {qs[1]}")
    dev, xp_torch = k.device, aq.is_torch
    if sp is None:
        sp = launch_stream(stream, xp_torch, dev)
    o_shape = tuple(abi.o_shape(var, B, Lq))
    if out is None:  # the output this call allocates: contiguous, aligned by the allocator
        ao = contiguous_view(o_shape, var.dtype, dev, xp_torch)
    else:
        ao = view(out, "out")
        check_out(ao, aq, ak, av, var.dtype, o_shape)
    os_ = seq_strides(var, ao, "out", align=align)
    lse_shape = tuple(abi.lse_shape(var, B, Lq)) if var.lse else None
    if lse is not None:
        if not var.lse:
            raise ValueError("lse: this variant does not compute the LSE (add `output lse` to the spec)")
        check_lse(view(lse, "lse"), aq, tuple(abi.lse_shape(var, B, Lq)))
    fixed, in_ptrs = input_fields(var, given)
    fixed.update({"B": B, "Lq": Lq, "Lk": Lk, "q_offset": pos.q_offset, "kv_offset": pos.kv_offset,
                  "Lq_total": pos.Lq_total, "Lk_total": pos.Lk_total,
                  "nan_flag": k._status.data.ptr if (var.nan_check and k._status is not None) else 0})
    for t, st in (("q", qs), ("k", ks), ("v", vs), ("o", os_)):
        fixed.update(stride_fields(t, st))
    if var.layout == Layout.VARLEN:
        fixed["lse_sh"] = Lq  # the LSE is [H, total_q]
    if persistent(kp.engine):
        fixed["work_counter"] = k._work_counter(sp)
    ws_names = [pr.field.name for pr in kp.workspaces]
    scalars = [f.name for f in kp.fields if f.name in CALL_SCALARS]
    maps = tma_maps(kp)
    args, _, slots = pack_fields(kp.fields, fixed, ("q", "k", "v", "o", "lse", *in_ptrs, *ws_names, *scalars),
                                     kp.kernel_name, blobs=len(maps))
    arr_names = ("q", "k", "v", *in_ptrs)
    tmaps: list[TmaSlot] = []
    lengths, strides = {"Lq": Lq, "Lk": Lk}, {"q": qs, "k": ks, "v": vs}
    for j, m in enumerate(maps):
        dims = m.dims(B, lengths[m.length])
        sb, sh, ss = strides[m.tensor]
        tmaps.append(TmaSlot(args, j, arr_names.index(m.tensor), var.dtype.value, dims,
                             TmaMap.byte_strides(dims, (ss, sh, sb), var.dtype.itemsize), (64, m.rows, 1, 1)))
    sm = sm_count(dev)
    fns = {ok.name: fn for ok, fn in zip(kp.prep_kernels, k._preps)}
    fns[kp.kernel_name] = k._function
    main = [Launch(cu_function(fns[ok.name]), ok.launch_grid(var.heads, B, Lq, Lk, sm), ok.threads, ok.smem.bytes, args)
            for ok in kp.kernels]
    checks, check_slots, check_shapes = _sorted_checks(k, given, check_inputs)
    ws_specs = [(math.prod(pr.workspace_shape(B, Lq, Lk)), pr.dtype) for pr in kp.workspaces]
    for ln in (*main, *checks):
        ln.bind_stream(sp)
    alloc = allocator(xp_torch, aq.obj.device if xp_torch else None, sp)
    return Binding(
        key=None, checks=checks, check_slots=check_slots, main=main,
        array_slots=[slots.get(n, -1) for n in arr_names],
        out_slot=slots.get("o", -1), lse_slot=slots.get("lse", -1), ws_slots=[slots[n] for n in ws_names],
        scalar_slots=[(slots[n], n) for n in scalars], tmaps=tmaps,
        alloc=alloc, new_out=maker(alloc, o_shape, var.dtype), new_lse=maker(alloc, lse_shape, DType.FP32) if lse_shape else None,
        ws_specs=ws_specs, pool_keys=POOL.keys((xp_torch, dev, sp), ws_specs), out_shape=o_shape, lse_shape=lse_shape,
        extents=[(byte_range(a)[0] - a.ptr, byte_range(a)[1] - a.ptr) for a in (aq, ak, av)],
        out_extent=(byte_range(ao)[0] - ao.ptr, byte_range(ao)[1] - ao.ptr),
        readback=var.nan_check or bool(checks), check_shapes=tuple(check_shapes))


def _sorted_checks(k: Any, given: Mapping[str, ArrayView], check_inputs: bool) -> tuple[list[Launch], list[tuple[int, int]], list[tuple[int, ...]]]:
    """The device checks of the `sorted` inputs (`attngen.runtime.checks`): launches, where each
    reads its input among the call's arrays, and the inputs' shapes (for the error message)."""
    var, kp = k.variant, k.plan
    checks: list[Launch] = []
    check_slots: list[tuple[int, int]] = []
    check_shapes: list[tuple[int, ...]] = []
    order = [d.name for d in var.runtime_inputs()]
    for i, (d, fn) in enumerate(zip(kp.problem.sorted_inputs, k._check_fns)):
        a = given[d.name]
        check_shapes.append(a.shape)
        if not check_inputs or a.shape[-1] < 2 or any(n == 0 for n in a.shape):
            continue
        sc = check_args(a.shape, a.strides)
        pairs = sc[0] * sc[1] * sc[2] * (sc[3] - 1)
        vals = [0, *sc, k._status.data.ptr + 8 * (1 + i)]
        checks.append(Launch(cu_function(fn), (check_grid(pairs), 1, 1), CHECK_THREADS, 0, ArgBuffer(vals)))
        check_slots.append((len(checks) - 1, 3 + order.index(d.name)))
    return checks, check_slots, check_shapes


def call_outputs(b: Any, dtype: DType, ptrs: Sequence[int], out: Any, op: int, lse: Any,
                 is_torch: bool) -> tuple[Any, int, Any, int]:
    """A bound call's per-call output step, shared by every family: q, k, v 16-byte aligned; `out`
    allocated (or checked: aligned, not overlapping an input) and the LSE allocated where the
    spec declares it. Returns (out, its pointer, lse, its pointer or 0)."""
    if (ptrs[0] | ptrs[1] | ptrs[2]) & 15:
        n = next(n for n, p in zip("qkv", ptrs) if p & 15)
        raise ValueError(f"{n}: expected a 16-byte aligned data pointer")
    if out is None:
        out = b.new_out()
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
            lse = b.new_lse()
        lp = lse.data_ptr() if is_torch else lse.data.ptr  # (a caller's: checked like q at the binding)
    return out, op, lse, lp
