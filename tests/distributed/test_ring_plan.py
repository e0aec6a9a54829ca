"""The ring's host-side decisions, without torch: which (query chunk, key chunk) blocks are skipped
without a launch, and which variants a ring refuses."""

from __future__ import annotations

import pytest

import attngen
from attngen.runtime.distributed import _block_visible, _check_variant, shard_ranges


def _v(body: str):
    return attngen.loads(f"attention t {{ dtype bf16; head_dim 64; heads 4; layout bshd; {body} }}").get()


def test_causal_blocks_after_the_queries_are_skipped() -> None:
    v = _v("mask causal")
    L, W = 64, 2
    r0 = shard_ranges(L, W, 0)  # chunks 0 and 3
    assert r0 == ((0, 16), (48, 64))
    assert not _block_visible(v, 1, L, r0[0], (16, 32))  # chunk 0 never sees chunk 1
    assert _block_visible(v, 1, L, r0[1], (16, 32))
    assert _block_visible(v, 1, L, r0[0], r0[0])  # the diagonal
    # With W=2 the zigzag ring launches 3 blocks a rank (two diagonals and one full), whatever the rank.
    for rank in range(W):
        n = sum(_block_visible(v, 1, L, qr, kr) for qr in shard_ranges(L, W, rank) for s in range(W) for kr in shard_ranges(L, W, s))
        assert n == 5  # 2 diagonals + 3 full blocks of the 8 pairs: balanced across ranks


def test_window_and_data_dependent_masks() -> None:
    w = _v("mask causal && window(8, 0)")
    assert not _block_visible(w, 1, 1000, (500, 600), (0, 100))
    assert _block_visible(w, 1, 1000, (500, 600), (490, 500))
    d = _v("input doc_ids: i32[B, Lk] sorted; mask document(doc_ids)")
    assert _block_visible(d, 1, 1000, (500, 600), (0, 100))  # ids unknown on the host: launched


def test_unmergeable_variants_are_refused() -> None:
    with pytest.raises(ValueError, match="norm o"):
        _check_variant(_v("mask causal; norm o rmsnorm(1e-5)"))
    with pytest.raises(ValueError, match="residual"):
        _check_variant(_v("mask causal; residual"))
    with pytest.raises(ValueError, match="sink"):
        _check_variant(_v("input sinks: fp32[H]; mask causal; sink sinks"))


def test_the_cpu_block_backward_refuses_pre_norms_before_the_forward() -> None:
    from attngen.runtime.distributed_bwd import _check_cpu

    _check_cpu(_v("mask causal"))
    with pytest.raises(ValueError, match="pre-norm"):
        _check_cpu(_v("mask causal; norm q rmsnorm(1e-5)"))
