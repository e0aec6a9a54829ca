"""The binder: a call's arrays → a launch, at almost no host cost (stage: launch).

Everything a launch needs that depends only on the call's *signature* (shapes, strides, dtypes,
devices of the arrays, the stream, whether inputs are checked) is validated and packed once, into
a `Binding`: every kernel argument sits in a prebuilt 8-byte slot, the `void**` array CUDA's
`cuLaunchKernel` reads points at those slots, grids are computed. A later call with the same
signature only reads its arrays' data pointers, patches the pointer slots and launches through the
CUDA driver with ctypes (no per-argument Python objects, no CuPy argument conversion).

The argument list comes from the plan's ABI fields (`OpPlan.fields`), by name: each field is either
a pointer patched per call, a value fixed by the signature, or a per-call scalar in
`CALL_SCALARS`. A field this module has no rule for is an error when the binding is built, so a new
ABI field cannot be silently passed as garbage.

The output, LSE and prep-kernel workspaces are allocated each call (their shapes, dtypes and
allocators are part of the binding) through the caller's allocator in the launch stream's order:
a buffer cached in the binding would be shared by concurrent callers and could be freed under a
CUDA graph that captured it.
"""

from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

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
        # TMA descriptors (WgmmaLoads.TMA kernels): resolved on first use, so that a driver without
        # the entry point still launches every other kernel
        self._lib = lib
        self._encode: Any = None
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

    def capturing(self, stream: int) -> bool:
        """Whether `stream` is being captured into a CUDA graph (a sync there would break it)."""
        status = ctypes.c_int(0)
        rc = self._capturing(stream, ctypes.byref(status))
        if rc:
            raise self.error(rc, "cuStreamIsCapturing")
        return status.value != 0

    def error(self, code: int, what: str) -> RuntimeError:
        msg = ctypes.c_char_p()
        self._err(code, ctypes.byref(msg))
        text = msg.value.decode() if msg.value else "unknown error"
        return RuntimeError(f"attngen: {what} failed: CUDA error {code} ({text})")


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


class TmaSlot:
    """One TMA descriptor argument of a binding (`attngen.cuda.render.TmaMap`): everything but the
    tensor's address is fixed by the call's signature, so a call re-encodes it only when its
    pointer changed since the last one."""

    __slots__ = ("args", "blob", "array", "dtype", "dims", "strides", "box", "unit", "last")

    def __init__(self, args: ArgBuffer, blob: int, array: int, dtype: str, dims: tuple[int, ...], strides: tuple[int, ...],
                 box: tuple[int, ...]) -> None:
        self.args, self.blob, self.array = args, blob, array
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
                             f"CUDA error {rc}; dims {tuple(self.dims)}, byte strides {tuple(self.strides)}); "
                             f"compile it with softmax=WgmmaSoftmax(loads=WgmmaLoads.CP_ASYNC), whose copies take any 16-byte strides")
        self.last = ptr


def tmap_scalar(dtype: str, ptr: int, dims: tuple[int, ...], byte_strides: tuple[int, ...], box: tuple[int, ...], what: str) -> Any:
    """One TMA descriptor (cuTensorMapEncodeTiled: 4-d, 128-byte swizzle, L2 256B, zero fill) as
    the 128-byte NumPy structured scalar a CuPy launch passes by value; ValueError naming `what`
    when the driver refuses the view."""
    import numpy as np

    buf = (ctypes.c_uint8 * (TMAP_BYTES + 64))()
    addr = (ctypes.addressof(buf) + 63) // 64 * 64
    rc = driver().encode_tmap()(addr, TMAP_DTYPES[dtype], 4, ptr, (ctypes.c_uint64 * 4)(*dims), (ctypes.c_uint64 * 3)(*byte_strides),
                                (ctypes.c_uint32 * 4)(*box), (ctypes.c_uint32 * 4)(1, 1, 1, 1), 0, TMAP_SWIZZLE_128B, TMAP_L2_256B, 0)
    if rc:
        raise ValueError(f"{what}: the TMA descriptor of the backward's copies cannot describe it (cuTensorMapEncodeTiled: CUDA error {rc}; "
                         f"dims {tuple(dims)}, byte strides {tuple(byte_strides)})")
    desc = np.dtype([("words", np.uint64, (TMAP_BYTES // 8,))])
    return np.frombuffer(ctypes.string_at(addr, TMAP_BYTES), dtype=desc)[0]


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
    alloc_out: Callable[[], Any]
    alloc_lse: Callable[[], Any] | None
    alloc_ws: list[Callable[[], Any]]
    out_shape: tuple[int, ...]
    lse_shape: tuple[int, ...] | None
    extents: list[tuple[int, int]]  # per q, k, v: [lo, hi) byte offsets around its pointer
    out_extent: tuple[int, int]
    readback: bool  # whether this call reads the status words back (a sync)
    check_shapes: tuple[tuple[int, ...], ...] = ()  # the sorted inputs' shapes (for error messages)
    lock: threading.Lock = field(default_factory=threading.Lock)


def launch_driver(ln: Launch, stream: int) -> None:
    """Launches `ln` on `stream` through the driver (prebuilt arguments when bound to it)."""
    d = _DRIVER or driver()
    if stream == ln.stream:
        rc = d.launch_raw(*ln.call_args)
    else:
        g = ln.grid
        rc = d.launch(ln.function, g[0], g[1], g[2], ln.block, 1, 1, ln.smem, stream, ln.args.ptrs, None)
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
