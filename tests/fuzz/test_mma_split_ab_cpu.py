"""The mma.sync split A/B benchmark's CPU parts: every case is a valid spec that runs on the
mma.sync forward and backward engines and the wgmma backward and splits, its two modes render the two forms (and put
the gate back), and the script refuses to time without a GPU."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from attngen.cuda import render, render_bwd
from attngen.lang import frontend
from attngen.plan.bwd import BwdEngine
from attngen.plan.schedule import Arch, Engine

import _benchmarks

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("D", [64, 128])
def test_cases_split_in_split_mode_only(D: int) -> None:
    bench = _benchmarks.load("mma_split_ab")
    cases = bench._cases(np.random.default_rng(0))
    assert [c[0] for c in cases] == ["doc_random", "doc_uniform1024", "prefix_lm", "padding"]
    gate = render.MMA_SPLIT_MAX_HEAD_DIM
    for label, mask, rt in cases:
        v = frontend.loads(f"attention a {{ dtype bf16; head_dim {D}; heads {bench.H}; {mask}; output lse; {bench.TILE} }}").get()
        assert {d.name for d in v.runtime_inputs()} == set(rt)
        for a in rt.values():
            assert a.dtype == np.int32 and a.shape[0] == bench.B
        for mode in ("plain", "split"):
            with bench._mode(mode):
                src, kp = render.render_with_plan(v, Arch.SM90A)  # the H200's arch: the tile selects mma.sync
                bsrc, bp = render_bwd.render_with_plan(v, Arch.SM90A, engine=BwdEngine.MMA)
                wsrc, wp = render_bwd.render_with_plan(v, Arch.SM90A, engine=BwdEngine.WGMMA)
            assert kp.engine == Engine.MMA_SYNC and bp.engine == BwdEngine.MMA and wp.engine == BwdEngine.WGMMA
            for text in (src, bsrc, wsrc):
                assert ("emit.split_by_axis" in text) == (mode == "split"), (label, mode)
        assert render.MMA_SPLIT_MAX_HEAD_DIM == render_bwd.MMA_SPLIT_MAX_HEAD_DIM == gate
        assert render._fwd_split.__name__ == "_fwd_split" and render_bwd._bwd_split_ctx.__name__ == "_bwd_split_ctx"


def test_refuses_without_a_gpu(tmp_path) -> None:
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "mma_split_ab.py"), "--out", str(tmp_path / "x.jsonl")],
                       capture_output=True, text=True, timeout=120)
    try:
        import torch

        gpu = torch.cuda.is_available()
    except Exception:
        gpu = False
    if gpu:
        pytest.skip("a GPU is present: the script would time")
    assert r.returncode == 2 and "mma_split_ab:" in r.stderr
