"""`attngen fuzz --shape`: the one named `--shape` form pins every drawn case's B, Lq and Lk (self
attention's Lq < Lk is a decode step placed at the end of the sequence, as `explain` reads it),
and a shape a variant cannot take is a usage error."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings

from attngen.check import fuzz, reference
from attngen.check.fuzz_run import positions_of
from attngen.ir.nodes import PADDING_Q_LENS
from attngen.lang import frontend
from attngen.tools import cli
from attngen.tools.shape import SHAPE_HELP

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _variant(name: str):
    return frontend.load(EXAMPLES / f"{name}.attn").get()


@pytest.mark.parametrize("name, shape", [
    ("llama3_gqa_causal", (3, 1, 300)),  # self attention, a decode step
    ("gpt2_causal_fp16", (2, 17, 17)),  # self attention, whole sequences
    ("mqa_decode_cross", (4, 5, 2000)),  # cross attention: any Lq, Lk (no cap on a pinned shape)
    ("seed_padded_fp32", (2, 3, 40)),  # padding lengths drawn within the pinned sizes
])
def test_a_pinned_shape_reaches_every_case(name, shape):
    v = _variant(name)
    seen = []

    @settings(max_examples=8, database=None, deadline=None)
    @given(fuzz.case_strategy(v, max_len=64, max_work=1 << 10, shape=shape))
    def draw(case):
        seen.append(case)
        assert (case.B, case.Lq, case.Lk) == shape
        if case.q_lens is not None:
            assert len(case.q_lens) == shape[0] and max(case.q_lens) <= shape[2]

    draw()
    assert len(seen) >= 2  # hypothesis drew cases, and the rest (seeds, distributions) varies
    assert len({(c.seed, c.dist) for c in seen}) > 1


def test_a_decode_step_is_placed_at_the_end_of_the_sequence():
    v = _variant("llama3_gqa_causal")
    case = fuzz.Case(1, 2, 50, seed=4)
    arrays = fuzz.case_inputs(v, case)
    ax = 2 if v.layout.value == "bhsd" else 1  # the sequence axis
    assert arrays["q"].shape[ax] == 2 and arrays["k"].shape[ax] == 50
    pos = positions_of(v, arrays)
    assert pos == {"q_offset": 48, "Lq_total": 50, "Lk_total": 50}
    # The placement matters: causal rows at positions 48 and 49 see (nearly) every key, rows 0 and
    # 1 of an unplaced call only the first one or two, so a kernel that ignored it would fail.
    q, k, vv, rest = fuzz.split_inputs(arrays)
    placed, _ = reference.attention(v, q, k, vv, rest, **pos)
    first = (slice(None),) * ax + (slice(0, 2),)
    whole, _ = reference.attention(v, q, k[first], vv[first], rest)
    assert not np.allclose(np.asarray(placed, np.float64), np.asarray(whole, np.float64))
    # Whole sequences and cross attention are not placed.
    assert positions_of(v, fuzz.case_inputs(v, fuzz.Case(1, 8, 8))) == {}
    cross = _variant("mqa_decode_cross")
    assert positions_of(cross, fuzz.case_inputs(cross, fuzz.Case(1, 2, 50))) == {}


def test_a_padded_decode_step_draws_global_query_lengths():
    v = _variant("seed_padded_fp32")
    if v.kind.value != "self" or PADDING_Q_LENS not in {d.name for d in v.runtime_inputs()}:
        pytest.skip("the example is not padded self attention")
    lens = []

    @settings(max_examples=30, database=None, deadline=None)
    @given(fuzz.case_strategy(v, shape=(2, 1, 40)))
    def draw(case):
        if case.q_lens is not None:
            lens.extend(case.q_lens)
            assert fuzz.case_inputs(v, case)[PADDING_Q_LENS].tolist() == list(case.q_lens)

    draw()
    assert lens and max(lens) <= 40


def test_the_strategy_refuses_what_it_cannot_pin():
    with pytest.raises(ValueError, match="varlen"):
        fuzz.case_strategy(_variant("varlen_causal_training"), shape=(2, 8, 8))
    with pytest.raises(ValueError, match="Lq <= Lk"):
        fuzz.case_strategy(_variant("gpt2_causal_fp16"), shape=(1, 9, 8))


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = cli.main(["fuzz", *argv])
    out = capsys.readouterr()
    assert "Traceback" not in out.err, out.err
    return rc, out.out, out.err


def test_fuzz_shape_runs_decode_kernels_on_the_cpu(tmp_path, capsys):
    rc, out, err = _run(capsys, str(EXAMPLES / "llama3_gqa_causal.attn"), "--shape", "B=1,Lq=1,Lk=300", "--device", "cpu",
                        "--max-examples", "3", "--seed", "7", "--out", str(tmp_path))
    assert rc == 0, err[-3000:]
    m = re.search(r"(\d+) kernel runs", out)
    assert m and int(m.group(1)) == 3 and "0 failing" in out


@pytest.mark.parametrize("argv, words", [
    (["llama3_gqa_causal", "--shape", "1,1,300"], ["expected sizes by name", "B=1,Lq=1,Lk=300", SHAPE_HELP]),
    (["llama3_gqa_causal", "--shape", "B=1,Lq=1"], ["lengths are missing", SHAPE_HELP]),
    (["llama3_gqa_causal", "--shape", "B=1,L=64,H=8"], ["H=8", "heads 32"]),
    (["llama3_gqa_causal", "--shape", "B=1,L=64,D=64"], ["D=64", "head_dim 128"]),
    (["llama3_gqa_causal", "--shape", "B=1,Lq=9,Lk=8"], ["self attention, so Lq <= Lk"]),
    (["varlen_causal_training", "--shape", "B=2,L=64"], ["layout varlen"]),
    (["gpt2_causal_fp16", "--shape", "B=1,Lq=1,Lk=64", "--pass", "both"], ["decode step", "--pass forward"]),
    (["--specs", "--shape", "B=1,L=64"], ["--specs"]),
])
def test_fuzz_shape_usage_errors(tmp_path, capsys, argv, words):
    argv = [str(EXAMPLES / f"{argv[0]}.attn"), *argv[1:]] if not argv[0].startswith("--") else argv
    rc, out, err = _run(capsys, *argv, "--device", "cpu", "--max-examples", "1", "--out", str(tmp_path))
    assert rc == 2, err
    for w in words:
        assert w in err, (w, err)
    assert "kernel runs" not in out  # refused before any fuzzing


def test_fuzz_help_names_the_shape_form(capsys):
    assert cli.main(["fuzz", "--help"]) == 0
    assert "B=..,Lq=..,Lk=.." in " ".join(capsys.readouterr().out.split())
