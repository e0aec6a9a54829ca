"""Every builtin is declared once (attngen.lang.builtins): lowering, explain, the workload and the
spec fuzzer read that declaration, and a new entry reaches all of them."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, given, settings

import attngen
from attngen.ir.nodes import SCORE_BUILTINS, BuiltinName
from attngen.lang.builtins import BUILTINS, fuzz_forms, q_aligned
from attngen.plan.validate import loads

PKG = Path(attngen.__file__).resolve().parent
HEAD = "attention a {\n  dtype bf16\n  head_dim 64\n  heads 4\n"


def test_every_builtin_is_declared_with_every_part():
    assert set(BUILTINS) == set(BuiltinName)
    for name, d in BUILTINS.items():
        assert d.name == name and d.usage and d.arities and d.fuzz, name
        assert max(d.arities) <= len(d.params), name
        assert d.score_only == (name in SCORE_BUILTINS)


def test_mask_and_score_forms_partition_the_builtins():
    masks, scores = fuzz_forms(score=False), fuzz_forms(score=True)
    assert not set(masks) & set(scores)
    owners = {form: d.name for d in BUILTINS.values() for form, _ in d.fuzz}
    assert {owners[f] for f in masks} == set(BuiltinName) - SCORE_BUILTINS
    assert {owners[f] for f in scores} == set(SCORE_BUILTINS)


def test_lowering_reads_the_declared_signature():
    # The arity message and its help come from the declaration's arities and usage.
    for name, d in BUILTINS.items():
        n = max(d.arities) + 1
        args = ", ".join(["1"] * n)
        stmt = "score" if d.score_only else "mask"
        try:
            loads(HEAD + f"  {stmt} {name.value}({args})\n}}\n")
        except attngen.SpecError as e:
            text = str(e)
        else:
            raise AssertionError(f"{name.value} with {n} arguments was accepted")
        assert f"`{name.value}` takes " in text and f"got {n}" in text and d.usage in text, text


def test_generated_specs_use_every_builtin_and_lower_it_to_its_desugaring():
    from attngen.check import fuzz
    from attngen.ir.nodes import Builtin, walk

    seen: set[BuiltinName] = set()

    @settings(max_examples=300, derandomize=True, database=None, deadline=None, suppress_health_check=list(HealthCheck))
    @given(fuzz.spec_strategy())
    def draw(text):
        v = loads(text).get()
        for e in (v.mask, *v.scores):
            for n in walk(e):
                if isinstance(n, Builtin):
                    seen.add(n.name)
                    tensors = {d.name: d for d in v.inputs}
                    aligned = q_aligned(paged=v.page_size is not None)
                    assert n.body == BUILTINS[n.name].desugar(n.args, tensors, v.heads, aligned)

    draw()
    assert seen == set(BuiltinName)


def test_workload_fills_from_the_declared_fillers():
    from attngen.check import workload

    v = loads(HEAD + "  input plen: i32[B] sorted\n  input blk: u8[QB, KB]\n  input sl: fp32[H]\n"
              "  input doc: i32[B, Lk]\n  mask prefix(plen[b]) && block_sparse(blk, 64, 64) && document(doc)\n"
              "  score alibi(sl)\n}\n").get()
    a = workload.make_inputs(v, 3, 200, 200, np.random.default_rng(0))
    assert a["blk"].shape == (4, 4) and set(np.unique(a["blk"])) <= {0, 1}
    assert ((a["plen"] >= 0) & (a["plen"] <= 200)).all()  # key lengths even though declared sorted
    assert (np.diff(a["doc"], axis=-1) >= 0).all() and a["doc"].max() <= 3
    assert ((a["sl"] >= 0.01) & (a["sl"] <= 0.5)).all()


def test_no_module_keeps_its_own_builtin_table():
    # Lowering, explain, the workload and the fuzzer name no individual builtin's signature,
    # words, filler or form: `BuiltinName.X` appears there only where a check is specific to X
    # (lowering's cross-argument checks; the fuzz cases' document and block-sparse overrides).
    allowed = {
        "lang/lower.py": {"DOCUMENT", "ALIBI", "REL_BIAS"},
        "tools/explain.py": set(),
        "check/workload.py": {"BLOCK_SPARSE"},
        "check/fuzz_specs.py": set(),
    }
    for rel, ok in allowed.items():
        text = (PKG / rel).read_text(encoding="utf-8")
        used = set(re.findall(r"BuiltinName\.([A-Z_]+)", text))
        assert used <= ok, (rel, used - ok)
