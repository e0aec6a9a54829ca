"""The decode family (split-KV + GQA packing + combine) against the NumPy reference (GPU only).

Specs cover fp16/bf16, head dims 64, 128 and 256, GQA ratios 1/2/4/8, both layouts, and every mask and
score kind the forward fuses (bottom-right causal, cache lengths, windows, padding, a mask that
reads h, softcap, alibi), with `output lse`. Shapes: Lq 1..16, Lk from 1 (and odd lengths) to a
few thousand, and forced schedules: split counts from 1 to the number of key chunks, and CTA
counts whose equal shares cut row blocks anywhere (a CTA then runs several segments), so the
combine meets splits that see nothing (LSE -inf) beside splits that see everything.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attngen.check import fuzz, reference
from gpu_helpers import examples, spec_text, variant_of

CACHE = ("input cache_lens: i32[B]",)
SINK = ("input sinks: fp32[H]", "sink sinks")
SPECS = [
    spec_text("d_none_fp16_d64", dtype="fp16", D=64, H=4, Hkv=4, kind="cross", lse=True),
    spec_text("d_causal_bf16_d128_g4", dtype="bf16", D=128, H=32, Hkv=8, kind="cross", layout="bshd", mask="causal",
              lse=True),
    spec_text("d_cache_bf16_d128_g8", dtype="bf16", D=128, H=16, Hkv=2, kind="cross", mask="causal && kv < cache_lens[b]",
              lse=True, extra=CACHE),
    spec_text("d_window_fp16_d128_g4", dtype="fp16", D=128, H=8, Hkv=2, kind="cross", layout="bshd",
              mask="window(100, 0) && kv < cache_lens[b]", lse=True, extra=CACHE),
    spec_text("d_padding_bf16_d64_g8", dtype="bf16", D=64, H=8, Hkv=1, kind="cross", mask="padding && causal", lse=True),
    spec_text("d_softcap_bf16_d128_g4", dtype="bf16", D=128, H=8, Hkv=2, kind="cross", mask="causal",
              scores=("softcap(30.0)",), lse=True),
    spec_text("d_alibi_fp16_d64_g1", dtype="fp16", D=64, H=4, Hkv=4, kind="cross", layout="bshd", mask="causal",
              scores=("alibi",), lse=True),
    spec_text("d_headmask_fp16_d64_g4", dtype="fp16", D=64, H=8, Hkv=2, kind="cross", mask="h % 3 != 0 || kv < 7", lse=True),
    spec_text("d_self_bf16_d64_g4", dtype="bf16", D=64, H=8, Hkv=2, mask="causal"),
    spec_text("d_sink_bf16_d64_g8", dtype="bf16", D=64, H=64, Hkv=8, kind="cross", mask="causal && window(127, 0)",
              lse=True, extra=SINK),
    # Paged KV caches (pages shuffled by the workload, plus spare pages no row uses).
    spec_text("d_paged16_bf16_d128_g4", dtype="bf16", D=128, H=32, Hkv=8, kind="cross",
              mask="causal && kv < cache_lens[b]", lse=True, extra=(*CACHE, "kv_cache paged(16)")),
    spec_text("d_paged8_fp16_d64_g8", dtype="fp16", D=64, H=8, Hkv=1, kind="cross", layout="bshd",
              mask="kv < cache_lens[b]", lse=True, extra=(*CACHE, "kv_cache paged(8)")),
    spec_text("d_paged64_bf16_d64_sink", dtype="bf16", D=64, H=16, Hkv=2, kind="cross", mask="causal && kv < cache_lens[b]",
              lse=True, extra=(*CACHE, *SINK, "kv_cache paged(64)")),
    spec_text("d_paged256_fp16_d128", dtype="fp16", D=128, H=4, Hkv=4, kind="cross", mask="causal",
              scores=("softcap(20.0)",), lse=True, extra=("kv_cache paged(256)",)),
    # Head dim 256 (Gemma): a 66 KiB ring chunk, block-table entries read at the copy.
    spec_text("d_d256_bf16_g2", dtype="bf16", D=256, H=8, Hkv=4, kind="cross", mask="causal && kv < cache_lens[b]",
              scores=("softcap(50.0)",), lse=True, extra=CACHE),
    spec_text("d_paged16_fp16_d256_sink", dtype="fp16", D=256, H=16, Hkv=8, kind="cross", layout="bshd",
              mask="kv < cache_lens[b]", lse=True, extra=(*CACHE, *SINK, "kv_cache paged(16)")),
]


def _id(text: str) -> str:
    return text.split()[1]


def _decode(v):
    from attngen.runtime import kernel as runtime

    return runtime.compile(v, family="decode")


def _check(v, kernel, case: fuzz.Case, splits: int | None = None, ctas: int | None = None, fused: bool | None = None,
           given=None) -> None:
    """The kernel on `case` (or on `given`: the case's inputs and their reference, made once for
    several schedules) against the reference."""
    arrays, ref = given or (fuzz.case_inputs(v, case), None)

    def call(q, k, vv, **kw):
        return kernel(q, k, vv, splits=splits, ctas=ctas, fused=fused, **kw)

    out, lse = fuzz.run_kernel(call, v, arrays)
    reports = fuzz.compare(v, arrays, out, lse, ref)
    bad = [r.summary() for r in reports if not r.ok]
    assert not bad, f"{v.name} at {case.describe()} splits={splits} ctas={ctas} fused={fused}:\n" + "\n".join(bad)


@st.composite
def _cases(draw, v):
    B = draw(st.integers(1, 3))
    Lq = draw(st.integers(1, 16))
    if v.kind.value == "self":
        Lk = Lq
    else:
        Lk = draw(st.one_of(st.sampled_from([1, 2, 3, 63, 64, 65, 127, 129, 255, 1000, 2049]), st.integers(1, 3000)))
    dist = draw(st.sampled_from(["normal", "normal", "large", "uniform"]))
    seed = draw(st.integers(0, 2**31 - 1))
    lens = None
    kv_lens = None
    if any(d.name == "kv_lens" for d in v.runtime_inputs()):
        kv_lens = tuple(draw(st.lists(st.sampled_from([0, 1, Lk, max(0, Lk - 1), Lk // 2]), min_size=B, max_size=B)))
        lens = tuple(draw(st.lists(st.sampled_from([0, 1, Lq]), min_size=B, max_size=B)))
    forced = draw(st.one_of(st.none(), st.integers(1, 64), st.tuples(st.just("ctas"), st.integers(1, 300))))
    fused = draw(st.sampled_from([None, True, False]))
    return fuzz.Case(B, Lq, Lk, dist, seed, q_lens=lens, kv_lens=kv_lens), forced, fused


@pytest.mark.gpu
@pytest.mark.parametrize("text", SPECS, ids=_id)
def test_decode_matches_reference(text: str) -> None:
    v = variant_of(text)
    kernel = _decode(v)
    chunk = kernel.plan.split.chunk

    @settings(max_examples=examples(1 / 5))
    @given(_cases(v))
    def run(drawn) -> None:
        case, forced, fused = drawn
        n_chunks = -(-case.Lk // chunk)
        if isinstance(forced, tuple):  # equal shares of the units: any count up to the units
            _check(v, kernel, case, ctas=min(forced[1], kernel.plan.split.units(case.B, case.Lq, case.Lk)), fused=fused)
        else:
            _check(v, kernel, case, None if forced is None else min(forced, n_chunks), fused=fused)

    run()


@pytest.mark.gpu
@pytest.mark.parametrize("Lk", [1, 63, 4097, 40000])
def test_decode_every_split_count_edge(Lk: int) -> None:
    """One split, as many splits as chunks, and the launch-time choice, on long and tiny caches."""
    v = variant_of(SPECS[2])
    kernel = _decode(v)
    n_chunks = -(-Lk // kernel.plan.split.chunk)
    for splits in sorted({1, n_chunks, None} - {0}, key=lambda s: -1 if s is None else s):
        _check(v, kernel, fuzz.Case(B=2, Lq=1, Lk=Lk, seed=Lk), splits)


@pytest.mark.gpu
@pytest.mark.parametrize("spec", [2, 10, -1], ids=lambda i: _id(SPECS[i]))
def test_decode_equal_shares_cut_row_blocks_anywhere(spec: int) -> None:
    """CTA counts that are not multiples of the row blocks: shares that start and end inside row
    blocks, CTAs with several segments, one CTA for everything, one CTA a unit, the launch-time
    schedule; each against the reference."""
    v = variant_of(SPECS[spec])
    kernel = _decode(v)
    for B, Lq, Lk in ((3, 5, 2049), (2, 1, 777), (1, 16, 5000)):
        base, units = kernel.plan.split.row_blocks(B, Lq), kernel.plan.split.units(B, Lq, Lk)
        # One input set and one reference a shape: the schedules differ, not the data (the
        # NumPy reference, not the GPU, was most of this test's time).
        case = fuzz.Case(B=B, Lq=Lq, Lk=Lk, seed=Lk)
        arrays = fuzz.case_inputs(v, case)
        q, k, vv, rest = fuzz.split_inputs(arrays)
        given = (arrays, reference.attention(v, q, k, vv, rest))
        for ctas in sorted({1, 2, base - 1, base + 1, 2 * base + 3, 131, units - 1, units} & set(range(1, units + 1))):
            for fused in (True, False):  # merged by the last CTA of a row block, or by the combine kernel
                _check(v, kernel, case, ctas=ctas, fused=fused, given=given)
        _check(v, kernel, case, given=given)


@pytest.mark.gpu
def test_merging_counters_stay_zero_across_calls_streams_and_graphs() -> None:
    """The split kernel's row-block counters: left zero by every launch (repeated calls agree
    bitwise), one buffer a stream (calls on two streams at once agree), and a CUDA graph captured
    without a warm-up on its stream (no counters allocated under capture: the combine merges)
    replays right."""
    torch = pytest.importorskip("torch")

    v = variant_of(SPECS[2])
    kernel = _decode(v)
    arrays = fuzz.case_inputs(v, fuzz.Case(B=3, Lq=2, Lk=3000, seed=11))
    q, k, vv, rest = fuzz.split_inputs(arrays)
    dq, dk, dv = fuzz.to_device(q), fuzz.to_device(k), fuzz.to_device(vv)
    extra = {n: fuzz.to_device(a) for n, a in rest.items()}
    first = kernel(dq, dk, dv, splits=5, fused=True, **extra)[0].clone()
    reports = fuzz.compare(v, arrays, fuzz.to_host(first, v.dtype), None)
    assert all(r.ok for r in reports), [r.summary() for r in reports]
    combined = kernel(dq, dk, dv, splits=5, fused=False, **extra)[0]
    torch.testing.assert_close(combined.float(), first.float(), rtol=1e-2, atol=1e-2)
    for _ in range(3):
        assert torch.equal(kernel(dq, dk, dv, splits=5, fused=True, **extra)[0], first)
    assert kernel._counters and all(int(abs(b).max()) == 0 for b in kernel._counters.values())
    main = torch.cuda.current_stream()
    streams = [torch.cuda.Stream() for _ in range(2)]
    outs = []
    for s in streams:
        s.wait_stream(main)
        with torch.cuda.stream(s):
            outs.append(kernel(dq, dk, dv, splits=5, fused=True, **extra)[0])
    torch.cuda.synchronize()
    assert all(torch.equal(o, first) for o in outs)
    assert len(kernel._counters) >= 3  # the main stream's buffer and one a side stream
    out = torch.empty_like(first)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        kernel(dq, dk, dv, splits=5, fused=True, out=out, **extra)
    for _ in range(3):
        out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(out.float(), first.float(), rtol=1e-2, atol=1e-2)


@pytest.mark.gpu
def test_auto_family_routes_small_lq_to_decode() -> None:
    from attngen.runtime import kernel as runtime
    from attngen.plan.decode import Family

    v = variant_of(SPECS[1])
    k = runtime.compile(v)
    assert k.family_for(1) == Family.DECODE and k.family_for(16) == Family.DECODE
    assert k.family_for(17) == Family.FORWARD
    for Lq in (1, 5, 17):
        case = fuzz.Case(B=2, Lq=Lq, Lk=777, seed=Lq)
        arrays = fuzz.case_inputs(v, case)
        out, lse = fuzz.run_kernel(k, v, arrays)
        assert all(r.ok for r in fuzz.compare(v, arrays, out, lse))


@pytest.mark.gpu
def test_decode_refuses_bad_splits_and_arrays() -> None:
    v = variant_of(SPECS[0])
    kernel = _decode(v)
    arrays = fuzz.case_inputs(v, fuzz.Case(B=1, Lq=1, Lk=100))
    q, k, vv, _ = fuzz.split_inputs(arrays)
    with pytest.raises(ValueError, match="splits"):
        kernel(fuzz.to_device(q), fuzz.to_device(k), fuzz.to_device(vv), splits=1000)
    with pytest.raises(ValueError, match="ctas: expected 1 to"):
        kernel(fuzz.to_device(q), fuzz.to_device(k), fuzz.to_device(vv), ctas=10**6)
    with pytest.raises(ValueError, match="at most one"):
        kernel(fuzz.to_device(q), fuzz.to_device(k), fuzz.to_device(vv), splits=1, ctas=1)
    with pytest.raises(ValueError, match="k:"):
        kernel(fuzz.to_device(q), fuzz.to_device(k[:, :, :, :32].copy()), fuzz.to_device(vv))


# Attention sinks in the forward family, one spec per engine (wgmma on sm_90a for the 128-row
# bf16 tile, mma.sync for a 64-row tile, FFMA for fp32), forced to the forward family.
FORWARD_SINKS = [
    spec_text("f_sink_wgmma_bf16", dtype="bf16", D=64, H=8, Hkv=2, mask="causal", lse=True, extra=SINK),
    spec_text("f_sink_mma_fp16", dtype="fp16", D=128, H=4, Hkv=2, kind="cross", mask="causal", lse=True,
              extra=(*SINK, "tile block_m 64 block_n 64 warps 4 stages 2")),
    spec_text("f_sink_ffma_fp32", dtype="fp32", D=64, H=4, Hkv=1, kind="cross", layout="bshd", mask="padding", lse=True,
              extra=SINK),
]


@pytest.mark.gpu
@pytest.mark.parametrize("text", FORWARD_SINKS, ids=_id)
def test_forward_sinks_match_reference(text: str) -> None:
    from attngen.runtime import kernel as runtime

    v = variant_of(text)
    kernel = runtime.compile(v, family="forward")

    @settings(max_examples=examples(1 / 8))
    @given(fuzz.case_strategy(v, max_len=700))
    def run(case: fuzz.Case) -> None:
        arrays = fuzz.case_inputs(v, case)
        out, lse = fuzz.run_kernel(kernel, v, arrays)
        bad = [r.summary() for r in fuzz.compare(v, arrays, out, lse) if not r.ok]
        assert not bad, f"{v.name} at {case.describe()}:\n" + "\n".join(bad)

    run()


@pytest.mark.gpu
def test_paged_refuses_out_of_range_pages_and_runs_chunked_prefill() -> None:
    """A page id outside the cache is refused before launch; Lq beyond the decode range (chunked
    prefill against the cache) runs on the decode family too, and matches the reference."""
    from attngen.runtime import kernel as runtime

    v = variant_of(next(s for s in SPECS if "d_paged16" in s))
    kernel = runtime.compile(v)  # auto: a paged cache always takes the decode family
    assert kernel.plan.kernels[0].name.endswith("_decode")
    arrays = fuzz.case_inputs(v, fuzz.Case(B=2, Lq=40, Lk=300, seed=5))
    out, lse = fuzz.run_kernel(kernel, v, arrays)
    assert all(r.ok for r in fuzz.compare(v, arrays, out, lse))
    q, k, vv, rest = fuzz.split_inputs(arrays)
    bad = dict(rest)
    bad["block_table"] = rest["block_table"].copy()
    bad["block_table"][1, 0] = k.shape[0]
    with pytest.raises(ValueError, match="block_table: expected page ids"):
        kernel(fuzz.to_device(q), fuzz.to_device(k), fuzz.to_device(vv), **{n: fuzz.to_device(a) for n, a in bad.items()})
    with pytest.raises(ValueError, match="decode family"):
        runtime.compile(v, family="forward")


# A speculative draft of Lq = 4 tokens against a paged cache with implied lengths: the draft is the
# last 4 entries of each row's cache, so `causal` aligns to cache_lens[b], not the capacity.
SPEC_DRAFT = spec_text("d_paged16_draft_bf16_d128_g4", dtype="bf16", D=128, H=32, Hkv=8, kind="cross", mask="causal",
                       lse=True, extra=("kv_cache paged(16)",))


def _draft_inputs(v, lens: list[int], pages: int, seed: int, poison: bool = False) -> dict:
    """Case inputs for rows of the given lengths (capacity pages * 16); with `poison`, every slot
    past a row's length holds NaN, which the kernels must never read."""
    import numpy as np

    from attngen.check import workload

    arrays = workload.make_inputs(v, len(lens), 4, pages * 16, np.random.default_rng(seed))
    arrays["cache_lens"] = np.asarray(lens, dtype=np.int32)
    if poison:
        bt = arrays["block_table"]
        for b, n in enumerate(lens):
            for t in range(n, pages * 16):
                arrays["k"][bt[b, t // 16], t % 16] = np.nan
                arrays["v"][bt[b, t // 16], t % 16] = np.nan
    return arrays


@pytest.mark.gpu
@pytest.mark.parametrize("lens,pages", [([4, 23, 130, 1024], 64), ([4, 5, 17], 2), ([2047, 4, 600, 1111, 2048], 128)],
                         ids=["mixed", "short", "long"])
def test_paged_speculative_draft_aligns_to_each_rows_length(lens: list[int], pages: int) -> None:
    """Lq = 4 draft tokens in rows of mixed cache_lens (only the draft, partial pages, whole pages,
    the full capacity), poisoned past each length, on every kind of schedule: one CTA a row block,
    splits past a row's end (empty partials the merge weighs 0), odd CTA shares, fused or combined."""
    v = variant_of(SPEC_DRAFT)
    kernel = _decode(v)
    arrays = _draft_inputs(v, lens, pages, seed=len(lens), poison=True)
    q, k, vv, rest = fuzz.split_inputs(arrays)
    ref = reference.attention(v, q, k, vv, rest)
    case = fuzz.Case(len(lens), 4, pages * 16, "normal", len(lens))
    n_chunks = -(-pages * 16 // kernel.plan.split.chunk)
    for splits in sorted({1, min(2, n_chunks), min(7, n_chunks), n_chunks}):
        for fused in (True, False):
            _check(v, kernel, case, splits=splits, fused=fused, given=(arrays, ref))
    _check(v, kernel, case, ctas=min(97, kernel.plan.split.units(len(lens), 4, pages * 16)), given=(arrays, ref))
    _check(v, kernel, case, given=(arrays, ref))


@pytest.mark.gpu
def test_paged_cache_lens_outside_lq_to_capacity_are_refused() -> None:
    v = variant_of(SPEC_DRAFT)
    kernel = _decode(v)
    for lens in ([3, 40], [4, 65]):
        arrays = _draft_inputs(v, [4, 40], 4, seed=1)
        arrays["cache_lens"][:] = lens
        q, k, vv, rest = fuzz.split_inputs(arrays)
        with pytest.raises(ValueError, match=r"cache_lens: expected each row's cached tokens, the Lq = 4 new ones included, in \[4, 64\]"):
            kernel(fuzz.to_device(q), fuzz.to_device(k), fuzz.to_device(vv), **{n: fuzz.to_device(a) for n, a in rest.items()})
