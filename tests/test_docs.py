"""The user guide and the API reference build with warnings as errors (mkdocs.yml, docs/)."""

from __future__ import annotations

import importlib.util
import re
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


def _headline_spec(md: Path) -> str:
    """The first ``` block of a page that holds an `attention` variant."""
    for block in re.findall(r"```[a-z]*\n(.*?)```", md.read_text(encoding="utf-8"), re.S):
        if re.search(r"^attention \w+ \{", block, re.M):
            return block
    raise AssertionError(f"{md.name} shows no spec")


@pytest.mark.parametrize("page", ["README.md", "docs/index.md"])
def test_headline_spec_is_canonical_and_takes_the_targets_tile(page: str) -> None:
    from attngen.lang.frontend import format_source
    from attngen.plan.validate import loads

    text = _headline_spec(ROOT / page)
    assert format_source(text) == text, f"{page}: the headline spec is not what `attngen fmt` prints"
    variant = loads(text).get()
    # An explicit tile can move a variant off its best engine; the headline shows `tile auto`.
    assert re.search(r"^\s*tile\s+(?!auto\b)", text, re.M) is None, f"{page}: explicit tile in the headline spec"
    assert variant.name


def test_quick_start_spec_is_valid() -> None:
    from attngen.plan.validate import loads

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    m = re.search(r'spec = """\n(.*?)"""', readme, re.S)
    assert m, "README's GPU quick start holds no spec"
    assert loads(m.group(1)).get().name == "causal_gqa"


def test_results_hold_only_cited_files() -> None:
    cited_in = "\n".join((ROOT / p).read_text(encoding="utf-8") for p in ("README.md", "benchmarks/README.md"))
    results = ROOT / "benchmarks" / "results"
    kept = sorted(p.name for p in results.iterdir())
    uncited = [name for name in kept if name not in cited_in]
    assert not uncited, f"benchmarks/results/ holds files no figure cites: {uncited}"
    named = set(re.findall(r"\b((?:h200|host|mma)[\w.-]*\.(?:jsonl|json|txt|png))\b", cited_in))
    missing = sorted(n for n in named if n not in kept)
    assert not missing, f"figures cite results files that are not committed: {missing}"


# Work sessions or rounds named by ordinal or number, or numbered days: the project speaks of the
# product, not of how the work went. attngen/ and backends/ are held by their own review.
_NARRATION = re.compile(
    r"\b(?:(?:first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|"
    r"\w+teenth|twentieth|twenty-\w+|thirtieth|previous|last|this|next) (?:session|round)|"
    r"session \d+|round \d+|day \d+)\b", re.I)
_SCANNED = ("README.md", "CHANGELOG.md", "mkdocs.yml", "docs", "benchmarks", "tools", "tests", "examples", ".ci")


def test_no_narration_of_work_outside_the_package() -> None:
    hits = []
    for top in _SCANNED:
        root = ROOT / top
        files = [root] if root.is_file() else [p for p in root.rglob("*") if p.is_file()]
        for path in files:
            if "__pycache__" in path.parts or path.suffix in {".png", ".gz", ".pyc"}:
                continue
            try:
                text = path.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                continue
            for m in _NARRATION.finditer(text):
                hits.append(f"{path.relative_to(ROOT)}: {m.group(0)!r}")
    assert not hits, "narration of work:\n" + "\n".join(hits[:40])
