"""Locating the grammar and templates, installed (inside the wheel) or from a source checkout.

In the wheel they are the data packages `attngen.grammar` and `attngen.backends.cuda` (pyproject
maps the repository's top-level grammar/ and backends/ there); in a checkout run from PYTHONPATH
those packages do not exist and the files sit beside attngen/. The lookup asks importlib.resources
first and takes a real directory from it only: a namespace package answers with a
`MultiplexedPath`, whose str() is not a path (the bug behind `site-packages/grammar/attn.lark`).
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

_PKG = Path(__file__).resolve().parent
_REPO = _PKG.parent


def _real_dir(package: str, probe: str) -> Path | None:
    """The on-disk directory of `package` holding `probe`, or None (not importable, not on disk)."""
    try:
        root = resources.files(package)
    except (ModuleNotFoundError, TypeError):
        return None
    f = root.joinpath(probe)
    # A plain package answers with a pathlib.Path; a namespace package with a MultiplexedPath
    # whose joinpath gives the Path of the first portion that has the file.
    if isinstance(f, Path) and f.is_file():
        return f.parent
    return None


def _dir(package: str, installed: str, repo_dir: str, probe: str) -> Path:
    for d in (_real_dir(package, probe), _PKG / installed, _REPO / repo_dir):
        if d is not None and (d / probe).is_file():
            return d
    raise FileNotFoundError(
        f"attngen is installed without its {probe} (looked in the package {package}, {_PKG / installed} and "
        f"{_REPO / repo_dir}): reinstall it (pip install attngen, or pip install . from a checkout)"
    )


def grammar_dir() -> Path:
    """The directory holding attn.lark."""
    return _dir("attngen.grammar", "grammar", "grammar", "attn.lark")


def cuda_template_dir() -> Path:
    """The directory holding the CUDA templates (attention.cu.j2 and its partials)."""
    return _dir("attngen.backends.cuda", "backends/cuda", "backends/cuda", "fwd/attention.cu.j2")
