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
    grids = [bp.launch_grid(kern, B, L, L) for kern in bp.kernels]
    assert [ln[1] for ln in fake.launches] == grids
    assert [ln[2] for ln in fake.launches] == [kern.threads for kern in bp.kernels]


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
def test_decode_buffer_matches_the_plan_fields(name, B, Lk, splits, fake):
    """Every ABI field of the decode kernels, by name, holds what the call's arrays and the
    schedule say (the field-by-field match with the former positional packer was checked on
    these cases before it was deleted)."""
    v, k, calls = _decode_kernel(DEC_SPECS[name])
    a, inputs = _decode_arrays(v, B, Lk)
    lse = a["lse"] if v.lse else None
    k(a["q"], a["k"], a["v"], out=a["o"], lse=lse, splits=splits, check_pages=False, **inputs)
    dp = k.plan
    paged = v.page_size is not None
    if paged:  # a paged call's Lk is the block table's width in keys
        Lk = inputs["block_table"].shape[1] * v.page_size
    n_split, n_ctas = (dp.split.slots(B, 1, dp.split.split_ctas(B, 1, Lk, splits)), dp.split.split_ctas(B, 1, Lk, splits)) if splits else dp.split.schedule(B, 1, Lk, 132)
    merged = n_split > 1  # fused_default: the split kernel merges with row-block counters
    want = dp.launches(B, 1, n_split, n_ctas, merged=merged)
    assert [(ln[1], ln[2], ln[3]) for ln in fake.launches] == [(w.grid, w.threads, w.smem_bytes) for w in want]
    got = dict(zip((f.name for f in k.fields), fake.launches[0][5]))
    assert len(fake.launches[0][5]) == len(k.fields)
    for n in ("q", "k", "v", "o"):
        assert got[n] == a[n].data.ptr, n
    assert got["lse"] == (a["lse"].data.ptr if v.lse else 0) and got["nan_flag"] == 0
    assert (got["B"], got["Lq"], got["Lk"], got["q_offset"], got["kv_offset"], got["Lq_total"], got["Lk_total"]) == (B, 1, Lk, 0, 0, 1, Lk)
    assert (got["splits"], got["ctas"]) == (n_split, n_ctas)
    assert (got["ws_o"] != 0) == (got["ws_lse"] != 0) == (n_split > 1)
    assert (got["ws_count"] != 0) == merged
    for t in ("q", "k", "v", "o"):
        x = a[t]
        el = [s // x.dtype.itemsize for s in x.strides]
        bhsd = v.layout.value == "bhsd" and not (paged and t in "kv")
        assert (got[f"{t}_sb"], got[f"{t}_sh"], got[f"{t}_ss"]) == ((el[0], el[1], el[2]) if bhsd else (el[0], el[2], el[1])), t
    if paged:
        assert got["num_pages"] == a["k"].shape[0]
    for d in v.runtime_inputs():
        x = inputs[d.name]
        assert got[f"in_{d.name}"] == x.data.ptr
        assert [got[f"in_{d.name}_n{j}"] for j in range(len(x.shape))] == list(x.shape)
        assert [got[f"in_{d.name}_s{j}"] for j in range(len(x.shape))] == [s // x.dtype.itemsize for s in x.strides]


# ---------------------------------------------------------------------------------------------
# Validation, caching, workspaces, counters, the page check


def _counting(monkeypatch, module, name):
    """Wraps module.name, counting its calls."""
    count = [0]
    real = getattr(module, name)

    def wrapped(*args, **kw):
        count[0] += 1
        return real(*args, **kw)

    monkeypatch.setattr(module, name, wrapped)
    return count


def test_backward_validates_once_a_signature_and_reuses_workspaces(fake, monkeypatch):
    v, tv, bp, bk, kernel, a, inputs, calls, compiled, det = _bwd_setup("qk_norm", monkeypatch)
    binds = _counting(monkeypatch, bwd, "bind_backward")
    views = _counting(monkeypatch, bwd, "view")
    run = lambda arrs, **kw: bwd.backward(kernel, arrs["q"], arrs["k"], arrs["v"], arrs["dO"], o=arrs["o"], lse=arrs["lse"],  # noqa: E731
                                          variant=v, **inputs, **kw)
    run(a)
    assert binds[0] == 1 and views[0] > 0 and compiled == [1]
    seen = views[0]
    first = dict(zip((f.name for f in bp.fields), fake.launches[-1][5]))
    allocs = binder.POOL.allocations
    b2 = arrays_for(tv, 2, 200, 200)
    fake.launches.clear()
    dq, dk, dv = run(b2)
    assert binds[0] == 1 and views[0] == seen and compiled == [1]  # no re-validation, no re-plan
    second = dict(zip((f.name for f in bp.fields), fake.launches[-1][5]))
    assert second["q"] == b2["q"].data.ptr != first["q"] and second["dq"] == dq.data.ptr and dq.shape == b2["q"].shape
    ws = [f.name for f in bp.fields if f.name.startswith("ws_")]
    assert set(ws) == {"ws_delta", "ws_dq", "ws_q", "ws_k", "ws_dk"}
    assert [second[n] for n in ws] == [first[n] for n in ws] and binder.POOL.allocations == allocs  # the pool's buffers again
    run(b2, stream=0x5EC)  # another stream: its own binding and its own workspaces
    third = dict(zip((f.name for f in bp.fields), fake.launches[-1][5]))
    assert binds[0] == 2 and all(third[n] != first[n] for n in ws) and binder.POOL.allocations == allocs + len(ws)
    fake.capturing.add(0xCA97)
    run(b2, stream=0xCA97)  # under graph capture: fresh buffers, the pool untouched
    assert binder.POOL.allocations == allocs + len(ws)
    run(a, stream=0xCA97)
    assert binds[0] == 3


def test_backward_refusals_say_what_was_expected(fake, monkeypatch):
    v, tv, bp, bk, kernel, a, inputs, *_ = _bwd_setup("gqa_bf16_mma", monkeypatch)

    def call(**over):
        arrs = {**a, **over}
        kw = {n: arrs[n] for n in ("o", "lse")}
        return bwd.backward(kernel, arrs["q"], arrs["k"], arrs["v"], arrs["dO"], variant=v, **kw, **inputs)

    with pytest.raises(ValueError, match="dO: expected dtype bfloat16"):
        call(dO=FakeArray(a["dO"].shape, np.float32))
    with pytest.raises(ValueError, match=r"dO: expected the output's shape \(2, 8, 200, 128\), got \(2, 8, 100, 128\)"):
        call(dO=FakeArray((2, 8, 100, 128), np.uint16))
    with pytest.raises(ValueError, match="lse: expected a contiguous float32 array of shape"):
        call(lse=FakeArray((2, 8, 100), np.float32))
    ran = []
    kernel._training_forward = lambda *args, **kw: ran.append(1)  # the forward a call without o, lse runs: never reached
    with pytest.raises(ValueError, match=r"dO: expected the output's shape \(2, 8, 200, 128\), got \(2, 8, 100, 128\)"):
        bwd.backward(kernel, a["q"], a["k"], a["v"], FakeArray((2, 8, 100, 128), np.uint16), variant=v)
    with pytest.raises(ValueError, match="dO: expected dtype bfloat16"):
        bwd.backward(kernel, a["q"], a["k"], a["v"], FakeArray(a["dO"].shape, np.float16), variant=v)
    assert not ran
    with pytest.raises(ValueError, match="o, lse: expected both"):
        bwd.backward(kernel, a["q"], a["k"], a["v"], a["dO"], o=a["o"], variant=v)
    with pytest.raises(ValueError, match="wrt: expected names of score inputs"):
        bwd.backward(kernel, a["q"], a["k"], a["v"], a["dO"], o=a["o"], lse=a["lse"], wrt=("bias",), variant=v)
    with pytest.raises(ValueError, match="k: expected every stride to be a multiple of 8 elements"):
        call(k=FakeArray((2, 2, 200, 128), np.uint16, strides=(2 * 2 * 200 * 132 * 2, 200 * 132 * 2, 132 * 2, 2)))
    with pytest.raises(ValueError, match="NumPy"):
        call(q=np.zeros((2, 8, 200, 128), np.uint16))
    assert not fake.launches
    bwd.backward(kernel, a["q"], a["k"], a["v"], a["dO"], o=a["o"], lse=a["lse"], variant=v)  # cached now
    with pytest.raises(ValueError, match="q: expected a 16-byte aligned data pointer for the tensor-core backward"):
        call(q=FakeArray(a["q"].shape, np.uint16, ptr=a["q"].data.ptr + 2))


def test_backward_dlse_is_subtracted_after_the_pre_kernel(fake, monkeypatch):
    v, tv, bp, bk, kernel, a, inputs, *_ = _bwd_setup("gqa_bf16_mma", monkeypatch)
    order = []
    monkeypatch.setattr(bwd, "_subtract", lambda delta, n, dlse, sp, is_torch: order.append(("sub", delta.data.ptr, n, dlse.data.ptr)))
    real = binder.launch_driver
    monkeypatch.setattr(binder, "launch_driver", lambda ln, s: order.append(("launch", ln.function)) or real(ln, s))
    dlse = FakeArray(a["lse"].shape, np.float32)
    bwd.backward(kernel, a["q"], a["k"], a["v"], a["dO"], o=a["o"], lse=a["lse"], dlse=dlse, variant=v)
    pre = next(i for i, kern in enumerate(bp.kernels) if kern.func == "ag_bwd_pre")
    got = dict(zip((f.name for f in bp.fields), fake.launches[0][5]))
    assert order[pre + 1] == ("sub", got["ws_delta"], dlse.size, dlse.data.ptr)
    with pytest.raises(ValueError, match="dlse: expected a contiguous float32 array"):
        bwd.backward(kernel, a["q"], a["k"], a["v"], a["dO"], o=a["o"], lse=a["lse"], dlse=FakeArray((2, 8, 3), np.float32), variant=v)


def test_decode_validates_once_and_zeroes_counters_without_a_sync(fake, monkeypatch):
    v, k, calls = _decode_kernel(DEC_SPECS["gqa_bf16"])
    binds = _counting(monkeypatch, decode, "bind_decode")
    a, inputs = _decode_arrays(v, 8, 4000)
    k(a["q"], a["k"], a["v"], **inputs)
    assert binds[0] == 1 and len(fake.launches) == 1  # merged in the split kernel: no combine
    got = dict(zip((f.name for f in k.fields), fake.launches[0][5]))
    assert fake.memsets == [(got["ws_count"], 0, k._counters[(0, 0)].size, 0)]  # zeroed on the launch stream
    b, _ = _decode_arrays(v, 8, 4000)
    o, lse = k(b["q"], b["k"], b["v"], **inputs)
    again = dict(zip((f.name for f in k.fields), fake.launches[1][5]))
    assert binds[0] == 1 and len(fake.memsets) == 1  # no re-validation, counters already zero
    assert again["q"] == b["q"].data.ptr and again["o"] == o.data.ptr and again["lse"] == lse.data.ptr
    assert (again["ws_o"], again["ws_lse"], again["ws_count"]) == (got["ws_o"], got["ws_lse"], got["ws_count"])
    fake.capturing.add(0xCA97)  # a first call under capture allocates no counters: the combine merges
    fake.launches.clear()
    k(a["q"], a["k"], a["v"], stream=0xCA97, **inputs)
    assert [ln[0] for ln in fake.launches] == [0xD00, 0xD01] and len(fake.memsets) == 1
    assert binds[0] == 2 and not fake.reads
    k(a["q"], a["k"], a["v"], stream=0xCA97, **inputs)
    assert binds[0] == 3  # not kept: a call after the capture gets its counters


def test_decode_refusals(fake):
    v, k, _ = _decode_kernel(DEC_SPECS["gqa_bf16"])
    a, inputs = _decode_arrays(v, 1, 100)
    with pytest.raises(ValueError, match="splits: expected 1 to"):
        k(a["q"], a["k"], a["v"], splits=1000, **inputs)
    with pytest.raises(ValueError, match="ctas: expected 1 to"):
        k(a["q"], a["k"], a["v"], ctas=10**6, **inputs)
    with pytest.raises(ValueError, match="at most one"):
        k(a["q"], a["k"], a["v"], splits=1, ctas=1, **inputs)
    with pytest.raises(ValueError, match="k:"):
        k(a["q"], FakeArray((1, 8, 100, 64), np.uint16), a["v"], **inputs)
    with pytest.raises(ValueError, match="q: expected dtype bfloat16"):
        k(FakeArray(a["q"].shape, np.float32), a["k"], a["v"], **inputs)
    with pytest.raises(ValueError, match="out: expected memory separate from the inputs, but it overlaps q"):
        k(a["q"], a["k"], a["v"], out=FakeArray(a["o"].shape, np.uint16, ptr=a["q"].data.ptr), **inputs)
    with pytest.raises(ValueError, match="runtime inputs|cache_lens"):
        k(a["q"], a["k"], a["v"])
    assert not fake.launches
    k(a["q"], a["k"], a["v"], **inputs)
    with pytest.raises(ValueError, match="v: expected a 16-byte aligned data pointer"):
        k(a["q"], a["k"], FakeArray(a["v"].shape, np.uint16, ptr=a["v"].data.ptr + 8), **inputs)
    with pytest.raises(ValueError, match="out: expected memory separate from the inputs, but it overlaps k"):
        k(a["q"], a["k"], a["v"], out=FakeArray(a["o"].shape, np.uint16, ptr=a["k"].data.ptr), **inputs)


def test_paged_check_reports_through_the_status_words(fake, monkeypatch):
    v, k, _ = _decode_kernel(DEC_SPECS["paged"])
    a, inputs = _decode_arrays(v, 2, 300)
    checked = []
    monkeypatch.setattr(decode, "check_page_ids",
                        lambda arrays, pc, kern, sp: checked.append((arrays[pc.table].data.ptr, arrays[pc.lens].data.ptr, pc.num_pages, sp)))
    pages = a["k"].shape[0]
    k(a["q"], a["k"], a["v"], **inputs)
    assert checked == [(inputs["block_table"].data.ptr, inputs["cache_lens"].data.ptr, pages, 0)]
    assert fake.reads == [(k._status.data.ptr, decode.STATUS_WORDS, 0)]  # read back at the end of the call (the check mode)
    fake.words = [0, 0, 0, 0, -3]  # the device saw a length 3 past the capacity
    with pytest.raises(ValueError, match=r"cache_lens: expected each row's cached tokens.*got values from"):
        k(a["q"], a["k"], a["v"], **inputs)
    fake.words = [0, 0, -2, 0, 0]  # the device saw page id pages + 1
    with pytest.raises(ValueError, match=rf"block_table: expected page ids in \[0, {pages}\), got values from 0 to {pages + 1}"):
        k(a["q"], a["k"], a["v"], **inputs)
    assert fake.writes == [(k._status.data.ptr, decode.STATUS_INIT, 0)] * 2  # reset for the next call, after each error
    fake.reads.clear()
    checked.clear()
    k(a["q"], a["k"], a["v"], check_pages=False, **inputs)
    assert not checked and not fake.reads  # no check, no sync
    fake.capturing.add(0xCA97)
    k(a["q"], a["k"], a["v"], stream=0xCA97, **inputs)
    assert checked and not fake.reads  # checked on the device, read later (raise_pending)
    with pytest.raises(ValueError, match="block_table: expected page ids"):
        k.raise_pending(0xCA97)


def test_page_check_folds_ids_into_the_words_with_torch():
    torch = pytest.importorskip("torch")
    v, k, _ = _decode_kernel(DEC_SPECS["paged"])
    words = torch.tensor(decode.STATUS_INIT, dtype=torch.int64)
    k._status_views["torch"] = words[1:]
    table = torch.tensor([[0, 5, 2], [3, 1, 4]], dtype=torch.int32)
    pc = decode.PageCheck(table=0, lens=1, num_pages=6, Lq=1, Lk=48)
    lens = torch.tensor([1, 48], dtype=torch.int32)
    monkey = decode.torch_current_stream
    decode.torch_current_stream = lambda dev: 0
    try:
        table.device.index  # noqa: B018  (CPU tensors: index None)
        decode.check_page_ids((table, lens), pc, k, 0)
        assert words.tolist() == [0, 0, 0, 0, 0]
        decode.check_page_ids((torch.tensor([[7, 1]], dtype=torch.int32), lens), pc, k, 0)
        assert words.tolist() == [0, 0, -2, 0, 0]
        decode.check_page_ids((torch.tensor([[-1, 1]], dtype=torch.int32), lens), pc, k, 0)
        assert words.tolist() == [0, -1, -2, 0, 0]
        decode.check_page_ids((table, torch.tensor([0, 50], dtype=torch.int32)), pc, k, 0)
        assert words.tolist() == [0, -1, -2, -1, -2]
    finally:
        decode.torch_current_stream = monkey


def test_workspace_pool_keys_by_size_stream_and_order():
    made = []
    pool = binder.WorkspacePool()
    alloc = lambda shape, dt, zero=False: made.append((shape, dt)) or object()  # noqa: E731
    from attngen.ir.nodes import DType

    specs = [(100, DType.FP32), (100, DType.FP32), (50, DType.BF16)]
    a = pool.take(pool.keys(("t", 0, 1), specs), specs, alloc)
    assert len(set(map(id, a))) == 3 and pool.allocations == 3  # two of one dtype in a call: two buffers
    b = pool.take(pool.keys(("t", 0, 1), specs), specs, alloc)
    assert [id(x) for x in a] == [id(x) for x in b] and pool.allocations == 3
    smaller = [(60, DType.FP32), (100, DType.FP32), (10, DType.BF16)]
    c = pool.take(pool.keys(("t", 0, 1), smaller), smaller, alloc)
    assert [id(x) for x in a] == [id(x) for x in c] and pool.allocations == 3  # what fits is reused
    larger = [(400, DType.FP32)]
    d = pool.take(pool.keys(("t", 0, 1), larger), larger, alloc)
    assert id(d[0]) != id(a[0]) and pool.allocations == 4 and made[-1] == ((400,), DType.FP32)  # replaced
    e = pool.take(pool.keys(("t", 0, 2), specs[:1]), specs[:1], alloc)
    assert id(e[0]) not in map(id, a) and pool.allocations == 5  # another stream: its own
    assert pool.stream_lock(1) is pool.stream_lock(1) is not pool.stream_lock(2)


def test_runtime_modules_import_without_cycles():
    """Every runtime module imports its shared pieces from binder.py: the import graph among
    attngen.runtime's modules (imports inside functions too) has no cycle."""
    import ast
    from pathlib import Path

    root = Path(binder.__file__).parent
    mods = {p.stem for p in root.glob("*.py") if p.stem != "__init__"}
    graph = {}
    for m in mods:
        deps = set()
        for node in ast.walk(ast.parse((root / f"{m}.py").read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                if node.module.startswith("attngen.runtime."):
                    deps.add(node.module.rsplit(".", 1)[1])
                elif node.module == "attngen.runtime":
                    deps.update(a.name for a in node.names if a.name in mods)
            elif isinstance(node, ast.Import):
                deps.update(a.name.rsplit(".", 1)[1] for a in node.names if a.name.startswith("attngen.runtime."))
        graph[m] = deps & mods - {m}
    state: dict[str, int] = {}

    def visit(m, path):
        state[m] = 1
        for d in graph[m]:
            assert state.get(d) != 1, f"import cycle: {' -> '.join(path + [m, d])}"
            if d not in state:
                visit(d, path + [m])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [])
    # The families import the binder and its leaves (arrays, inputs: no attngen imports), never kernel.py.
    shared = {"binder", "arrays", "inputs"}
    assert not graph["inputs"] and graph["bwd"] <= shared and graph["decode"] <= shared


def test_dispatch_and_backward_remember_their_plans(fake, monkeypatch):
    """A call does not re-plan: Dispatch keeps its family per Lq, backward its kernels per variant
    (until the kernel cache is cleared, as the template A/B benchmarks do)."""
    v = _variant(DEC_SPECS["gqa_bf16"])
    chosen = _counting(monkeypatch, decode, "choose_family")
    d = decode.Dispatch(types.SimpleNamespace(variant=v), Arch.SM80)
    assert d.family_for(1) == d.family_for(1) == plan_decode.Family.DECODE and chosen[0] == 1
    d.family_for(64)
    assert chosen[0] == 2
    v2, tv, bp, bk, kernel, a, inputs, calls, compiled, det = _bwd_setup("gqa_bf16_mma", monkeypatch)
    run = lambda: bwd.backward(kernel, a["q"], a["k"], a["v"], a["dO"], o=a["o"], lse=a["lse"], variant=v2)  # noqa: E731
    run()
    run()
    assert compiled == [1]
    bwd._CACHE.clear()
    run()
    assert compiled == [1, 1]


def test_dlse_subtraction_touches_only_the_calls_rows(monkeypatch):
    """A pool buffer may be longer than a call's rows: delta - dlse touches the first n only."""
    import contextlib

    torch = pytest.importorskip("torch")
    monkeypatch.setattr(bwd, "_torch_stream", lambda sp, dev: contextlib.nullcontext())
    delta = torch.zeros(10)
    bwd._subtract(delta, 6, torch.ones(2, 3), 0, True)
    assert delta.tolist() == [-1.0] * 6 + [0.0] * 4


def test_decode_refuses_positional_runtime_inputs_by_name(fake):
    v, k, _ = _decode_kernel(DEC_SPECS["gqa_bf16"])
    a, inputs = _decode_arrays(v, 2, 300)
    with pytest.raises(TypeError, match=r"runtime inputs go by name.*cache_lens=cache_lens"):
        k(a["q"], a["k"], a["v"], inputs["cache_lens"])
    assert not fake.launches
    k(a["q"], a["k"], a["v"], **inputs)
    assert fake.launches
