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
    # Dv 256 with an o post-norm: mma.sync on sm_90a as well (schedule.variant_tile).
    "hd256_onorm_nan_sink": (
        "attention hd256_onorm_nan_sink {\n  dtype bf16\n  head_dim 256\n  heads 4 kv 2\n  input sinks0: fp32[H]\n"
        "  mask causal\n  norm o layernorm(1e-5)\n  nan_check\n  sink sinks0\n}\n"),
    "hd256_gqa_causal_lse": (
        "attention hd256_gqa_causal_lse {\n  dtype bf16\n  head_dim 256\n  heads 8 kv 4\n  kind cross\n"
        "  mask causal\n  output lse\n}\n"),
}

# Other tiles of the benchmark's causal D256 and D192/128 specs, for `headdim_bench.py --sweep`
# (the auto tiles' alternatives within the register and shared-memory limits).
SWEEP_TILES: dict[str, tuple[tuple[int, int, int, int], ...]] = {
    "hd256_causal": ((128, 64, 8, 2), (128, 32, 8, 3), (128, 48, 8, 2)),
    "hd192_causal": ((128, 64, 8, 3), (128, 96, 8, 2), (128, 112, 8, 2)),
}


def swept(name: str, tile: tuple[int, int, int, int]) -> str:
    """The spec text of `name` with a tile hint, as a variant of its own name."""
    bm, bn, w, st = tile
    new = f"{name}_{bm}x{bn}w{w}s{st}"
    return HEADDIM_SPECS[name].replace(f"attention {name} ", f"attention {new} ").replace(
        "\n}\n", f"\n  tile block_m {bm} block_n {bn} warps {w} stages {st}\n}}\n")


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
    ("hd256_onorm_nan_sink", "sm_90a", ((1, 1, 1), (2, 130, 130), (1, 401, 401))),
]
# Specs that plan to mma.sync on sm_90a too; the rest run on wgmma there.
MMA_ON_SM90A = frozenset({"hd256_onorm_nan_sink"})


@functools.lru_cache(maxsize=None)
def compiled(name: str, arch: str, tile: tuple[int, int, int, int] | None = None):
    """(variant, forward kernel) of a spec (with a tile hint from SWEEP_TILES) for an arch, built
    once a process."""
    from attngen.lang import frontend
    from attngen.runtime import kernel as runtime

    text = HEADDIM_SPECS[name] if tile is None else swept(name, tile)
    v = frontend.loads(text, "<headdim>").get(None)
    return v, runtime.compile(v, arch=arch, family="forward")
