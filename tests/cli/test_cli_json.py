"""`check --json` and `explain --json`: the documented structure (docs/JSON.md) for every example
and for specs with errors, sorted keys, deterministic bytes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from attngen.tools import cli

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.attn"))
IDS = [p.stem for p in EXAMPLES]

DIAG_KEYS = {"severity", "message", "help", "file", "line", "col", "end_line", "end_col"}
VARIANT_KEYS = {"name", "summary", "dtype", "kind", "layout", "heads", "kv_heads", "head_dim", "value_head_dim",
                "runtime_inputs", "family", "engine", "tile"}
EXPLAIN_KEYS = VARIANT_KEYS | {"shape", "io", "tile_advice", "text"}
BAD = """\
attention broken {
  dtype fp16
  head_dim 64
  heads 8
  score s + bias[q, kv]
  mask causl
}
"""


def run_json(capsys, *argv: str) -> tuple[int, dict, str]:
    rc = cli.main(list(argv))
    out = capsys.readouterr()
    assert "Traceback" not in out.err
    doc = json.loads(out.out)
    # Sorted keys at every level, so the bytes are stable.
    assert out.out == json.dumps(doc, sort_keys=True, indent=2, ensure_ascii=False) + "\n"
    return rc, doc, out.err


def check_diagnostic(d: dict, path: str) -> None:
    assert set(d) == DIAG_KEYS
    assert d["severity"] in ("error", "warning") and isinstance(d["message"], str) and d["message"]
    assert d["help"] is None or isinstance(d["help"], str)
    assert d["file"] == path
    for k in ("line", "col", "end_line", "end_col"):
        assert isinstance(d[k], int) and d[k] >= 1, d
    assert (d["end_line"], d["end_col"]) >= (d["line"], d["col"])


def check_variant(v: dict, keys: set[str]) -> None:
    assert set(v) == keys, set(v) ^ keys
    assert v["dtype"] in ("fp32", "fp16", "bf16") and v["kind"] in ("self", "cross")
    assert v["layout"] in ("bhsd", "bshd", "varlen") and v["family"] in ("forward", "decode")
    assert all(isinstance(v[k], int) and v[k] > 0 for k in ("heads", "kv_heads", "head_dim", "value_head_dim"))
    assert v["summary"].startswith(v["name"] + ": ")
    for d in v["runtime_inputs"]:
        assert set(d) == {"name", "dtype", "shape"}
        assert all(isinstance(s, (int, str)) for s in d["shape"])
    if v["family"] == "decode":
        assert v["engine"] is None and v["tile"] is None
    else:
        assert v["engine"] in ("wgmma", "mma.sync", "ffma")
        assert set(v["tile"]) == {"block_m", "block_n", "warps", "stages", "auto"}


@pytest.mark.parametrize("path", EXAMPLES, ids=IDS)
def test_check_json_every_example(capsys, path):
    rc, doc, err = run_json(capsys, "check", "--json", str(path))
    assert rc == 0 and err == ""
    assert set(doc) == {"schema_version", "command", "arch", "files"}
    assert (doc["schema_version"], doc["command"], doc["arch"]) == (1, "check", "sm_90a")
    (f,) = doc["files"]
    assert set(f) == {"path", "ok", "diagnostics", "variants"} and f["path"] == str(path) and f["ok"] is True
    for d in f["diagnostics"]:
        check_diagnostic(d, str(path))
        assert d["severity"] == "warning"
    assert f["variants"]
    for v in f["variants"]:
        check_variant(v, VARIANT_KEYS)


@pytest.mark.parametrize("path", EXAMPLES, ids=IDS)
def test_explain_json_every_example(capsys, path):
    rc, doc, err = run_json(capsys, "explain", "--json", str(path), "--shape", "B=2,Lq=64,Lk=256"
                            if "cross" in path.read_text() or "paged" in path.read_text() else "B=2,L=128")
    assert rc == 0 and err == ""
    assert set(doc) == {"schema_version", "command", "arch", "diagnostics", "variants"}
    assert (doc["schema_version"], doc["command"], doc["diagnostics"]) == (1, "explain", [])
    assert doc["variants"]
    for v in doc["variants"]:
        check_variant(v, EXPLAIN_KEYS)
        B, Lq, Lk = v["shape"]["B"], v["shape"]["Lq"], v["shape"]["Lk"]
        assert B == 2 and v["text"].startswith(f"attention {v['name']}: ")
        assert {"q", "k", "v", "o"} <= set(v["io"])
        for name, shape in v["io"].items():
            assert shape is None or all(isinstance(n, int) and n >= 1 for n in shape), name
        assert v["tile_advice"] is None or set(v["tile_advice"]) == {"engine", "auto_engine", "auto_tile", "why"}


def test_check_json_spec_with_errors(capsys, tmp_path):
    path = tmp_path / "bad.attn"
    path.write_text(BAD, encoding="utf-8")
    good = ROOT / "examples" / "gpt2_causal_fp16.attn"
    rc, doc, err = run_json(capsys, "check", "--json", str(path), str(good))
    assert rc == 1 and err == ""  # the errors are in the document, not on stderr
    bad, ok = doc["files"]
    assert bad["ok"] is False and bad["variants"] == [] and ok["ok"] is True
    assert len(bad["diagnostics"]) == 2
    for d in bad["diagnostics"]:
        check_diagnostic(d, str(path))
        assert d["severity"] == "error"
    first, second = bad["diagnostics"]
    assert (first["line"], first["col"], first["end_col"]) == (5, 13, 17) and first["message"] == "unknown tensor `bias`"
    assert (second["line"], second["col"]) == (6, 8) and "causal" in (second["help"] or "")


def test_explain_json_spec_with_errors(capsys, tmp_path):
    path = tmp_path / "bad.attn"
    path.write_text(BAD, encoding="utf-8")
    rc, doc, err = run_json(capsys, "explain", "--json", str(path))
    assert rc == 1 and err == "" and doc["variants"] == []
    assert [d["line"] for d in doc["diagnostics"]] == [5, 6]
    for d in doc["diagnostics"]:
        check_diagnostic(d, str(path))


def test_check_json_warning_and_tile_advice(capsys):
    path = str(ROOT / "examples" / "gemma2_local_softcap.attn")
    rc, doc, _ = run_json(capsys, "check", "--json", path)
    (d,) = doc["files"][0]["diagnostics"]
    assert rc == 0 and d["severity"] == "warning" and d["line"] == 12 and d["col"] == 3
    rc, doc, _ = run_json(capsys, "explain", "--json", path)
    adv = doc["variants"][0]["tile_advice"]
    assert adv["engine"] == "mma.sync" and adv["auto_engine"] == "wgmma"
    assert adv["auto_tile"] == "tile block_m 128 block_n 128 warps 8 stages 3"


def test_json_is_deterministic(capsys):
    path = str(ROOT / "examples" / "t5_relative_bias.attn")
    cli.main(["explain", "--json", path])
    a = capsys.readouterr().out
    cli.main(["explain", "--json", path])
    assert capsys.readouterr().out == a


@pytest.mark.parametrize("stem, family", [("fp8_prefill", "forward"), ("whisper_preln_int8", "forward"),
                                          ("fp8_paged_decode", "decode"), ("sage_int8", None)])
def test_check_json_names_the_family_that_runs_a_quantized_spec(capsys, stem: str, family) -> None:
    rc, doc, _ = run_json(capsys, "check", str(ROOT / "examples" / "quant" / f"{stem}.attn"), "--json", "--arch", "sm_90a")
    assert rc == 0
    (v,) = doc["files"][0]["variants"]
    assert v["family"] == family and v["quant"]["statements"]
