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
