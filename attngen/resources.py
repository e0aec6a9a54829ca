"""Locating the grammar and templates, installed (inside the wheel) or from a source checkout.

In the wheel they are the data packages `attngen.grammar` and `attngen.backends.cuda` (pyproject
maps the repository's top-level grammar/ and backends/ there); in a checkout run from PYTHONPATH
those packages do not exist and the files sit beside attngen/. The lookup asks importlib.resources
first and takes a real directory from it only: a namespace package answers with a
`MultiplexedPath`, whose str() is not a path (the bug behind `site-packages/grammar/attn.lark`).
"""

from __future__ import annotations

import os
import tempfile
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


def cpu_template_dir() -> Path:
    """The directory holding the CPU backend's templates (attention.cpp.j2)."""
    return _dir("attngen.backends.cpu", "backends/cpu", "backends/cpu", "attention.cpp.j2")


def cache_dir() -> Path:
    """Where attngen keeps what it can rebuild: cubins, the parser tables, compiled templates.
    ATTNGEN_CACHE_DIR, else $XDG_CACHE_HOME/attngen, else ~/.cache/attngen."""
    root = os.environ.get("ATTNGEN_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "attngen"
    )
    return Path(root)


def cache_write(name: str, data: bytes) -> None:
    """Writes one cache entry atomically (a temporary file renamed into place, so a reader sees the
    old entry or the new one, never half of one). A read-only or full cache directory is ignored:
    it only costs a rebuild."""
    d = cache_dir()
    try:
        d.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, d / name)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError:
        pass
