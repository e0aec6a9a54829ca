"""`layout varlen` on the GPU: packed batches against the reference (each sequence on its own),
on every forward engine (wgmma, mma.sync, FFMA), with empty sequences, sequences of one row,
Lq != Lk per sequence, lengths around the tile sizes; loads and stores stay inside each sequence
(NaN guard rows around q/k/v/o and NaN rows of query-less sequences are never read or written);
bad cu_seqlens are refused before (shape, dtype, host arrays) or by the device check (decreasing).

Run: pytest -q -m gpu tests/gpu/test_gpu_varlen.py
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings

from attngen.check import fuzz, reference, workload
from gpu_helpers import check_case, examples, kernel_for, variant_of

pytestmark = pytest.mark.gpu

# One spec a forward engine on the H200 (sm_90a): wgmma (bf16 D128, tile auto), mma.sync (fp16,
# an explicit 64 x 64 tile), FFMA (fp32); cross attention with GQA, a window, a softcap, a b-indexed
# input, sinks and the residual.
SPECS = {
    "wgmma_causal": """
attention vl_wgmma {
  dtype bf16; head_dim 128; heads 16; layout varlen
  mask causal
  output lse
}""",
    "wgmma_cross": """
attention vl_wgmma_x {
  dtype fp16; head_dim 64; heads 8 kv 2; layout varlen; kind cross
  input lens: i32[B]
  mask causal && window(100, 0) && kv < lens[b]
  score softcap(30.0)
  output lse
}""",
    "mma_cross": """
attention vl_mma {
  dtype fp16; head_dim 64; heads 4 kv 2; layout varlen; kind cross
  input sinks: fp32[H]
  sink sinks
  mask causal
  residual
  output lse
  tile block_m 64 block_n 64 warps 4 stages 2
}""",
    "ffma_cross": """
attention vl_ffma {
  dtype fp32; head_dim 64; heads 2; layout varlen; kind cross
  mask causal
  output lse
}""",
}


def _v(key: str):
    return variant_of(SPECS[key])


@pytest.mark.parametrize("key", list(SPECS))
def test_random_varlen_batches_match_reference(key: str) -> None:
    v = _v(key)

    @settings(max_examples=examples(1 / 10, minimum=6))
    @given(fuzz.case_strategy(v, max_len=700))
    def run(case: fuzz.Case) -> None:
        check_case(v, case)

    run()


EDGE_CASES = [
    ([1], [1]),
    ([0, 5, 0, 1], [3, 5, 1, 1]),
    ([127, 128, 129], [127, 128, 129]),
    ([1, 300, 2, 64, 0, 65], [400, 3, 2, 64, 9, 1]),  # Lq > Lk and Lq < Lk per sequence
    ([17] * 40, [23] * 40),  # many short sequences
    ([1000], [1000]),
]


@pytest.mark.parametrize("key", list(SPECS))
@pytest.mark.parametrize("lens", EDGE_CASES, ids=[f"case{i}" for i in range(len(EDGE_CASES))])
def test_edge_case_batches(key: str, lens) -> None:
    v = _v(key)
    seq_q, seq_k = lens
    if v.kind.value == "self":
        seq_k = seq_q
    case = fuzz.Case(B=len(seq_q), Lq=sum(seq_q), Lk=sum(seq_k), seed=len(seq_q), seq_q=tuple(seq_q), seq_k=tuple(seq_k))
    check_case(v, case)


def test_loads_and_stores_stay_inside_each_sequence() -> None:
    """Cross attention where every other sequence has no queries and NaN keys/values: no query of
    another sequence may read them (a read would turn into NaN through P.V even when masked), and
    guard rows of NaN before and after k/v and of sentinel values around o stay untouched."""
    torch = pytest.importorskip("torch")
    v = _v("wgmma_cross")
    seq_q = [37, 0, 130, 0, 1, 0, 64]
    seq_k = [50, 20, 129, 7, 1, 33, 200]
    case = fuzz.Case(B=len(seq_q), Lq=sum(seq_q), Lk=sum(seq_k), seed=3, seq_q=tuple(seq_q), seq_k=tuple(seq_k))
    arrays = fuzz.case_inputs(v, case)
    cu_k = workload.cu_seqlens_of(seq_k)
    for b, n in enumerate(seq_q):
        if n == 0:  # a sequence nobody may read
            arrays["k"][cu_k[b]:cu_k[b + 1]] = np.nan
            arrays["v"][cu_k[b]:cu_k[b + 1]] = np.nan
    ref_o, ref_lse = reference.attention(v, arrays["q"], arrays["k"], arrays["v"], {n: a for n, a in arrays.items() if n not in "qkv"})
    assert np.isfinite(ref_o.astype(np.float32)).all()

    G = 8  # guard rows
    def guarded(a: np.ndarray, fill: float):
        big = np.full((a.shape[0] + 2 * G, *a.shape[1:]), fill, dtype=a.dtype)
        big[G:-G] = a
        d = fuzz.to_device(big)
        return d, d[G:-G]

    _, q = guarded(arrays["q"], np.nan)
    _, k = guarded(arrays["k"], np.nan)
    _, vv = guarded(arrays["v"], np.nan)
    o_big = torch.full((sum(seq_q) + 2 * G, v.heads, v.value_head_dim), 1000.0, dtype=torch.float16, device="cuda")
    out = o_big[G:-G]
    rest = {n: fuzz.to_device(a) for n, a in arrays.items() if n not in "qkv"}
    res = kernel_for(v)(q, k, vv, out=out, **rest)
    o = res[0] if isinstance(res, tuple) else res
    torch.cuda.synchronize()
    assert o.data_ptr() == out.data_ptr()
    guard = torch.cat([o_big[:G], o_big[-G:]]).float()
    assert bool((guard == 1000.0).all()), "a store left its sequence"
    got = fuzz.to_host(out, v.dtype)
    assert np.isfinite(got.astype(np.float32)).all(), "a load read another sequence's (NaN) rows or a guard row"
    reports = fuzz.compare(v, arrays, got, fuzz.to_host(res[1]) if isinstance(res, tuple) else None, ref=(ref_o, ref_lse))
    assert all(r.ok for r in reports), [r.summary() for r in reports]


def _call_inputs(v, seq):
    case = fuzz.Case(B=len(seq), Lq=sum(seq), Lk=sum(seq), seed=1, seq_q=tuple(seq), seq_k=tuple(seq))
    arrays = fuzz.case_inputs(v, case)
    return {n: fuzz.to_device(a) for n, a in arrays.items()}


def test_bad_cu_seqlens_are_refused() -> None:
    torch = pytest.importorskip("torch")
    v = _v("wgmma_causal")
    k = kernel_for(v)
    dev = _call_inputs(v, [5, 9, 2])
    q, kk, vv = dev.pop("q"), dev.pop("k"), dev.pop("v")
    with pytest.raises(ValueError, match=r"cu_seqlens: expected dtype int32"):
        k(q, kk, vv, cu_seqlens=dev["cu_seqlens"].to(torch.int64))
    with pytest.raises(ValueError, match=r"cu_seqlens: expected a device array"):
        k(q, kk, vv, cu_seqlens=np.array([0, 5, 14, 16], np.int32))
    with pytest.raises(ValueError, match=r"cu_seqlens: expected shape \(B\+1,\) with B >= 1"):
        k(q, kk, vv, cu_seqlens=dev["cu_seqlens"][:1])
    with pytest.raises(ValueError, match=r"runtime inputs: expected cu_seqlens; got missing cu_seqlens"):
        k(q, kk, vv)
    from attngen.runtime.kernel import InputCheckError

    bad = torch.tensor([0, 9, 5, 16], dtype=torch.int32, device="cuda")
    with pytest.raises(InputCheckError, match=r"cu_seqlens: expected values that never decrease .*cu_seqlens\[2\]"):
        k(q, kk, vv, cu_seqlens=bad)


def test_lse_layout_is_heads_by_total() -> None:
    v = _v("wgmma_causal")
    dev = _call_inputs(v, [3, 200, 1])
    q, kk, vv = dev.pop("q"), dev.pop("k"), dev.pop("v")
    o, lse = kernel_for(v)(q, kk, vv, **dev)
    assert tuple(o.shape) == (204, 16, 128) and tuple(lse.shape) == (16, 204)


def test_torch_op_takes_varlen_batches() -> None:
    """attngen.torch.register: the op (its fake shapes too) on a packed batch equals the kernel."""
    torch = pytest.importorskip("torch")
    from attngen.runtime import torch_op

    v = _v("wgmma_causal")
    dev = _call_inputs(v, [70, 1, 0, 300])
    q, kk, vv = dev.pop("q"), dev.pop("k"), dev.pop("v")
    op = torch_op.register(v)
    o, lse = op(q, kk, vv, cu_seqlens=dev["cu_seqlens"])
    o_k, lse_k = kernel_for(v)(q, kk, vv, **dev)
    torch.cuda.synchronize()
    assert torch.equal(o, o_k) and torch.equal(lse, lse_k)
    fo, fl = op._fake(q, kk, vv, dev["cu_seqlens"])
    assert fo.shape == o.shape and fl.shape == lse.shape
