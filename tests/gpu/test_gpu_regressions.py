"""Every bug the fuzzer found, as a minimal spec under regressions/ with its failing case on the
first line (`# case: B=.. Lq=.. Lk=.. dist=.. seed=.. [q_lens=a,b] [kv_lens=a,b]`)."""

from __future__ import annotations

from pathlib import Path

import pytest
from gpu_helpers import check_case

from attngen.lang import frontend
from attngen.check import fuzz

REGRESSIONS = sorted((Path(__file__).parent / "regressions").glob("*.attn"))


def case_of(path: Path) -> fuzz.Case:
    first = path.read_text(encoding="utf-8").splitlines()[0]
    assert first.startswith("# case:"), f"{path.name}: the first line must be '# case: ...'"
    kw: dict = {}
    for item in first.removeprefix("# case:").split():
        key, val = item.split("=", 1)
        if key in ("B", "Lq", "Lk", "seed"):
            kw[key] = int(val)
        elif key in ("q_lens", "kv_lens"):
            kw[key] = tuple(int(x) for x in val.split(","))
        else:
            kw[key] = val
    return fuzz.Case(**kw)


def test_regressions_parse() -> None:
    assert REGRESSIONS, "no regression specs found"
    for p in REGRESSIONS:
        frontend.load(p)
        case_of(p)


@pytest.mark.gpu
@pytest.mark.parametrize("path", REGRESSIONS, ids=lambda p: p.stem)
def test_regression(path: Path) -> None:
    for v in frontend.load(path).variants:
        check_case(v, case_of(path))
