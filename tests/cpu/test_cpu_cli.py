"""`attngen compile --target cpu`: every example variant renders through the command line; the
header is C; GPU-only options are usage errors that say what the cpu target takes."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from attngen.plan.validate import load
from attngen.tools import cli

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.attn"))


def test_every_example_compiles_for_the_cpu(tmp_path, capsys):
    for f in EXAMPLES:
        for v in load(f).variants:
            out = tmp_path / f"{v.name}.cpp"
            assert cli.main(["compile", str(f), "--variant", v.name, "--target", "cpu", "-o", str(out)]) == 0, capsys.readouterr().err
            text = out.read_text()
            assert f"attngen_{v.name}_cpu_launch" in text and "__global__" not in text and "#include <cuda" not in text


def test_header_is_plain_c_and_matches_the_source(tmp_path):
    f = ROOT / "examples" / "paged_decode_llama3.attn"
    h, src = tmp_path / "k.h", tmp_path / "k.cpp"
    assert cli.main(["compile", str(f), "--target", "cpu", "--prefix", "eng", "--emit", "header", "-o", str(h)]) == 0
    assert cli.main(["compile", str(f), "--target", "cpu", "--prefix", "eng", "-o", str(src)]) == 0
    header = h.read_text()
    assert "eng_paged_decode_llama3_cpu_params" in header and "#define eng_paged_decode_llama3_cpu_PAGE_SIZE 16" in header
    # The struct is one text, spliced into both.
    start = header.index("typedef struct")
    struct = header[start:header.index("_params;", start)]
    assert struct in src.read_text()
    from attngen.cpu.compile import find_compiler

    cc = find_compiler()
    if "g++" in cc[0] or "clang" in cc[0]:
        c = cc[0].replace("g++", "gcc").replace("clang++", "clang")
        r = subprocess.run([c, "-std=c99", "-fsyntax-only", "-x", "c", str(h)], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("extra", [["--arch", "sm_80"], ["--emit", "ptx"], ["--deterministic"], ["--family", "decode"],
                                   ["--resources"]])
def test_gpu_options_are_refused_with_the_cpu_target(extra, capsys):
    f = str(ROOT / "examples" / "seed_padded_fp32.attn")
    assert cli.main(["compile", f, "--target", "cpu", *extra]) == 2
    err = capsys.readouterr().err
    assert "GPU options; --target cpu takes --emit cu|header" in err and "Traceback" not in err


def test_a_spec_error_is_located(tmp_path, capsys):
    bad = tmp_path / "bad.attn"
    bad.write_text("attention x {\n  dtype fp32\n  head_dim 64\n  heads 2\n  mask kv <= qq\n}\n")
    assert cli.main(["compile", str(bad), "--target", "cpu"]) == 1
    assert "bad.attn:5:" in capsys.readouterr().err
