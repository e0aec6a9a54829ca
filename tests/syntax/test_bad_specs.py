"""Golden diagnostics: every malformed spec in bad/ gives exactly the text in its .expected file.

Regenerate the goldens (then read every diff!) with ATTNGEN_UPDATE_GOLDEN=1.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from attngen.lang.diagnostics import SpecError
from attngen.plan.validate import loads  # what `attngen check` runs: the front end, then the plan stage

BAD = Path(__file__).parent / "bad"
SPECS = sorted(BAD.glob("*.attn"))
UPDATE = os.environ.get("ATTNGEN_UPDATE_GOLDEN") == "1"


def test_enough_bad_specs():
    assert len(SPECS) >= 20


@pytest.mark.parametrize("spec", SPECS, ids=lambda p: p.stem)
def test_golden_diagnostic(spec: Path):
    text = spec.read_text(encoding="utf-8")
    with pytest.raises(SpecError) as info:
        loads(text, path=spec.name)
    got = info.value.render() + "\n"
    golden = spec.with_suffix(".expected")
    if UPDATE:
        golden.write_text(got, encoding="utf-8")
    assert golden.exists(), f"no golden for {spec.name}; run with ATTNGEN_UPDATE_GOLDEN=1"
    assert got == golden.read_text(encoding="utf-8")


@pytest.mark.parametrize("spec", SPECS, ids=lambda p: p.stem)
def test_diagnostics_are_located_and_ordered(spec: Path):
    with pytest.raises(SpecError) as info:
        loads(spec.read_text(encoding="utf-8"), path=spec.name)
    diags = info.value.diagnostics
    assert diags
    for d in diags:
        assert d.span is not None and d.span.path == spec.name
        assert not any(word in d.render(None) for word in ("__ANON", "Token(", "Traceback", "$END", "RBRACE", "LPAR"))
    keys = [(d.span.line, d.span.col) for d in diags]
    assert keys == sorted(keys)


def test_multiple_errors_all_reported_in_source_order():
    text = (BAD / "multiple_errors.attn").read_text()
    with pytest.raises(SpecError) as info:
        loads(text, path="m.attn")
    msgs = [d.message for d in info.value.diagnostics]
    assert len(msgs) >= 6
    assert [d.span.line for d in info.value.diagnostics] == sorted(d.span.line for d in info.value.diagnostics)
    assert any("bf17" in m for m in msgs) and any("casual" in m for m in msgs) and any("softcap" in m for m in msgs)


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("attention a { dtyp bf16 }", "did you mean `dtype`?"),
        ("attention a { dtype bf16 head_dim 64 heads 2 mask casual }", "did you mean `causal`?"),
        ("attention a { dtype bf16 head_dim 64 heads 2 score tnah(s) }", "did you mean `tanh`?"),
        ("attention a { dtype bf61 head_dim 64 heads 2 }", "did you mean `bf16`?"),
        ("attention a { dtype bf16 head_dim 64 heads 2 layout bhsdd }", "did you mean `bhsd`?"),
        ("attention a { dtype bf16 head_dim 64 heads 2 input ids: i32[B, Lk] mask idss[b, q] > 0 }", "did you mean `ids`?"),
        ("attention a { dtype bf16 head_dim 64 heads 2 mask kv < Lkk }", "did you mean `Lk`?"),
        ("attention a { dtype bf16 head_dim 64 heads 2 norm q rmsnrom(1e-5) }", "did you mean `rmsnorm`?"),
        ("attention a { dtype bf16 head_dim 64 heads 2 tile warp 4 }", "did you mean `warps`?"),
    ],
)
def test_did_you_mean(text: str, fragment: str):
    with pytest.raises(SpecError) as info:
        loads(text)
    assert fragment in info.value.render()


def test_expected_tokens_in_words():
    with pytest.raises(SpecError) as info:
        loads("attention a { heads 16 kv }")
    d = info.value.diagnostics[0]
    assert d.message == "unexpected `}`"
    assert d.help == "expected a number"


def test_keywords_double_as_names():
    # `kv`, `q`, `k` are keywords in some statements and names in expressions; statement
    # keywords can even name tensors.
    p = loads(
        "attention a { dtype bf16 head_dim 64 heads 4 kv 2\n"
        "  input mask: i32[B, Lk]\n  norm q rmsnorm(1e-5)\n  norm k rmsnorm(1e-5)\n"
        "  mask mask[b, kv] != 0 && kv <= q }"
    )
    v = p.get()
    assert v.kv_heads == 2 and v.inputs[0].name == "mask" and len(v.norms) == 2


def test_empty_file_is_an_error():
    with pytest.raises(SpecError, match="no `attention` variant"):
        loads("# only a comment\n")


def test_deep_nesting_is_a_spec_error():
    with pytest.raises(SpecError, match="nested more than"):
        loads("attention a { dtype bf16 head_dim 64 heads 2 mask " + "!" * 5000 + "true }")
    with pytest.raises(SpecError, match="nested more than"):
        loads("attention a { dtype bf16 head_dim 64 heads 2 score s" + " + 1" * 5000 + " }")


def test_redundant_parentheses_cost_nothing():
    p = loads("attention a { dtype bf16 head_dim 64 heads 2 mask " + "(" * 5000 + "true" + ")" * 5000 + " }")
    assert p.get().mask.value is True


def test_load_missing_file(tmp_path):
    from attngen.plan.validate import load

    with pytest.raises(SpecError, match="cannot read"):
        load(tmp_path / "nope.attn")


def test_load_reads_file(tmp_path):
    from attngen.plan.validate import load

    f = tmp_path / "ok.attn"
    f.write_text("attention a { dtype fp16; head_dim 64; heads 2 }\n")
    p = load(f)
    assert p.get().head_dim == 64 and p.path == str(f)


def test_load_non_utf8(tmp_path):
    from attngen.plan.validate import load

    f = tmp_path / "bin.attn"
    f.write_bytes(b"attention \xff\xfe {}")
    with pytest.raises(SpecError, match="not UTF-8"):
        load(f)
