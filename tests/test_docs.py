"""The user guide and the API reference build with warnings as errors (mkdocs.yml, docs/)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _missing_docs_tools() -> str | None:
    for module, extra in (("mkdocs", "mkdocs"), ("mkdocstrings", "mkdocstrings"), ("mkdocstrings_handlers.python", "mkdocstrings-python")):
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            return f"{extra} is not installed (pip install -e '.[docs]')"
    return None


@pytest.mark.skipif(_missing_docs_tools() is not None, reason=_missing_docs_tools() or "")
def test_docs_build_strict(tmp_path: Path) -> None:
    site = tmp_path / "site"
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    api = (site / "api" / "index.html").read_text(encoding="utf-8")
    # The reference is generated from the docstrings, not left empty: the entry points users call.
    for anchor in ("attngen.runtime.kernel.compile", "attngen.runtime.torch.register",
                   "attngen.runtime.distributed.ring_attention", "attngen.check.reference.attention",
                   "attngen.plan.validate.load"):
        assert f'id="{anchor}"' in api, anchor


def test_every_guide_page_is_in_the_nav() -> None:
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    pages = sorted(p.name for p in (ROOT / "docs").glob("*.md"))
    assert pages, "docs/ holds no pages"
    for name in pages:
        assert f" {name}" in nav, f"docs/{name} is not in mkdocs.yml's nav"
