"""Generated specs (`fuzz.spec_strategy`: masks, score modifications, norms, residual, GQA, layouts,
tiles) rendered for the tensor-core forward engines and run on the CPU under the emulation
(`_fwd_emu.py`) against the float64 reference, on hypothesis-drawn shapes: sm_80's mma.sync engine
(which the GPU suite runs only where a test builds it for sm_90) and sm_90a's wgmma engine, fuzzed
without a GPU."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _fwd_emu  # noqa: E402

from attngen.check import fuzz, reference, tolerance  # noqa: E402
from attngen.cuda import render  # noqa: E402
from attngen.lang import frontend  # noqa: E402
from attngen.plan.schedule import Arch, Engine  # noqa: E402

pytestmark = pytest.mark.skipif(_fwd_emu.available() is not None, reason=f"no host emulation: {_fwd_emu.available()}")


def _check(text: str, data, workdir: str, arch: Arch, engine: Engine, max_work: int) -> None:
    v = frontend.loads(text, "<fuzz>").get()
    assume(v.dtype.value in ("fp16", "bf16") and v.layout.value != "varlen")
    try:
        src, kp = render.render_with_plan(v, arch)
    except ValueError:
        assume(False)
    assume(kp.engine == engine)
    case = data.draw(fuzz.case_strategy(v, max_len=3 * kp.tile.block_m // 2, max_work=max_work), label="case")
    assume(case.B * case.Lq * case.Lk <= max_work)
    arrays = fuzz.case_inputs(v, case)
    # mma.sync: the first and the last query head (of the last kv group); the persistent wgmma
    # kernel runs them all
    heads = tuple(sorted({0, v.heads - 1})) if engine == Engine.MMA_SYNC else None
    o, lse = _fwd_emu.run(src, kp, v, arrays, workdir=workdir, timeout=300, heads=heads)
    q, k, vv, rest = fuzz.split_inputs(arrays)
    o_ref, lse_ref = reference.attention(v, q, k, vv, rest)
    se = reference.score_error(v, q, k, rest)
    axis = 1 if v.layout.value == "bhsd" else 2
    hs = list(heads or range(v.heads))
    reports = [tolerance.check(np.take(o, hs, axis), np.take(o_ref, hs, axis), v.dtype, "O", score_err=se)]
    if v.lse:
        reports.append(tolerance.check_lse(lse[:, hs], lse_ref[:, hs], v.dtype, "LSE", score_err=se))
    bad = [r.summary() for r in reports if not r.ok]
    assert not bad, f"{text}\nat {case.describe()}:\n" + "\n".join(bad)


# A random campaign: ATTNGEN_EMU_EXAMPLES=N HYPOTHESIS_PROFILE=dev (not derandomized, unlike CI's
# profile) runs N generated specs through each engine instead of the few CI draws.
_EXAMPLES = int(os.environ.get("ATTNGEN_EMU_EXAMPLES", "0"))


@settings(max_examples=_EXAMPLES or 12, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(text=fuzz.spec_strategy(), data=st.data())
def test_generated_specs_on_the_mma_engine_match_the_reference(text, data, tmp_path_factory) -> None:
    _check(text, data, str(tmp_path_factory.mktemp("emu")), Arch.SM80, Engine.MMA_SYNC, 1 << 17)


@settings(max_examples=_EXAMPLES or 6, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(text=fuzz.spec_strategy(), data=st.data())
def test_generated_specs_on_the_wgmma_engine_match_the_reference(text, data, tmp_path_factory) -> None:
    _check(text, data, str(tmp_path_factory.mktemp("emu")), Arch.SM90A, Engine.WGMMA, 1 << 16)
