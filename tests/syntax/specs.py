"""Valid specs shared by the syntax tests (the fuzzer mutates them; the formatter reformats them)."""

VALID_SPECS = [
    """# Gemma-2 local layer: GQA, causal sliding window, logit softcap
attention gemma_local {
  dtype bf16; head_dim 128; heads 16 kv 8; layout bshd
  mask  causal && window(4096, 0)
  score softcap(50.0)
  tile  block_m 128 block_n 64 warps 4 stages 2
}
""",
    """attention doc {  # packed sequences
  dtype fp16
  head_dim 64
  heads 8 kv 1
  input ids: i32[B, Lk] sorted
  input plen: i32[B]
  mask (document(ids) && causal) || prefix(plen[b])   # prefix-LM per document

  # a custom score
  score s - 0.5 * abs(q - kv) / 1e3
  output lse; nan_check
}
""",
    """attention preln_cross {
  dtype bf16; head_dim 64; heads 16; kind cross; layout bshd
  norm q layernorm(1e-5) scope token
  norm k rmsnorm(1e-6) affine false
  residual
  scale 0.125
  input bm: u8[H, nqb, nkb]
  mask padding && block_sparse(bm, 64, 64)
  score alibi
  tile auto
}
attention rel {
  dtype fp32; head_dim 32 value 32; heads 4
  input rb: fp32[H, 9]
  input bias_t: fp32[B, H, Lq, Lk]
  score rel_bias(rb, 4)
  score bias(bias_t) + where(kv > q, -s, tanh(s)) * min(D, Dv)
  norm o rmsnorm(1e-5)
}
""",
]
