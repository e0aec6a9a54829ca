"""Every hint the front end prints leads somewhere: applying the text it suggests gets the spec past
that error, and the chain of hints that follows ends in a spec that loads (no dead end such as
`input bias: ...`, which the reserved-name check refuses).

The sites are found in the source (every `error(...)`/`Diagnostic(...)` in attngen/lang/ whose help
is not a plain sentence without code), so a new hint must join one of the two tables below: FIXERS
(how a user applies its text) or NOT_TEXT (why it suggests no text to paste).
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from attngen.lang.diagnostics import Diagnostic, SpecError
from attngen.plan import validate

LANG = Path(__file__).resolve().parents[2] / "attngen" / "lang"

# What a user types for a suggestion's placeholders (`softcap(c)`, `window(left, right)`, `x[...]`).
FILL = {"c": "30.0", "left": "128", "right": "0", "x": "s", "a": "s", "b": "30.0", "cond": "q >= kv", "NAME": "a",
        "n": "16", "t": "tbl", "m": "8"}
INDEX_DIMS = {"b": "B", "h": "H", "q": "Lq", "kv": "Lk"}


# --------------------------------------------------------------------------------------------
# the sites


def _template(node: ast.expr) -> str:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _template(node.left) + _template(node.right)
    return "{}"


# Variables that hold a computed hint (a did-you-mean, a declaration) where a help is passed on.
_HINT_VARIABLES = {"hint", "extra", "help_"}


def _suggests(help_: ast.expr) -> bool:
    """Whether a help expression may suggest text: code in backticks, or a computed hint."""
    src = ast.unparse(help_)
    names = {n.id for n in ast.walk(help_) if isinstance(n, ast.Name)}
    return "`" in src or "_did_you_mean" in src or "_declare_hint" in src or bool(names & _HINT_VARIABLES)


def hint_sites() -> set[str]:
    """The message templates of every diagnostic in attngen/lang/ whose help may suggest text."""
    out = set()
    for path in sorted(LANG.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        helpers = {id(n) for f in ast.walk(tree) if isinstance(f, ast.FunctionDef) and f.name == "error"
                   for n in ast.walk(f)}  # the error() method that passes a diagnostic on
        for n in ast.walk(tree):
            if not isinstance(n, ast.Call) or len(n.args) < 3 or id(n) in helpers:
                continue
            name = n.func.attr if isinstance(n.func, ast.Attribute) else getattr(n.func, "id", None)
            if name in ("error", "Diagnostic") and _suggests(n.args[2]):
                out.add(_template(n.args[0]))
    return out


def _regex(template: str) -> re.Pattern[str]:
    return re.compile("^" + ".+?".join(re.escape(p) for p in template.split("{}")) + "$", re.S)


def template_of(message: str, templates) -> str:
    """The most specific template `message` was made from."""
    # ("{}" is the parser's message, passed on whole: it always starts "unexpected")
    found = [t for t in templates if _regex(t).match(message) and (t != "{}" or message.startswith("unexpected "))]
    assert found, f"no hint site makes {message!r}"
    return max(found, key=lambda t: len(t.replace("{}", "")))


# --------------------------------------------------------------------------------------------
# applying a hint's text


def _offset(text: str, line: int, col: int) -> int:
    lines = text.split("\n")
    return sum(len(ln) + 1 for ln in lines[:line - 1]) + col - 1


def _span(text: str, d: Diagnostic) -> tuple[int, int]:
    sp = d.span
    return _offset(text, sp.line, sp.col), _offset(text, sp.end_line, sp.end_col)


def snippets(d: Diagnostic) -> list[str]:
    return re.findall(r"`([^`]*)`", d.help or "")


def fill(snippet: str, text: str = "") -> str:
    """A suggestion with its placeholders filled as a user would: parameter names by FILL, an
    `input NAME: fp32[...]` by the indices NAME is looked up with."""
    if re.match(r"input \w+: \.\.\.$", snippet):  # a tensor argument: a bias table's shape
        return snippet.replace("...", "fp32[H, Lq, Lk]")
    m = re.match(r"input (\w+): (\w+)\[\.\.\.\]$", snippet)
    if m:
        use = re.search(rf"\b(?:{m.group(1)}|{m.group(1).removesuffix('_t')})\[([^\]]*)\]", text)
        dims = [INDEX_DIMS.get(i.strip(), "Lk") for i in use.group(1).split(",")] if use else ["H"]
        return f"input {m.group(1)}: {m.group(2)}[{', '.join(dims)}]"
    return re.sub(r"\b(\w+)\b", lambda w: FILL.get(w.group(1), w.group(1)), snippet) if "(" in snippet else snippet


@functools.cache
def replace_span(k: int) -> Callable[[str, Diagnostic], str]:
    def fix(text: str, d: Diagnostic) -> str:
        a, b = _span(text, d)
        return text[:a] + fill(snippets(d)[k], text) + text[b:]
    return fix


def did_you_mean(text: str, d: Diagnostic) -> str:
    """`did you mean `x`?`: the name at the span becomes x."""
    m = re.search(r"did you mean `([^`]*)`", d.help or "")
    if m is None:
        return declare(text, d)
    a, b = _span(text, d)
    return text[:a] + m.group(1) + text[b:]


def declare(text: str, d: Diagnostic) -> str:
    """`declare it: `input x: T`` (or, for a reserved name, under `x_t`, written at the span too)."""
    snip = snippets(d)
    decl = fill(next(s for s in snip if s.startswith("input ")), text)
    if "write" in (d.help or ""):  # a reserved name: the use takes the new name as well
        a, b = _span(text, d)
        text = text[:a] + snip[-1] + text[b:]
    return insert_line(text, decl)


def insert_line(text: str, line: str) -> str:
    i = text.rindex("}")
    return text[:i] + f"  {line}\n" + text[i:]


@functools.cache
def insert(k: int) -> Callable[[str, Diagnostic], str]:
    return lambda text, d: insert_line(text, fill(snippets(d)[k]))


@functools.cache
def replace_line(k: int) -> Callable[[str, Diagnostic], str]:
    def fix(text: str, d: Diagnostic) -> str:
        lines = text.split("\n")
        lines[d.span.line - 1] = "  " + fill(snippets(d)[k])
        return "\n".join(lines)
    return fix


def replace_statement(keyword: str, k: int) -> Callable[[str, Diagnostic], str]:
    """Replace the `keyword ...` statement (not the one at the span) with the k-th snippet."""
    return lambda text, d: re.sub(rf"(?m)^  {keyword} .*$", "  " + snippets(d)[k], text, count=1)


def delete_line(text: str, d: Diagnostic) -> str:
    lines = text.split("\n")
    del lines[d.span.line - 1]
    return "\n".join(lines)


def drop_word(text: str, d: Diagnostic) -> str:
    lines = text.split("\n")
    word = snippets(d)[0]
    lines[d.span.line - 1] = re.sub(rf"\s+{word}\b", "", lines[d.span.line - 1])
    return "\n".join(lines)


def compare(text: str, d: Diagnostic) -> str:
    """`compare first, e.g. `x != 0``: the operand at the span, compared (parenthesised)."""
    a, b = _span(text, d)
    return text[:a] + "(" + snippets(d)[0].replace("x", text[a:b], 1) + ")" + text[b:]


def call_to_lookup(text: str, d: Diagnostic) -> str:
    """`look it up with brackets: `t[...]``: `t(i, j)` becomes `t[i, j]`."""
    a, _ = _span(text, d)
    m = re.compile(r"(\w+)\(([^()]*)\)").match(text, a)
    return text[:a] + snippets(d)[0].replace("...", m.group(2)) + text[m.end():]


def rename_input(text: str, d: Diagnostic) -> str:
    """`pick another name, e.g. `x_t``: the declaration and every use."""
    a, b = _span(text, d)
    return re.sub(rf"\b{re.escape(text[a:b])}\b(?=\[|\)|:)", snippets(d)[0], text)


def redeclare(text: str, d: Diagnostic) -> str:
    """`declare it as `input x: T``: the input's declaration becomes that."""
    decl = snippets(d)[0]
    name = decl.split()[1].rstrip(":")
    return re.sub(rf"(?m)^  input {name}:.*$", "  " + decl, text)


def whole_spec(text: str, d: Diagnostic) -> str:
    return text + fill(snippets(d)[0]).replace("; ", "\n  ").replace("{ ", "{\n  ").replace(" }", "\n}") + "\n"


def insert_all(text: str, d: Diagnostic) -> str:
    """`add `a`, `b``: every snippet, one a line."""
    for snip in snippets(d):
        text = insert_line(text, snip)
    return text


def append_to_line(text: str, d: Diagnostic) -> str:
    """`add one of `x`, ...`: the first snippet appended to the statement at the span."""
    lines = text.split("\n")
    lines[d.span.line - 1] += " " + snippets(d)[0]
    return "\n".join(lines)


FIXERS: dict[str, Callable[[str, Diagnostic], str]] = {
    "bad number `{}`": replace_span(1),
    "`{}` is a function": replace_span(0),
    "tensor `{}` must be indexed": replace_span(0),
    "unknown name `{}`": did_you_mean,
    "unknown {} `{}`": did_you_mean,
    "unknown tensor `{}`": did_you_mean,
    "unknown function `{}`": did_you_mean,
    "`!` needs a bool, got {}": compare,
    "`{}` needs bools, got {}": compare,
    "`{}` is a tensor, not a function": call_to_lookup,
    "`{}` takes {} argument{}, got {}": replace_span(0),
    "`{}` modifies the score and cannot be used in a mask": replace_line(1),
    "`{}` needs arguments": replace_span(0),
    "`{}` takes {}, got {}": replace_span(0),
    "`document(ids)` with one tensor needs `kind self`": replace_span(0),
    "variant `{}` has no `dtype`": insert(0),
    "variant `{}` has no `head_dim`": insert(0),
    "variant `{}` has no `heads`": insert(0),
    "a score must be a number, got {}": replace_line(2),
    "a mask must be a bool, got {}": replace_line(0),
    "unknown kv_cache layout `{}`": replace_line(1),
    "`kv_cache paged` needs `kind cross`": insert(0),
    "`{}` is implied by `kv_cache paged`": delete_line,
    "`{}` is implied by `kv_cache paged` as i32[B]": delete_line,
    "`sorted` input `{}` with `kv_cache paged`: the decode family, which runs paged caches, does not check `sorted` "
    "promises yet": drop_word,
    "`{}` is implied by `layout varlen`": delete_line,
    "`norm {}` is not implemented with `layout varlen`": replace_statement("layout", 0),
    "`kv_cache paged` does not combine with `layout varlen`": replace_statement("layout", 0),
    "`sink {}` names no declared input": lambda text, d: insert_line(text, snippets(d)[0]),
    "a sink input must be fp32[H], got {}[{}]": redeclare,
    "`{}` is a reserved name and cannot name an input": rename_input,
    "token-scope norm is only for `q`, not `{}`": replace_span(0),
    "no `attention` variant in this file": whole_spec,
    "{}": did_you_mean,  # the parser's "unexpected ...": did you mean `keyword`?
    "the output cannot be {}: quantized types are for q, k and v": replace_line(0),
    "{}{} stored quantized without a scale": insert_all,
    "`{}` is stored as {}: its scale cannot be computed in the kernel": replace_line(0),
    "`{}` is quantized in the kernel but `{}` is not": insert(0),
    "p is quantized but v is not": insert(0),
    "p is computed in the kernel and has no input scale": replace_line(0),
    "`static` needs its scale: `static(c)`": replace_line(0),
    "a `static` scale covers the whole of p": replace_line(0),
    "`smooth mean` needs scales computed in the kernel": replace_line(0),
    "`quant` is not implemented with `layout varlen`": replace_statement("layout", 0),
    "say what one scale of `{}` covers": append_to_line,
    "`{}` takes no `{}` scales `per {}`{}": replace_span(0),
}

NOT_TEXT = {
    "{} `{}` is not an identifier": "names the characters a name may use",
    "{} `{}` uses a reserved prefix": "names the prefixes a name may not start with",
    "the score `s` cannot be used in a mask": "says where `s` belongs; moving it changes what is computed",
    "`{}` needs numbers, got {}": "lists the bool operators; which one is meant is the user's choice",
    "variant name `{}` ends in the reserved suffix `{}`": "lists the suffixes to avoid",
    "input name `{}` ends in the reserved suffix `{}`": "lists the suffixes to avoid",
    "`{}` cannot name a dimension": "lists the size names",
    "unexpected character `{}`": "says the language has no strings",
}

HEAD = "attention a {\n  dtype fp16\n  head_dim 64\n  heads 8\n"

# Specs whose first error is each site (the key), and so the start of a chain.
CASES: dict[str, str] = {
    "bad number `{}`": HEAD + "  scale 0.5.5\n}\n",
    "`{}` is a function": HEAD + "  score s + exp\n}\n",
    "tensor `{}` must be indexed": HEAD + "  input ids: i32[B, Lk]\n  mask ids != 0\n}\n",
    "unknown name `{}`": HEAD + "  mask q >= kvv\n}\n",
    "unknown {} `{}`": HEAD.replace("fp16", "fp61") + "}\n",
    "unknown tensor `{}`": HEAD + "  input tbl: fp32[H, Lq, Lk]\n  score s + tbll[h, q, kv]\n}\n",
    "unknown function `{}`": HEAD + "  score s + tanhh(s)\n}\n",
    "`!` needs a bool, got {}": HEAD + "  input ids: i32[B, Lk]\n  mask !ids[b, kv]\n}\n",
    "`{}` needs bools, got {}": HEAD + "  input ids: i32[B, Lk]\n  mask ids[b, kv] && q >= kv\n}\n",
    "`{}` is a tensor, not a function": HEAD + "  input tbl: fp32[H, Lq, Lk]\n  score s + tbl(h, q, kv)\n}\n",
    "`{}` takes {} argument{}, got {}": HEAD + "  score min(s)\n}\n",
    "`{}` modifies the score and cannot be used in a mask": HEAD + "  mask softcap(30.0)\n}\n",
    "`{}` needs arguments": HEAD + "  score softcap\n}\n",
    "`{}` takes {}, got {}": HEAD + "  mask window(128)\n}\n",
    "`document(ids)` with one tensor needs `kind self`":
        HEAD + "  kind cross\n  input q_ids: i32[B, Lq]\n  input kv_ids: i32[B, Lk]\n  mask document(q_ids)\n}\n",
    "variant `{}` has no `dtype`": "attention a {\n  head_dim 64\n  heads 8\n}\n",
    "variant `{}` has no `head_dim`": "attention a {\n  dtype fp16\n  heads 8\n}\n",
    "variant `{}` has no `heads`": "attention a {\n  dtype fp16\n  head_dim 64\n}\n",
    "a score must be a number, got {}": HEAD + "  score q >= kv\n}\n",
    "a mask must be a bool, got {}": HEAD + "  mask s0\n  input s0: i32[B, Lk]\n}\n".replace("mask s0", "mask 1"),
    "unknown kv_cache layout `{}`": HEAD + "  kind cross\n  kv_cache pagd(16)\n}\n",
    "`kv_cache paged` needs `kind cross`": HEAD + "  kv_cache paged(16)\n}\n",
    "`{}` is implied by `kv_cache paged`": HEAD + "  kind cross\n  kv_cache paged(16)\n  input block_table: i32[B, max_pages]\n}\n",
    "`{}` is implied by `kv_cache paged` as i32[B]": HEAD + "  kind cross\n  kv_cache paged(16)\n  input cache_lens: i32[B, Lk]\n}\n",
    "`sorted` input `{}` with `kv_cache paged`: the decode family, which runs paged caches, does not check `sorted` "
    "promises yet": HEAD + "  kind cross\n  kv_cache paged(16)\n  input st: i32[B, Lk] sorted\n  mask st[b, kv] > 0\n}\n",
    "`{}` is implied by `layout varlen`": HEAD + "  layout varlen\n  input cu_seqlens: i32[Bp1]\n}\n",
    "`norm {}` is not implemented with `layout varlen`": HEAD + "  layout varlen\n  norm k rmsnorm(1e-6)\n}\n",
    "`kv_cache paged` does not combine with `layout varlen`": HEAD + "  kind cross\n  layout varlen\n  kv_cache paged(16)\n}\n",
    "`sink {}` names no declared input": HEAD + "  sink sk\n}\n",
    "a sink input must be fp32[H], got {}[{}]": HEAD + "  input sk: fp16[H]\n  sink sk\n}\n",
    "`{}` is a reserved name and cannot name an input": HEAD + "  input bias: fp32[H, Lq, Lk]\n  score bias(bias)\n}\n",
    "token-scope norm is only for `q`, not `{}`": HEAD + "  layout bshd\n  norm k rmsnorm(1e-6) scope token\n}\n",
    "no `attention` variant in this file": "# nothing here yet\n",
    "{}": (HEAD + "  dtyp fp16\n}\n").replace("  dtype fp16\n", ""),
    "the output cannot be {}: quantized types are for q, k and v": HEAD.replace("fp16", "fp8_e4m3") + "}\n",
    "{}{} stored quantized without a scale": HEAD.replace("fp16", "fp16 k i8 v i8") + "}\n",
    "`{}` is stored as {}: its scale cannot be computed in the kernel":
        HEAD.replace("fp16", "fp16 v fp8_e5m2") + "  quant v fp8_e5m2 amax per channel\n}\n",
    "`{}` is quantized in the kernel but `{}` is not": HEAD + "  quant k i8 amax per block(64)\n}\n",
    "p is quantized but v is not": HEAD + "  quant p fp8_e4m3 static(448.0)\n}\n",
    "p is computed in the kernel and has no input scale": HEAD + "  quant v fp8_e4m3 amax per channel\n  quant p fp8_e4m3 input per head\n}\n",
    "`static` needs its scale: `static(c)`": HEAD + "  quant v fp8_e4m3 amax per channel\n  quant p fp8_e4m3 static\n}\n",
    "a `static` scale covers the whole of p": HEAD + "  quant v i8 amax per channel\n  quant p i8 static(127.0) per token\n}\n",
    "`smooth mean` needs scales computed in the kernel":
        HEAD + "  quant q i8 input per head\n  quant k i8 input per head smooth mean\n}\n",
    "`quant` is not implemented with `layout varlen`": HEAD + "  layout varlen\n  quant q i8 amax per token\n  quant k i8 amax per token\n}\n",
    "say what one scale of `{}` covers": HEAD + "  quant q i8 amax\n  quant k i8 amax per token\n}\n",
    "`{}` takes no `{}` scales `per {}`{}": HEAD + "  quant v fp8_e4m3 input per token\n  quant p fp8_e4m3 static(448.0)\n}\n",
}
# The chain of the issue: a lookup of the reserved `bias` hints at another name, not `input bias`.
CASES_EXTRA = {"reserved lookup": HEAD + "  score s + bias[q, kv]\n}\n",
               "reserved tensor argument": HEAD + "  score bias(bias)\n}\n"}


def first_error(text: str) -> Diagnostic | None:
    try:
        validate.loads(text, "h.attn")
    except SpecError as e:
        return e.diagnostics[0]
    return None


def walk(text: str, templates: set[str], steps: int = 4) -> list[str]:
    """Apply hints until the spec loads; the templates met on the way."""
    seen = []
    for _ in range(steps):
        d = first_error(text)
        if d is None:
            return seen
        t = template_of(d.message, templates)
        assert t in FIXERS, f"dead end: {d.message!r} (help: {d.help!r}) suggests no text to apply\n{text}"
        seen.append(t)
        fixed = FIXERS[t](text, d)
        after = first_error(fixed)
        assert fixed != text and (after is None or (after.message, after.span) != (d.message, d.span)), (
            f"applying {d.help!r} did not get past {d.message!r}:\n{fixed}")
        text = fixed
    raise AssertionError(f"still failing after {steps} hints: {seen}\n{text}")


def test_every_hint_site_is_classified():
    sites = hint_sites()
    assert len(sites) > 30  # the scan finds the front end's hints
    unclassified = sites - set(FIXERS) - set(NOT_TEXT)
    assert not unclassified, f"new hints: add a fixer and a case, or say why they suggest no text: {unclassified}"
    stale = (set(FIXERS) | set(NOT_TEXT)) - sites
    assert not stale, f"hints no longer in the source: {stale}"
    assert set(CASES) == set(FIXERS), set(CASES) ^ set(FIXERS)


@pytest.mark.parametrize("site", sorted(CASES))
def test_hint_chain_ends_in_a_spec_that_loads(site):
    templates = hint_sites()
    d = first_error(CASES[site])
    # (a message two sites can make, "`window` takes 2 arguments", is fixed the same way by both)
    assert d is not None and FIXERS[template_of(d.message, templates)] is FIXERS[site], (d, site)
    walk(CASES[site], templates)


@pytest.mark.parametrize("name", sorted(CASES_EXTRA))
def test_reserved_name_chain(name):
    d = first_error(CASES_EXTRA[name])
    assert "`input bias:" not in (d.help or ""), d.help
    assert "`input bias_t:" in d.help
    walk(CASES_EXTRA[name], hint_sites())
