"""`layout varlen`: the reference on a packed batch equals the dense reference run on each
sequence alone (positions from 0, its own Lq/Lk, b-indexed inputs read at the sequence's index),
and malformed cu_seqlens are refused with the first break named."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from attngen.check import reference as ref
from attngen.ir import abi
from attngen.ir.nodes import Layout
from attngen.lang.frontend import loads

CROSS = """
attention vx {
  dtype fp16; head_dim 32; heads 4 kv 2; layout varlen; kind cross
  input lens: i32[B]
  mask causal && window(5, 0) && kv < lens[b]
  score softcap(20.0)
  output lse
}
"""
SELF = """
attention vs {
  dtype bf16; head_dim 32; heads 2; layout varlen
  mask causal
  input sinks: fp32[H]
  sink sinks
  residual
  output lse
}
"""


def _packed(rng: np.random.Generator, lens: list[int], heads: int, d: int) -> np.ndarray:
    return rng.standard_normal((sum(lens), heads, d)).astype(np.float32)


def _cu(lens: list[int]) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)


def _dense_per_sequence(v, q, k, vv, cu_q, cu_k, per_b_inputs):
    """The dense (bshd, B = 1) reference run sequence by sequence, packed back."""
    dense = dataclasses.replace(v, layout=Layout.BSHD)
    o = np.zeros((q.shape[0], v.heads, v.value_head_dim), dtype=np.float32)
    lse = np.full((v.heads, q.shape[0]), -np.inf, dtype=np.float32)
    for b in range(len(cu_q) - 1):
        a, e, c, f = cu_q[b], cu_q[b + 1], cu_k[b], cu_k[b + 1]
        if e == a:
            continue
        if f == c:  # no keys: every row is empty (the dense reference needs Lk >= 1)
            o[a:e] = q[a:e] * 0 + (q[a:e] if v.residual else 0)
            continue
        ob, lb = ref.attention(dense, q[None, a:e], k[None, c:f], vv[None, c:f], per_b_inputs(b))
        o[a:e] = ob[0].astype(np.float32)
        lse[:, a:e] = lb[0]
    return o, lse


@pytest.mark.parametrize("seed", range(6))
def test_cross_varlen_matches_dense_per_sequence(seed: int) -> None:
    rng = np.random.default_rng(seed)
    v = loads(CROSS).get()
    B = int(rng.integers(1, 6))
    lq = [int(x) for x in rng.integers(0, 20, B)]
    lk = [int(x) for x in rng.integers(1, 20, B)]
    lq[0] = max(lq[0], 1)  # total_q >= 1
    if B > 2:
        lq[1], lk[2] = 0, 1  # an empty query sequence, a single key
    q, k, vv = _packed(rng, lq, 4, 32), _packed(rng, lk, 2, 32), _packed(rng, lk, 2, 32)
    lens = rng.integers(0, 25, B).astype(np.int32)
    cu_q, cu_k = _cu(lq), _cu(lk)
    o, lse = ref.attention(v, q, k, vv, {"lens": lens, "cu_seqlens_q": cu_q, "cu_seqlens_k": cu_k})
    assert o.shape == (sum(lq), 4, 32) and lse.shape == (4, sum(lq))
    o_d, lse_d = _dense_per_sequence(v, q, k, vv, cu_q, cu_k, lambda b: {"lens": lens[b:b + 1]})
    np.testing.assert_array_equal(o.astype(np.float32), o_d)
    np.testing.assert_array_equal(lse, lse_d)


def test_self_varlen_with_sink_and_residual_matches_dense() -> None:
    rng = np.random.default_rng(7)
    v = loads(SELF).get()
    lens = [1, 17, 0, 40, 3]
    q, k, vv = (_packed(rng, lens, 2, 32) for _ in range(3))
    sinks = rng.standard_normal(2).astype(np.float32)
    cu = _cu(lens)
    o, lse = ref.attention(v, q, k, vv, {"sinks": sinks, "cu_seqlens": cu})
    o_d, lse_d = _dense_per_sequence(v, q, k, vv, cu, cu, lambda b: {"sinks": sinks})
    np.testing.assert_array_equal(o.astype(np.float32), o_d)
    np.testing.assert_array_equal(lse, lse_d)


def test_causal_is_bottom_right_per_sequence() -> None:
    """Lq < Lk in a sequence: the last query sees every key of its own sequence and none of the
    next; Lq > Lk: the first Lq - Lk queries see nothing (O = 0, LSE = -inf)."""
    v = loads(CROSS.replace("mask causal && window(5, 0) && kv < lens[b]", "mask causal").replace("  score softcap(20.0)\n", "")
              .replace("  input lens: i32[B]\n", "")).get()
    rng = np.random.default_rng(3)
    lq, lk = [2, 6], [5, 3]
    q, k, vv = _packed(rng, lq, 4, 32), _packed(rng, lk, 2, 32), _packed(rng, lk, 2, 32)
    o, lse = ref.attention(v, q, k, vv, {"cu_seqlens_q": _cu(lq), "cu_seqlens_k": _cu(lk)})
    # sequence 1 (rows 2..7, keys 5..7): queries 0..2 see nothing, query 3 sees key 0 only.
    assert np.all(lse[:, 2:5] == -np.inf) and np.all(o[2:5] == 0)
    assert np.all(np.isfinite(lse[:, 5:8]))
    k0 = k[5].astype(np.float64)
    s = (q[5].astype(np.float64) * k0[[0, 0, 1, 1]]).sum(-1) / np.sqrt(32)
    np.testing.assert_allclose(lse[:, 5], s, rtol=1e-2, atol=1e-2)  # one visible key: LSE = its score


@pytest.mark.parametrize(
    "cu, message",
    [
        ([1, 3, 5], r"cu_seqlens: expected prefix sums starting at 0, got cu_seqlens\[0\] = 1"),
        ([0, 4, 3, 5], r"cu_seqlens\[2\] = 3 < cu_seqlens\[1\] = 4"),
        ([0, 2, 4], r"expected the last value to be the total row count 5, got 4"),
    ],
)
def test_bad_cu_seqlens_are_refused(cu, message) -> None:
    v = loads(SELF).get()
    x = np.zeros((5, 2, 32), np.float32)
    with pytest.raises(ValueError, match=message):
        ref.attention(v, x, x, x, {"sinks": np.zeros(2, np.float32), "cu_seqlens": np.array(cu, np.int32)})


def test_bind_sizes_varlen_shapes() -> None:
    v = loads(CROSS).get()
    s = abi.bind_sizes(v, (10, 4, 32), (7, 2, 32), (7, 2, 32),
                       {"lens": ((3,), "int32"), "cu_seqlens_q": ((4,), "int32"), "cu_seqlens_k": ((4,), "int32")})
    assert (s.B, s.Lq, s.Lk) == (3, 10, 7)
    assert abi.o_shape(v, 3, 10) == (10, 4, 32) and abi.lse_shape(v, 3, 10) == (4, 10)
    with pytest.raises(ValueError, match=r"cu_seqlens_k: expected shape \(4,\) like cu_seqlens_q"):
        abi.bind_sizes(v, (10, 4, 32), (7, 2, 32), (7, 2, 32),
                       {"lens": ((3,), "int32"), "cu_seqlens_q": ((4,), "int32"), "cu_seqlens_k": ((5,), "int32")})
    with pytest.raises(ValueError, match=r"q: expected shape \(total_q, H=4, D=32\)"):
        abi.bind_sizes(v, (1, 10, 4, 32), (7, 2, 32), (7, 2, 32), {})
    with pytest.raises(ValueError, match="layout varlen` takes no q_offset"):
        abi.bind_sizes(v, (10, 4, 32), (7, 2, 32), (7, 2, 32), {}, positions=abi.Positions(q_offset=3))
    with pytest.raises(ValueError, match=r"runtime inputs: expected lens, cu_seqlens_k, cu_seqlens_q; got missing cu_seqlens_k"):
        abi.bind_sizes(v, (10, 4, 32), (7, 2, 32), (7, 2, 32), {"lens": ((3,), "int32"), "cu_seqlens_q": ((4,), "int32")})
