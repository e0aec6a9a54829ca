"""Position offsets (`abi.Positions`): a shard of a sequence computed with its offsets and the
global lengths gives exactly the shard's rows and keys of the whole problem (the contract the
kernels' q_offset / kv_offset / Lq_total / Lk_total arguments implement)."""

from __future__ import annotations

import numpy as np
import pytest

import attngen
from attngen.check import reference
from attngen.check.workload import make_inputs

SPECS = {
    "causal": "mask causal",
    "window": "mask causal && window(5, 2)",
    "document": "input doc_ids: i32[B, Lk] sorted\n  mask document(doc_ids) && causal",
    "alibi_prefix": "mask causal || prefix(4)\n  score alibi",
    "padding": "mask padding && causal",
}


def _variant(body: str):
    return attngen.loads(f"attention t {{\n  dtype fp32; head_dim 32; heads 2; layout bshd\n  {body}\n  output lse\n}}").get()


@pytest.mark.parametrize("name", sorted(SPECS))
def test_a_block_with_offsets_is_the_block_of_the_whole(name: str) -> None:
    v = _variant(SPECS[name])
    L = 23
    x = make_inputs(v, 2, L, L, np.random.default_rng(5))
    ins = {d.name: x[d.name] for d in v.runtime_inputs()}
    full_o, full_lse = reference.attention(v, x["q"], x["k"], x["v"], ins)
    # Queries 9..16 against every key: the rows of the whole problem.
    o, lse = reference.attention(v, x["q"][:, 9:17], x["k"], x["v"], ins, q_offset=9, Lq_total=L, Lk_total=L)
    np.testing.assert_allclose(o, full_o[:, 9:17], rtol=0, atol=1e-12)
    np.testing.assert_array_equal(lse, full_lse[:, :, 9:17])
    # A key block alone: the same as the whole problem with the other keys masked out.
    ob, lb = reference.attention(v, x["q"][:, 9:17], x["k"][:, 3:12], x["v"][:, 3:12], ins,
                                 q_offset=9, kv_offset=3, Lq_total=L, Lk_total=L)
    assert ob.shape == (2, 8, 2, 32) and lb.shape == (2, 2, 8)
    assert np.isfinite(ob).all()


def test_chunked_prefill_defaults_end_the_sequence_at_the_chunk() -> None:
    v = _variant("mask causal")
    x = make_inputs(v, 1, 20, 20, np.random.default_rng(1))
    full_o, _ = reference.attention(v, x["q"], x["k"], x["v"])
    # Queries 12..19 against keys 0..19: q_offset=12, totals default to 20 and 20.
    o, _ = reference.attention(v, x["q"][:, 12:], x["k"], x["v"], q_offset=12)
    np.testing.assert_allclose(o, full_o[:, 12:], rtol=0, atol=1e-12)


def test_bad_positions_are_refused() -> None:
    v = _variant("mask causal")
    x = make_inputs(v, 1, 8, 8, np.random.default_rng(1))
    with pytest.raises(ValueError, match="q_offset >= 0"):
        reference.attention(v, x["q"], x["k"], x["v"], q_offset=-1)
    with pytest.raises(ValueError, match="Lq_total: expected >= q_offset"):
        reference.attention(v, x["q"], x["k"], x["v"], q_offset=4, Lq_total=8, Lk_total=8)
    with pytest.raises(ValueError, match="kind self"):
        reference.attention(v, x["q"], x["k"], x["v"], Lq_total=9, Lk_total=10)
