"""The backward ablation script's CPU parts: every ablation finds its text in the rendered wgmma
backward of every row (so a template change cannot silently turn one into the base kernel), each
removes something, and every ablated source still compiles for sm_90a."""

from __future__ import annotations

import shutil

import pytest

from attngen.cuda import render_bwd
from attngen.cuda.compile import nvcc
from attngen.lang import frontend
from attngen.plan.bwd import BwdEngine
from attngen.plan.schedule import Arch

import _benchmarks

ROWS = ["d128_l16k_dense", "d128_l16k_causal", "d128_l2k_causal", "d128_l16k_window"]


def _src(bench, row: str) -> str:
    src, bp = render_bwd.render_with_plan(frontend.loads(bench.spec_text(row)).get(), Arch.SM90A)
    assert bp.engine == BwdEngine.WGMMA
    return src


@pytest.mark.parametrize("row", ROWS)
def test_every_ablation_applies_and_differs(row: str) -> None:
    bench = _benchmarks.load("bwd_ablate")
    assert sorted(bench.ROWS) == sorted(ROWS)
    src = _src(bench, row)
    seen = {bench.ablate(src, "base")}
    for what in bench.ABLATIONS[1:]:
        out = bench.ablate(src, what)
        assert out not in seen, what
        assert out != src, what
        seen.add(out)
    # no_dq takes the dQ product out but keeps the next step's loads issued under it
    assert src.count("    prefetch();\n") == 1 and "  prefetch();\n  ag_wgmma_wait<0>();" in bench.ablate(src, "no_dq")
    with pytest.raises(ValueError, match="expected text"):
        bench.ablate(src.replace("__syncthreads", "__syncthreads_x").replace("ag_nbar_sync(CONS_BAR", "ag_nbar_sync_x(CONS_BAR"), "no_loop_bar")


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on the PATH")
def test_ablated_sources_compile_for_sm90a() -> None:
    bench = _benchmarks.load("bwd_ablate")
    src = _src(bench, "d128_l16k_causal")
    for what in bench.ABLATIONS[1:]:
        nvcc(bench.ablate(src, what), Arch.SM90A, "cubin")
