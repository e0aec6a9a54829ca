"""The head-dim-256 and 192/128 specs of the GPU checks and benchmarks/headdim_bench.py (one text
each, so that a device run builds each kernel once: the on-disk compile cache is keyed by source)."""

from __future__ import annotations

import functools

HEADDIM_SPECS: dict[str, str] = {
    # The benchmark's shapes (B4 H16 L8k) and the tests' plain cases.
    "hd256_dense": "attention hd256_dense {\n  dtype bf16\n  head_dim 256\n  heads 16\n  layout bshd\n}\n",
    "hd256_causal": "attention hd256_causal {\n  dtype bf16\n  head_dim 256\n  heads 16\n  layout bshd\n  mask causal\n}\n",
    "hd192_causal": "attention hd192_causal {\n  dtype bf16\n  head_dim 192 value 128\n  heads 16\n  layout bshd\n  mask causal\n}\n",
    # Feature cases: GQA, cross lengths, window, softcap, LSE, fp16.
    "hd256_gqa_window_softcap": (
        "attention hd256_gqa_window_softcap {\n  dtype fp16\n  head_dim 256\n  heads 8 kv 2\n  kind cross\n"
        "  mask causal && window(100, 0)\n  score softcap(50.0)\n  output lse\n}\n"),
    "hd192_gqa_window_softcap": (
        "attention hd192_gqa_window_softcap {\n  dtype fp16\n  head_dim 192 value 128\n  heads 8 kv 1\n  kind cross\n"
        "  layout bshd\n  mask causal && window(300, 20)\n  score softcap(30.0)\n  output lse\n}\n"),
    "hd256_gqa_causal_lse": (
        "attention hd256_gqa_causal_lse {\n  dtype bf16\n  head_dim 256\n  heads 8 kv 4\n  kind cross\n"
        "  mask causal\n  output lse\n}\n"),
}

# (spec, arch, (B, Lq, Lk) cases). sm_90a: the wgmma engine; sm_90: mma.sync (runs on a 9.0 device).
# Self-attention specs take Lq == Lk; lengths are odd so that query and key tiles end partial.
GPU_CASES: list[tuple[str, str, tuple[tuple[int, int, int], ...]]] = [
    ("hd256_dense", "sm_90a", ((1, 1, 1), (2, 77, 77), (1, 555, 555))),
    ("hd256_causal", "sm_90a", ((1, 129, 129), (1, 899, 899))),
    ("hd192_causal", "sm_90a", ((1, 1, 1), (2, 211, 211), (1, 901, 901))),
    ("hd256_gqa_window_softcap", "sm_90a", ((2, 1, 700), (1, 333, 517), (1, 1025, 97))),
    ("hd192_gqa_window_softcap", "sm_90a", ((2, 65, 1000), (1, 777, 777))),
    ("hd256_gqa_causal_lse", "sm_90a", ((1, 200, 1333), (3, 45, 45))),
    ("hd256_gqa_window_softcap", "sm_90", ((2, 1, 700), (1, 333, 517))),
    ("hd192_gqa_window_softcap", "sm_90", ((2, 65, 1000), (1, 777, 777))),
    ("hd256_causal", "sm_90", ((1, 129, 129), (1, 501, 501))),
]


@functools.lru_cache(maxsize=None)
def compiled(name: str, arch: str):
    """(variant, forward kernel) of a spec for an arch, built once a process."""
    from attngen.lang import frontend
    from attngen.runtime import kernel as runtime

    v = frontend.loads(HEADDIM_SPECS[name], "<headdim>").get(None)
    return v, runtime.compile(v, arch=arch, family="forward")
