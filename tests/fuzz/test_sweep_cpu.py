"""The length sweep's CPU parts: every configuration is a valid spec, the table pairs ours with
the peers of the same cell, and a results file round-trips through --plot-only."""

from __future__ import annotations

import importlib.util
import json
from dataclasses import asdict
from pathlib import Path

from attngen.tools import bench
from attngen.lang import frontend

ROOT = Path(__file__).resolve().parents[2]


def _sweep():
    spec = importlib.util.spec_from_file_location("sweep", ROOT / "benchmarks" / "sweep.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


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
