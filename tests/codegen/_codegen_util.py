"""Shared by the codegen tests: every (example file, variant) pair, loaded once."""

from __future__ import annotations

import functools
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.attn"))


@functools.lru_cache(maxsize=None)
def load_example(path: str):
    from attngen.frontend import load

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


VARIANTS = example_variants()
VARIANT_IDS = [f"{p.stem}:{n}" if p.stem != n else n for p, n in VARIANTS]
