"""Every variant of every examples/*.attn spec against the reference at a few random shapes."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings

from attngen.lang import frontend
from attngen.check import fuzz
from gpu_helpers import check_case, examples

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.attn"))


def _variants() -> list:
    out = []
    for p in EXAMPLES:
        for v in frontend.load(p).variants:
            out.append(pytest.param(v, id=f"{p.stem}:{v.name}"))
    return out


@pytest.mark.gpu
@pytest.mark.parametrize("v", _variants())
def test_example_matches_reference(v) -> None:
    # Many heads (BLOOM's 112) make each example costlier; the work cap in case_strategy bounds it.
    @settings(max_examples=examples(1 / 25, minimum=4))
    @given(fuzz.case_strategy(v, max_len=1024))
    def run(case: fuzz.Case) -> None:
        check_case(v, case)

    run()
