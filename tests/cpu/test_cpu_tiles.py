"""The CPU kernel's tile machinery at lengths that cross its tiles: several query tiles and key
blocks a stream (the online softmax rescaling across blocks), partial last tiles, GQA packing, the half tiles of a short masked stream,
fp32 keys and values read in place (the AVX-512 transpose) and converted ones, and the tile sizes
render.py picks for a variant with and without a mask."""

from __future__ import annotations

import pytest

from attngen.cpu import render
from attngen.lang.frontend import loads

from test_cpu_examples import check_against_reference

SPEC = """
attention t {{
  dtype {dtype}
  head_dim {D}
  heads {H} kv {HKV}
  kind {kind}
{extra}}}
"""

CASES = [
    # name, dtype, D, H, HKV, kind, extra, (B, Lq, Lk)
    ("dense_gqa_fp32", "fp32", 64, 4, 2, "self", "", (2, 301, 301)),
    ("dense_d128_fp32", "fp32", 128, 2, 2, "self", "", (1, 200, 200)),
    ("dense_cross_fp16", "fp16", 64, 2, 1, "cross", "", (1, 150, 389)),
    ("causal_d96_fp32", "fp32", 96, 2, 2, "self", "  mask causal\n", (2, 333, 333)),
    # G * Lq = 180 packed rows: a masked stream this short takes half tiles (4 of them).
    ("causal_short_gqa_fp32", "fp32", 64, 2, 1, "self", "  mask causal\n", (2, 90, 90)),
    ("window_bf16", "bf16", 64, 2, 2, "self", "  mask causal && q - kv < 100\n", (1, 290, 290)),
    ("alibi_causal_fp32", "fp32", 64, 4, 4, "self", "  mask causal\n  score alibi\n", (1, 257, 257)),
]


def _variant(dtype, D, H, HKV, kind, extra):
    return loads(SPEC.format(dtype=dtype, D=D, H=H, HKV=HKV, kind=kind, extra=extra)).get()


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_lengths_across_tiles_match_the_reference(case, cpu_kernel):
    _, dtype, D, H, HKV, kind, extra, (B, Lq, Lk) = case
    v = _variant(dtype, D, H, HKV, kind, extra)
    check_against_reference(cpu_kernel(v), v, B, Lq, Lk, seed=3)


def test_tile_sizes_follow_the_mask():
    dense = render.render(_variant("fp32", 64, 2, 2, "self", ""))
    assert f"constexpr int BM = {render.BLOCK_M};" in dense and f"constexpr int BN = {render.BLOCK_N};" in dense
    causal = render.render(_variant("fp32", 64, 2, 2, "self", "  mask causal\n"))
    assert f"constexpr int BM = {render.MASKED_BLOCK_M};" in causal
    assert f"constexpr int BN = {render.MASKED_BLOCK_N};" in causal
    # fp32 keys and values are read in place; converted dtypes are converted into contiguous
    # rows first (kb), then both transpose keys in registers.
    bf16 = render.render(_variant("bf16", 64, 2, 2, "self", ""))
    assert "ag_transpose16(kr + j0" in dense and "ag_transpose16(kr + j0" in bf16
    assert "float* kx = w.kb + j * D;" in bf16 and "float* kx = w.kb + j * D;" not in dense
