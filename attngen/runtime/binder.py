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
        self._err = lib.cuGetErrorString
        self._err.restype = ctypes.c_int
        self._err.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]

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
    field reads the low 4 bytes of its slot (little endian), a pointer or long long all 8."""

    __slots__ = ("vals", "ptrs", "n")

    def __init__(self, values: list[int]) -> None:
        self.n = len(values)
        self.vals = (ctypes.c_int64 * max(1, self.n))(*values)
        base = ctypes.addressof(self.vals)
        self.ptrs = (ctypes.c_void_p * max(1, self.n))(*(base + 8 * i for i in range(self.n)))


@dataclass
class Launch:
    """One kernel launch of a binding: function, grid, block, shared memory, arguments."""

    function: int  # CUfunction
    grid: tuple[int, int, int]
    block: int
    smem: int
    args: ArgBuffer
    cupy_fn: Any = None  # the CuPy kernel object, for the CuPy launch path
    ctypes_list: tuple[str, ...] = ()  # per slot: "p" pointer, "i" int, "q" long long (CuPy path)
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


def launch_cupy(ln: Launch, stream_obj: Any) -> None:
    """The same launch through CuPy's RawKernel (numpy scalars rebuilt per call): the path the
    runtime used before the binder, kept for comparison (`tools/host_overhead.py`)."""
    import numpy as np

    conv = {"p": np.uint64, "i": np.int32, "q": np.int64}
    vals = ln.args.vals
    args = tuple(conv[c](vals[i] & 0xFFFFFFFFFFFFFFFF if c == "p" else vals[i]) for i, c in enumerate(ln.ctypes_list))
    ln.cupy_fn(ln.grid, (ln.block,), args, shared_mem=ln.smem, stream=stream_obj)


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
