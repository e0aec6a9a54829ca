"""Conventions of the command line: `fmt --check --diff`, the one `--shape` form, `--json`, and
the warning for an explicit tile that moves a variant off the engine `tile auto` picks."""

from __future__ import annotations

from pathlib import Path

import pytest

from attngen.tools import cli

MESSY = "# messy\nattention   tiny{dtype fp16;head_dim 64 ; heads 4\n   mask causal}\n"


def run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = cli.main(list(argv))
    out = capsys.readouterr()
    assert "Traceback" not in out.err, out.err
    return rc, out.out, out.err


def write(tmp_path: Path, name: str, text: str) -> str:
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return str(p)


# --------------------------------------------------------------------------------------------
# fmt --check --diff


def test_fmt_diff_prints_a_unified_diff_that_applies(capsys, tmp_path):
    path = write(tmp_path, "messy.attn", MESSY)
    rc, out, err = run(capsys, "fmt", "--check", "--diff", path)
    assert rc == 1 and "not formatted" in err
    lines = out.splitlines(keepends=True)
    assert lines[0] == f"--- {path}\n" and lines[1] == f"+++ {path} (formatted)\n"
    assert any(ln.startswith("@@ ") for ln in lines)
    # The diff is exactly what --write does: the file is short, so one hunk holds all of it, and its
    # context and "+" lines rebuilt are the formatted file.
    rc2, formatted, _ = run(capsys, "fmt", path)
    assert rc2 == 0
    assert "".join(ln[1:] for ln in lines[2:] if ln[:1] in "+ " and not ln.startswith("@@")) == formatted
    assert Path(path).read_text() == MESSY  # never writes


def test_fmt_diff_is_silent_on_canonical_files_and_alone_implies_check(capsys, tmp_path):
    ok = Path(__file__).resolve().parents[2] / "examples" / "gpt2_causal_fp16.attn"
    rc, out, err = run(capsys, "fmt", "--check", "--diff", str(ok))
    assert (rc, out, err) == (0, "", "")
    path = write(tmp_path, "messy.attn", MESSY)
    rc, out, _ = run(capsys, "fmt", "--diff", path)
    assert rc == 1 and out.startswith("--- ")


def test_fmt_diff_with_write_is_a_usage_error(capsys, tmp_path):
    path = write(tmp_path, "messy.attn", MESSY)
    rc, _, err = run(capsys, "fmt", "--write", "--diff", path)
    assert rc == 2 and "--diff" in err
    assert Path(path).read_text() == MESSY


# --------------------------------------------------------------------------------------------
# --shape: one named form for explain, bench and fuzz

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("text, want", [
    ("B=2,Lq=1,Lk=4096", (2, 1, 4096, None, None)),
    ("Lk=4096, Lq=1", (1, 1, 4096, None, None)),  # any order, spaces, B defaults to 1
    ("B=8,L=4096,H=16,D=128", (8, 4096, 4096, 16, 128)),
])
def test_parse_shape_named_form(text, want):
    from attngen.tools.shape import parse_shape

    s = parse_shape(text)
    assert (s.B, s.Lq, s.Lk, s.H, s.D) == want
    assert parse_shape(s.text) == s  # the canonical text reads back


@pytest.mark.parametrize("text, words", [
    ("2,1,4096", "sizes go by name, e.g. B=2,Lq=1,Lk=4096"),
    ("2,16,4096,128", "e.g. B=2,H=16,L=4096,D=128"),
    ("B=2,Lq=1", "the lengths are missing"),
    ("B=2,L=8,Lk=8", "not both"),
    ("B=2,L=8,B=3", "B given twice"),
    ("B=2,L=8,W=3", "unknown size 'W'"),
    ("B=0,L=8", "must be >= 1"),
    ("B=x,L=8", "expected sizes by name"),
])
def test_parse_shape_errors_show_the_form(text, words):
    from attngen.tools.shape import ShapeError, parse_shape

    with pytest.raises(ShapeError) as e:
        parse_shape(text)
    assert words in str(e.value)


def test_explain_shows_a_self_attention_decode_step(capsys):
    rc, out, err = run(capsys, "explain", str(ROOT / "examples/gpt2_causal_fp16.attn"), "--shape", "B=2,Lq=1,Lk=4096")
    assert rc == 0, err
    assert "Inputs and outputs (shapes at B=2, Lq=1, Lk=4096)" in out
    assert "[2, 12, 1, 64]" in out and "[2, 12, 4096, 64]" in out  # q one row, k the whole sequence
    assert "Decode step (self attention, Lq=1 < Lk=4096): the query is the last position" in out
    assert "q_offset=4095" in out
    # The causal mask over the whole sequence keeps about half of it (its last row sees every key).
    assert "Mask density at B=2, Lq = Lk = 4096 (the whole sequence; this step computes its last 1 row)" in out
    assert "visible fraction: 50.01%" in out


def test_explain_decode_step_of_a_variant_the_decode_family_cannot_run(capsys):
    rc, out, _ = run(capsys, "explain", str(ROOT / "examples/seed_padded_fp32.attn"), "--shape", "B=2,Lq=4,Lk=512")
    assert rc == 0
    assert "the 4 queries are the last 4 positions of the 512-long sequence" in out and "q_offset=508" in out


def test_explain_whole_sequence_output_is_unchanged_by_the_named_form(capsys):
    path = str(ROOT / "examples/gpt2_causal_fp16.attn")
    _, by_l, _ = run(capsys, "explain", path, "--shape", "B=1,L=4096")
    _, default, _ = run(capsys, "explain", path)
    assert by_l == default and "Decode step" not in default


def test_explain_and_bench_take_the_same_form(capsys):
    from attngen.lang import frontend
    from attngen.tools import bench

    path = ROOT / "examples/mqa_decode_cross.attn"
    v = frontend.load(path).get()
    assert bench.parse_shape("B=2,Lq=4,Lk=1024", v) == (2, 4, 1024)
    rc, out, _ = run(capsys, "explain", str(path), "--shape", "B=2,Lq=4,Lk=1024")
    assert rc == 0 and "shapes at B=2, Lq=4, Lk=1024" in out
    rc, _, err = run(capsys, "explain", str(path), "--shape", f"B=2,Lq=4,Lk=1024,H={v.heads + 1}")
    assert rc == 2 and f"has heads {v.heads}" in err


# --------------------------------------------------------------------------------------------
# An explicit tile that moves a variant off the engine `tile auto` picks

HEADLINE_OLD = """\
attention gemma_local {
  dtype bf16
  head_dim 128
  heads 16 kv 8
  layout bshd
  mask causal && window(4096, 0)
  score softcap(50.0)
  tile block_m 128 block_n 64 warps 4 stages 2
}
"""


def test_check_warns_at_the_tile_that_leaves_wgmma(capsys, tmp_path):
    path = write(tmp_path, "g.attn", HEADLINE_OLD)
    rc, out, err = run(capsys, "check", path)
    assert rc == 0 and f"{path}: ok: " in out  # a valid tile: a warning, not an error
    lines = err.splitlines()
    assert lines[0] == (f"{path}:8:3: warning: this tile moves `gemma_local` from wgmma to mma.sync on sm_90a: "
                        "wgmma runs block_m 128 with warps 8; this tile has block_m 128 with warps 4")
    assert lines[1] == "   8 |   tile block_m 128 block_n 64 warps 4 stages 2"
    assert lines[2] == "     |   " + "^" * len("tile block_m 128 block_n 64 warps 4 stages 2")
    assert "`tile auto` picks `tile block_m 128 block_n 128 warps 8 stages 3` (wgmma)" in lines[3]


@pytest.mark.parametrize("tile", ["tile auto", "tile block_m 128 block_n 128 warps 8 stages 3", "tile block_n 64"])
def test_no_warning_on_the_auto_engine(capsys, tmp_path, tile):
    path = write(tmp_path, "g.attn", HEADLINE_OLD.replace("tile block_m 128 block_n 64 warps 4 stages 2", tile))
    rc, _, err = run(capsys, "check", path)
    assert rc == 0 and err == ""


def test_no_warning_where_the_target_has_no_wgmma(capsys, tmp_path):
    path = write(tmp_path, "g.attn", HEADLINE_OLD)
    rc, _, err = run(capsys, "check", "--arch", "sm_80", path)
    assert rc == 0 and err == ""


def test_one_stage_tile_names_the_stage_rule(capsys, tmp_path):
    path = write(tmp_path, "g.attn", HEADLINE_OLD.replace("block_n 64 warps 4 stages 2", "block_n 64 warps 8 stages 1"))
    rc, _, err = run(capsys, "check", path)
    assert rc == 0 and "wgmma needs at least 2 stages" in err


def test_explain_says_why_the_engine_moved(capsys, tmp_path):
    path = write(tmp_path, "g.attn", HEADLINE_OLD)
    rc, out, _ = run(capsys, "explain", path)
    assert rc == 0
    assert ("  warning: this explicit tile moves the kernel from wgmma to mma.sync: wgmma runs block_m 128 with warps 8; "
            "this tile has block_m 128 with warps 4; `tile auto` picks `tile block_m 128 block_n 128 warps 8 stages 3` "
            "(wgmma) here") in out.splitlines()


def test_language_guide_headline_example_is_canonical_and_on_the_auto_engine(capsys, tmp_path):
    text = (ROOT / "docs" / "LANGUAGE.md").read_text(encoding="utf-8")
    example = text.split("```\n", 2)[1]  # the first fenced block
    path = write(tmp_path, "headline.attn", example)
    rc, out, err = run(capsys, "fmt", "--check", "--diff", path)
    assert rc == 0, out + err
    rc, _, err = run(capsys, "check", path)
    assert rc == 0 and err == "", err
