"""Odd shapes through the backward kernels, for compute-sanitizer (memcheck / racecheck):

    compute-sanitizer --tool memcheck python3 tools/sanitize_bwd_cases.py [--quick]

Each case runs the backward (tensor-core engine for fp16/bf16, FFMA for fp32; atomics and
deterministic dQ) and compares dq, dk, dv with the float64 reference, as tests/gpu/test_gpu_backward.py
does; exits non-zero if any disagrees (the sanitizer reports access errors and hazards itself)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "gpu"))

import test_gpu_backward as T  # noqa: E402

CASES = [
    ("bf16_gqa4_local_softcap", (1, 17, 17)),
    ("bf16_gqa4_local_softcap", (2, 200, 200)),
    ("fp16_padding_mqa_cross", (2, 33, 129)),
    ("bf16_bias_gqa", (1, 1, 1)),
    ("fp16_learnable", (1, 70, 70)),
    ("fp32_causal_softcap_gqa", (1, 65, 65)),
    ("fp32_document_cross", (2, 40, 90)),
]


QUICK = CASES[:2] + CASES[4:6]  # racecheck is slow: the GQA local softcap, the learnable bias, fp32


def main() -> int:
    cases = QUICK if "--quick" in sys.argv[1:] else CASES
    bad = 0
    for name, (B, Lq, Lk) in cases:
        v = T._variant(name)
        for det in (False, True):
            try:
                T._check(v, T._case(v, B, Lq, Lk, seed=11, empty=True), det)
                print(f"ok   {name} B={B} Lq={Lq} Lk={Lk} deterministic={det}", flush=True)
            except AssertionError as e:
                bad += 1
                print(f"BAD  {name} B={B} Lq={Lq} Lk={Lk} deterministic={det}: {e}", flush=True)
    print(f"sanitize bwd cases: {2 * len(cases) - bad} passed, {bad} failed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
