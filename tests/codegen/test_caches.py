"""The on-disk caches that make a warm `attngen.compile` cheap in a fresh process: the parser's
LALR tables and the compiled templates. Each must give exactly what a rebuild gives, treat a
damaged entry as a miss, and shrug off a cache directory it cannot write."""

from __future__ import annotations

import lark
import pytest

from attngen.cuda import render as R
from attngen.lang import parse as P
from attngen.lang.diagnostics import SpecError
from attngen.lang.frontend import loads
from attngen.plan.schedule import Arch

GOOD = "attention a {\n  dtype bf16\n  head_dim 128\n  heads 8 kv 2\n  mask causal && window(64, 0)\n  score softcap(30)\n}\n"
BAD = "attention a {\n  dtype bf16\n  head_dim 128\n  mask causal &&\n}\n"


def _diagnostic(parser: lark.Lark, monkeypatch: pytest.MonkeyPatch, text: str) -> str:
    monkeypatch.setattr(P, "_parser", lambda: parser)
    with pytest.raises(SpecError) as e:
        P.parse(text, "bad.attn")
    return str(e.value)


def test_parser_tables_come_back_from_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNGEN_CACHE_DIR", str(tmp_path))
    built = P._parser.__wrapped__()
    entries = list(tmp_path.glob("parser-*.lark"))
    assert len(entries) == 1
    # The second build must not construct a grammar: it loads the saved tables.
    monkeypatch.setattr(lark.Lark, "__init__", lambda *a, **k: pytest.fail("rebuilt instead of loading"))
    loaded = P._parser.__wrapped__()
    monkeypatch.undo()
    assert _diagnostic(built, monkeypatch, BAD) == _diagnostic(loaded, monkeypatch, BAD)
    monkeypatch.setattr(P, "_parser", lambda: loaded)
    assert P.parse(GOOD, "good.attn") is not None


def test_damaged_parser_entry_is_a_miss(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNGEN_CACHE_DIR", str(tmp_path))
    P._parser.__wrapped__()
    (entry,) = tmp_path.glob("parser-*.lark")
    entry.write_bytes(b"not a pickle at all")
    parser = P._parser.__wrapped__()
    monkeypatch.setattr(P, "_parser", lambda: parser)
    assert P.parse(GOOD, "good.attn") is not None
    assert entry.read_bytes() != b"not a pickle at all"  # rebuilt and written again


def test_unwritable_cache_directory_only_costs_a_rebuild(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    monkeypatch.setenv("ATTNGEN_CACHE_DIR", str(blocker / "cache"))
    parser = P._parser.__wrapped__()
    env = R._environment.__wrapped__()
    monkeypatch.setattr(P, "_parser", lambda: parser)
    assert P.parse(GOOD, "good.attn") is not None
    assert env.get_template("common/checks.cu.j2") is not None


def _render(env, monkeypatch) -> str:
    monkeypatch.setattr(R, "_environment", lambda: env)
    v = loads(GOOD).get(None)
    return R.render(v, Arch.SM90A)


def test_compiled_templates_render_the_same_bytes(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNGEN_CACHE_DIR", str(tmp_path))
    make = R._environment.__wrapped__
    fresh = _render(make(), monkeypatch)
    saved = list((tmp_path / "templates").iterdir())
    assert saved, "the first environment keeps its compiled templates on disk"
    assert _render(make(), monkeypatch) == fresh
    for f in saved:
        f.write_bytes(f.read_bytes()[:20])  # truncated entries
    assert _render(make(), monkeypatch) == fresh


def test_one_environment_a_process():
    assert R._environment() is R._environment()
