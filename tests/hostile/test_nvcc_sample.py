"""Whatever `check` accepts compiles: accepted specs through nvcc for sm_90a and sm_80.

A generated sample (the fuzzer's valid-spec strategy and this layer's hostile one; ATTNGEN_NVCC_SAMPLE
specs, 300 by default: a few minutes on 2 cores) and the hand-written hostile specs that are
expected to be accepted. Compiles run in parallel (nvcc_check.NvccChecker, one job a core).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from attngen.lang import frontend
from attngen.cuda import nvcc_check
from attngen.lang.diagnostics import SpecError
from attngen.check.fuzz import spec_strategy

from ._hostile import expectation
from .test_hostile_specs import _many_inputs, hostile_spec

pytestmark = pytest.mark.nvcc

SAMPLE = int(os.environ.get("ATTNGEN_NVCC_SAMPLE", "300"))
SPECS = sorted((Path(__file__).parent / "specs").glob("*.attn"))


def _failures(checker: nvcc_check.NvccChecker) -> str:
    return "\n\n".join(f"{f.variant} on {f.arch.value}:\n{f.message[-1500:]}\n--- spec ---\n{f.spec_text[:3000]}"
                       for f in checker.failures)


def test_hand_written_accepted_specs_compile():
    checker = nvcc_check.NvccChecker()
    for p in SPECS:
        text = p.read_text(encoding="utf-8")
        if expectation(text)[0] == "ok":
            checker.submit(text, frontend.loads(text, p.name).variants)
    # The parameter-space boundary: 581 rank-4 inputs is the most `check` takes.
    big = _many_inputs(581, "B, H, Lq, Lk")
    checker.submit(big, frontend.loads(big).variants)
    checker.wait()
    assert not checker.failures, _failures(checker)
    assert checker.compiled >= 2 * 8


@pytest.mark.slow
def test_generated_accepted_specs_compile():
    texts: list[str] = []

    @settings(max_examples=SAMPLE, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck),
              phases=(Phase.generate,))
    @given(st.one_of(spec_strategy(), hostile_spec()))
    def collect(text: str) -> None:
        texts.append(text)

    collect()
    checker = nvcc_check.NvccChecker()
    for text in texts:
        try:
            prog = frontend.loads(text)
        except SpecError:
            continue
        checker.submit(text, prog.variants)
    checker.wait()
    print(checker.summary())
    assert not checker.failures, _failures(checker)
    assert checker.specs >= SAMPLE // 3, checker.summary()
