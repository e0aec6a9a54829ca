"""The hostile-spec layer: hand-written and generated extreme specs through check, fmt, explain and
compile. Every outcome is exit 0 or a located error with exit 1, inside a time and memory budget.

Each file in specs/ starts with `# expect: ok` or `# expect: error LINE TEXT`: a regression test for
one defect class of issue 19 (its second line says which). Specs too large to keep as files
(hundreds of inputs, megabyte literals, thousands of variants) are generated here.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ._hostile import COMMANDS, check_outcome, expectation, run

SPECS = sorted((Path(__file__).parent / "specs").glob("*.attn"))


def test_enough_hostile_specs():
    assert len(SPECS) >= 20


@pytest.mark.parametrize("spec", SPECS, ids=lambda p: p.stem)
def test_hand_written(spec: Path, tmp_path: Path):
    want, line, text = expectation(spec.read_text(encoding="utf-8"))
    for command in COMMANDS:
        r = run(command, spec, tmp_path)
        check_outcome(r, spec.name)
        if command == "fmt":
            continue  # fmt needs only valid syntax: it formats specs that do not check
        if want == "ok":
            assert r.rc == 0, f"`{command}` refused {spec.name}:\n{r.err}"
        else:
            assert r.rc == 1, f"`{command}` accepted {spec.name}"
            assert f"{spec.name}:{line}:" in r.err and text in r.err, f"{spec.name}: expected line {line}, {text!r}:\n{r.err}"
    if want == "ok":
        assert (tmp_path / (spec.stem + ".cu")).stat().st_size > 0


def _write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return p


def _many_inputs(n: int, dims: str) -> str:
    inputs = "".join(f"  input t{i}: fp32[{dims}]\n" for i in range(n))
    return f"attention many {{\n  dtype bf16\n  head_dim 128\n  heads 16\n  mask causal\n{inputs}}}\n"


@pytest.mark.parametrize("n, dims, ok", [(581, "B, H, Lq, Lk", True), (582, "B, H, Lq, Lk", False),
                                         (1400, "Lk", False)])
def test_parameter_space(tmp_path: Path, n: int, dims: str, ok: bool):
    """Hundreds of rank-4 inputs, or 1400 rank-1 (the issue had 10k), overflowed the kernel's 32,764 bytes of arguments:
    refused at the input that passes the limit. 581 rank-4 inputs still fit (nvcc compiles them:
    tests/hostile/test_nvcc_sample.py)."""
    p = _write(tmp_path, "many.attn", _many_inputs(n, dims))
    for command in ("check", "compile"):
        r = run(command, p, tmp_path)
        check_outcome(r, f"{n} inputs")
        assert r.rc == (0 if ok else 1), r.err[:2000]
    if not ok:
        assert "more than the 32764 a CUDA kernel may take" in r.err
        # Located at the first input whose fields pass the limit, not at the variant.
        line = int(r.err.split(":")[1])
        assert 6 < line < 6 + n


def test_megabyte_literal(tmp_path: Path):
    p = _write(tmp_path, "huge.attn", "attention a {\n  dtype bf16\n  head_dim 64\n  heads 4\n  scale 0." + "1" * (1 << 20) + "\n}\n")
    for command in COMMANDS:
        r = run(command, p, tmp_path)
        check_outcome(r, "1 MB literal")
        assert r.rc == 1 and "huge.attn:5:9: error: number of 1048578 characters is too long" in r.err


def test_megabyte_name(tmp_path: Path):
    p = _write(tmp_path, "name.attn", "attention a {\n  dtype bf16\n  head_dim 64\n  heads 4\n  mask " + "x" * (1 << 20) + "\n}\n")
    r = run("check", p, tmp_path)
    check_outcome(r, "1 MB name")
    assert r.rc == 1 and "name.attn:5:8: error: name of 1048576 characters is too long" in r.err


def test_expression_size_is_bounded(tmp_path: Path):
    """A balanced tree of lookups stays under the nesting bound but made a kernel ptxas could not
    finish: the masks and scores of a variant hold at most MAX_EXPR_NODES operations."""
    from attngen.lang.lower import MAX_EXPR_NODES

    terms = [f"t[kv + {i}] != {i}" for i in range(400)]
    while len(terms) > 1:
        terms = [f"({terms[i]} || {terms[i + 1]})" if i + 1 < len(terms) else terms[i] for i in range(0, len(terms), 2)]
    p = _write(tmp_path, "wide.attn", f"attention a {{\n  dtype bf16\n  head_dim 64\n  heads 4\n  input t: i32[Lk]\n"
               f"  score s * 0.5\n  mask {terms[0]}\n}}\n")
    r = run("check", p, tmp_path)
    check_outcome(r, "wide mask")
    assert r.rc == 1 and f"wide.attn:7:3: error: the masks and scores of `a` pass {MAX_EXPR_NODES} operations" in r.err


# --------------------------------------------------------------------------------------------
# Generated hostile specs


_NAME_PARTS = ("x", "n", "s", "_", "0", "1", "q_lens", "kv_lens", "q_norm_weight", "in", "ag", "t")


@st.composite
def hostile_spec(draw) -> str:
    """A spec near every limit at once: names built from the mangling's own parts, extreme numbers,
    many or high-rank inputs, heads at the grid's edge, odd line breaks and nested expressions.
    Many are refused; none may crash, hang or hold memory."""
    nl = draw(st.sampled_from(["\n", "\r\n", "\r", "\n\f", "\n# \v \x85 \u2028\n"]))
    heads = draw(st.sampled_from(["1", "4", "64", "65535", "65536", "2147483647", "4 kv 2", "0"]))
    lines = [f"dtype {draw(st.sampled_from(['bf16', 'fp16', 'fp32']))}", f"head_dim {draw(st.sampled_from(['64', '128']))}",
             f"heads {heads}"]
    names: list[tuple[str, int]] = []
    for _ in range(draw(st.integers(0, 6))):
        name = "".join(draw(st.lists(st.sampled_from(_NAME_PARTS), min_size=1, max_size=4)))
        if not (name[0].isalpha() or name[0] == "_"):
            name = "t" + name
        rank = draw(st.integers(1, 4))
        dims = draw(st.sampled_from(["B", "H", "Lq", "Lk", "E", "2147483647", "1000000", "1"]))
        shape = ", ".join(["B", "H", "Lq", dims][-rank:] if rank < 4 else ["B", "H", "Lq", "Lk"])
        lines.append(f"input {name}: {draw(st.sampled_from(['u8', 'i32', 'fp32']))}[{shape}]")
        names.append((name, rank))
    tiny = draw(st.sampled_from(["1e-50", "1e-45", "1.2e-38", "0.125", "1" + "0" * 40, "0" * 300 + "1"]))
    if draw(st.booleans()):
        lines.append(f"scale {tiny}")
    if draw(st.booleans()):
        lines.append(f"norm q rmsnorm({tiny})")
    if draw(st.booleans()):
        lines.append("mask padding")
    elif names and draw(st.booleans()):
        name, rank = names[0]
        idx = ", ".join(["b", "h", "q", "kv"][-rank:])
        depth = draw(st.sampled_from([1, 2, 5]))
        inner = idx
        if rank == 1:
            for _ in range(depth - 1):
                inner = f"{name}[{inner}]"
        lines.append(f"mask {name}[{inner}] != 0 && causal")
    if draw(st.booleans()):
        lines.append(f"score softcap({tiny})")
    body = "".join(f"  {x}{nl}" for x in lines)
    return f"# hostile{nl}attention hostile {{{nl}{body}}}{nl}"


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(hostile_spec())
def test_generated_hostile_specs(tmp_path_factory, text: str):
    tmp = tmp_path_factory.mktemp("hostile")
    p = tmp / "h.attn"
    p.write_bytes(text.encode("utf-8"))
    results = {c: run(c, p, tmp) for c in COMMANDS}
    for r in results.values():
        check_outcome(r, repr(text[:400]))
    # Whatever check accepts, explain and compile accept too (and the reverse).
    assert results["check"].rc == results["explain"].rc == results["compile"].rc, {c: r.err[:500] for c, r in results.items()}
