"""The backward ablation script's CPU parts: every ablation finds its text in the rendered wgmma
backward of every row (so a template change cannot silently turn one into the base kernel), each
removes something, and every ablated source still compiles for sm_90a; under the tile and wg dQ
modes the ablations whose part that kernel has apply too, and the others are refused (recorded as
skipped)."""

from __future__ import annotations

import shutil

import pytest

from attngen.cuda import render_bwd
from attngen.cuda.compile import nvcc
from attngen.lang import frontend
from attngen.plan import bwd as plan_bwd
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


def _forced_src(bench, mode: str, monkeypatch) -> str:
    """The D128 causal row's source with the dQ mode forced to `mode` (WG_DQ restored after the test)."""
    for bm, m in list(plan_bwd.WG_DQ.items()):
        monkeypatch.setitem(plan_bwd.WG_DQ, bm, m)
    plan_bwd.force_wg_dq(mode)
    return _src(bench, "d128_l16k_causal")


def test_tile_mode_ablations(monkeypatch) -> None:
    bench = _benchmarks.load("bwd_ablate")
    src = _forced_src(bench, "tile", monkeypatch)
    assert "ag_red_add2(row" not in src
    # the step's bulk reduction is what no_dq_red removes here
    assert "ag_bulk_reduce_add(p.ws_dq" in src and "ag_bulk_reduce_add(p.ws_dq" not in bench.ablate(src, "no_dq_red")
    for what in ("no_loop_bar", "no_exp", "no_steps", "no_dkdv"):
        assert bench.ablate(src, what) != src, what
    for what in ("no_dq", "no_dq_bar", "no_dq_store", "no_dq_handoff"):
        with pytest.raises(ValueError, match="expected text"):
            bench.ablate(src, what)


def test_dq_warpgroup_mode_ablations(monkeypatch) -> None:
    bench = _benchmarks.load("bwd_ablate")
    src = _forced_src(bench, "wg", monkeypatch)
    # whole tiles by v4 reductions of lane pairs, a head's last partial tile by v2
    assert "ag_red_add2(row" not in src and src.count("ag_red_add2(g") == 2 and src.count("ag_red_add4(g4") == 1
    # the dQ warpgroup's reductions are what no_dq_red removes; its hand-off through shared memory stays
    cut = bench.ablate(src, "no_dq_red")
    assert "ag_red_add2(g" not in cut and "ag_red_add4(g4" not in cut
    assert "ag_wg_dq_adder(p, ag_smem" in cut and "ag_nbar_arrive(DQ_FULL_BAR" in cut
    for what in ("no_exp", "no_steps", "no_dkdv"):
        assert bench.ablate(src, what) != src, what
    # its consumers meet at a named barrier, which the barrier ablations find in place of __syncthreads
    assert "ag_nbar_sync(CONS_BAR, WG_THREADS);" not in bench.ablate(src, "no_loop_bar").split("while (cur < end)")[1].split("const int cls")[0]
    no_dq = bench.ablate(src, "no_dq")
    assert "ag_nbar_arrive(DQ_FULL_BAR + dq_buf" in no_dq and no_dq.count("ag_nbar_arrive(DQ_FULL_BAR + dq_buf") == 1  # only the stop header's
    assert bench.ablate(src, "no_dq_bar") != src
    # the hand-off's parts: the stores alone (barriers and header kept), or all of it with the dQ
    # product kept; cuts without the hand-off keep the buffer index at 0 (the stop header's buffer
    # is then the one the dQ warpgroup waits on first, whatever the step count)
    turn = "    dq_buf ^= 1;\n"
    assert "buf[j * WG_THREADS + tid] = make_float4" not in bench.ablate(src, "no_dq_store")
    assert bench.ablate(src, "no_dq_store").count("ag_nbar_arrive(DQ_FULL_BAR + dq_buf") == 2 and turn in bench.ablate(src, "no_dq_store")
    handoff = bench.ablate(src, "no_dq_handoff")
    assert "ag_nbar_sync(DQ_EMPTY_BAR + dq_buf, WG_CTA_THREADS);\n    {" not in handoff and turn not in handoff
    assert handoff.count("ag_nbar_arrive(DQ_FULL_BAR + dq_buf") == 1 and handoff.count("ag_wgmma_ss_n") == src.count("ag_wgmma_ss_n")
    assert turn in src and turn not in no_dq


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on the PATH")
def test_ablated_sources_compile_for_sm90a() -> None:
    bench = _benchmarks.load("bwd_ablate")
    src = _src(bench, "d128_l16k_causal")
    for what in bench.ABLATIONS[1:]:
        nvcc(bench.ablate(src, what), Arch.SM90A, "cubin")
