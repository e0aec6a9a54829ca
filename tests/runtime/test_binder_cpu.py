"""The binder on the CPU: a stand-in for CuPy (arrays with fake device pointers) and a recording
launcher, so that argument packing, caching per signature and the refusals run without a GPU."""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest

from attngen.runtime import binder, kernel as runtime
from attngen.lang.frontend import loads
from attngen.cuda.render import plan
from attngen.plan.schedule import Arch

_NEXT = [1 << 32]


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
        self.shape = tuple(shape)
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


FakeArray.__module__ = "cupy._fake"


def _fake_cupy():
    m = types.ModuleType("cupy")
    cuda = types.SimpleNamespace()
    stream = types.SimpleNamespace(ptr=0)
    cuda.get_current_stream = lambda: stream
    cuda.Device = lambda i=None: types.SimpleNamespace(id=0, attributes={"MultiProcessorCount": 132}, synchronize=lambda: None)
    cuda.Stream = type("Stream", (), {})
    class _Stream:
        def __init__(self, ptr):
            self.ptr = ptr

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    cuda.ExternalStream = _Stream
    m.cuda = cuda
    m.float32, m.float16, m.uint16, m.int32, m.int64 = np.float32, np.float16, np.uint16, np.int32, np.int64
    m.empty = lambda shape, dtype: FakeArray(shape, dtype)
    m.zeros = lambda n, dtype: FakeArray((n,), dtype)
    return m


@pytest.fixture
def fake(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", _fake_cupy())
    launches = []

    def record(ln, stream):
        vals = [ln.args.vals[i] for i in range(ln.args.n)]
        launches.append((ln.function, ln.grid, ln.block, ln.smem, stream, vals))

    monkeypatch.setattr(runtime, "launch_driver", record)
    monkeypatch.setattr(binder, "launch_driver", record)
    monkeypatch.setattr(binder, "sm_count", lambda dev: 132)
    monkeypatch.setattr(runtime, "driver", lambda: types.SimpleNamespace(capturing=lambda stream: stream == 0xCA97))
    # TMA kernels encode their descriptors through the driver: recorded, never encoded; memsets recorded.
    MEMSETS.clear()
    monkeypatch.setattr(binder, "_DRIVER", types.SimpleNamespace(
        encode_tmap=lambda: _record_encode, capturing=lambda stream: stream == 0xCA97,
        memset32=lambda ptr, value, words, stream: MEMSETS.append((ptr, value, words, stream)) or 0))
    ENCODES.clear()
    return launches


ENCODES: list[tuple] = []
MEMSETS: list[tuple] = []


def _record_encode(addr, dtype, rank, ptr, dims, strides, box, unit, interleave, swizzle, l2, oob) -> int:
    ENCODES.append((addr, dtype, rank, ptr, tuple(dims), tuple(strides), tuple(box), tuple(unit), interleave, swizzle, oob))
    return 0


def _kernel(src: str, arch=Arch.SM80, status=False):
    v = loads(src).variants[0]
    kp = plan(v, arch)
    fn = types.SimpleNamespace(ptr=0xF00)
    preps = tuple(types.SimpleNamespace(ptr=0xE00 + i) for i in range(len(kp.workspaces)))
    k = runtime.Kernel(v, "", kp, 0.0, "none", True, None, fn, preps, device=0)
    if status:
        k._status = FakeArray((1 + len(kp.problem.sorted_inputs),), np.int64)
        k._check_fns = tuple(types.SimpleNamespace(ptr=0xC00 + i) for i in range(len(kp.problem.sorted_inputs)))
    return k


SEED = "attention seed { dtype fp32; head_dim 64; heads 8; layout bhsd; mask padding }"


def test_packing_follows_the_plan_fields(fake):
    k = _kernel(SEED)
    q, kk, v = (FakeArray((4, 8, 128, 64), np.float32) for _ in range(3))
    ql, kl = FakeArray((4,), np.int32), FakeArray((4,), np.int32)
    o = k(q, kk, v, q_lens=ql, kv_lens=kl)
    assert o.shape == (4, 8, 128, 64)
    (fn, grid, block, smem, stream, vals), = fake
    assert fn == 0xF00 and grid == (128 // k.tile.block_m, 8, 4) and block == k.plan.threads and smem == k.plan.smem_bytes
    got = dict(zip((f.name for f in k.plan.fields), vals))
    assert got["q"] == q.data.ptr and got["k"] == kk.data.ptr and got["v"] == v.data.ptr and got["o"] == o.data.ptr
    assert got["lse"] == 0 and got["nan_flag"] == 0
    assert (got["B"], got["Lq"], got["Lk"]) == (4, 128, 128)
    assert (got["q_sb"], got["q_sh"], got["q_ss"]) == (8 * 128 * 64, 128 * 64, 64)
    assert got["in_q_lens"] == ql.data.ptr and got["in_kv_lens_n0"] == 4 and got["in_kv_lens_s0"] == 1


def test_binding_cached_per_signature_pointers_patched(fake):
    k = _kernel(SEED)
    mk = lambda: [FakeArray((4, 8, 128, 64), np.float32) for _ in range(3)]  # noqa: E731
    lens = {"q_lens": FakeArray((4,), np.int32), "kv_lens": FakeArray((4,), np.int32)}
    a, b = mk(), mk()
    k(*a, **lens)
    k(*b, **lens)
    assert len(k._bindings) == 1
    names = [f.name for f in k.plan.fields]
    assert fake[1][5][names.index("q")] == b[0].data.ptr != a[0].data.ptr
    k(*[FakeArray((2, 8, 64, 64), np.float32) for _ in range(3)],
      q_lens=FakeArray((2,), np.int32), kv_lens=FakeArray((2,), np.int32))
    assert len(k._bindings) == 2 and fake[2][1] == (64 // k.tile.block_m, 8, 2)


def test_refusals_before_launch(fake):
    k = _kernel(SEED)
    q, kk, v = (FakeArray((4, 8, 128, 64), np.float32) for _ in range(3))
    lens = {"q_lens": FakeArray((4,), np.int32), "kv_lens": FakeArray((4,), np.int32)}
    with pytest.raises(ValueError, match="q: expected dtype float32"):
        k(FakeArray((4, 8, 128, 64), np.float16), kk, v, **lens)
    with pytest.raises(ValueError, match="runtime inputs"):
        k(q, kk, v, q_lens=lens["q_lens"])
    with pytest.raises(ValueError, match="NumPy"):
        k(np.zeros((4, 8, 128, 64), np.float32), kk, v, **lens)
    with pytest.raises(ValueError, match="overlaps q"):
        k(q, kk, v, out=FakeArray((4, 8, 128, 64), np.float32, ptr=q.data.ptr), **lens)
    k(q, kk, v, **lens)  # cached now; a misaligned pointer with the same signature is still refused
    with pytest.raises(ValueError, match="16-byte aligned"):
        k(FakeArray((4, 8, 128, 64), np.float32, ptr=q.data.ptr + 4), kk, v, **lens)
    assert len(fake) == 1


def test_sorted_inputs_get_a_check_launch(fake):
    src = ("attention d { dtype bf16; head_dim 64; heads 4; input doc: i32[B, Lk] sorted; "
           "mask document(doc) }")
    k = _kernel(src, status=True)
    q, kk, v = (FakeArray((2, 4, 256, 64), np.float16) for _ in range(3))
    q, kk, v = (FakeArray(x.shape, np.uint16, ptr=x.data.ptr) for x in (q, kk, v))
    doc = FakeArray((2, 256), np.int32)
    reads = []
    k._read_status = lambda sp: reads.append(sp)
    k(q, kk, v, doc=doc)
    assert [ln[0] for ln in fake] == [0xC00, 0xF00]
    chk = fake[0][5]
    assert chk[0] == doc.data.ptr and chk[1:5] == [1, 1, 2, 256] and chk[-1] == k._status.data.ptr + 8
    assert reads == [0]  # the check's result is read back (a sync) by default
    fake.clear()
    k(q, kk, v, doc=doc, check_inputs=False)
    assert [ln[0] for ln in fake] == [0xF00] and reads == [0]
    k(q, kk, v, doc=doc, stream=0xCA97)  # a stream being captured: checked, but not read back (no sync)
    assert [ln[0] for ln in fake] == [0xF00, 0xC00, 0xF00] and reads == [0]


def test_unknown_abi_field_is_refused(fake, monkeypatch):
    import dataclasses

    from attngen.cuda.render import Field

    k = _kernel(SEED)
    k.plan = dataclasses.replace(k.plan, fields=(*k.plan.fields, Field("int", "mystery", "?")))
    q, kk, v = (FakeArray((4, 8, 128, 64), np.float32) for _ in range(3))
    with pytest.raises(NotImplementedError, match="mystery"):
        k(q, kk, v, q_lens=FakeArray((4,), np.int32), kv_lens=FakeArray((4,), np.int32))
    monkeypatch.setitem(binder.CALL_SCALARS, "mystery", 0)
    k(q, kk, v, q_lens=FakeArray((4,), np.int32), kv_lens=FakeArray((4,), np.int32), mystery=7)
    assert fake[-1][5][-1] == 7


def test_check_args_and_index():
    from attngen.runtime.checks import check_args, check_grid, flat_to_index

    assert check_args((3, 5), (8, 1)) == (1, 1, 3, 5, 0, 0, 8, 1)
    assert check_args((1, 2, 3, 4, 5), (120, 60, 20, 5, 1)) == (2, 3, 4, 5, 60, 20, 5, 1)
    with pytest.raises(ValueError, match="at most 4"):
        check_args((2, 2, 2, 2, 5), (80, 40, 20, 10, 1))
    assert flat_to_index(13, (3, 5)) == (2, 3)
    assert flat_to_index(0, (3, 5)) == (0, 0)
    assert check_grid(1) == 1 and check_grid(10**9) == 1024


_RECORDER = r"""
unsigned long long g_f, g_s; unsigned g_v[7]; void** g_p; void** g_e;
int cuLaunchKernel(void* f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                   unsigned smem, void* s, void** p, void** e) {
  g_f = (unsigned long long)f; g_v[0] = gx; g_v[1] = gy; g_v[2] = gz; g_v[3] = bx; g_v[4] = by; g_v[5] = bz;
  g_v[6] = smem; g_s = (unsigned long long)s; g_p = p; g_e = e; return 0;
}
int cuStreamIsCapturing(void* s, int* st) { *st = 0; return 0; }
int cuMemcpyDtoHAsync_v2(void* d, unsigned long long s, unsigned long n, void* st) { return 0; }
int cuMemcpyHtoDAsync_v2(unsigned long long d, void* s, unsigned long n, void* st) { return 0; }
int cuStreamSynchronize(void* s) { return 0; }
int cuGetErrorString(int c, const char** m) { *m = "recorder"; return 0; }
"""


def test_driver_launch_marshals_every_argument(tmp_path, monkeypatch):
    """Both ctypes call paths (prebuilt arguments on the bound stream, argtypes otherwise) hand
    cuLaunchKernel the function, grid, block, shared memory, stream and a void** whose slots hold
    the argument values (an int field reads the low 4 bytes of its slot)."""
    import ctypes
    import shutil
    import subprocess

    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build the recording stand-in for libcuda")
    src = tmp_path / "rec.c"
    src.write_text(_RECORDER)
    so = tmp_path / "librec.so"
    subprocess.run([cc, "-shared", "-fPIC", "-O2", "-o", str(so), str(src)], check=True)
    lib = ctypes.CDLL(str(so))
    real_cdll = ctypes.CDLL
    monkeypatch.setattr(binder.ctypes, "CDLL", lambda name: real_cdll(str(so)))
    monkeypatch.setattr(binder, "_DRIVER", None)
    binder.driver()
    monkeypatch.setattr(binder.ctypes, "CDLL", real_cdll)
    ln = binder.Launch(0xDEADBEEF1234, (7, 8, 9), 384, 200000, binder.ArgBuffer([11, -2, 1 << 40]))
    ln.bind_stream(0xABCDEF987654)
    for stream in (0xABCDEF987654, 0x1111):
        binder.launch_driver(ln, stream)
        assert ctypes.c_uint64.in_dll(lib, "g_f").value == 0xDEADBEEF1234
        assert list((ctypes.c_uint * 7).in_dll(lib, "g_v")) == [7, 8, 9, 384, 1, 1, 200000]
        assert ctypes.c_uint64.in_dll(lib, "g_s").value == stream
        assert ctypes.c_void_p.in_dll(lib, "g_e").value is None
        slots = (ctypes.c_void_p * 3).from_address(ctypes.c_void_p.in_dll(lib, "g_p").value)
        assert [ctypes.c_int64.from_address(a).value for a in slots] == [11, -2, 1 << 40]
        assert ctypes.c_int32.from_address(slots[1]).value == -2
    monkeypatch.setattr(binder, "_DRIVER", None)


def test_load_functions_takes_every_entry_point_while_the_file_exists(monkeypatch):
    """The one load stage of the forward, decode, backward and check modules: CuPy reads the cubin
    from a file on first use, so each entry point must be taken before the temporary file goes;
    entry points past 48 KiB of dynamic shared memory are opted in to it."""
    import os
    import sys
    import types

    from attngen.runtime.kernel import load_functions

    seen = {}

    class Fn:
        max_dynamic_shared_size_bytes = 0

    class RawModule:
        def __init__(self, path):
            self.path = path

        def get_function(self, name):
            with open(self.path, "rb") as f:
                seen[name] = f.read()
            return Fn()

    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(RawModule=RawModule))
    module, fns = load_functions(b"\x7fELF-cubin", {"big": 100_000, "small": 0})
    assert seen == {"big": b"\x7fELF-cubin", "small": b"\x7fELF-cubin"}
    assert fns["big"].max_dynamic_shared_size_bytes == 100_000 and fns["small"].max_dynamic_shared_size_bytes == 0
    assert not os.path.exists(module.path)


def test_short_key_loops_launch_the_short_kernel(fake):
    # Plain causal D128 on sm_90a: the main kernel (128 x 128 x 3) and the plan's short-loop kernel
    # (`OpPlan.short`, schedule.short_tile's tile) for Lk <= 4096, which the runtime's compile
    # attaches (bshd: the sequence is dim 1). Each call launches exactly one of them, with that
    # kernel's own plan.
    from attngen.plan.schedule import short_tile

    k = _kernel("attention c { dtype bf16; head_dim 128; heads 8 kv 2; layout bshd; mask causal; output lse }", Arch.SM90A)
    st = short_tile(k.variant, Arch.SM90A)
    assert st is not None and st.max_lk == 4096
    t = st.tile
    sp = k.plan.short
    assert sp is not None and k.plan.short_max_lk == st.max_lk and sp.short is None
    k.short = runtime.Kernel(k.variant, "", sp, 0.0, "none", True, None, types.SimpleNamespace(ptr=0xF01), (), device=0)
    k.short_max_lk = k.plan.short_max_lk
    assert sp.tile == t and sp.smem.kv_split and sp.smem_bytes != k.plan.smem_bytes
    assert sp.fields == k.plan.fields and sp.kernel_name == k.plan.kernel_name  # one ABI, one launcher

    def call(L):
        q = FakeArray((2, L, 8, 128), np.uint16)
        kv = [FakeArray((2, L, 2, 128), np.uint16) for _ in range(2)]
        return k(q, *kv)

    for L, want in ((4096, k.short), (4097, k), (1, k.short), (9000, k)):
        n = len(fake)
        call(L)
        (fn, grid, block, smem, stream, vals), = fake[n:]
        assert (fn, block, smem) == (want._function.ptr, want.plan.threads, want.plan.smem_bytes), L
        got = dict(zip((f.name for f in want.plan.fields), vals))
        assert (got["Lq"], got["Lk"]) == (L, L)
    assert len(k._bindings) == 2 and len(k.short._bindings) == 2
    # A tile hint is the user's choice at every length: no short kernel.
    import dataclasses

    from attngen.ir.nodes import TileHint

    sv = dataclasses.replace(k.variant, tile=TileHint(t.block_m, t.block_n, t.warps, t.stages))
    assert short_tile(sv, Arch.SM90A) is None and plan(sv, Arch.SM90A).short is None


def test_tma_kernel_takes_descriptors_encoded_per_pointer(fake, monkeypatch):
    """A TMA kernel (the wgmma default where it applies) gets its three 128-byte descriptors after
    the ABI fields, each 64-byte aligned, encoded from the call's pointers and strides (bshd, GQA:
    4-d views of columns, rows, heads, batch, in bytes; a size-1 batch gets its implied stride),
    and re-encoded only when a pointer changes."""
    objs = []
    monkeypatch.setattr(runtime, "launch_driver", lambda ln, stream: objs.append(ln))
    k = _kernel("attention c { dtype bf16; head_dim 128; heads 8 kv 2; layout bshd; mask causal; output lse }", Arch.SM90A)
    assert k.plan.attention.tma
    B, L = 1, 4096
    q = FakeArray((B, L, 8, 128), np.uint16)
    kv = [FakeArray((B, L, 2, 128), np.uint16) for _ in range(2)]
    k(q, *kv)
    ln = objs[-1]
    n = len(k.plan.fields)
    assert ln.args.n == n and len(ln.args.ptrs) == n + 3
    blobs = [ln.args.ptrs[n + j] for j in range(3)]
    assert all(a % 64 == 0 for a in blobs) and blobs[1] - blobs[0] == blobs[2] - blobs[1] == 128
    assert [e[3] for e in ENCODES] == [q.data.ptr, kv[0].data.ptr, kv[1].data.ptr]
    assert [e[0] for e in ENCODES] == blobs
    t = k.plan.tile
    (_, dt, rank, _, dq, sq, bq, unit, il, sw, oob), (_, _, _, _, dk, sk, bk, *_) = ENCODES[0], ENCODES[1]
    assert (dt, rank, unit, il, sw, oob) == (9, 4, (1, 1, 1, 1), 0, 3, 0)  # bf16, 128-byte swizzle, zero fill
    assert dq == (128, L, 8, B) and sq == (8 * 128 * 2, 128 * 2, L * 8 * 128 * 2) and bq == (64, t.block_m, 1, 1)
    assert dk == (128, L, 2, B) and sk == (2 * 128 * 2, 128 * 2, L * 2 * 128 * 2) and bk == (64, t.block_n, 1, 1)
    k(q, *kv)  # the same pointers: nothing re-encoded
    assert len(ENCODES) == 3
    q2 = FakeArray((B, L, 8, 128), np.uint16)
    k(q2, *kv)
    assert len(ENCODES) == 4 and ENCODES[-1][3] == q2.data.ptr and ENCODES[-1][0] == blobs[0]
    # the cp.async producer takes no descriptors
    from attngen.plan.schedule import WgmmaLoads, WgmmaSoftmax

    v = k.variant
    kp = plan(v, Arch.SM90A, softmax=WgmmaSoftmax(loads=WgmmaLoads.CP_ASYNC))
    kc = runtime.Kernel(v, "", kp, 0.0, "none", True, None, types.SimpleNamespace(ptr=0xF00), (), device=0)
    kc(q, *kv)
    assert len(objs[-1].args.ptrs) == len(kp.fields) and len(ENCODES) == 4


def test_tma_descriptor_the_driver_refuses_is_a_clear_error(fake, monkeypatch):
    monkeypatch.setattr(binder, "_DRIVER", types.SimpleNamespace(encode_tmap=lambda: lambda *a: 1))
    k = _kernel("attention c { dtype bf16; head_dim 128; heads 8 }", Arch.SM90A)
    q, kk, vv = (FakeArray((2, 8, 300, 128), np.uint16) for _ in range(3))
    with pytest.raises(ValueError, match=r"q: the TMA descriptor of this kernel's copies cannot describe it"):
        k(q, kk, vv)
