"""The IR → FlexAttention translation, on the CPU: mask_mod and score_mod elementwise against
`attngen.reference`, and eager FlexAttention (with torch norms/residual) against the reference."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from attngen.check import flex, fuzz, reference, tolerance  # noqa: E402
from attngen.lang import frontend  # noqa: E402
from attngen.ir.abi import Sizes  # noqa: E402
from attngen.ir.nodes import IndexVar, SizeSym  # noqa: E402

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.attn"))

# Custom expressions that stress the translation: floor division and modulo of negative numbers,
# a zero divisor, out-of-bounds lookups (read as 0), int/float mixing in scores, where/min/max.
CUSTOM = [
    """attention c_floor { dtype fp32; head_dim 32; heads 2; kind cross
       mask (q - kv) / 3 == -1 || (kv - q) % 4 == 3 || (q - kv) % (kv - 5) == 0 }""",
    """attention c_oob { dtype fp16; head_dim 32; heads 2
       input t: i32[7]
       mask t[kv - 3] > 0 || t[q + 100] != 0 || q == kv }""",
    """attention c_scores { dtype bf16; head_dim 64; heads 4 kv 2
       input w: fp32[H, Lk]
       mask !(kv > q + 2) && h * 3 <= kv + 40
       score where(kv % 2 == 0, s, s - 1.0)
       score min(s, 4.0) + w[h, kv] * 0.5
       score max(tanh(s) * 3.0, s / 2.0) }""",
    """attention c_blocks { dtype fp16; head_dim 64; heads 2; kind cross
       input blk: u8[H, QB, KB]
       mask block_sparse(blk, 16, 32) && causal }""",
    """attention c_alibi_cross { dtype fp32; head_dim 32; heads 6; kind cross
       mask causal
       score alibi
       score softcap(5.0) }""",
]


def _all_variants() -> list:
    out = []
    for p in EXAMPLES:
        for v in frontend.load(p).variants:
            out.append(pytest.param(v, id=f"{p.stem}:{v.name}"))
    for text in CUSTOM:
        v = frontend.loads(text).get()
        out.append(pytest.param(v, id=v.name))
    return out


def _small_shape(v) -> tuple[int, int, int]:
    Lq = 37 if v.heads <= 16 else 9
    Lk = Lq if v.kind.value == "self" else 29
    return 2, Lq, Lk


def _grids(v, B, Lq, Lk):
    b = torch.arange(B)[:, None, None, None]
    h = torch.arange(v.heads)[None, :, None, None]
    q = torch.arange(Lq)[None, None, :, None]
    kv = torch.arange(Lk)[None, None, None, :]
    return b, h, q, kv


@pytest.mark.parametrize("v", _all_variants())
def test_mask_mod_matches_reference(v) -> None:
    B, Lq, Lk = _small_shape(v)
    arrays = fuzz.case_inputs(v, fuzz.Case(B, Lq, Lk, seed=3))
    rest = {n: a for n, a in arrays.items() if n not in ("q", "k", "v")}
    mask_mod, _ = flex.to_flex(v, inputs=rest, B=B, Lq=Lq, Lk=Lk)
    ref = reference.mask_matrix(v, Sizes(B, Lq, Lk, tuple(sorted(_symbols(v, rest).items()))), rest)
    if mask_mod is None:
        assert ref.all()
        return
    got = torch.broadcast_to(mask_mod(*_grids(v, B, Lq, Lk)), (B, v.heads, Lq, Lk)).numpy()
    assert got.dtype == np.bool_
    np.testing.assert_array_equal(got, ref)


def _symbols(v, rest) -> dict:
    syms = {}
    for d in v.runtime_inputs():
        for dim, n in zip(d.shape, rest[d.name].shape):
            if isinstance(dim, str):
                syms[dim] = int(n)
    return syms


@pytest.mark.parametrize("v", [p for p in _all_variants() if p.values[0].scores])
def test_score_mod_matches_reference(v) -> None:
    B, Lq, Lk = _small_shape(v)
    arrays = fuzz.case_inputs(v, fuzz.Case(B, Lq, Lk, seed=4))
    rest = {n: a for n, a in arrays.items() if n not in ("q", "k", "v")}
    _, score_mod = flex.to_flex(v, inputs=rest, B=B, Lq=Lq, Lk=Lk)
    s = np.random.default_rng(5).standard_normal((B, v.heads, Lq, Lk)) * 4
    got = score_mod(torch.from_numpy(s.astype(np.float32)), *_grids(v, B, Lq, Lk)).numpy()
    sizes = Sizes(B, Lq, Lk, tuple(sorted(_symbols(v, rest).items())))
    env_sizes = {sym: __import__("attngen.ir.abi", fromlist=["x"]).size_value(v, sym, sizes) for sym in SizeSym}
    tensors = reference.prepare_tensors(v, rest)
    want = s.astype(np.float32).astype(np.float64)
    for e in v.scores:
        env = reference.Env({IndexVar.B: np.arange(B)[:, None, None, None], IndexVar.H: np.arange(v.heads)[None, :, None, None],
                             IndexVar.Q: np.arange(Lq)[None, None, :, None], IndexVar.KV: np.arange(Lk)[None, None, None, :]},
                            env_sizes, tensors, want)
        want = np.broadcast_to(reference.evaluate(e, env), s.shape)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5 * max(1.0, np.abs(want).max()))


@pytest.mark.parametrize("v", _all_variants())
def test_eager_flex_matches_reference(v) -> None:
    B, Lq, Lk = _small_shape(v)
    arrays = fuzz.case_inputs(v, fuzz.Case(B, Lq, Lk, seed=6))
    q, k, vv, rest = fuzz.split_inputs(arrays)
    if v.layout.value == "varlen":  # packed batches: no Flex oracle, a clear refusal
        with pytest.raises(ValueError, match="varlen"):
            flex.run_flex(v, q, k, vv, rest, compiled=False, upcast=True)
        return
    o_ref, lse_ref = reference.attention(v, q, k, vv, rest)
    o, lse = flex.run_flex(v, q, k, vv, rest, compiled=False, upcast=True)
    se = tolerance.score_error(q, k, v.effective_scale)
    tolerance.assert_close(fuzz.to_host_cpu(o), o_ref, v.dtype, "O", score_err=se)
    if not v.norms and not v.residual:
        tolerance.assert_close(lse.numpy(), lse_ref, v.dtype, "LSE", score_err=se)


def test_flex_notes_what_it_cannot_fuse() -> None:
    v = frontend.load(Path(EXAMPLES[0]).parent / "whisper_preln_cross.attn").get()
    notes = flex.not_in_flex(v)
    assert any("q-norm" in n for n in notes) and "residual" in notes
    assert flex.not_in_flex(frontend.load(Path(EXAMPLES[0]).parent / "gpt2_causal_fp16.attn").get()) == []


def test_missing_input_is_an_error() -> None:
    v = frontend.loads(CUSTOM[1]).get()
    with pytest.raises(ValueError, match="'t'"):
        flex.to_flex(v, inputs={}, B=1, Lq=4, Lk=4)


def test_standard_alibi_slopes_match_the_reference() -> None:
    for h in (1, 6, 8, 12, 112):
        np.testing.assert_allclose(flex.standard_alibi_slopes(h), reference.standard_alibi_slopes(h), rtol=1e-12)


def test_prepared_flex_reuses_mods_for_new_inputs() -> None:
    """The benchmark swaps input sets into one prepared Flex call; results match a fresh call."""
    v = frontend.load(EXAMPLES[0].parent / "whisper_preln_cross.attn").get()
    a = fuzz.case_inputs(v, fuzz.Case(1, 20, 12, seed=1))
    b = fuzz.case_inputs(v, fuzz.Case(1, 20, 12, seed=2))
    qa, ka, va, rest = fuzz.split_inputs(a)
    run = flex.prepare_flex(v, qa, ka, va, rest, compiled=False, upcast=True)
    o_swapped, _ = run(b["q"], b["k"], b["v"])
    o_fresh, _ = flex.run_flex(v, b["q"], b["k"], b["v"], rest, compiled=False, upcast=True)
    np.testing.assert_array_equal(fuzz.to_host_cpu(o_swapped), fuzz.to_host_cpu(o_fresh))
    o_a, _ = run()
    assert not np.array_equal(fuzz.to_host_cpu(o_a), fuzz.to_host_cpu(o_swapped))


def test_compiled_flex_never_falls_back_to_eager_silently() -> None:
    # Regression: the sweep's 9th Flex shape hit dynamo's recompile limit (8) and ran eager Flex,
    # reported as 4-5 TFLOP/s. The compiled peer must allow many shapes and fail past its limit.
    import torch._dynamo.config as dynamo_config

    flex.compiled_flex()
    limit = getattr(dynamo_config, "recompile_limit", getattr(dynamo_config, "cache_size_limit", 0))
    assert limit >= 1024
    assert getattr(dynamo_config, "fail_on_recompile_limit_hit", getattr(dynamo_config, "fail_on_cache_limit_hit", True))
