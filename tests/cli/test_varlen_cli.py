"""`layout varlen` through the command line: check and explain describe it, the families that do
not take it refuse it with a located error or a clear message."""

from __future__ import annotations

from pathlib import Path

from attngen.tools import cli

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "varlen_causal_training.attn"


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = cli.main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_check_and_explain(capsys) -> None:
    rc, out, _ = _run(capsys, "check", str(EXAMPLE))
    assert rc == 0 and "self varlen" in out and "cu_seqlens: i32[B_plus_1]" in out
    rc, out, _ = _run(capsys, "explain", str(EXAMPLE))
    assert rc == 0
    assert "B packed sequences" in out and "implied by layout varlen" in out and "[16, Lq]" in out
    assert "query tile slots (total_q / 128 + B" in out


def test_backward_pass_renders_the_packed_backward(capsys) -> None:
    rc, out, _ = _run(capsys, "compile", str(EXAMPLE), "--pass", "backward", "-o", "-")
    assert rc == 0
    assert "Varlen (packed) batch: B sequences" in out and "ag_varlen_view<true>" in out


def test_bench_points_to_the_varlen_benchmark(capsys) -> None:
    rc, _, err = _run(capsys, "bench", str(EXAMPLE))
    assert rc == 2 and "benchmarks/varlen_bench.py" in err
