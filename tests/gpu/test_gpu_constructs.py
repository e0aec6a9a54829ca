"""Constructs the dtype/mask grid and the examples leave out: layernorm and affine-free norms on
q/k/o, a value head dim different from the key's, small and deep tiles, bias tensors in half
precision, block masks in i32, cross-attention documents, u8 keep masks, steep softcaps in fp16,
and scale 1.0 on large inputs. Each spec runs at an odd shape and at tile-boundary shapes."""

from __future__ import annotations

import pytest
from gpu_helpers import check_case, variant_of

from attngen.check import fuzz

SPECS = {
    "k_layernorm": "dtype fp16; head_dim 64; heads 4 kv 2; mask causal; norm k layernorm(1e-5)",
    "qk_layernorm_noaffine": "dtype bf16; head_dim 128; heads 2; norm q layernorm(1e-5) affine false; norm k layernorm(1e-6) affine false",
    "o_layernorm": "dtype fp16; head_dim 64; heads 2; mask causal; norm o layernorm(1e-5)",
    "dv_differs_bf16": "dtype bf16; head_dim 128 value 64; heads 4 kv 1; mask causal",
    "dv_differs_fp32": "dtype fp32; head_dim 32 value 96; heads 2; kind cross; layout bshd",
    "tile_1warp": "dtype fp16; head_dim 64; heads 2; mask causal; tile block_m 16 block_n 16 warps 1 stages 1",
    "tile_2warps_3stages": "dtype bf16; head_dim 96; heads 2; mask window(40, 3); tile block_m 64 block_n 32 warps 2 stages 3",
    "tile_8warps_2rows": "dtype bf16; head_dim 32; heads 2; mask padding; tile block_m 128 block_n 16 warps 4 stages 4",
    "bias_fp16": "dtype fp16; head_dim 64; heads 2; input bb: fp16[H, Lq, Lk]; score bias(bb)",
    "bias_bf16_rank4": "dtype bf16; head_dim 64; heads 2; input bb: bf16[B, H, Lq, Lk]; mask causal; score bias(bb)",
    "rel_bias": "dtype fp16; head_dim 64; heads 4; input rel: fp32[H, 33]; score rel_bias(rel, 16)",
    "block_sparse_i32": "dtype bf16; head_dim 64; heads 2; input blk: i32[B, H, QB, KB]; mask block_sparse(blk, 64, 64)",
    "document_cross": "dtype fp16; head_dim 64; heads 2; kind cross; input qd: i32[B, Lq] sorted; input kd: i32[B, Lk] sorted; mask document(qd, kd)",
    "keep_u8": "dtype bf16; head_dim 64; heads 2; input keep: u8[B, Lk]; mask keep[b, kv] != 0 || causal",
    "softcap5_fp16": "dtype fp16; head_dim 64; heads 2; mask causal; score softcap(5.0)",
    "tanh_score_fp16": "dtype fp16; head_dim 128; heads 2; score tanh(s) * 3.0; score min(s, 2.0)",
    # FFMA register tiles: one warp, 32 and 64 rows, 32-key warp slices (GQA, LSE).
    "fp32_tile_1warp": "dtype fp32; head_dim 32; heads 2; mask causal; tile block_m 16 block_n 16 warps 1 stages 1",
    "fp32_tile_32rows": "dtype fp32; head_dim 64; heads 2 kv 1; mask window(40, 3); tile block_m 32 block_n 64 warps 4 stages 1",
    "fp32_tile_64rows_2warps": "dtype fp32; head_dim 32; heads 2; mask padding; tile block_m 64 block_n 32 warps 2 stages 1",
    "fp32_tile_slices32": "dtype fp32; head_dim 128; heads 4 kv 2; mask causal; output lse; tile block_m 16 block_n 128 warps 4 stages 1",
    "scale1_fp32": "dtype fp32; head_dim 64; heads 2; scale 1.0; mask causal",
    "nan_check_residual": "dtype bf16; head_dim 64; heads 2; layout bshd; residual; nan_check; output lse",
}


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(SPECS))
def test_construct(name: str) -> None:
    v = variant_of(f"attention c_{name} {{ {SPECS[name]} }}")
    cross = v.kind.value == "cross"
    shapes = [(2, 77, 130 if cross else 77), (1, 128, 64 if cross else 128), (3, 200, 333 if cross else 200)]
    for i, (B, Lq, Lk) in enumerate(shapes):
        for dist in ("normal", "large"):
            check_case(v, fuzz.Case(B=B, Lq=Lq, Lk=Lk, dist=dist, seed=17 * i + (dist == "large")))
