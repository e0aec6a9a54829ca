"""A stand-in for CuPy on the CPU (arrays with fake device pointers) and recorders of launches,
for the binder tests of every family."""

from __future__ import annotations

import types

import numpy as np

_NEXT = [1 << 40]


class _Ptr:
    def __init__(self, ptr: int) -> None:
        self.ptr = ptr


class _Dev:
    def __init__(self, i: int = 0) -> None:
        self.id = i


class FakeArray:
    """Enough of cupy.ndarray for the runtime: shape, strides (bytes), dtype, data.ptr, device."""

    def __init__(self, shape, dtype, strides=None, ptr=None):
        self.dtype = np.dtype(dtype)
        self.shape = (shape,) if isinstance(shape, int) else tuple(shape)
        if strides is None:
            st, acc = [], self.dtype.itemsize
            for n in reversed(self.shape):
                st.append(acc)
                acc *= n
            strides = tuple(reversed(st))
        self.strides = tuple(strides)
        if ptr is None:
            ptr = _NEXT[0]
            _NEXT[0] += (max(1, int(np.prod(self.shape))) * self.dtype.itemsize + 255) // 256 * 256 + 256
        self.data = _Ptr(ptr)
        self.device = _Dev(0)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape))


FakeArray.__module__ = "cupy._fake"


class FakeStream:
    def __init__(self, ptr: int = 0) -> None:
        self.ptr = ptr

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def fake_cupy(capturing: set[int] | None = None) -> types.ModuleType:
    m = types.ModuleType("cupy")
    cuda = types.SimpleNamespace()
    stream = FakeStream(0)
    cuda.get_current_stream = lambda: stream
    cuda.Device = lambda i=None: types.SimpleNamespace(id=0, attributes={"MultiProcessorCount": 132}, synchronize=lambda: None)
    cuda.Stream = FakeStream
    cuda.ExternalStream = FakeStream
    cuda.runtime = types.SimpleNamespace(streamIsCapturing=lambda p: int(p in (capturing or ())))
    m.cuda = cuda
    m.float32, m.float16, m.uint16, m.int32, m.int64 = np.float32, np.float16, np.uint16, np.int32, np.int64
    m.empty = lambda shape, dtype: FakeArray(shape, dtype)
    m.zeros = lambda shape, dtype: FakeArray(shape, dtype)
    m.array = lambda values, dtype: FakeArray((len(values),), dtype)
    return m


class RecordingFunction:
    """A CuPy RawKernel stand-in: its CUfunction address, and the calls the CuPy path made."""

    def __init__(self, ptr: int, calls: list) -> None:
        self.ptr = ptr
        self.calls = calls

    def __call__(self, grid, block, args, shared_mem=0, stream=None):
        self.calls.append((self.ptr, tuple(grid), block[0], shared_mem, tuple(args)))


def arrays_for(v, B: int, Lq: int, Lk: int, dtype=None, num_pages: int | None = None) -> dict:
    """Every array of a call of `v` (contiguous FakeArrays): q, k, v, o, dO, lse and the runtime inputs."""
    from attngen.ir import abi
    from attngen.ir.nodes import DType

    el = dtype or {DType.FP32: np.float32, DType.FP16: np.float16, DType.BF16: np.uint16}[v.dtype]
    ints = {DType.I32: np.int32, DType.U8: np.uint8, DType.FP32: np.float32, DType.FP16: np.float16, DType.BF16: np.uint16}
    pages = -(-Lk // v.page_size) + 1 if v.page_size is not None else 0
    sizes = abi.Sizes(B, Lq, Lk, (("B_plus_1", B + 1), ("max_pages", pages)))  # cu_seqlens [B + 1], block_table [B, max_pages]
    out = {
        "q": FakeArray(abi.q_shape(v, B, Lq), el),
        "k": FakeArray(abi.kv_shape(v, B, Lk, False, num_pages), el),
        "v": FakeArray(abi.kv_shape(v, B, Lk, True, num_pages), el),
        "o": FakeArray(abi.o_shape(v, B, Lq), el),
        "dO": FakeArray(abi.o_shape(v, B, Lq), el),
        "lse": FakeArray(abi.lse_shape(v, B, Lq), np.float32),
    }
    for d in v.runtime_inputs():
        out[d.name] = FakeArray(abi.input_shape(v, d, sizes), ints[d.dtype])
    return out
