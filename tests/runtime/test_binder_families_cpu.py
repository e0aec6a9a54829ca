"""The backward and decode families on the binder, on the CPU (fake pointers, recorded launches):
argument buffers field by field, validation, caching per signature, the workspace pool."""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest

from binder_fakes import FakeArray, RecordingFunction, arrays_for, fake_cupy

from attngen.lang.frontend import loads
from attngen.plan import bwd as plan_bwd
from attngen.plan import decode as plan_decode
from attngen.plan.schedule import Arch
from attngen.runtime import binder, bwd, decode


@pytest.fixture
def fake(monkeypatch):
    """Fake CuPy, a fake driver (capture, memsets, TMA encodes recorded) and recorded driver launches."""
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy())
    rec = types.SimpleNamespace(launches=[], memsets=[], encodes=[], capturing=set(), reads=[], writes=[],
                                words=list(decode.STATUS_INIT))

    def launch(ln, stream):
        rec.launches.append((ln.function, tuple(ln.grid), ln.block, ln.smem, stream, [ln.args.vals[i] for i in range(ln.args.n)]))

    def encode(addr, dtype, rank, ptr, dims, strides, box, unit, interleave, swizzle, l2, oob):
        rec.encodes.append((dtype, ptr, tuple(dims), tuple(strides), tuple(box)))
        return 0

    drv = types.SimpleNamespace(encode_tmap=lambda: encode, capturing=lambda s: s in rec.capturing,
                                memset32=lambda p, v, n, s: rec.memsets.append((p, v, n, s)) or 0)
    monkeypatch.setattr(binder, "launch_driver", launch)
    monkeypatch.setattr(binder, "sm_count", lambda dev: 132)
    monkeypatch.setattr(binder, "_DRIVER", drv)
    monkeypatch.setattr(binder, "driver", lambda: drv)
    monkeypatch.setattr(decode, "sm_count", lambda dev: 132)
    monkeypatch.setattr(binder, "read_words", lambda p, n, s: rec.reads.append((p, n, s)) or list(rec.words))
    monkeypatch.setattr(binder, "write_words", lambda p, vals, s: rec.writes.append((p, tuple(vals), s)))
    binder.POOL.clear()
    return rec


def _variant(src: str):
    return loads(src).variants[0]


# ---------------------------------------------------------------------------------------------
# The backward


BWD_SPECS = {
    "seed_fp32_ffma": ("attention seed { dtype fp32; head_dim 64; heads 8; layout bhsd; mask padding }", Arch.SM80, False),
    "gqa_bf16_mma": ("attention g { dtype bf16; head_dim 128; heads 8 kv 2; mask causal }", Arch.SM80, False),
    "gqa_bf16_deterministic": ("attention g { dtype bf16; head_dim 64; heads 4 kv 2; mask causal }", Arch.SM80, True),
    "alibi_wrt": ("attention a { dtype fp16; head_dim 64; heads 4; mask causal; score alibi }", Arch.SM80, False),
    "qk_norm": ("attention n { dtype bf16; head_dim 64; heads 4 kv 2; norm q rmsnorm(1e-6) scope head; "
                "norm k rmsnorm(1e-6) scope head; mask causal }", Arch.SM80, False),
    "varlen": ("attention vl { dtype bf16; head_dim 64; heads 4 kv 2; layout varlen; mask causal }", Arch.SM80, False),
    "wgmma_sm90": ("attention w { dtype bf16; head_dim 128; heads 8 kv 2; mask causal }", Arch.SM90A, False),
}


def _bwd_setup(name: str, monkeypatch):
    src, arch, det = BWD_SPECS[name]
    v = _variant(src)
    tv = bwd.training_variant(v)
    bp = plan_bwd.plan(v, arch, deterministic=det)
    calls: list = []
    fns = {kern.func: RecordingFunction(0xB00 + i, calls) for i, kern in enumerate(bp.kernels)}
    bk = bwd.BackwardKernels(v, "", bp, fns, input_names=tuple(d.name for d in v.runtime_inputs()))
    compiled = []
    monkeypatch.setattr(bwd, "compile_backward", lambda var, a, deterministic=False, engine=None: compiled.append(1) or bk)
    kernel = types.SimpleNamespace(variant=tv, plan=types.SimpleNamespace(arch=arch))
    B, L = (2, 300) if v.layout.value == "varlen" else (2, 200)
    arrs = arrays_for(tv, B, L, L)
    inputs = {d.name: arrs[d.name] for d in v.runtime_inputs()}
    return v, tv, bp, bk, kernel, arrs, inputs, calls, compiled, det


def _wrt(v) -> tuple[str, ...]:
    return plan_bwd.learnable(v)


PER_CALL_BWD = ("dq", "dk", "dv")  # allocated by the call: compared as distinct non-null pointers


@pytest.mark.parametrize("name", sorted(BWD_SPECS))
def test_backward_buffer_matches_the_plan_fields(name, fake, monkeypatch):
    """Every ABI field of the backward kernels, by name, holds what the call's arrays say."""
    v, tv, bp, bk, kernel, a, inputs, calls, _, det = _bwd_setup(name, monkeypatch)
    wrt = _wrt(v)
    bwd.backward(kernel, a["q"], a["k"], a["v"], a["dO"], o=a["o"], lse=a["lse"], deterministic=det, wrt=wrt, variant=v, **inputs)
    assert [ln[0] for ln in fake.launches] == [0xB00 + i for i in range(len(bp.kernels))]
    fields = [f.name for f in bp.fields]
    got = dict(zip(fields, fake.launches[0][5]))
    for ln in fake.launches:
        assert ln[5] == fake.launches[0][5]  # one buffer for every kernel
    B, L = (2, 300) if v.layout.value == "varlen" else (2, 200)
    for n in ("q", "k", "v", "o", "dO", "lse"):
        assert got[n] == a[n].data.ptr, n
    assert (got["B"], got["Lq"], got["Lk"], got["q_offset"], got["kv_offset"], got["Lq_total"], got["Lk_total"]) == (B, L, L, 0, 0, L, L)
    ptrs = [got[n] for n in (*PER_CALL_BWD, *(f for f in fields if f.startswith("ws_")), *(f"grad_{n}" for n in wrt))]
    assert all(ptrs) and len(set(ptrs)) == len(ptrs)
    for t in ("q", "k", "v", "o", "dO"):
        x = a[t]
        el = [s // x.dtype.itemsize for s in x.strides]
        want = (0, el[1], el[0]) if v.layout.value == "varlen" else (el[0], el[1], el[2]) if v.layout.value == "bhsd" else (el[0], el[2], el[1])
        assert (got[f"{t}_sb"], got[f"{t}_sh"], got[f"{t}_ss"]) == want, t
    for d in v.runtime_inputs():
        x = inputs[d.name]
        assert got[f"in_{d.name}"] == x.data.ptr
        assert [got[f"in_{d.name}_n{j}"] for j in range(len(x.shape))] == list(x.shape)
    grids = [bp.grid(kern.func, B, L, L, v.heads, v.kv_heads, v.head_dim) for kern in bp.kernels]
    assert [ln[1] for ln in fake.launches] == grids
    assert [ln[2] for ln in fake.launches] == [kern.threads for kern in bp.kernels]


@pytest.mark.parametrize("name", sorted(BWD_SPECS))
def test_backward_buffer_matches_the_positional_packer(name, fake, monkeypatch):
    """The binder's argument buffer equals, field by field, what the positional packer gave the
    same call (pointers the call allocates: both non-null and distinct), with the same kinds."""
    v, tv, bp, bk, kernel, a, inputs, calls, _, det = _bwd_setup(name, monkeypatch)
    wrt = _wrt(v)
    bwd._legacy_backward(kernel, a["q"], a["k"], a["v"], a["dO"], o=a["o"], lse=a["lse"], deterministic=det, wrt=wrt,
                         variant=v, **inputs)
    legacy_encodes = list(fake.encodes)
    fake.encodes.clear()
    bwd.backward(kernel, a["q"], a["k"], a["v"], a["dO"], o=a["o"], lse=a["lse"], deterministic=det, wrt=wrt, variant=v, **inputs)
    assert len(calls) == len(fake.launches) == len(bp.kernels)
    per_call = {*PER_CALL_BWD, *(f.name for f in bp.fields if f.name.startswith("ws_")), *(f"grad_{n}" for n in wrt)}
    kinds = {np.uint64: "p", np.int32: "i", np.int64: "q"}
    for (fn, grid, block, smem, old), (fn2, grid2, block2, smem2, _, new) in zip(calls, fake.launches):
        assert (fn, grid, block, smem) == (fn2, grid2, block2, smem2)
        assert len(old) >= len(bp.fields) == len(new)
        for f, o, n in zip(bp.fields, old, new):
            assert kinds[type(o)] == binder.slot_kind(f.ctype), f.name
            if f.name in per_call:
                assert (int(o) != 0) == (n != 0), f.name
            else:
                assert int(o) == n, f.name
    if bp.wg_loads is not None and plan_bwd.wg_tma_maps(bp, v):
        # descriptors: same tensors of the call (q, dO, k, v), dims, strides and boxes
        ours = [e for e in fake.encodes if e[1] in {a[n].data.ptr for n in ("q", "k", "v", "dO")}]
        theirs = [e for e in legacy_encodes if e[1] in {a[n].data.ptr for n in ("q", "k", "v", "dO")}]
        assert ours and sorted(ours) == sorted(theirs)


# ---------------------------------------------------------------------------------------------
# The decode family


DEC_SPECS = {
    "gqa_bf16": "attention d { dtype bf16; head_dim 128; heads 32 kv 8; kind cross; input cache_lens: i32[B]; mask kv < cache_lens[b]; output lse }",
    "paged": "attention p { dtype bf16; head_dim 128; heads 32 kv 8; kind cross; input cache_lens: i32[B]; kv_cache paged(16); "
             "mask causal && kv < cache_lens[b]; output lse }",
    "bshd_fp16": "attention b { dtype fp16; head_dim 64; heads 8 kv 1; kind cross; layout bshd }",
}


def _decode_kernel(src: str, arch=Arch.SM80):
    v = _variant(src)
    dp = plan_decode.plan(v, arch)
    calls: list = []
    fns = (RecordingFunction(0xD00, calls), RecordingFunction(0xD01, calls))
    k = decode.DecodeKernel(v, "", dp, 0.0, "none", True, None, fns, device=0)
    k._status = FakeArray((3,), np.int64)
    return v, k, calls


def _decode_arrays(v, B, Lk):
    pages = None
    if v.page_size is not None:
        pages = B * -(-Lk // v.page_size) + 3
    a = arrays_for(v, B, 1, Lk, num_pages=pages)
    inputs = {d.name: a[d.name] for d in v.runtime_inputs()}
    return a, inputs


@pytest.mark.parametrize("name", sorted(DEC_SPECS))
@pytest.mark.parametrize("B, Lk, splits", [(1, 8192, None), (8, 4000, 3), (64, 512, None)])
def test_decode_buffer_matches_the_positional_packer(name, B, Lk, splits, fake, monkeypatch):
    v, k, calls = _decode_kernel(DEC_SPECS[name])
    a, inputs = _decode_arrays(v, B, Lk)
    monkeypatch.setattr(decode, "_check_pages", lambda t, n: None)
    monkeypatch.setattr(decode, "check_page_ids", lambda *args: None)
    lse = a["lse"] if v.lse else None
    k._legacy_call(a["q"], a["k"], a["v"], out=a["o"], lse=lse, splits=splits, **inputs)
    k(a["q"], a["k"], a["v"], out=a["o"], lse=lse, splits=splits, **inputs)
    assert len(calls) == len(fake.launches) >= 1
    per_call = {"ws_o", "ws_lse", "ws_count"}
    kinds = {np.uint64: "p", np.int32: "i", np.int64: "q"}
    for (fn, grid, block, smem, old), (fn2, grid2, block2, smem2, _, new) in zip(calls, fake.launches):
        assert (fn, grid, block, smem) == (fn2, grid2, block2, smem2)
        assert len(old) == len(k.fields) == len(new)
        for f, o, n in zip(k.fields, old, new):
            assert kinds[type(o)] == binder.slot_kind(f.ctype), f.name
            if f.name in per_call:
                assert (int(o) != 0) == (n != 0), f.name
            else:
                assert int(o) == n, f.name
