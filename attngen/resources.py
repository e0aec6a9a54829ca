"""Locating the grammar and templates, installed (inside the wheel) or from a source checkout."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

_REPO = Path(__file__).resolve().parent.parent


def _dir(package: str, repo_dir: str) -> Path:
    try:
        p = Path(str(resources.files(package)))
        if p.is_dir():
            return p
    except (ModuleNotFoundError, TypeError):
        pass
    # Running from a checkout on PYTHONPATH, where attngen.grammar is not mapped.
    return _REPO / repo_dir


def grammar_dir() -> Path:
    return _dir("attngen.grammar", "grammar")


def cuda_template_dir() -> Path:
    return _dir("attngen.backends.cuda", "backends/cuda")
