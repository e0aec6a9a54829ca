"""Grammar fuzzing: mutated specs give a Program or a SpecError, never any other exception."""

from __future__ import annotations

from hypothesis import example, given
from hypothesis import strategies as st

from attngen.lang.diagnostics import SpecError
from attngen.lang.frontend import format_source, loads

from .specs import VALID_SPECS

TOKENS = [
    "attention", "{", "}", "(", ")", "[", "]", ",", ";", ":", "&&", "||", "!", "==", "<=", "-", "*",
    "/", "%", "mask", "score", "kv", "q", "s", "causal", "window(", "1e999", "99999999999", "0.5",
    "12x8", "#", "\n", " ", "\"", "'", "$", "\x00", "é", "\t", "tile", "block_m", "norm", "input",
    "true", "heads", "__x", "ag_", "1.2.3", ".5", "1e", "q_lens", "scope token", "affine",
]

text_noise = st.text(min_size=0, max_size=6)
token_noise = st.lists(st.sampled_from(TOKENS), min_size=1, max_size=4).map("".join)


@st.composite
def mutated(draw) -> str:
    text = draw(st.sampled_from(VALID_SPECS))
    for _ in range(draw(st.integers(1, 4))):
        i = draw(st.integers(0, len(text)))
        kind = draw(st.sampled_from(["delete", "insert_token", "insert_noise", "replace"]))
        if kind == "delete":
            j = draw(st.integers(i, min(len(text), i + 12)))
            text = text[:i] + text[j:]
        elif kind == "insert_token":
            text = text[:i] + draw(token_noise) + text[i:]
        elif kind == "insert_noise":
            text = text[:i] + draw(text_noise) + text[i:]
        else:
            text = text[:i] + draw(token_noise) + text[i + 1 :]
    return text


def _outcome(text: str):
    try:
        return loads(text, path="fuzz.attn")
    except SpecError as e:
        assert e.diagnostics, "a SpecError must carry at least one diagnostic"
        rendered = e.render()
        assert "Traceback" not in rendered and "__ANON" not in rendered
        return None


@given(mutated())
@example("attention a { mask \x00 }")
@example("attention")
@example("}")
@example("attention a { dtype bf16 head_dim 64 heads 2 mask q[")
def test_mutated_specs_never_crash(text: str):
    _outcome(text)  # any exception other than SpecError fails the test


@given(mutated())
def test_formatting_mutants_never_crash_and_keeps_meaning(text: str):
    try:
        out = format_source(text, path="fuzz.attn")
    except SpecError:
        return
    assert format_source(out) == out
    before, after = _outcome(text), _outcome(out)
    assert (before is None) == (after is None)
    if before is not None:
        assert before == after


@given(st.text(max_size=80))
def test_arbitrary_text_never_crashes(text: str):
    _outcome(text)
