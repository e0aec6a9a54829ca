"""Every example variant's CPU forward matches the float64 reference under the GPU's tolerances
(`attngen.check.tolerance`), at two small shapes each: lengths off every tile boundary, B > 1."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from attngen.check import reference, tolerance, workload
from attngen.ir.nodes import AttnKind
from attngen.plan.validate import load

ROOT = Path(__file__).resolve().parents[2]
VARIANTS = [(p.name, v) for p in sorted((ROOT / "examples").glob("*.attn")) for v in load(p).variants]


def _shapes(v):
    if v.kind == AttnKind.SELF:
        return [(2, 37, 37), (1, 80, 80)]
    return [(2, 5, 77), (1, 19, 130)]


def check_against_reference(kernel, v, B, Lq, Lk, seed=0, dist="normal"):
    """Runs `kernel` on workload inputs into NaN-poisoned outputs; asserts O (and LSE) pass."""
    from attngen.check.fuzz_run import run_kernel

    rng = np.random.default_rng(seed)
    arrays = workload.make_inputs(v, B, Lq, Lk, rng, dist)
    o, lse = run_kernel(kernel, v, arrays)
    q, k, vv = arrays["q"], arrays["k"], arrays["v"]
    rest = {n: a for n, a in arrays.items() if n not in ("q", "k", "v")}
    ro, rl = reference.attention(v, q, k, vv, rest)
    se = reference.score_error(v, q, k, rest)
    rep = tolerance.check(o, ro, v.dtype, score_err=se)
    assert rep.ok, rep.summary()
    if v.lse:
        rep = tolerance.check_lse(lse, rl, v.dtype, score_err=se)
        assert rep.ok, rep.summary()


@pytest.mark.parametrize("v", [v for _, v in VARIANTS], ids=[f"{f}:{v.name}" for f, v in VARIANTS])
def test_example_matches_reference(v, cpu_kernel):
    k = cpu_kernel(v)
    for i, (B, Lq, Lk) in enumerate(_shapes(v)):
        check_against_reference(k, v, B, Lq, Lk, seed=i)
