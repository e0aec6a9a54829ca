"""Attention sinks (`sink NAME`): the language, the printer and the reference's semantics."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from attngen.lang import frontend
from attngen.check import reference
from attngen.lang.diagnostics import SpecError

SPEC = """
attention s {
  dtype fp32
  head_dim 32
  heads 4 kv 2
  kind cross
  input sinks: fp32[H]
  mask causal
  sink sinks
  output lse
}
"""


def _v(text: str = SPEC):
    return frontend.loads(text, "<test>").get()


def test_sink_round_trips_through_the_printer() -> None:
    v = _v()
    assert v.sink == "sinks"
    again = frontend.loads(frontend.print_program(frontend.loads(SPEC)), "<again>").get()
    assert again == v


@pytest.mark.parametrize("bad,msg", [
    ("sink nope", "names no declared input"),
    ("input t2: fp32[B]\n  sink t2", "must be fp32[H]"),
    ("input t3: i32[H]\n  sink t3", "must be fp32[H]"),
])
def test_bad_sinks_are_located(bad: str, msg: str) -> None:
    with pytest.raises(SpecError, match=msg.replace("[", r"\[").replace("]", r"\]")):
        frontend.loads(SPEC.replace("sink sinks", bad), "<test>")


@pytest.mark.parametrize("Lq,Lk", [(1, 1), (3, 17), (9, 4), (16, 40)])
def test_sink_joins_the_denominator(Lq: int, Lk: int) -> None:
    """With a sink t: LSE' = logaddexp(LSE, t[h]) and O' = O exp(LSE - LSE'), from the same
    variant without it; rows with nothing visible (bottom-right causal with Lq > Lk) get O = 0 and
    LSE = t[h]."""
    v = _v()
    plain = dataclasses.replace(v, sink=None)
    rng = np.random.default_rng(Lq * 100 + Lk)
    q = rng.standard_normal((2, 4, Lq, 32)).astype(np.float32)
    k = rng.standard_normal((2, 2, Lk, 32)).astype(np.float32)
    vv = rng.standard_normal((2, 2, Lk, 32)).astype(np.float32)
    sinks = (3.0 * rng.standard_normal(4)).astype(np.float32)
    o, lse = reference.attention(v, q, k, vv, {"sinks": sinks})
    o0, lse0 = reference.attention(plain, q, k, vv, {"sinks": sinks})
    t = sinks.astype(np.float64)[None, :, None]
    lse_want = np.logaddexp(lse0.astype(np.float64), t)
    np.testing.assert_allclose(lse, lse_want, rtol=1e-6, atol=1e-6)
    o_want = o0 * np.exp(lse0.astype(np.float64) - lse_want)[..., None]
    np.testing.assert_allclose(o, o_want, rtol=1e-5, atol=1e-6)
    empty = np.isneginf(lse0)
    if Lq > Lk:
        assert empty.any()
    assert np.all(o[empty] == 0)
    assert np.all(np.isfinite(lse))
