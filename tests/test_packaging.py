"""The package builds into a wheel that carries the grammar and the CUDA templates."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import attngen

ROOT = Path(__file__).resolve().parents[1]

# Failures that mean "this machine cannot fetch build requirements", not "the package is broken".
_OFFLINE = re.compile(
    r"No matching distribution|Could not find a version|Failed to establish a new connection|"
    r"Temporary failure in name resolution|Network is unreachable|ProxyError|NewConnectionError",
    re.I,
)


def _pyproject() -> dict:
    import tomllib

    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _can_build_without_isolation() -> bool:
    # setuptools >= 70.1 builds wheels by itself; older ones need the `wheel` package.
    if importlib.util.find_spec("setuptools") is None:
        return False
    import setuptools

    major, minor = (int(x) for x in setuptools.__version__.split(".")[:2])
    if (major, minor) < (61, 0):
        return False
    return (major, minor) >= (70, 1) or importlib.util.find_spec("wheel") is not None


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(ROOT)]
    if _can_build_without_isolation():
        cmd.insert(4, "--no-build-isolation")
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=600)
    if p.returncode != 0:
        log = p.stdout + p.stderr
        if "--no-build-isolation" not in cmd and _OFFLINE.search(log):
            pytest.skip("cannot build a wheel: the build backend (setuptools, wheel) is not installed "
                        "and the package index is unreachable")
        pytest.fail(f"wheel build failed ({' '.join(cmd)}):\n{log[-4000:]}")
    wheels = list(out.glob("attngen-*.whl"))
    assert len(wheels) == 1, list(out.iterdir())
    return wheels[0]


def test_wheel_contains_grammar_and_templates(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "attngen/grammar/attn.lark" in names
    templates = [n for n in names if n.startswith("attngen/backends/cuda/") and n.endswith(".cu.j2")]
    assert templates, sorted(names)
    # every template in the checkout made it in
    for t in (ROOT / "backends" / "cuda").rglob("*.cu.j2"):
        assert f"attngen/backends/cuda/{t.relative_to(ROOT / 'backends' / 'cuda').as_posix()}" in names
    for mod in ("attngen/__init__.py", "attngen/cli.py", "attngen/ir.py"):
        assert mod in names


def test_wheel_declares_console_script_and_version(wheel):
    z = zipfile.ZipFile(wheel)
    dist = next(n.split("/")[0] for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    entry = z.read(f"{dist}/entry_points.txt").decode()
    assert re.search(r"^attngen\s*=\s*attngen\.cli:main$", entry, re.M), entry
    meta = z.read(f"{dist}/METADATA").decode()
    assert f"Version: {attngen.__version__}" in meta


def test_version_matches_pyproject():
    assert attngen.__version__ == _pyproject()["project"]["version"]


def test_every_package_dir_exists():
    cfg = _pyproject()["tool"]["setuptools"]
    for pkg, d in cfg["package-dir"].items():
        assert (ROOT / d).is_dir(), f"{pkg} maps to missing {d}/"
    assert (ROOT / "README.md").is_file()  # pyproject's readme: the build fails without it


def test_public_api_is_lazy_and_complete():
    code = (
        "import sys, attngen; "
        "assert 'lark' not in sys.modules and 'numpy' not in sys.modules, sorted(sys.modules); "
        "assert callable(attngen.load) and callable(attngen.loads); "
        "assert hasattr(attngen.reference, 'attention'); "
        "print('ok')"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stderr


def test_unknown_attribute_is_attribute_error():
    with pytest.raises(AttributeError):
        attngen.no_such_thing  # noqa: B018
