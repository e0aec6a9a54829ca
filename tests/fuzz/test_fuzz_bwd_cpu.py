"""`attngen fuzz --pass backward` without a GPU: the CLI plumbing, the refusal of variants the
backward kernels do not support, the reference checks it runs (which must catch a wrong
gradient), --specs over both passes, and the gradient tolerance (tolerance.check_grad)."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from attngen.check import fuzz, fuzz_bwd, reference_bwd, tolerance
from attngen.ir.nodes import DType
from attngen.lang import frontend

ROOT = Path(__file__).resolve().parents[2]


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "attngen", "fuzz", *args], capture_output=True, text=True, cwd=ROOT,
                          check=False, timeout=300)


def test_file_mode_backward_runs_the_reference_checks(tmp_path):
    r = _cli("examples/t5_relative_bias.attn", "--pass", "backward", "--max-examples", "6", "--seed", "3", "--out", str(tmp_path), "--reference-only")
    assert r.returncode == 0, r.stderr
    assert "t5_relative_bias (backward): 6" in r.stdout and "rendered the backward source (both dQ modes)" in r.stdout
    both = _cli("examples/llama3_gqa_causal.attn", "--pass", "both", "--max-examples", "3", "--seed", "3", "--out", str(tmp_path))
    assert both.returncode == 0, both.stderr
    assert "llama3_gqa_causal: 3" in both.stdout and "llama3_gqa_causal (backward): 3" in both.stdout


def test_refused_variant_is_a_failure_that_says_why(tmp_path):
    r = _cli("examples/paged_decode_llama3.attn", "--pass", "backward", "--max-examples", "2", "--out", str(tmp_path))
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "the backward kernels refuse this variant: `kv_cache paged` is decode-time inference state, not a training workload" in r.stderr


@pytest.mark.parametrize("example", ["diff_transformer_subln", "whisper_preln_cross", "varlen_causal_training"])
def test_issue14_constructs_fuzz_on_the_cpu(example, tmp_path):
    # The o post-norm, the token-scope q norm and layout varlen: rendered in both dQ modes, the
    # reference backward against central differences on drawn cases.
    r = _cli(f"examples/{example}.attn", "--pass", "backward", "--max-examples", "6", "--seed", "2", "--out", str(tmp_path), "--reference-only")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "0 failing" in r.stdout + r.stderr


def test_bad_pass_is_a_usage_error():
    r = _cli("examples/t5_relative_bias.attn", "--pass", "sideways")
    assert r.returncode == 2 and "--pass" in r.stderr


def test_specs_cover_both_passes(tmp_path):
    r = _cli("--specs", "--no-nvcc", "--max-examples", "12", "--seed", "5", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "generated specs: " in r.stdout and "generated specs (backward): 3" in r.stdout
    only = _cli("--specs", "--pass", "backward", "--no-nvcc", "--max-examples", "8", "--seed", "5", "--out", str(tmp_path), "--reference-only")
    assert only.returncode == 0, only.stderr[-3000:]
    assert "generated specs (backward): 2" in only.stdout and "generated specs:" not in only.stdout.replace("generated specs (backward)", "")


def test_reference_checks_catch_a_wrong_gradient(monkeypatch):
    v = frontend.load(ROOT / "examples" / "t5_relative_bias.attn").get()
    case = fuzz.Case(B=2, Lq=9, Lk=9, seed=4, q_lens=(9, 5), kv_lens=(9, 7))
    arrays, dO = fuzz_bwd.backward_inputs(v, case)
    wrt = fuzz_bwd.wrt_names(v)
    assert wrt == ("rel_table",)
    q, k, vv, rest = fuzz.split_inputs(arrays)
    assert np.abs(reference_bwd.attention_backward(v, q, k, vv, rest, dO.astype(np.float64), wrt=wrt)["rel_table"]).max() > 0
    assert fuzz_bwd.reference_problems(v, arrays, dO, wrt) == []
    real = reference_bwd.attention_backward

    def off(*a, **kw):
        g = real(*a, **kw)
        g["rel_table"] = g["rel_table"] * 1.1
        return g

    monkeypatch.setattr(reference_bwd, "attention_backward", off)
    probs = fuzz_bwd.reference_problems(v, arrays, dO, wrt)
    assert len(probs) == 1 and probs[0].startswith("rel_table: directional derivative"), probs


def test_backward_inputs_perturb_norm_weights_and_draw_do():
    v = frontend.load(ROOT / "examples" / "qwen3_qk_norm.attn").get()
    arrays, dO = fuzz_bwd.backward_inputs(v, fuzz.Case(B=2, Lq=5, Lk=5, seed=1))
    names = fuzz_bwd.wrt_names(v)
    assert names and all(n.endswith("norm_weight") for n in names)
    assert all(not np.allclose(arrays[n], 1.0) for n in names)
    assert dO.shape == arrays["q"].shape[:3] + (v.value_head_dim,) and dO.dtype == arrays["q"].dtype


def test_check_grad_policy():
    rng = np.random.default_rng(0)
    ref = rng.normal(size=(2, 3, 5))
    ok = tolerance.check_grad(ref * (1 + 1e-3), ref, DType.FP16, "dq")
    assert ok.ok and ok.n_bad == 0
    bad = tolerance.check_grad(ref + 0.1, ref, DType.FP16, "dq")
    assert not bad.ok and "max abs error" in bad.summary()
    assert tolerance.check_grad(ref + 0.1, ref, DType.FP16, "dq", atol=0.2).ok
    nan = ref.copy()
    nan[0, 0, 0] = math.nan
    assert not tolerance.check_grad(nan, ref, DType.FP32, "dk").ok
    assert not tolerance.check_grad(ref[:1], ref, DType.FP32, "dk").ok
    assert tolerance.grad_atol(DType.BF16, q_max=1, k_max=1, v_max=1, do_max=1, value_head_dim=64, scale=0.125) > \
        tolerance.grad_atol(DType.FP32, q_max=1, k_max=1, v_max=1, do_max=1, value_head_dim=64, scale=0.125)


@pytest.mark.parametrize("path", sorted((ROOT / "examples").glob("*.attn")), ids=lambda p: p.stem)
def test_every_supported_example_passes_the_reference_checks(path):
    for v in frontend.load(path).variants:
        if fuzz_bwd._refusal(v):
            continue
        arrays, dO = fuzz_bwd.backward_inputs(v, fuzz.Case(B=2, Lq=7, Lk=11 if v.kind.value == "cross" else 7, seed=2))
        assert fuzz_bwd.reference_problems(v, arrays, dO, fuzz_bwd.wrt_names(v)) == []


def test_specs_backward_nvcc_failure_is_reported(tmp_path, monkeypatch):
    from attngen.cuda import nvcc_check

    seen = []

    def broken(source, arch, timeout_s=0):
        seen.append(arch.value)
        return f"nvcc for {arch.value} failed: boom"

    monkeypatch.setattr(nvcc_check, "compile_check", broken)
    out, = fuzz_bwd.fuzz_specs_backward(gpu=False, max_examples=10, seconds=None, seed=5, out_dir=str(tmp_path), quiet=True, nvcc_jobs=1)
    assert seen and set(seen) <= {"sm_90a", "sm_80"}
    assert out.failure and "backward source(s) do not compile" in out.failure and "boom" in out.failure
    assert any(n.startswith("backward nvcc: 0 of ") for n in out.notes)
