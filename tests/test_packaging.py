"""The package builds into a wheel that carries the grammar and the CUDA templates."""

from __future__ import annotations

import importlib.util
import os
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
    # pyproject's build-system asks for setuptools >= 77 (PEP 639 license fields), which builds
    # wheels by itself.
    if importlib.util.find_spec("setuptools") is None:
        return False
    import setuptools

    major = int(setuptools.__version__.split(".")[0])
    return major >= 77


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
    # every template in the checkout made it in, family folders (common/, fwd/, ...) included
    tdir = ROOT / "backends" / "cuda"
    for t in tdir.rglob("*.cu.j2"):
        assert f"attngen/backends/cuda/{t.relative_to(tdir).as_posix()}" in names
    for mod in ("attngen/__init__.py", "attngen/tools/cli.py", "attngen/ir/nodes.py", "attngen/py.typed"):
        assert mod in names
    # the CPU backend: its package and its template
    assert "attngen/cpu/render.py" in names and "attngen/backends/cpu/attention.cpp.j2" in names


def test_wheel_declares_console_script_and_version(wheel):
    z = zipfile.ZipFile(wheel)
    dist = next(n.split("/")[0] for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    entry = z.read(f"{dist}/entry_points.txt").decode()
    assert re.search(r"^attngen\s*=\s*attngen\.tools\.cli:main$", entry, re.M), entry
    meta = z.read(f"{dist}/METADATA").decode()
    assert f"Version: {attngen.__version__}" in meta


def test_version_is_kept_in_one_place():
    # pyproject reads it from attngen/__init__.py; the wheel's METADATA (above) shows it arrives.
    project = _pyproject()["project"]
    assert "version" not in project and "version" in project["dynamic"]
    dyn = _pyproject()["tool"]["setuptools"]["dynamic"]["version"]
    assert dyn == {"attr": "attngen.__version__"}
    assert re.fullmatch(r"\d+\.\d+\.\d+", attngen.__version__)


def test_license_file_matches_pyproject(wheel):
    project = _pyproject()["project"]
    assert project["license"] == "Apache-2.0"
    assert project["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    z = zipfile.ZipFile(wheel)
    dist = next(n.split("/")[0] for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    meta = z.read(f"{dist}/METADATA").decode()
    assert re.search(r"^License-Expression: Apache-2.0$", meta, re.M), meta[:800]
    assert any(n.startswith(dist) and n.endswith("LICENSE") for n in z.namelist())


def test_base_install_can_fuzz_and_extras_are_declared():
    project = _pyproject()["project"]
    names = [re.split(r"[<>=!~ ;\[]", d)[0] for d in project["dependencies"]]
    assert "hypothesis" in names  # `attngen fuzz` on a base install
    extras = project["optional-dependencies"]
    assert any(d.startswith("torch>=2.4") for d in extras["torch"])
    cuda = [re.split(r"[<>=!~ ;\[]", d)[0] for d in extras["cuda"]]
    # CuPy, and NVRTC with the headers it compiles against, for a machine with only a driver
    assert {"cupy-cuda13x", "nvidia-cuda-nvrtc", "nvidia-cuda-runtime"} <= set(cuda), cuda


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


# --------------------------------------------------------------------------------------------
# Installed as users install: the wheel in a fresh virtual environment, used from outside the
# checkout. The venv reuses this environment's dependencies through a .pth line (after its own
# site-packages, so the wheel's attngen is the one imported) instead of downloading them.


def _purelib() -> str:
    import sysconfig

    return sysconfig.get_paths()["purelib"]


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("venv")
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    p = subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-deps", "--no-index",
                        str(wheel)], capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    # Only now (pip would see this environment's own attngen, editable, as already installed).
    Path(site, "zz_deps_from_test_env.pth").write_text(_purelib() + "\n")
    return venv


def _in_venv(venv: Path, cwd: Path, *argv: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    return subprocess.run([str(venv / "bin" / argv[0]), *argv[1:]], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=300)


def test_installed_wheel_imports_from_the_venv(installed, tmp_path):
    p = _in_venv(installed, tmp_path, "python", "-c",
                 "import attngen, attngen.resources as r; print(attngen.__file__); print(r.grammar_dir()); "
                 "print(r.cuda_template_dir())")
    assert p.returncode == 0, p.stderr
    mod, grammar, templates = p.stdout.split()
    for path in (mod, grammar, templates):
        assert path.startswith(str(installed)), (path, installed)  # not the checkout
    assert Path(grammar, "attn.lark").is_file() and Path(templates, "fwd/attention.cu.j2").is_file()


def test_installed_console_script_checks_explains_compiles_fuzzes(installed, tmp_path):
    spec = tmp_path / "llama3_gqa_causal.attn"
    spec.write_text((ROOT / "examples" / "llama3_gqa_causal.attn").read_text())  # outside the checkout
    p = _in_venv(installed, tmp_path, "attngen", "check", spec.name)
    assert p.returncode == 0 and ": ok: llama3_gqa_causal" in p.stdout, p.stdout + p.stderr
    p = _in_venv(installed, tmp_path, "attngen", "explain", spec.name)
    assert p.returncode == 0 and "llama3_gqa_causal" in p.stdout and "Tile plan" in p.stdout, p.stdout + p.stderr
    p = _in_venv(installed, tmp_path, "attngen", "compile", spec.name, "-o", "k.cu")
    assert p.returncode == 0, p.stderr
    assert "__global__" in (tmp_path / "k.cu").read_text()
    p = _in_venv(installed, tmp_path, "attngen", "compile", spec.name, "--emit", "header", "-o", "k.h")
    assert p.returncode == 0 and "_launch(" in (tmp_path / "k.h").read_text(), p.stderr
    # fuzzing is a base-install command (hypothesis is a dependency); without a GPU it fuzzes the
    # front end and the reference only, and says so
    p = _in_venv(installed, tmp_path, "attngen", "fuzz", spec.name, "--max-examples", "3", "--seconds", "30")
    assert p.returncode == 0 and "0 failing" in p.stdout + p.stderr, p.stdout + p.stderr
    p = _in_venv(installed, tmp_path, "attngen", "--version")
    assert p.returncode == 0 and p.stdout.strip() == f"attngen {attngen.__version__}", p.stdout + p.stderr
