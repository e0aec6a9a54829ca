"""The length sweep's CPU parts: every configuration is a valid spec, the table pairs ours with
the peers of the same cell, and a results file round-trips through --plot-only."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from attngen.tools import bench
from attngen.lang import frontend

import _benchmarks

ROOT = Path(__file__).resolve().parents[2]


def _sweep():
    return _benchmarks.load("sweep")


def test_every_configuration_checks():
    sweep = _sweep()
    for label, heads, kv, d, causal in sweep.CONFIGS:
        v = frontend.loads(sweep.spec(label, heads, kv, d, causal)).get()
        assert (v.heads, v.kv_heads, v.head_dim) == (heads, kv, d)
        assert ("causal" in sweep.spec(label, heads, kv, d, causal)) == causal


def _row(impl: str, cfg: str, L: int, tf: float) -> bench.Row:
    r = bench.Row(workload=f"{cfg}_L{L}", variant=cfg, impl=impl, dtype="bf16", B=32768 // L, H=16, Lq=L, Lk=L, D=128,
                  ms=1.0, tflops_visible=tf)
    r.extra["config"] = cfg
    return r


def test_table_ratios_and_round_trip(tmp_path):
    sweep = _sweep()
    rows = [_row("attngen", "d128_dense", 1024, 500.0), _row("sdpa-cudnn", "d128_dense", 1024, 400.0),
            _row("sdpa-flash", "d128_dense", 1024, 250.0)]
    text = sweep.table(rows)
    line = next(ln for ln in text.splitlines() if ln.startswith("d128_dense"))
    assert "1.25" in line and "2.00" in line  # ours / cuDNN, ours / FA2
    path = tmp_path / "sweep.jsonl"
    path.write_text("".join(json.dumps({"kind": "row", **asdict(r)}) + "\n" for r in rows), encoding="utf-8")
    back = sweep.load_rows(str(path))
    assert [(r.impl, r.tflops_visible) for r in back] == [(r.impl, r.tflops_visible) for r in rows]


def test_append_adds_a_run_to_the_results_file(tmp_path, monkeypatch):
    """--append: a grid split over calls lands in one file, each call under its own env line, and
    the table covers every call's cells (GPU work replaced by stand-ins)."""
    sweep = _sweep()
    from attngen.check import fuzz
    from attngen.runtime import kernel as runtime

    monkeypatch.setattr(fuzz, "gpu_status", lambda: (True, ""))
    monkeypatch.setattr(runtime, "compile", lambda v: object())
    monkeypatch.setattr(sweep.bench, "env_info", lambda: {"date": "now"})
    monkeypatch.setattr(sweep.bench, "gemm_rate", lambda: {"tflops": 800.0})
    monkeypatch.setattr(sweep.bench, "bench_shape", lambda v, k, B, Lq, Lk, **kw: [_row("attngen", v.name, Lq, 300.0)])
    out = tmp_path / "sweep.jsonl"
    base = ["--out", str(out), "--peers", "", "--lengths", "512,1024"]
    assert sweep.main(base + ["--only", "d64_dense"]) == 0
    assert sweep.main(base + ["--only", "d64_causal", "--append"]) == 0
    kinds = [json.loads(ln)["kind"] for ln in out.read_text(encoding="utf-8").splitlines()]
    assert kinds.count("env") == 2 and kinds.count("row") == 4
    assert {(r.extra["config"], r.Lq) for r in sweep.load_rows(str(out))} == {
        (c, L) for c in ("d64_dense", "d64_causal") for L in (512, 1024)}
    assert sweep.main(base + ["--only", "d64_dense"]) == 0  # without --append the file starts over
    assert [json.loads(ln)["kind"] for ln in out.read_text(encoding="utf-8").splitlines()].count("row") == 2
