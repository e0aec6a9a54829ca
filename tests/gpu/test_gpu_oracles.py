"""FlexAttention (from the IR, `attngen.check.flex`) as an independent GPU oracle on long sequences the
NumPy reference is too slow for; and smoke runs of `attngen bench` and `attngen fuzz` on the GPU."""

from __future__ import annotations

import json

import pytest

from attngen.tools import bench, cmd_fuzz
from attngen.check import flex, fuzz, reference, tolerance
from gpu_helpers import kernel_for, spec_text, variant_of

LONG = [
    spec_text("o_causal_gqa", dtype="bf16", D=128, H=8, Hkv=2, mask="causal", lse=True),
    spec_text("o_window_softcap", dtype="fp16", D=64, H=4, layout="bshd", mask="causal && window(255, 0)",
              scores=("softcap(30.0)",), lse=True),
    spec_text("o_padding_cross", dtype="bf16", D=64, H=4, kind="cross", mask="padding"),
]


@pytest.mark.gpu
@pytest.mark.parametrize("text", LONG, ids=lambda t: t.split()[1])
def test_kernel_matches_flex_on_long_sequences(text: str) -> None:
    pytest.importorskip("torch")
    v = variant_of(text)
    L = 4096
    Lk = 3000 if v.kind.value == "cross" else L
    arrays = fuzz.case_inputs(v, fuzz.Case(B=1, Lq=L, Lk=Lk, seed=11))
    out, lse = fuzz.run_kernel(kernel_for(v), v, arrays)
    q, k, vv, rest = fuzz.split_inputs(arrays)
    dev = {n: fuzz.to_device(a) for n, a in arrays.items()}
    fo, flse = flex.run_flex(v, dev["q"], dev["k"], dev["v"], {n: dev[n] for n in rest}, compiled=True)
    se = reference.score_error(v, q, k, rest)
    # Flex rounds P like we do, so two bf16 kernels differ by up to twice one's error.
    rep = tolerance.check(out, fuzz.to_host(fo, v.dtype), v.dtype, "O vs flex", score_err=se + 2.0**-9)
    assert rep.ok, rep.summary()
    if v.lse:
        lrep = tolerance.check_lse(lse, fuzz.to_host(flse), v.dtype, "LSE vs flex", score_err=se)
        assert lrep.ok, lrep.summary()


@pytest.mark.gpu
def test_bench_command_writes_rows(tmp_path) -> None:
    spec = tmp_path / "b.attn"
    spec.write_text(spec_text("bench_smoke", dtype="bf16", D=64, H=4, mask="causal"))
    out = tmp_path / "b.json"
    rc = bench.main([str(spec), "--shape", "B=2,H=4,L=512,D=64", "--shape", "B=1,H=4,L=1000,D=64", "--json", str(out), "--repeats", "20"])
    assert rc == 0
    data = json.loads(out.read_text())
    ours = [r for r in data["rows"] if r["impl"] == "attngen"]
    assert len(ours) == 2 and all(r["ms"] > 0 and r["agrees"] for r in ours)
    assert data["gemm"]["tflops"] > 0
    # Causal over a square: about half the scores are visible.
    assert 0.45 < ours[0]["visible"] < 0.6


@pytest.mark.gpu
def test_bench_rejects_wrong_heads(tmp_path, capsys) -> None:
    spec = tmp_path / "b.attn"
    spec.write_text(spec_text("bench_heads", dtype="bf16", D=64, H=4))
    assert bench.main([str(spec), "--shape", "B=2,H=8,L=512,D=64"]) == 2
    assert "heads 4" in capsys.readouterr().err


@pytest.mark.gpu
def test_fuzz_command_passes_on_an_example(tmp_path) -> None:
    from pathlib import Path

    ex = Path(__file__).resolve().parents[2] / "examples" / "seed_padded_fp32.attn"
    rc = cmd_fuzz.main([str(ex), "--max-examples", "8", "--seed", "3", "--out", str(tmp_path / "fails")])
    assert rc == 0
    assert not (tmp_path / "fails").exists()
