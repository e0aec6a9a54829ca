"""The backward ablation script's CPU parts: every ablation finds its text in the rendered wgmma
backward of both rows (so a template change cannot silently turn one into the base kernel), each
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


@pytest.mark.parametrize("row", ["d128_l16k_dense", "d128_l16k_causal"])
def test_every_ablation_applies_and_differs(row: str) -> None:
    bench = _benchmarks.load("bwd_ablate")
    src, bp = render_bwd.render_with_plan(frontend.loads(bench.spec_text(row)).get(), Arch.SM90A)
    assert bp.engine == BwdEngine.WGMMA
    seen = {bench.ablate(src, "base")}
    for what in bench.ABLATIONS[1:]:
        out = bench.ablate(src, what)
        assert out not in seen, what
        assert len(out) < len(src), what
        seen.add(out)
    with pytest.raises(ValueError, match="expected text"):
        bench.ablate(src.replace("__syncthreads", "__syncthreads_x"), "no_loop_bar")


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on the PATH")
def test_ablated_sources_compile_for_sm90a() -> None:
    bench = _benchmarks.load("bwd_ablate")
    src, _ = render_bwd.render_with_plan(frontend.loads(bench.spec_text("d128_l16k_causal")).get(), Arch.SM90A)
    for what in bench.ABLATIONS[1:]:
        nvcc(bench.ablate(src, what), Arch.SM90A, "cubin")
