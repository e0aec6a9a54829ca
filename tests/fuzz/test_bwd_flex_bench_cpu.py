"""The backward-against-Flex benchmark's CPU parts: every row is a valid spec that trains on the
sm_90a wgmma backward, matches the suite's workload of the same name but for the LSE, and the
script refuses to time without a GPU."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from attngen.lang import frontend
from attngen.plan.bwd import BwdEngine, plan as plan_bwd
from attngen.plan.schedule import Arch

import _benchmarks

ROOT = Path(__file__).resolve().parents[2]


_load = _benchmarks.load


@pytest.mark.parametrize("row", ["sliding_window_1024", "document_causal_16", "causal_softcap_30"])
def test_rows_train_on_the_wgmma_backward_as_the_suite_workloads(row: str) -> None:
    bench = _load("bwd_flex_bench")
    suite = _load("suite")
    v = frontend.loads(bench.spec_text(row)).get()
    assert v.lse and (v.head_dim, v.heads) == (bench.D, bench.H)
    assert plan_bwd(v, Arch.SM90A).engine == BwdEngine.WGMMA
    s = frontend.loads(suite.SPECS[row]).get()
    assert (s.mask, s.scores, s.head_dim, s.heads, s.dtype) == (v.mask, v.scores, v.head_dim, v.heads, v.dtype)
    w = next(w for w in suite.WORKLOADS if w.name == row)
    assert w.B == bench.B and w.Lq == w.Lk and w.Lq in bench.LENGTHS  # the suite row is one of the bar's lengths


def test_without_a_gpu_nothing_is_timed() -> None:
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bwd_flex_bench.py")], capture_output=True, text=True,
                       cwd=ROOT, timeout=120)
    if r.returncode == 0:
        pytest.skip("a GPU is present: the benchmark ran")
    assert r.returncode == 2, r.stderr
    assert "no GPU" in r.stderr
