"""Every example in the gallery loads, says what it stands for, and round-trips through the printer."""

from __future__ import annotations

from pathlib import Path

import pytest

from attngen.ir.nodes import AttnKind, Builtin, BuiltinName, NormScope, NormTarget, walk

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples").glob("*.attn"))
IDS = [p.stem for p in EXAMPLES]
# The quantized gallery (docs/QUANT.md) lives apart until the CUDA backend runs it: the tests that
# compile every example for a GPU read EXAMPLES; the language's tests below read both.
QUANT = sorted((ROOT / "examples" / "quant").glob("*.attn"))
ALL, ALL_IDS = EXAMPLES + QUANT, IDS + [f"quant/{p.stem}" for p in QUANT]


def _load(path: Path):
    from attngen.lang.frontend import load

    return load(str(path))


def test_gallery_size():
    assert len(EXAMPLES) >= 14, [p.name for p in EXAMPLES]


@pytest.mark.parametrize("path", ALL, ids=ALL_IDS)
def test_example_loads(path):
    program = _load(path)
    assert program.variants, f"{path.name} defines no variant"
    names = [v.name for v in program.variants]
    assert len(set(names)) == len(names)


@pytest.mark.parametrize("path", ALL, ids=ALL_IDS)
def test_example_has_header_comment(path):
    lines = path.read_text().splitlines()
    header = []
    for line in lines:
        if not line.startswith("#"):
            break
        header.append(line.lstrip("# ").strip())
    words = " ".join(header)
    # A real sentence about the model or use it stands for, before the first variant.
    assert len(words) >= 40, f"{path.name}: the header comment should say what model/use it stands for"


@pytest.mark.parametrize("path", ALL, ids=ALL_IDS)
def test_example_print_round_trip(path):
    from attngen.lang.frontend import loads, print_program

    program = _load(path)
    text = print_program(program)
    again = loads(text, str(path))
    assert again == program
    assert print_program(again) == text  # the printer is a fixed point


@pytest.mark.parametrize("path", ALL, ids=ALL_IDS)
def test_single_variant_examples_are_named_after_their_file(path):
    program = _load(path)
    if len(program.variants) == 1:
        assert program.variants[0].name == path.stem


def _all_variants():
    return [v for p in EXAMPLES for v in _load(p).variants]


def test_gallery_covers_every_builtin():
    seen = set()
    for v in _all_variants():
        for e in (v.mask, *v.scores):
            seen |= {n.name for n in walk(e) if isinstance(n, Builtin)}
    missing = set(BuiltinName) - seen
    # `bias` with a rank-3 table and the rest: each builtin is used by at least one example.
    assert not missing, f"no example uses: {sorted(m.value for m in missing)}"


def test_gallery_covers_the_headline_cases():
    vs = _all_variants()
    # The seed case: fp32, H8, D64, padding.
    assert any(
        v.dtype.value == "fp32" and v.heads == 8 and v.head_dim == 64
        and any(isinstance(n, Builtin) and n.name == BuiltinName.PADDING for n in walk(v.mask))
        for v in vs
    )
    # Seed 003: pre-LN (token scope) cross attention with residual, bf16.
    assert any(
        v.kind == AttnKind.CROSS and v.residual and v.dtype.value == "bf16"
        and (n := v.norm(NormTarget.Q)) is not None and n.scope == NormScope.TOKEN
        for v in vs
    )
    # GQA, MQA, QK-norm on both q and k, an lse output, a custom (builtin-free) mask term.
    assert any(1 < v.kv_heads < v.heads for v in vs)
    assert any(v.kv_heads == 1 and v.heads > 1 for v in vs)
    assert any(v.norm(NormTarget.Q) and v.norm(NormTarget.K) for v in vs)
    assert any(v.lse for v in vs)
    assert any(v.dtype.value == d for v in vs for d in ("fp16",))
    assert any(len(_load(p).variants) >= 2 for p in EXAMPLES)


def test_quantized_gallery_covers_the_issue():
    # FP8 prefill, Sage-style INT8, the pre-LN INT8 seed case and an FP8 paged decode.
    from attngen.ir.nodes import QuantOperand

    vs = {p.stem: _load(p).get() for p in QUANT}
    assert vs["fp8_prefill"].quantized_qk and vs["fp8_prefill"].quantized_pv and vs["fp8_prefill"].q_dtype.value == "fp8_e4m3"
    assert vs["sage_int8"].quant(QuantOperand.K).smooth is not None and vs["sage_int8"].quant(QuantOperand.Q).dtype.value == "i8"
    seed = vs["whisper_preln_int8"]
    assert seed.norm(NormTarget.Q).scope == NormScope.TOKEN and seed.quant(QuantOperand.Q).dtype.value == "i8"
    assert vs["fp8_paged_decode"].page_size is not None and vs["fp8_paged_decode"].k_dtype.value == "fp8_e4m3"
