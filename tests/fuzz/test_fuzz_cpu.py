"""`attngen fuzz` on the CPU: the spec generator, the mutation fuzzer, cases, reproducers, the command."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attngen.lang import frontend
from attngen.check import fuzz, fuzz_specs
from attngen.tools import cmd_fuzz
from attngen.ir.nodes import PADDING_KV_LENS, PADDING_Q_LENS

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@settings(max_examples=80)
@given(fuzz.spec_strategy())
def test_generated_specs_load_and_round_trip(text: str) -> None:
    prog = frontend.loads(text, "<generated>")  # a SpecError here is a generator (or front end) bug
    assert len(prog.variants) == 1
    assert fuzz.check_round_trip(prog) is None


@settings(max_examples=150)
@given(st.one_of(fuzz.spec_strategy(), st.sampled_from(sorted(p.read_text() for p in EXAMPLES.glob("*.attn")))),
       st.integers(0, 2**32 - 1))
def test_mutated_specs_give_success_or_spec_error_only(base: str, seed: int) -> None:
    text = fuzz.mutate(base, np.random.default_rng(seed))
    # The fuzzer's own loader (the plan stage included): a spec the front end alone accepts can
    # still be refused by a backend limit (head_dim 4096), and the round trip is held at one stage.
    prog, problem = fuzz.check_front_end(text)
    assert problem is None, problem
    if prog is not None:
        assert fuzz.check_round_trip(prog) is None


def test_check_front_end_classifies_outcomes(monkeypatch) -> None:
    prog, problem = fuzz.check_front_end((EXAMPLES / "gpt2_causal_fp16.attn").read_text())
    assert prog is not None and problem is None
    prog, problem = fuzz.check_front_end("attention x { dtype fp99 }")
    assert prog is None and problem is None  # a SpecError is an acceptable outcome
    monkeypatch.setattr(frontend, "loads", lambda *a, **k: (_ for _ in ()).throw(KeyError("boom")))
    prog, problem = fuzz.check_front_end("anything")
    assert prog is None and "KeyError escaped the front end" in problem


def test_mutate_changes_text_deterministically() -> None:
    base = (EXAMPLES / "llama3_gqa_causal.attn").read_text()
    a = fuzz.mutate(base, np.random.default_rng(1))
    b = fuzz.mutate(base, np.random.default_rng(1))
    assert a == b
    assert any(fuzz.mutate(base, np.random.default_rng(s)) != base for s in range(5))


def test_case_strategy_caps_work_and_favours_boundaries() -> None:
    v = frontend.load(EXAMPLES / "bloom_alibi_causal.attn").get()  # 112 heads
    seen = []

    @settings(max_examples=60, database=None)
    @given(fuzz.case_strategy(v, max_work=1 << 20))
    def run(case: fuzz.Case) -> None:
        assert 1 <= case.B <= 4 and case.Lq == case.Lk >= 1
        assert case.B * v.heads * case.Lq * case.Lk <= 1 << 20
        seen.append(case.Lq)

    run()
    assert any(L in fuzz.BOUNDARY_LENGTHS for L in seen)


def test_case_inputs_apply_overrides() -> None:
    v = frontend.load(EXAMPLES / "seed_padded_fp32.attn").get()
    arrays = fuzz.case_inputs(v, fuzz.Case(3, 40, 40, q_lens=(0, 40, 7), kv_lens=(40, 0, 1)))
    assert arrays[PADDING_Q_LENS].tolist() == [0, 40, 7] and arrays[PADDING_KV_LENS].tolist() == [40, 0, 1]
    assert arrays[PADDING_Q_LENS].dtype == np.int32
    assert np.abs(arrays["q"]).max() > 0  # never zeros
    docs = frontend.load(EXAMPLES / "packed_documents.attn").get()
    single = fuzz.case_inputs(docs, fuzz.Case(2, 30, 30, docs="single"))["doc_ids"]
    assert (single == single.flat[0]).all()
    per = fuzz.case_inputs(docs, fuzz.Case(2, 30, 30, docs="per_token"))["doc_ids"]
    assert per[1].tolist() == list(range(30))
    blocks = frontend.load(EXAMPLES / "block_sparse_pattern.attn").get()
    empty = fuzz.case_inputs(blocks, fuzz.Case(1, 300, 300, blocks="empty"))["blocks"]
    assert empty.shape == (16, 3, 3) and not empty.any()


def test_reproducer_round_trips_inputs_and_its_cpu_test_passes(tmp_path) -> None:
    path = EXAMPLES / "t5_relative_bias.attn"
    text = path.read_text()
    v = frontend.loads(text).get()
    case = fuzz.Case(2, 19, 19, seed=9, q_lens=(0, 19))
    arrays = fuzz.case_inputs(v, case)
    d = fuzz.write_reproducer(tmp_path, text, v, arrays, case, "O [bf16]: MISMATCH (made up)")
    assert {p.name for p in d.iterdir()} == {"spec.attn", "inputs.npz", "test_repro.py", "FAILURE.txt"}
    spec = importlib.util.spec_from_file_location("repro_mod", d / "test_repro.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    meta, back = mod._arrays()
    assert meta["variant"] == v.name and set(back) == set(arrays)
    assert back["q"].dtype == ml_dtypes.bfloat16
    for n in arrays:
        np.testing.assert_array_equal(np.asarray(back[n], dtype=np.float64), np.asarray(arrays[n], dtype=np.float64))
    mod.test_reference_is_sane()  # the CPU half of the reproducer runs as written


def test_failures_shrink_and_write_a_reproducer(tmp_path, monkeypatch, capsys) -> None:
    """A planted bug (the 'reference' fails for Lq > 100) is found, shrunk to Lq = 101, written out."""
    v = frontend.load(EXAMPLES / "gpt2_causal_fp16.attn").get()
    real = fuzz.reference_invariants

    def planted(var, arrays):
        L = arrays["q"].shape[2]
        return ["planted failure"] if L > 100 else real(var, arrays)

    monkeypatch.setattr(fuzz, "reference_invariants", planted)
    monkeypatch.setattr(fuzz, "flex_crosscheck", lambda *a: None)
    out = fuzz.fuzz_variant(v, (EXAMPLES / "gpt2_causal_fp16.attn").read_text(), gpu=False, max_examples=200,
                            seconds=None, seed=1, out_dir=str(tmp_path), quiet=True)
    assert out.failure and "planted failure" in out.failure
    assert "Lq=101 " in out.failure  # shrunk to the smallest failing length
    assert out.reproducer is not None and (out.reproducer / "inputs.npz").exists()
    data = np.load(out.reproducer / "inputs.npz")
    assert data["q"].shape[2] == 101
    # The first failure was reported before shrinking (a time-limited run keeps this evidence).
    assert "first failure (before shrinking)" in capsys.readouterr().err
    first = (tmp_path / "FIRST_FAILURE.txt").read_text()
    assert "planted failure" in first


def test_fuzz_command_on_cpu(tmp_path, capsys) -> None:
    rc = cmd_fuzz.main([str(EXAMPLES / "paligemma_prefix_lm.attn"), "--max-examples", "6", "--seed", "2",
                    "--out", str(tmp_path)])
    assert rc == 0
    assert "paligemma_prefix_lm: 6" in capsys.readouterr().out


def test_fuzz_command_summary_says_cpu_only(tmp_path, capsys) -> None:
    if fuzz.gpu_status()[0]:
        pytest.skip("a GPU is present: the CPU-only message does not apply")
    rc = cmd_fuzz.main([str(EXAMPLES / "gpt2_causal_fp16.attn"), "--max-examples", "4", "--seed", "2", "--out", str(tmp_path),
                    "--reference-only"])
    cap = capsys.readouterr()
    assert rc == 0
    assert "GPU kernels unavailable" in cap.err and "CPU only (no kernels ran)" in cap.out and "0 failing" in cap.out
    from attngen.runtime.extras import GpuStatus, gpu_check

    if gpu_check().status is GpuStatus.NO_CUPY:  # the missing extra is named, and no GPU is claimed absent
        assert "pip install 'attngen[cuda]'" in cap.err and "no GPU" not in cap.err


def test_fuzz_specs_command(tmp_path, capsys) -> None:
    rc = cmd_fuzz.main(["--specs", "--max-examples", "15", "--seed", "4", "--out", str(tmp_path), "--no-nvcc"])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    assert "generated specs: " in cap.out and "mutated specs: " in cap.out and "nvcc" not in cap.out


@pytest.mark.nvcc
def test_fuzz_specs_nvcc_step(tmp_path, capsys) -> None:
    rc = cmd_fuzz.main(["--specs", "--max-examples", "2", "--seed", "4", "--out", str(tmp_path), "--nvcc", "--jobs", "2"])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    assert "nvcc (sm_90a and sm_80): " in cap.out and " 0 failed" in cap.out


def test_fuzz_specs_nvcc_failure_is_reported(tmp_path, monkeypatch) -> None:
    """An accepted spec whose source nvcc rejects fails the run and leaves a reproducer."""
    from attngen.lang import frontend
    from attngen.cuda import nvcc_check

    monkeypatch.setattr(nvcc_check, "compile_check", lambda source, arch, timeout_s=0: f"nvcc for {arch.value} failed: boom")
    checker = nvcc_check.NvccChecker(jobs=1)
    text = (EXAMPLES / "gpt2_causal_fp16.attn").read_text()
    checker.submit(text, frontend.loads(text).variants)
    out = fuzz_specs.nvcc_outcome(checker, str(tmp_path), quiet=True)
    assert out.failure and "boom" in out.failure and len(checker.failures) == 2
    assert (out.reproducer / "spec.attn").read_text() == text


def test_fuzz_usage_errors(tmp_path, capsys) -> None:
    assert cmd_fuzz.main([]) == 2
    assert cmd_fuzz.main([str(EXAMPLES / "gpt2_causal_fp16.attn"), "--specs"]) == 2
    assert cmd_fuzz.main([str(tmp_path / "missing.attn")]) == 2
    assert cmd_fuzz.main([str(EXAMPLES / "gemma2_alternating.attn"), "--variant", "nope"]) == 2
    bad = tmp_path / "bad.attn"
    bad.write_text("attention x { dtype fp99 }")
    assert cmd_fuzz.main([str(bad)]) == 1
    assert "fp99" in capsys.readouterr().err


def test_a_spec_only_a_backend_limit_refuses_is_a_spec_error_not_a_round_trip_failure() -> None:
    # The front end alone takes head_dim 4096; the plan stage refuses it with a located error.
    text = "attention wide {\n  dtype bf16\n  head_dim 4096\n  heads 4\n}\n"
    frontend.loads(text, "<wide>")
    prog, problem = fuzz.check_front_end(text)
    assert prog is None and problem is None
