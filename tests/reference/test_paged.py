"""Paged KV caches (`kv_cache paged(N)`): the language, the shape contract, the workload's shuffled
pages and the reference (which must equal the contiguous computation on the gathered cache)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from attngen.ir import abi
from attngen.lang import frontend
from attngen.check import reference, workload
from attngen.lang.diagnostics import SpecError

SPEC = """
attention pd {
  dtype fp32
  head_dim 32
  heads 4 kv 2
  kind cross
  input cache_lens: i32[B]
  kv_cache paged(16)
  mask causal && kv < cache_lens[b]
  output lse
}
"""


def _v(text: str = SPEC):
    return frontend.loads(text, "<test>").get()


def test_paged_round_trips_and_implies_the_block_table() -> None:
    v = _v()
    assert v.page_size == 16
    assert [d.name for d in v.runtime_inputs()] == ["cache_lens", "block_table"]
    assert frontend.loads(frontend.print_program(frontend.loads(SPEC)), "<again>").get() == v


@pytest.mark.parametrize("bad,msg", [
    ("kv_cache paged(12)", "page size 12 is not supported"),
    ("kv_cache paged(264)", "page size 264 is not supported"),
    ("kv_cache ring(16)", "unknown kv_cache layout"),
])
def test_bad_caches_are_located(bad: str, msg: str) -> None:
    with pytest.raises(SpecError, match=msg):
        frontend.loads(SPEC.replace("kv_cache paged(16)", bad), "<test>")


def test_paged_needs_kind_cross() -> None:
    with pytest.raises(SpecError, match="needs `kind cross`"):
        frontend.loads(SPEC.replace("kind cross", "kind self"), "<test>")


def test_bind_sizes_takes_lk_from_the_block_table() -> None:
    v = _v()
    s = abi.bind_sizes(v, (2, 4, 3, 32), (9, 16, 2, 32), (9, 16, 2, 32),
                       {"cache_lens": ((2,), "int32"), "block_table": ((2, 4), "int32")})
    assert (s.B, s.Lq, s.Lk) == (2, 3, 64)
    with pytest.raises(ValueError, match="k: expected shape"):
        abi.bind_sizes(v, (2, 4, 3, 32), (9, 8, 2, 32), (9, 8, 2, 32),
                       {"cache_lens": ((2,), "int32"), "block_table": ((2, 4), "int32")})
    with pytest.raises(ValueError, match="missing block_table"):
        abi.bind_sizes(v, (2, 4, 3, 32), (9, 16, 2, 32), (9, 16, 2, 32), {"cache_lens": ((2,), "int32")})


@pytest.mark.parametrize("B,Lq,Lk", [(1, 1, 1), (2, 3, 50), (3, 16, 16), (2, 5, 129)])
def test_reference_equals_contiguous_on_the_gathered_cache(B: int, Lq: int, Lk: int) -> None:
    v = _v()
    a = workload.make_inputs(v, B, Lq, Lk, np.random.default_rng(B * Lk))
    bt = a["block_table"]
    pages = bt.shape[1]
    assert a["k"].shape == (B * pages + 3, 16, 2, 32)
    assert sorted(bt.ravel().tolist()) != list(range(B * pages)) or B * pages < 3  # shuffled, with spares
    o, lse = reference.attention(v, a["q"], a["k"], a["v"], {"cache_lens": a["cache_lens"], "block_table": bt})
    flat = dataclasses.replace(v, page_size=None)
    kc = a["k"][bt].reshape(B, pages * 16, 2, 32).transpose(0, 2, 1, 3)
    vc = a["v"][bt].reshape(B, pages * 16, 2, 32).transpose(0, 2, 1, 3)
    o2, lse2 = reference.attention(flat, a["q"], kc, vc, {"cache_lens": a["cache_lens"]})
    np.testing.assert_array_equal(o, o2)
    np.testing.assert_array_equal(lse, lse2)


def test_reference_refuses_out_of_range_pages() -> None:
    v = _v()
    a = workload.make_inputs(v, 2, 1, 40, np.random.default_rng(0))
    a["block_table"][0, 0] = a["k"].shape[0]
    with pytest.raises(ValueError, match="block_table: expected page ids"):
        reference.attention(v, a["q"], a["k"], a["v"], {n: a[n] for n in ("cache_lens", "block_table")})
