"""The formatter: canonical layout, comments kept in place, idempotent, meaning unchanged."""

from __future__ import annotations

import pytest

from attngen.lang.frontend import format_source, loads

from .specs import VALID_SPECS


@pytest.mark.parametrize("text", VALID_SPECS)
def test_idempotent(text: str):
    once = format_source(text)
    assert format_source(once) == once


@pytest.mark.parametrize("text", VALID_SPECS)
def test_meaning_unchanged(text: str):
    assert loads(format_source(text)) == loads(text)


@pytest.mark.parametrize("text", VALID_SPECS)
def test_every_comment_kept(text: str):
    out = format_source(text)
    comments = [line[line.index("#") :].strip() for line in text.splitlines() if "#" in line]
    for c in comments:
        assert c in out


def test_canonical_layout_exactly():
    src = (
        "# leading comment\n"
        "attention   a{dtype bf16;head_dim 128 ; heads 16 kv 8   # trailing\n"
        "  # before mask\n"
        "  mask ((causal)) &&(q-kv)<  (4)\n"
        "\n"
        "\n"
        "  score (s*2.0)-1  # two\n"
        "  # dangling before brace\n"
        "}  # after brace\n"
        "attention b { dtype fp32 head_dim 32 heads 1 scale auto tile auto }\n"
        "\n"
        "# end of file\n"
    )
    assert format_source(src) == (
        "# leading comment\n"
        "attention a {\n"
        "  dtype bf16\n"
        "  head_dim 128\n"
        "  heads 16 kv 8  # trailing\n"
        "  # before mask\n"
        "  mask causal && q - kv < 4\n"
        "\n"
        "  score s * 2.0 - 1  # two\n"
        "  # dangling before brace\n"
        "}  # after brace\n"
        "\n"
        "attention b {\n"
        "  dtype fp32\n"
        "  head_dim 32\n"
        "  heads 1\n"
        "  scale auto\n"
        "  tile auto\n"
        "}\n"
        "\n"
        "# end of file\n"
    )


def test_parentheses_that_matter_stay():
    out = format_source("attention a { dtype bf16 head_dim 64 heads 2 score s - (s - 1) mask (causal || q < 2) && kv > 0 && !(q < 1) }")
    assert "score s - (s - 1)" in out
    assert "mask (causal || q < 2) && kv > 0 && !(q < 1)" in out


def test_multiline_expression_with_comments():
    src = "attention a { dtype bf16 head_dim 64 heads 2\n  mask causal &&  # first part\n    kv > 0  # second\n}\n"
    out = format_source(src)
    assert "  mask causal && kv > 0  # first part # second\n" in out
    assert format_source(out) == out


def test_format_does_not_need_valid_meaning():
    # Semantic errors are `check`'s business; the formatter only needs the syntax.
    assert "dtype bf17" in format_source("attention a { dtype bf17 }")


def test_comment_only_file():
    assert format_source("# just this\n\n# and this\n") == "# just this\n\n# and this\n"
