"""Paged KV caches (`kv_cache paged(N)`): the language, the shape contract, the workload's shuffled
pages and lengths, and the reference (which must equal the contiguous computation on the gathered
cache, and the attention the lengths define: keys past cache_lens[b] invisible, `causal` aligned to
each row's own end, so a speculative draft's tokens see only those before them)."""

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
    # The implied lengths (no `input` line, no `kv < cache_lens[b]`): `unpaged` is the same attention.
    bare = _v(IMPLIED)
    o3, lse3 = reference.attention(bare, a["q"], a["k"], a["v"], {"cache_lens": a["cache_lens"], "block_table": bt})
    o4, lse4 = reference.attention(reference.unpaged(bare), a["q"], kc, vc, {"cache_lens": a["cache_lens"]})
    np.testing.assert_array_equal(o3, o)
    np.testing.assert_array_equal(lse3, lse)
    np.testing.assert_array_equal(o4, o)
    np.testing.assert_array_equal(lse4, lse)


def test_reference_refuses_out_of_range_pages() -> None:
    v = _v()
    a = workload.make_inputs(v, 2, 1, 40, np.random.default_rng(0))
    a["block_table"][0, 0] = a["k"].shape[0]
    with pytest.raises(ValueError, match="block_table: expected page ids"):
        reference.attention(v, a["q"], a["k"], a["v"], {n: a[n] for n in ("cache_lens", "block_table")})


IMPLIED = """
attention pd {
  dtype fp32
  head_dim 32
  heads 4 kv 2
  kind cross
  kv_cache paged(16)
  mask causal
  output lse
}
"""


def test_cache_lens_is_implied_after_the_block_table_and_readable() -> None:
    v = _v(IMPLIED)
    assert [(d.name, d.dtype.value, d.shape) for d in v.runtime_inputs()] == [
        ("block_table", "i32", (abi.SizeSym.B, "max_pages")), ("cache_lens", "i32", (abi.SizeSym.B,))]
    assert frontend.loads(frontend.print_program(frontend.loads(IMPLIED)), "<again>").get() == v
    # Expressions may read the implied lengths without declaring them.
    w = _v(IMPLIED.replace("mask causal", "mask kv >= cache_lens[b] - 8"))
    assert [d.name for d in w.runtime_inputs()] == ["block_table", "cache_lens"]
    # Outside a paged variant the name is an ordinary one: undeclared, it is unknown.
    with pytest.raises(SpecError, match="cache_lens"):
        frontend.loads(IMPLIED.replace("  kv_cache paged(16)\n", "").replace("mask causal", "mask kv < cache_lens[b]"))


def test_a_declared_cache_lens_must_be_what_the_cache_implies() -> None:
    with pytest.raises(SpecError, match=r"`cache_lens` is implied by `kv_cache paged` as i32\[B\]") as e:
        frontend.loads(IMPLIED.replace("  kv_cache", "  input cache_lens: i32[B, 2]\n  kv_cache"), "<test>")
    assert "<test>:7:" in e.value.render()  # at the declaration


def test_causal_aligns_to_each_rows_cache_lens_not_the_capacity() -> None:
    from attngen.ir.nodes import Builtin

    paged, flat = _v(IMPLIED), _v(IMPLIED.replace("  kv_cache paged(16)\n", ""))
    assert isinstance(paged.mask, Builtin) and isinstance(flat.mask, Builtin)
    assert "cache_lens" in repr(paged.mask.body) and "cache_lens" not in repr(flat.mask.body)
    assert "LK" in repr(flat.mask.body) and "LK" not in repr(paged.mask.body)


def _hand_attention(q, k_pages, v_pages, table, lens, page: int, Lq: int, scale: float):
    """Attention over a paged cache written out loop by loop, independent of the reference's
    code: row b's token t lives in page table[b, t // page], slot t % page; query i of row b is
    token lens[b] - Lq + i and sees tokens t <= that position (and t < lens[b])."""
    B, H = q.shape[0], q.shape[1]
    G = H // k_pages.shape[2]
    o = np.zeros((B, H, Lq, v_pages.shape[3]))
    lse = np.zeros((B, H, Lq))
    for b in range(B):
        for h in range(H):
            for i in range(Lq):
                pos = int(lens[b]) - Lq + i
                keys = [t for t in range(int(lens[b])) if t <= pos]
                s = np.array([scale * float(np.dot(q[b, h, i].astype(np.float64),
                                                   k_pages[table[b, t // page], t % page, h // G].astype(np.float64)))
                              for t in keys])
                m = s.max()
                w = np.exp(s - m)
                o[b, h, i] = sum(wt * v_pages[table[b, t // page], t % page, h // G].astype(np.float64)
                                 for wt, t in zip(w, keys)) / w.sum()
                lse[b, h, i] = m + np.log(w.sum())
    return o, lse


def _spec_case(lens, Lq: int = 4, pages: int = 4, seed: int = 0):
    v = _v(IMPLIED)
    B = len(lens)
    a = workload.make_inputs(v, B, Lq, pages * 16, np.random.default_rng(seed))
    a["cache_lens"] = np.asarray(lens, dtype=np.int32)
    return v, a


def test_speculative_draft_of_four_sees_only_the_tokens_before_it() -> None:
    """Lq = 4 draft tokens (speculative decoding) in rows of different lengths: each draft token
    sees the cache and the draft tokens before it, not those after it, in every row; and keys
    past each row's length (here NaN, as a stale slot may hold) are never read."""
    lens = [4, 23, 48, 64]  # only the draft; a partial page; whole pages; the full capacity
    v, a = _spec_case(lens)
    bt = a["block_table"]
    for b, n in enumerate(lens):  # poison every slot past each row's length
        for t in range(n, bt.shape[1] * 16):
            a["k"][bt[b, t // 16], t % 16] = np.nan
            a["v"][bt[b, t // 16], t % 16] = np.nan
    ins = {"cache_lens": a["cache_lens"], "block_table": bt}
    o, lse = reference.attention(v, a["q"], a["k"], a["v"], ins)
    ho, hl = _hand_attention(a["q"], a["k"], a["v"], bt, lens, 16, 4, v.effective_scale)
    assert np.isfinite(o).all()
    np.testing.assert_allclose(o, ho, rtol=2e-6, atol=2e-6)
    np.testing.assert_allclose(lse, hl, rtol=2e-6, atol=2e-6)
    # The mask itself: row b's draft token i sees exactly keys 0 .. lens[b] - 4 + i.
    sizes = abi.Sizes(len(lens), 4, 64, (("max_pages", 4),))
    m = reference.mask_matrix(v, sizes, ins, h=0)
    for b, n in enumerate(lens):
        for i in range(4):
            assert m[b, i].nonzero()[0].tolist() == list(range(n - 4 + i + 1)), (b, i)


def test_the_capacity_aligned_reading_differs_by_a_wide_margin() -> None:
    """What the bug computed (causal aligned to max_pages * 16, every draft token seeing all the
    others) against the per-row attention: not a rounding difference."""
    lens = [20, 37, 53, 64]
    v, a = _spec_case(lens, seed=3)
    bt = a["block_table"]
    o, _ = reference.attention(v, a["q"], a["k"], a["v"], {"cache_lens": a["cache_lens"], "block_table": bt})
    keys = np.arange(64)
    old = np.zeros_like(o, dtype=np.float64)
    for b, n in enumerate(lens):
        kk = a["k"][bt[b]].reshape(64, 2, 32).astype(np.float64)
        vv = a["v"][bt[b]].reshape(64, 2, 32).astype(np.float64)
        for h in range(4):
            s = a["q"][b, h].astype(np.float64) @ kk[:, h // 2].T * v.effective_scale  # [4, 64]
            seen = (keys[None, :] < n) & (keys[None, :] <= 64 - 4 + np.arange(4)[:, None])
            w = np.where(seen, np.exp(s - np.where(seen, s, -np.inf).max(axis=-1, keepdims=True)), 0.0)
            old[b, h] = (w / w.sum(-1, keepdims=True)) @ vv[:, h // 2]
    # The full row (64 = the capacity) is the one the two readings agree on.
    np.testing.assert_allclose(old[3], o[3], rtol=1e-5, atol=1e-6)
    rel = np.linalg.norm(old[:3] - o[:3]) / np.linalg.norm(o[:3])
    assert rel > 0.1, rel


@pytest.mark.parametrize("lens,ok", [([4, 64], True), ([3, 10], False), ([4, 65], False), ([64, 64], True)])
def test_reference_refuses_cache_lens_outside_lq_to_capacity(lens, ok: bool) -> None:
    v, a = _spec_case([4, 4], pages=4)
    ins = {"cache_lens": np.asarray(lens, dtype=np.int32), "block_table": a["block_table"]}
    if ok:
        reference.attention(v, a["q"], a["k"], a["v"], ins)
        return
    with pytest.raises(ValueError, match=r"cache_lens: expected each row's cached tokens, the Lq = 4 new ones included, "
                                         r"in \[4, 64\] \(max_pages \* page_size\)"):
        reference.attention(v, a["q"], a["k"], a["v"], ins)


def test_workload_lengths_lie_in_lq_to_capacity_with_both_edges() -> None:
    v = _v(IMPLIED)
    for B, Lq, Lk, seed in [(5, 4, 64, 0), (3, 1, 17, 1), (1, 16, 16, 2), (4, 20, 16, 3), (2, 3, 40, 4)]:
        a = workload.make_inputs(v, B, Lq, Lk, np.random.default_rng(seed))
        cap = a["block_table"].shape[1] * 16
        assert cap >= max(Lk, Lq)  # the capacity holds the new tokens, even for Lq > Lk
        lens = a["cache_lens"]
        assert lens.dtype == np.int32 and lens.shape == (B,)
        assert lens.min() >= Lq and lens.max() <= cap
        if B >= 3:
            assert lens[0] == cap and lens[-1] == Lq
        reference.attention(v, a["q"], a["k"], a["v"], {n: a[n] for n in ("cache_lens", "block_table")})


def test_the_regression_case_holds_a_draft_only_row() -> None:
    """tests/gpu/regressions/paged_causal_aligns_to_cache_lens.attn: its case gives a full row and
    a row of only the 4 draft tokens, whose mask is the 4 x 4 lower triangle."""
    from pathlib import Path

    from attngen.check import fuzz

    path = Path(__file__).resolve().parents[1] / "gpu" / "regressions" / "paged_causal_aligns_to_cache_lens.attn"
    v = frontend.load(path).get()
    first = path.read_text(encoding="utf-8").splitlines()[0]
    kw = dict(item.split("=", 1) for item in first.removeprefix("# case:").split())
    case = fuzz.Case(B=int(kw["B"]), Lq=int(kw["Lq"]), Lk=int(kw["Lk"]), dist=kw["dist"], seed=int(kw["seed"]))
    a = fuzz.case_inputs(v, case)
    lens = a["cache_lens"]
    assert lens[0] == 112 and lens[-1] == 4
    m = reference.mask_matrix(v, abi.Sizes(3, 4, 112, (("max_pages", 7),)), {n: a[n] for n in ("block_table", "cache_lens")}, h=0)
    np.testing.assert_array_equal(m[2, :, :4], np.tri(4, dtype=bool))
    assert not m[2, :, 4:].any()
    np.testing.assert_array_equal(m[0, :, 108:], np.tri(4, dtype=bool))


def test_visibility_adds_the_length_bound_once() -> None:
    """`Variant.visibility`: the mask the kernels and the reference apply. A paged cache bounds
    keys by cache_lens[b], once (a mask that already says so is kept as it is); a contiguous
    variant's mask is untouched."""
    from attngen.ir.nodes import TRUE, Binary, BinOp

    declared, implied = _v(), _v(IMPLIED)
    assert declared.visibility() is declared.mask  # `causal && kv < cache_lens[b]`
    vis = implied.visibility()
    assert isinstance(vis, Binary) and vis.op == BinOp.AND and vis.lhs == implied.mask
    assert vis.rhs == _v(IMPLIED.replace("mask causal", "mask kv < cache_lens[b]")).mask
    bare = _v(IMPLIED.replace("  mask causal\n", ""))
    assert bare.mask == TRUE and bare.visibility() == vis.rhs
    flat = _v(IMPLIED.replace("  kv_cache paged(16)\n", ""))
    assert flat.visibility() is flat.mask


def test_flex_on_the_gathered_cache_agrees_for_a_draft() -> None:
    """The fuzzer's FlexAttention cross-check (contiguous, through `reference.unpaged`) on a
    speculative draft of 4 over rows of mixed lengths."""
    pytest.importorskip("torch")
    from attngen.check import fuzz_run

    v, a = _spec_case([4, 23, 48, 64])
    fuzz_run._last_ref[0] = None
    rep = fuzz_run.flex_crosscheck(v, a)
    assert rep is not None and rep.ok, rep.summary()
