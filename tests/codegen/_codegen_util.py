"""Shared by the codegen tests: every (example file, variant) pair, loaded once."""

from __future__ import annotations

import functools
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.attn"))


@functools.lru_cache(maxsize=None)
def load_example(path: str):
    from attngen.lang.frontend import load

    return load(path)


def example_variants() -> list[tuple[Path, str]]:
    """(path, variant name) for every variant of every example, in a stable order."""
    out = []
    for p in EXAMPLES:
        for v in load_example(str(p)).variants:
            out.append((p, v.name))
    return out


def variant(path: Path, name: str):
    return load_example(str(path)).get(name)


def _id(p: Path, n: str) -> str:
    return f"{p.stem}:{n}" if p.stem != n else n


def _forward_ok(p: Path, n: str) -> bool:
    from attngen.plan.decode import forward_unsupported

    return forward_unsupported(variant(p, n)) is None


ALL_VARIANTS = example_variants()
ALL_VARIANT_IDS = [_id(p, n) for p, n in ALL_VARIANTS]
# The forward kernel's examples; those only the decode family runs (a paged KV cache) are
# rendered and compiled by test_decode_plan.py.
VARIANTS = [(p, n) for p, n in ALL_VARIANTS if _forward_ok(p, n)]
VARIANT_IDS = [_id(p, n) for p, n in VARIANTS]
DECODE_ONLY = [(p, n) for p, n in ALL_VARIANTS if not _forward_ok(p, n)]
DECODE_ONLY_IDS = [_id(p, n) for p, n in DECODE_ONLY]
