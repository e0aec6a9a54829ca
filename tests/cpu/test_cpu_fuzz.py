"""`attngen fuzz` on the CPU backend: real kernels run without a GPU, a run in which none ran is
never green, and `--specs` compiles and runs a sample of the generated specs."""

from __future__ import annotations

import re
from pathlib import Path

from attngen.check import fuzz
from attngen.tools import cmd_fuzz

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _runs(out: str) -> int:
    m = re.search(r"(\d+) kernel runs", out)
    assert m, out
    return int(m.group(1))


def test_fuzz_file_on_the_cpu_backend(tmp_path, capsys):
    rc = cmd_fuzz.main([str(EXAMPLES / "packed_documents.attn"), "--device", "cpu", "--max-examples", "12", "--seed", "5",
                    "--out", str(tmp_path)])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    assert "CPU backend" in cap.err and "on the CPU backend" in cap.out and "0 failing" in cap.out
    # The reported count is what ran: every example launched the kernel.
    assert "12 examples (packed_documents: 12)" in cap.out and _runs(cap.out) == 12


def test_fuzz_specs_runs_generated_specs_on_the_cpu(tmp_path, capsys):
    rc = cmd_fuzz.main(["--specs", "--device", "cpu", "--pass", "forward", "--no-nvcc", "--max-examples", "10", "--seed", "11",
                    "--out", str(tmp_path)])
    cap = capsys.readouterr()
    assert rc == 0, cap.err[-3000:]
    assert "generated specs: 10" in cap.out
    assert _runs(cap.out) >= 2  # the sample: every CPU_SAMPLE-th generated spec, the first included


def test_a_run_without_kernels_is_never_green(tmp_path, capsys, monkeypatch):
    # No GPU here and no C++ compiler: nothing can run, so the run fails and says so ...
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    monkeypatch.setattr(fuzz, "gpu_status", lambda: (False, "no GPU for this test"))
    rc = cmd_fuzz.main([str(EXAMPLES / "gpt2_causal_fp16.attn"), "--max-examples", "3", "--seed", "1", "--out", str(tmp_path)])
    cap = capsys.readouterr()
    assert rc == 1 and "no kernel ran" in cap.err and "0 kernel runs" in cap.out
    # ... unless the reference-only checks are what was asked for.
    rc = cmd_fuzz.main([str(EXAMPLES / "gpt2_causal_fp16.attn"), "--max-examples", "3", "--seed", "1", "--out", str(tmp_path),
                    "--reference-only"])
    assert rc == 0
    # An explicit device that is not there is a usage error naming the missing piece.
    assert cmd_fuzz.main([str(EXAMPLES / "gpt2_causal_fp16.attn"), "--device", "cpu"]) == 2
    assert "no-such-compiler" in capsys.readouterr().err
    assert cmd_fuzz.main([str(EXAMPLES / "gpt2_causal_fp16.attn"), "--device", "cuda"]) == 2
    assert "--device cuda: no GPU for this test" in capsys.readouterr().err


def test_hypothesis_keeps_its_files_in_the_cache_dir(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    rc = cmd_fuzz.main([str(EXAMPLES / "gpt2_causal_fp16.attn"), "--max-examples", "2", "--seed", "1", "--out",
                    str(tmp_path / "f"), "--reference-only"])
    assert rc == 0
    assert not (tmp_path / ".hypothesis").exists()


def test_every_fuzz_option_has_help():
    import argparse

    from attngen.tools.cli import fuzz_arguments

    p = argparse.ArgumentParser()
    fuzz_arguments(p)
    missing = [a.option_strings or a.dest for a in p._actions if not a.help and a.dest != "help"]
    assert missing == []
