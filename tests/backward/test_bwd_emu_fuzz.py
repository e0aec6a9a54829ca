"""Generated specs (`fuzz.spec_strategy`) through the tensor-core backward engines on the CPU under
the execution-model emulation (`_host_emu.py`): mma.sync (sm_80-89's dK/dV engine) and wgmma
(sm_90a's), against the float64 reference backward with `attngen fuzz --pass backward`'s own inputs
and tolerance policy (`fuzz_bwd.backward_inputs`, `fuzz_bwd.compare_backward`): the backward fuzzed
without a GPU."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _host_emu  # noqa: E402

from attngen.check import fuzz, fuzz_bwd, reference  # noqa: E402
from attngen.cuda import render_bwd  # noqa: E402
from attngen.ir.nodes import NormTarget  # noqa: E402
from attngen.lang import frontend  # noqa: E402
from attngen.plan import bwd as plan_bwd  # noqa: E402
from attngen.plan.bwd import BwdEngine  # noqa: E402
from attngen.plan.schedule import Arch  # noqa: E402

pytestmark = pytest.mark.skipif(_host_emu.available() is not None, reason=f"no host emulation: {_host_emu.available()}")


def _check(text: str, data, arch: Arch, engine: BwdEngine, max_len: int, max_work: int) -> None:
    v = frontend.loads(text, "<fuzz>").get()
    assume(v.dtype.value in ("fp16", "bf16") and v.layout.value != "varlen" and not plan_bwd.unsupported(v))
    try:
        src, bp = render_bwd.render_with_plan(v, arch)
    except ValueError:
        assume(False)
    assume(bp.engine == engine)
    case = data.draw(fuzz.case_strategy(v, max_len=max_len, max_work=max_work), label="case")
    assume(case.B * case.Lq * case.Lk <= max_work)
    arrays, dO = fuzz_bwd.backward_inputs(v, case)
    wrt = fuzz_bwd.wrt_names(v)
    if v.norm(NormTarget.O) is not None:
        o, lse = _host_emu.pre_norm_forward(v, arrays)  # the training forward's O' before the post-norm
    else:
        q, k, vv, rest = fuzz.split_inputs(arrays)
        o, lse = reference.attention(v, q, k, vv, rest)
    got = _host_emu.run(src, bp, v, arrays, lse, dO, o, wrt=wrt)
    bad = [r.summary() for r in fuzz_bwd.compare_backward(v, arrays, dO, got, wrt) if not r.ok]
    assert not bad, f"{text}\nat {case.describe()}:\n" + "\n".join(bad)


# A random campaign: ATTNGEN_EMU_EXAMPLES=N HYPOTHESIS_PROFILE=dev (not derandomized, unlike CI's
# profile) runs N generated specs through each engine instead of the few CI draws.
_EXAMPLES = int(os.environ.get("ATTNGEN_EMU_EXAMPLES", "0"))


@settings(max_examples=_EXAMPLES or 10, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(text=fuzz.spec_strategy(), data=st.data())
def test_generated_specs_on_the_mma_backward_match_the_reference(text, data) -> None:
    _check(text, data, Arch.SM80, BwdEngine.MMA, 160, 1 << 15)


@settings(max_examples=_EXAMPLES or 6, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(text=fuzz.spec_strategy(), data=st.data())
def test_generated_specs_on_the_wgmma_backward_match_the_reference(text, data) -> None:
    _check(text, data, Arch.SM90A, BwdEngine.WGMMA, 200, 1 << 15)
