"""The key bounds a mask states (`analysis.kv_bounds`): the upper ones the wgmma producer walks
down from, the lower ones and the sorted matches the backward's tile loops are bounded by. What is
recognised, what is not, and soundness against the reference mask on every example."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from attngen.analysis.kv_bounds import kv_lower_bounds, kv_upper_bounds, sorted_matches
from attngen.check import fuzz, reference
from attngen.check.reference import Env, evaluate
from attngen.ir.abi import Sizes
from attngen.ir.nodes import IndexVar, SizeSym
from attngen.lang import frontend

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _variant(mask: str, extra: str = ""):
    return frontend.loads(f"attention t {{ dtype bf16; head_dim 64; heads 2; {extra} mask {mask} }}", "<t>").get()


def _at(bound, q: int, Lq: int, Lk: int) -> int:
    env = Env({IndexVar.Q: np.int64(q)}, {SizeSym.LQ: Lq, SizeSym.LK: Lk}, {})
    return int(evaluate(bound, env))


@pytest.mark.parametrize(
    "mask, extra, q, Lq, Lk, want",
    [
        ("causal", "", 5, 10, 10, 5),
        ("causal", "", 5, 10, 30, 25),  # bottom-right alignment
        ("causal && window(7, 3)", "", 20, 64, 64, 20),  # the tighter of causal and the window's right edge
        ("window(7, 3)", "", 20, 64, 64, 23),
        ("kv < q", "", 9, 16, 16, 8),
        ("q >= kv", "", 9, 16, 16, 9),
        ("q + 2 > kv", "", 9, 16, 16, 10),
        ("document(doc) && causal", "input doc: i32[B, Lk] sorted;", 7, 16, 16, 7),
    ],
)
def test_bounds_recognised(mask: str, extra: str, q: int, Lq: int, Lk: int, want: int) -> None:
    bounds = kv_upper_bounds(_variant(mask, extra).mask)
    assert bounds, mask
    assert min(_at(b, q, Lq, Lk) for b in bounds) == want


@pytest.mark.parametrize(
    "mask, extra",
    [
        ("true", ""),
        ("causal || window(4, 4)", ""),  # a disjunction bounds nothing
        ("kv <= 2 * q", ""),  # slope other than 1 is not taken
        ("kv <= lim[q]", "input lim: i32[Lq];"),  # reads memory
        ("kv >= q", ""),  # a lower bound
        ("padding", ""),
        ("!(kv > q)", ""),  # not a plain comparison at the top level
    ],
)
def test_no_bound(mask: str, extra: str) -> None:
    assert kv_upper_bounds(_variant(mask, extra).mask) == ()


def _examples():
    for f in sorted(EXAMPLES.glob("*.attn")):
        for v in frontend.load(f).variants:
            if kv_upper_bounds(v.mask):
                yield pytest.param(v, id=f"{f.stem}:{v.name}")


@pytest.mark.parametrize("v", list(_examples()))
def test_bounds_hold_on_every_visible_element(v) -> None:
    """Every visible (q, kv) of the reference mask satisfies kv <= bound(q), at Lq == Lk and at
    Lq < Lk (bottom-right alignment), with random runtime inputs."""
    seen = 0
    for Lq, Lk in ((70, 70), (33, 90)):
        if v.kind.value == "self" and Lq != Lk:
            continue
        arrays = fuzz.case_inputs(v, fuzz.Case(2, Lq, Lk, seed=3))
        rest = {n: a for n, a in arrays.items() if n not in ("q", "k", "v")}
        syms = {}
        for d in v.runtime_inputs():
            for dim, n in zip(d.shape, rest[d.name].shape):
                if isinstance(dim, str):
                    syms[dim] = n
        vis = reference.mask_matrix(v, Sizes(2, Lq, Lk, tuple(sorted(syms.items()))), rest)
        hi = np.array([min(_at(b, q, Lq, Lk) for b in kv_upper_bounds(v.mask)) for q in range(Lq)])
        kv = np.arange(Lk)[None, None, None, :]
        assert not (vis & (kv > hi[None, None, :, None])).any(), (v.name, Lq, Lk)
        seen += int(vis.sum())
    # Non-vacuous wherever the inputs leave something visible (a decode cache may be empty).
    assert seen > 0 or v.kind.value == "cross", v.name


@pytest.mark.parametrize(
    "mask, extra, q, Lq, Lk, want",
    [
        ("window(7, 3)", "", 20, 64, 64, 13),
        ("causal && window(7, 3) && kv >= q - 5", "", 20, 64, 64, 15),  # the tighter of the two
        ("window(4, 0)", "", 5, 10, 30, 21),  # bottom-right alignment
        ("kv > q", "", 9, 16, 16, 10),
        ("q <= kv", "", 9, 16, 16, 9),
    ],
)
def test_lower_bounds_recognised(mask: str, extra: str, q: int, Lq: int, Lk: int, want: int) -> None:
    bounds = kv_lower_bounds(_variant(mask, extra).mask)
    assert bounds, mask
    assert max(_at(b, q, Lq, Lk) for b in bounds) == want


@pytest.mark.parametrize("mask", ["causal", "causal || window(4, 4)", "kv >= 2 * q", "kv <= q", "padding"])
def test_no_lower_bound(mask: str) -> None:
    assert kv_lower_bounds(_variant(mask).mask) == ()


@pytest.mark.parametrize(
    "mask, extra, want",
    [
        ("document(doc) && causal", "input doc: i32[B, Lk] sorted;", 1),
        ("causal && qd[b, q] == kd[b, kv]", "kind cross; input qd: i32[B, Lq] sorted; input kd: i32[B, Lk] sorted;", 1),
        ("kd[b, kv] == qd[b, q]", "kind cross; input qd: i32[B, Lq] sorted; input kd: i32[B, Lk] sorted;", 1),  # either side first
        ("document(doc)", "input doc: i32[B, Lk];", 0),  # not promised sorted
        ("doc[b, q] == doc[b, kv] || causal", "input doc: i32[B, Lk] sorted;", 0),  # not a conjunct
        ("ids[h, q] == ids[h, kv]", "input ids: i32[H, Lk] sorted;", 0),  # per head: the walk spans the group
        ("doc[b, q] == doc[b, kv + 1]", "input doc: i32[B, Lk] sorted;", 0),  # the last index is not kv itself
    ],
)
def test_sorted_matches(mask: str, extra: str, want: int) -> None:
    v = _variant(mask, extra)
    assert len(sorted_matches(v.mask, {d.name: d for d in v.runtime_inputs()})) == want


def _lower_examples():
    for f in sorted(EXAMPLES.glob("*.attn")):
        for v in frontend.load(f).variants:
            if kv_lower_bounds(v.mask):
                yield pytest.param(v, id=f"{f.stem}:{v.name}")


@pytest.mark.parametrize("v", list(_lower_examples()))
def test_lower_bounds_hold_on_every_visible_element(v) -> None:
    """Every visible (q, kv) of the reference mask satisfies kv >= bound(q) (the backward bounds
    a key tile's query rows from above by it)."""
    seen = 0
    for Lq, Lk in ((70, 70), (33, 90)):
        if v.kind.value == "self" and Lq != Lk:
            continue
        arrays = fuzz.case_inputs(v, fuzz.Case(2, Lq, Lk, seed=3))
        rest = {n: a for n, a in arrays.items() if n not in ("q", "k", "v")}
        vis = reference.mask_matrix(v, Sizes(2, Lq, Lk, ()), rest)
        lo = np.array([max(_at(b, q, Lq, Lk) for b in kv_lower_bounds(v.mask)) for q in range(Lq)])
        kv = np.arange(Lk)[None, None, None, :]
        assert not (vis & (kv < lo[None, None, :, None])).any(), (v.name, Lq, Lk)
        seen += int(vis.sum())
    assert seen > 0, v.name
