"""The CPU runtime: layouts, positions, torch tensors, wrong arrays refused before launch, the
value checks, nan_check, the compile cache and a missing compiler."""

from __future__ import annotations

import numpy as np
import pytest

import attngen
from attngen.check import reference, tolerance, workload
from attngen.lang.frontend import loads

SPEC = """
attention t {{
  dtype {dtype}
  head_dim 64
  heads 4 kv 2
  layout {layout}
  kind {kind}
  mask {mask}
}}
"""


def _variant(dtype="fp32", layout="bhsd", kind="self", mask="causal"):
    return loads(SPEC.format(dtype=dtype, layout=layout, kind=kind, mask=mask)).get()


def _check(v, o, q, k, vv, rest=None, **pos):
    ro, _ = reference.attention(v, q, k, vv, rest or {}, **pos)
    rep = tolerance.check(o, ro, v.dtype, score_err=reference.score_error(v, q, k, rest or {}))
    assert rep.ok, rep.summary()


@pytest.mark.parametrize("dtype,layout", [("fp32", "bshd"), ("bf16", "bhsd"), ("fp16", "bshd")])
def test_layouts_and_dtypes(dtype, layout, cpu_kernel):
    v = _variant(dtype, layout)
    a = workload.make_inputs(v, 2, 45, 45, np.random.default_rng(3))
    _check(v, cpu_kernel(v)(a["q"], a["k"], a["v"]), a["q"], a["k"], a["v"])


def test_positions_place_a_shard(cpu_kernel):
    # A chunk of a longer sequence: masks see global positions and lengths.
    v = _variant(kind="cross")
    a = workload.make_inputs(v, 1, 20, 70, np.random.default_rng(4))
    o = cpu_kernel(v)(a["q"], a["k"], a["v"], q_offset=50, kv_offset=0, Lq_total=70, Lk_total=70)
    _check(v, o, a["q"], a["k"], a["v"], q_offset=50, kv_offset=0, Lq_total=70, Lk_total=70)


def test_torch_tensors_in_and_out_without_copies(cpu_kernel):
    torch = pytest.importorskip("torch")
    v = _variant("bf16")
    k = cpu_kernel(v)
    q, kk, vv = (torch.randn(2, h, 33, 64).to(torch.bfloat16) for h in (4, 2, 2))
    out = torch.empty(2, 4, 33, 64, dtype=torch.bfloat16)
    got = k(q, kk, vv, out=out)
    assert got is out
    from attngen.check.fuzz_device import to_host_cpu

    _check(v, to_host_cpu(out), to_host_cpu(q), to_host_cpu(kk), to_host_cpu(vv))
    # Non-contiguous heads (a transposed view) are read in place through their strides.
    qt = q.transpose(1, 2).contiguous().transpose(1, 2)
    assert not qt.is_contiguous()
    o2 = k(qt, kk, vv)
    assert torch.equal(o2, out)


def test_wrong_arrays_are_refused_before_launch(cpu_kernel):
    v = _variant()
    k = cpu_kernel(v)
    q = np.zeros((1, 4, 8, 64), np.float32)
    kv = np.zeros((1, 2, 8, 64), np.float32)
    with pytest.raises(ValueError, match=r"k: expected shape \(B=1, Hkv=2, Lk=8, D=64\)"):
        k(q, kv[:, :, :, :32], kv)
    with pytest.raises(ValueError, match=r"q: expected dtype float32 \(fp32\), got float16"):
        k(q.astype(np.float16), kv, kv)
    with pytest.raises(ValueError, match="contiguous last dimension"):
        k(np.zeros((1, 4, 8, 128), np.float32)[..., ::2], kv, kv)
    with pytest.raises(ValueError, match="out: expected shape"):
        k(q, kv, kv, out=np.zeros((1, 4, 8, 32), np.float32))
    with pytest.raises(ValueError, match="unexpected extra"):
        k(q, kv, kv, extra=q)
    with pytest.raises(ValueError, match="expected a NumPy array or a torch CPU tensor"):
        k([[1.0]], kv, kv)


def test_value_checks_run_every_call(cpu_kernel):
    from attngen.runtime.kernel import InputCheckError

    v = loads("""
attention docs {
  dtype fp32
  head_dim 32
  heads 2
  input doc: i32[B, Lq] sorted
  mask doc[b, q] == doc[b, kv]
}
""").get()
    k = cpu_kernel(v)
    q = np.random.default_rng(0).standard_normal((1, 2, 10, 32)).astype(np.float32)
    doc = np.array([[0, 0, 0, 1, 1, 1, 1, 2, 2, 2]], np.int32)
    _check(v, k(q, q, q, doc=doc), q, q, q, {"doc": doc})
    bad = doc.copy()
    bad[0, 5] = 0
    with pytest.raises(InputCheckError, match=r"doc: declared sorted, but doc\[0, 5\] = 0 < doc\[0, 4\] = 1"):
        k(q, q, q, doc=bad)


def test_nan_check_raises(cpu_kernel):
    from attngen.runtime.kernel import NaNCheckError

    v = loads("attention n {\n  dtype fp16\n  head_dim 32\n  heads 1\n  nan_check\n}\n").get()
    q = np.zeros((1, 1, 4, 32), np.float16)
    vv = np.full((1, 1, 4, 32), 60000, np.float16)
    vv[0, 0, 0] = -60000  # the mean stays finite in fp32 ...
    cpu_kernel(v)(q, q, vv)  # ... (ok)
    vv[0, 0, :, 0] = np.inf
    with pytest.raises(NaNCheckError):
        cpu_kernel(v)(q, q, vv)


def test_cache_entry_is_reused_and_a_corrupt_one_is_a_miss(tmp_path, monkeypatch):
    from attngen.cpu import compile as cc
    from attngen.cpu import render

    monkeypatch.setenv("ATTNGEN_CACHE_DIR", str(tmp_path))
    src = render.render(_variant())
    first = cc.compile_source(src)
    assert not first.cached and first.path.startswith(str(tmp_path))
    again = cc.compile_source(src)
    assert again.cached and again.path == first.path
    with open(first.path, "wb") as f:
        f.write(b"garbage")
    rebuilt = cc.compile_source(src)
    assert not rebuilt.cached
    assert list(tmp_path.glob(".tmp-*")) == []  # written by rename, nothing left behind


def test_missing_compiler_names_the_missing_piece(monkeypatch, tmp_path):
    from attngen.cpu import compile as cc

    monkeypatch.setenv("CXX", str(tmp_path / "nope++"))
    with pytest.raises(cc.CompilerNotFound, match=r"nope\+\+. is not an executable.*C\+\+17 compiler"):
        cc.compile_source("int x;")
    monkeypatch.delenv("CXX")
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(cc.CompilerNotFound, match="no C\\+\\+ compiler found.*install g\\+\\+ or clang\\+\\+, or set CXX"):
        cc.find_compiler()


def test_attngen_compile_device_cpu():
    v = _variant()
    k = attngen.compile(v, device="cpu")
    assert k.target == "cpu" and k.variant == v
    with pytest.raises(ValueError, match="device"):
        attngen.compile(v, device="tpu")


@pytest.mark.parametrize("name", ["mqa_decode_cross", "paged_decode_llama3", "gpt_oss_sinks", "varlen_causal_training",
                                  "diff_transformer_subln"])
def test_split_kv_matches_the_reference(name, cpu_kernel):
    """More threads than work items: each item's key range is split and the states merged."""
    from pathlib import Path

    from attngen.check.fuzz_run import split_inputs
    from attngen.ir.nodes import AttnKind
    from attngen.plan.validate import load

    for v in load(Path(__file__).resolve().parents[2] / "examples" / f"{name}.attn").variants:
        B, Lq, Lk = (1, 3, 3) if v.kind == AttnKind.SELF else (1, 1, 1000)
        if v.kind == AttnKind.SELF:
            B, Lq, Lk = 2, 600, 600
        a = workload.make_inputs(v, B, Lq, Lk, np.random.default_rng(11))
        q, k, vv, rest = split_inputs(a)
        k_ = cpu_kernel(v)
        one = k_(q, k, vv, num_threads=1, **rest)
        many = k_(q, k, vv, num_threads=16, **rest)
        ref, ref_lse = reference.attention(v, q, k, vv, rest)
        se = reference.score_error(v, q, k, rest)
        for got in (one, many):
            o = got[0] if v.lse else got
            rep = tolerance.check(o, ref, v.dtype, score_err=se)
            assert rep.ok, rep.summary()
            if v.lse:
                rep = tolerance.check_lse(got[1], ref_lse, v.dtype, score_err=se)
                assert rep.ok, rep.summary()
