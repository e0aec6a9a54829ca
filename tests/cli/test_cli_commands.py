"""The `attngen` command line: exit codes, messages, and that no user error shows a traceback."""

from __future__ import annotations

import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

from attngen.tools import cli

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.attn"))
IDS = [p.stem for p in EXAMPLES]

GOOD = """\
# a small valid spec
attention tiny {
  dtype fp16
  head_dim 64
  heads 4
  mask causal
}
"""

TWO = """\
# two variants
attention first {
  dtype bf16
  head_dim 64
  heads 4
  mask causal
}

attention second {
  dtype bf16
  head_dim 64
  heads 4
}
"""


def run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = cli.main(list(argv))
    out = capsys.readouterr()
    assert "Traceback" not in out.err, out.err
    return rc, out.out, out.err


def write(tmp_path: Path, name: str, text: str) -> str:
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return str(p)


def test_examples_exist():
    assert len(EXAMPLES) >= 14, [p.name for p in EXAMPLES]


# --------------------------------------------------------------------------------------------
# check


@pytest.mark.parametrize("path", EXAMPLES, ids=IDS)
def test_check_every_example(capsys, path):
    from attngen.lang.frontend import load

    rc, out, err = run(capsys, "check", str(path))
    assert rc == 0, err
    program = load(str(path))
    lines = out.strip().splitlines()
    assert len(lines) == len(program.variants)
    for line, v in zip(lines, program.variants):
        assert f": ok: {v.name}: {v.dtype.value}" in line


def test_check_many_files_at_once(capsys):
    rc, out, _ = run(capsys, "check", *map(str, EXAMPLES))
    assert rc == 0
    assert len(out.strip().splitlines()) >= len(EXAMPLES)


def test_check_bad_spec_is_located(capsys, tmp_path):
    path = write(tmp_path, "bad.attn", GOOD.replace("mask causal", "mask casual"))
    rc, out, err = run(capsys, "check", path)
    assert rc == 1
    assert out == ""
    # path:line:col: error: ..., pointing at line 6 where the misspelling is.
    assert re.search(re.escape(path) + r":6:\d+: error: ", err), err
    assert "casual" in err
    assert "^" in err


def test_check_syntax_error_is_located(capsys, tmp_path):
    path = write(tmp_path, "syntax.attn", GOOD.replace("heads 4", "heads 4 {"))
    rc, _, err = run(capsys, "check", path)
    assert rc == 1
    assert re.search(re.escape(path) + r":5:\d+: error: ", err), err


def test_check_missing_file_names_the_path(capsys, tmp_path):
    missing = str(tmp_path / "nope.attn")
    rc, out, err = run(capsys, "check", missing)
    assert rc == 2
    assert missing in err and "no such file" in err
    assert out == ""


def test_check_directory_is_usage_error(capsys, tmp_path):
    rc, _, err = run(capsys, "check", str(tmp_path))
    assert rc == 2
    assert "directory" in err


def test_check_binary_file_is_usage_error(capsys, tmp_path):
    p = tmp_path / "bin.attn"
    p.write_bytes(b"\xff\xfe\x00attention")
    rc, _, err = run(capsys, "check", str(p))
    assert rc == 2
    assert "UTF-8" in err


def test_check_arch_rejects_tile_too_big_for_it(capsys, tmp_path):
    # 128x64 tiles, 3 stages, D128 bf16: 128 KiB of shared memory, fine on sm_90a (227 KiB),
    # too much on sm_86 (99 KiB).
    spec = GOOD.replace("head_dim 64", "head_dim 128").replace(
        "mask causal", "mask causal\n  tile block_m 128 block_n 64 warps 4 stages 3"
    )
    path = write(tmp_path, "big.attn", spec)
    rc, _, err = run(capsys, "check", path, "--arch", "sm_90a")
    assert rc == 0, err
    rc, _, err = run(capsys, "check", path, "--arch", "sm_86")
    assert rc == 1
    assert "shared memory" in err and "sm_86" in err
    assert re.search(re.escape(path) + r":7:\d+: error: ", err), err


def test_check_unknown_arch(capsys, tmp_path):
    rc, _, err = run(capsys, "check", write(tmp_path, "a.attn", GOOD), "--arch", "sm_70")
    assert rc == 2
    assert "sm_90a" in err


def test_no_command_is_usage_error(capsys):
    rc, _, err = run(capsys)
    assert rc == 2
    assert "usage" in err


def test_unknown_option_is_usage_error(capsys):
    rc, _, err = run(capsys, "check", "--frobnicate", "x.attn")
    assert rc == 2
    assert "--frobnicate" in err


def test_version(capsys):
    from attngen import __version__

    rc, out, _ = run(capsys, "--version")
    assert rc == 0
    assert __version__ in out


# --------------------------------------------------------------------------------------------
# fmt


@pytest.mark.parametrize("path", EXAMPLES, ids=IDS)
def test_fmt_every_example(capsys, path):
    from attngen.lang.frontend import format_source, loads

    rc, out, err = run(capsys, "fmt", str(path))
    assert rc == 0, err
    text = path.read_text()
    assert out == format_source(text, str(path))
    # Formatting never changes meaning.
    assert loads(out, str(path)) == loads(text, str(path))


@pytest.mark.parametrize("path", EXAMPLES, ids=IDS)
def test_examples_are_canonically_formatted(capsys, path):
    rc, _, err = run(capsys, "fmt", "--check", str(path))
    assert rc == 0, err


def test_fmt_check_write_cycle(capsys, tmp_path):
    messy = "# messy\nattention   tiny{dtype fp16;head_dim 64 ; heads 4\n   mask causal}\n"
    path = write(tmp_path, "messy.attn", messy)
    rc, out, err = run(capsys, "fmt", "--check", path)
    assert rc == 1
    assert "not formatted" in err and path in err
    assert Path(path).read_text() == messy  # --check never writes
    rc, _, err = run(capsys, "fmt", "--write", path)
    assert rc == 0
    assert "reformatted" in err
    assert Path(path).read_text() != messy
    rc, _, err = run(capsys, "fmt", "--check", path)
    assert rc == 0, err
    # Formatting is idempotent: a second write changes nothing and says nothing.
    before = Path(path).read_text()
    rc, _, err = run(capsys, "fmt", "--write", path)
    assert rc == 0 and err == ""
    assert Path(path).read_text() == before


def test_fmt_keeps_comments(capsys, tmp_path):
    path = write(tmp_path, "c.attn", GOOD.replace("mask causal", "mask causal  # the LM mask"))
    rc, out, _ = run(capsys, "fmt", path)
    assert rc == 0
    assert "# a small valid spec" in out
    assert "# the LM mask" in out


def test_fmt_bad_spec(capsys, tmp_path):
    path = write(tmp_path, "bad.attn", "attention x { dtype fp16; head_dim 64; heads 4; mask (q < }\n")
    rc, out, err = run(capsys, "fmt", path)
    assert rc == 1
    assert out == ""
    assert re.search(re.escape(path) + r":1:\d+: error: ", err), err


def test_fmt_check_and_write_are_exclusive(capsys, tmp_path):
    rc, _, err = run(capsys, "fmt", "--check", "--write", write(tmp_path, "a.attn", GOOD))
    assert rc == 2
    assert "not allowed" in err


# --------------------------------------------------------------------------------------------
# explain


def _decl_dims(v, d) -> str:
    from attngen.tools.explain import _decl_symbolic

    return _decl_symbolic(v, d)


@pytest.mark.parametrize("path", EXAMPLES, ids=IDS)
def test_explain_every_example(capsys, path):
    from attngen.lang.frontend import load

    program = load(str(path))
    rc, out, err = run(capsys, "explain", str(path), "--shape", "B=1,L=512")
    assert rc == 0, err
    for v in program.variants:
        assert f"attention {v.name}:" in out
        # every runtime input with its dtype and declared shape
        for d in v.runtime_inputs():
            row = [ln for ln in out.splitlines() if ln.strip().startswith(d.name + " ")]
            assert row, f"{d.name} missing from explain output:\n{out}"
            assert d.dtype.value in row[0] and _decl_dims(v, d) in row[0], row[0]
        for name in ("q", "k", "v", "o"):
            assert any(ln.strip().startswith(name + " ") for ln in out.splitlines()), name
        assert any(ln.strip().startswith("lse ") for ln in out.splitlines()) == v.lse  # the output row
        assert ("Decode plan" if v.page_size is not None else "Tile plan") in out and "shared memory" in out
        assert "Mask density" in out


def test_explain_paged_decode_describes_what_runs(capsys):
    # A paged cache runs on the decode family at every Lq: explain describes that plan, the page
    # pool's shape and the implied block table, not a forward tile it never launches.
    rc, out, err = run(capsys, "explain", str(ROOT / "examples/paged_decode_llama3.attn"), "--shape", "B=4,Lq=1,Lk=8192")
    assert rc == 0, err
    assert re.search(r"^\s*k\s+bf16\s+\[num_pages, 16, 8, 128\]\s+\[2048, 16, 8, 128\]", out, re.M), out
    row = next(ln for ln in out.splitlines() if ln.strip().startswith("block_table "))
    assert "implied by kv_cache paged(16)" in row and "unused" not in row
    assert "Tile plan" not in out and "tiles of" not in out
    assert "Decode plan on sm_90a" in out and "split-KV mma.sync" in out and "4 query heads of a key/value head" in out
    from attngen.lang.frontend import load
    from attngen.plan import decode as plan_decode

    dp = plan_decode.plan(load(str(ROOT / "examples/paged_decode_llama3.attn")).variants[0])
    splits, ctas = dp.split.schedule(4, 1, 8192, 132)
    assert f"split into {splits} key range(s), {ctas} CTAs" in out and dp.kernel_name in out


def test_explain_paged_decode_on_an_arch_without_it(capsys, tmp_path):
    # fp16 passes the spec checks on sm_75, where the decode family has no kernel: said, not a crash.
    f = tmp_path / "p16.attn"
    f.write_text((ROOT / "examples/paged_decode_llama3.attn").read_text().replace("bf16", "fp16"))
    rc, out, err = run(capsys, "explain", str(f), "--arch", "sm_75")
    assert rc == 0, err
    assert "Decode plan on sm_75: none" in out and "sm_80 or newer" in out


def test_explain_forward_variant_also_names_its_decode_plan(capsys, tmp_path):
    # The runtime's default family sends Lq <= 16 calls of a decode-capable forward variant to the
    # decode family: for cross attention explain gives that plan at Lq 1 of the sample shape; for
    # self attention (Lq = Lk, so only tiny calls) one line; nothing where decode cannot run.
    spec = str(ROOT / "examples/mqa_decode_cross.attn")
    rc, out, err = run(capsys, "explain", spec, "--shape", "B=2,Lq=64,Lk=8192")
    assert rc == 0, err
    assert "Tile plan on sm_90a" in out
    assert 'Decode plan on sm_90a (the runtime\'s default family="auto" runs calls with Lq <= 16' in out
    from attngen.lang.frontend import load
    from attngen.plan import decode as plan_decode

    dp = plan_decode.plan(load(spec).variants[0])
    splits, ctas = dp.split.schedule(2, 1, 8192, 132)
    assert "at B=2, Lq=1, Lk=8192 on 132 SMs" in out and f"split into {splits} key range(s), {ctas} CTAs" in out
    assert "71 query heads of a key/value head packed" in out
    rc, out, err = run(capsys, "explain", str(ROOT / "examples/llama3_gqa_causal.attn"))
    assert rc == 0 and "Decode family: calls with Lq = Lk <= 16" in out and "Decode plan" not in out, err
    rc, out, err = run(capsys, "explain", str(ROOT / "examples/seed_padded_fp32.attn"))  # fp32: forward only
    assert rc == 0 and "Tile plan" in out and "Decode" not in out, err
    f = tmp_path / "mqa_fp16.attn"
    f.write_text(Path(spec).read_text().replace("bf16", "fp16"))
    rc, out, err = run(capsys, "explain", str(f), "--arch", "sm_75")  # no cp.async / m16n8k16 there
    assert rc == 0 and "Tile plan on sm_75" in out and "Decode" not in out, err


def test_explain_shapes_and_tile(capsys):
    rc, out, _ = run(capsys, "explain", str(ROOT / "examples/llama3_gqa_causal.attn"), "--shape", "B=2,L=1024")
    assert rc == 0
    assert "GQA" in out and "32 query heads" in out and "8 key/value heads" in out
    # q is [B, H, Lq, D] in bhsd; k has Hkv heads.
    assert re.search(r"^\s*q\s+bf16\s+\[B, 32, Lq, 128\]\s+\[2, 32, 1024, 128\]", out, re.M), out
    assert re.search(r"^\s*k\s+bf16\s+\[B, 8, Lk, 128\]\s+\[2, 8, 1024, 128\]", out, re.M), out
    assert re.search(r"^\s*lse\s+fp32\s+\[B, 32, Lq\]", out, re.M), out
    assert "(tile auto)" in out
    assert "causal" in out


def test_explain_token_norm_and_residual(capsys):
    rc, out, _ = run(capsys, "explain", str(ROOT / "examples/whisper_preln_cross.attn"))
    assert rc == 0
    assert "cross attention" in out
    assert "LayerNorm" in out and "1024-wide hidden row" in out
    assert "residual" in out
    assert "q_norm_weight" in out and "q_norm_bias" in out
    assert "[1024]" in out


def test_explain_names_the_ffma_warp_slices(capsys):
    rc, out, _ = run(capsys, "explain", str(ROOT / "examples/seed_padded_fp32.attn"))
    assert rc == 0
    assert "engine: fp32 FFMA" in out
    assert "each warp owns 16 keys of every K/V tile" in out and "the 8 partial results combine" in out
    assert "40 accumulator registers a thread" in out


def test_explain_data_dependent_mask_is_flagged(capsys):
    rc, out, _ = run(capsys, "explain", str(ROOT / "examples/packed_documents.attn"), "--shape", "B=1,L=1024")
    assert rc == 0
    assert "depends on runtime inputs" in out and "doc_ids" in out
    rc, out, _ = run(capsys, "explain", str(ROOT / "examples/gpt2_causal_fp16.attn"), "--shape", "B=1,L=1024")
    assert rc == 0
    assert "depends on runtime inputs" not in out


def test_explain_causal_density(capsys):
    # A causal mask at L=1024 sees (L+1)/(2L) of the matrix; with 64x32 fp32 tiles or larger
    # bf16 ones, some tiles are skipped and some are partial.
    pytest.importorskip("attngen.analysis.intervals")
    rc, out, _ = run(capsys, "explain", str(ROOT / "examples/gpt2_causal_fp16.attn"), "--shape", "B=1,L=1024")
    assert rc == 0
    m = re.search(r"visible fraction: ([0-9.]+)%", out)
    assert m, out
    assert abs(float(m.group(1)) - 100 * 1025 / 2048) < 0.01
    m = re.search(r"(\d+) skipped \(nothing visible\), (\d+) full \(no per-element mask\), (\d+) partial of (\d+)", out)
    assert m, out
    skipped, full, partial, total = map(int, m.groups())
    assert skipped > 0 and full > 0 and partial > 0 and skipped + full + partial == total


def test_explain_multi_variant(capsys, tmp_path):
    path = write(tmp_path, "two.attn", TWO)
    rc, out, _ = run(capsys, "explain", path, "--shape", "B=1,L=256")
    assert rc == 0
    assert "attention first:" in out and "attention second:" in out
    rc, out, _ = run(capsys, "explain", path, "--variant", "second", "--shape", "B=1,L=256")
    assert rc == 0
    assert "attention second:" in out and "attention first:" not in out


def test_explain_unknown_variant_lists_variants(capsys, tmp_path):
    path = write(tmp_path, "two.attn", TWO)
    rc, out, err = run(capsys, "explain", path, "--variant", "third")
    assert rc == 2
    assert "third" in err and "first" in err and "second" in err
    assert out == ""


@pytest.mark.parametrize("shape", ["1,x,4", "0,4,4", "1,2,3,4", "", "-1,4,4", "B=1", "B=0,L=4", "B=1,L=4,Lq=2", "B=1,X=3,L=4",
                                   "B=1,B=2,L=4", "B=1,Lq=4", "B=1,L=4,H=5"])
def test_explain_bad_shape(capsys, tmp_path, shape):
    rc, _, err = run(capsys, "explain", write(tmp_path, "a.attn", GOOD), "--shape", shape)
    assert rc == 2
    assert "--shape" in err


def test_explain_bad_spec(capsys, tmp_path):
    path = write(tmp_path, "bad.attn", GOOD.replace("heads 4", "heads 5 kv 2"))
    rc, out, err = run(capsys, "explain", path)
    assert rc == 1
    assert out == ""
    assert re.search(re.escape(path) + r":\d+:\d+: error: ", err), err


def test_explain_missing_file(capsys, tmp_path):
    rc, _, err = run(capsys, "explain", str(tmp_path / "missing.attn"))
    assert rc == 2
    assert "missing.attn" in err


# --------------------------------------------------------------------------------------------
# compile / fuzz / bench delegate to their modules


@pytest.mark.parametrize(
    "command,module,extra",
    [("compile", "attngen.tools.cmd_compile", ["-o", "x.cu"]), ("fuzz", "attngen.tools.cmd_fuzz", []), ("bench", "attngen.tools.bench", [])],
)
def test_delegating_commands(capsys, monkeypatch, command, module, extra):
    seen = {}

    def fake_main(args):
        seen["args"] = args
        return 3

    monkeypatch.setitem(sys.modules, module, types.SimpleNamespace(main=fake_main))
    rc, _, _ = run(capsys, command, "examples/llama3_gqa_causal.attn", "--variant", "llama3_gqa_causal", *extra)
    assert rc == 3
    assert seen["args"].variant == "llama3_gqa_causal"
    assert seen["args"].file == "examples/llama3_gqa_causal.attn"


@pytest.mark.parametrize("command,module", [("compile", "attngen.tools.cmd_compile"), ("fuzz", "attngen.tools.cmd_fuzz"), ("bench", "attngen.tools.bench")])
def test_delegating_commands_when_missing(capsys, monkeypatch, command, module):
    monkeypatch.setitem(sys.modules, module, None)  # makes `import module` fail as if absent
    rc, _, err = run(capsys, command, "examples/llama3_gqa_causal.attn")
    assert rc == 2
    assert "needs a package that is not installed" in err and command in err and module in err


# --------------------------------------------------------------------------------------------
# as a process


def test_python_dash_m(tmp_path):
    p = subprocess.run(
        [sys.executable, "-m", "attngen", "check", str(tmp_path / "absent.attn")],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert p.returncode == 2
    assert "absent.attn" in p.stderr and "Traceback" not in p.stderr


def test_python_dash_m_spec_error(tmp_path):
    path = write(tmp_path, "bad.attn", "attention x {\n  dtype fp64\n}\n")
    p = subprocess.run([sys.executable, "-m", "attngen", "check", path], capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 1
    assert f"{path}:2:" in p.stderr and "Traceback" not in p.stderr


def test_explain_self_attention_needs_lq_at_most_lk(capsys, tmp_path):
    path = write(tmp_path, "a.attn", GOOD)
    rc, _, err = run(capsys, "explain", path, "--shape", "B=1,Lq=512,Lk=256")
    assert rc == 2
    assert "Lq <= Lk" in err
    rc, out, _ = run(capsys, "explain", path, "--shape", "B=2,L=256")  # L means Lq = Lk = L
    assert rc == 0
    assert "B=2, Lq=256, Lk=256" in out


def test_explain_cross_attention_takes_two_lengths(capsys):
    rc, out, _ = run(capsys, "explain", str(ROOT / "examples/mqa_decode_cross.attn"), "--shape", "B=2,Lq=4,Lk=1024")
    assert rc == 0
    assert re.search(r"^\s*q\s+bf16\s+\[B, 71, Lq, 64\]\s+\[2, 71, 4, 64\]", out, re.M), out
    assert re.search(r"^\s*k\s+bf16\s+\[B, 1, Lk, 64\]\s+\[2, 1, 1024, 64\]", out, re.M), out


def test_console_script_on_path():
    import shutil

    exe = shutil.which("attngen")
    if exe is None:
        pytest.skip("the attngen console script is not on the PATH (package not installed with pip)")
    p = subprocess.run([exe, "--version"], capture_output=True, text=True)
    assert p.returncode == 0
    from attngen import __version__

    assert __version__ in p.stdout


def test_internal_error_is_one_line(capsys, monkeypatch):
    def broken(args):
        raise RuntimeError("boom")

    monkeypatch.delenv("ATTNGEN_TRACEBACK", raising=False)
    monkeypatch.setitem(sys.modules, "attngen.tools.bench", types.SimpleNamespace(main=broken))
    rc, _, err = run(capsys, "bench", "x.attn")
    assert rc == 3
    assert "internal error: RuntimeError: boom" in err
    monkeypatch.setenv("ATTNGEN_TRACEBACK", "1")
    with pytest.raises(RuntimeError):
        cli.main(["bench", "x.attn"])
