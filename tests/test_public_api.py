"""The public surface: typed (py.typed, annotated entry points), `__all__` on the public modules,
a clean `dir(attngen)`, and no old-path alias modules at the top of the package."""

from __future__ import annotations

import importlib
import inspect
try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib
from pathlib import Path

import pytest

import attngen

ROOT = Path(__file__).resolve().parents[1]
PUBLIC_MODULES = ["attngen", "attngen.reference", "attngen.distributed", "attngen.plan.validate",
                  "attngen.lang.diagnostics", "attngen.runtime.kernel", "attngen.runtime.extras",
                  "attngen.runtime.inputs"]


def test_py_typed_ships():
    assert (ROOT / "attngen" / "py.typed").is_file()
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert "py.typed" in cfg["package-data"]["attngen"]


def test_dir_attngen_is_the_public_api():
    names = dir(attngen)
    for bad in ("Any", "annotations", "importlib", "typing", "_LAZY", "_importlib", "_typing"):
        assert bad not in names
    assert set(attngen.__all__) <= set(names)
    assert {"compile", "load", "loads", "torch", "reference", "distributed", "SpecError"} <= set(attngen.__all__)


@pytest.mark.parametrize("name", PUBLIC_MODULES)
def test_public_modules_declare_all_and_every_name_resolves(name):
    mod = importlib.import_module(name)
    assert isinstance(mod.__all__, (list, tuple)) and mod.__all__
    for n in mod.__all__:
        if n in ("torch",):  # attngen.torch needs the torch extra; tested below
            continue
        assert getattr(mod, n) is not None, f"{name}.{n}"


def test_attngen_torch_is_a_real_module():
    pytest.importorskip("torch")
    import attngen.torch as at

    assert at.__name__ == "attngen.torch" and set(at.__all__) == {"Attention", "AttnOp", "raise_pending", "register"}
    assert attngen.torch is at


@pytest.mark.parametrize("old", ["workload", "runtime_bwd", "derivative", "intervals"])
def test_old_path_aliases_are_gone(old):
    assert not (ROOT / "attngen" / f"{old}.py").exists()
    with pytest.raises(ImportError):
        importlib.import_module(f"attngen.{old}")
    with pytest.raises(AttributeError):
        getattr(attngen, old)


def test_documented_modules_keep_their_paths():
    import attngen.distributed
    import attngen.reference

    assert attngen.reference.attention is importlib.import_module("attngen.check.reference").attention
    assert attngen.distributed.ring_attention is importlib.import_module("attngen.runtime.distributed").ring_attention


def _annotations(fn) -> list[str]:
    sig = inspect.signature(fn)
    return [str(p.annotation) for p in sig.parameters.values() if p.name != "self"] + [str(sig.return_annotation)]


@pytest.mark.parametrize("fn", ["compile", "load", "loads", "Kernel.__call__"])
def test_entry_points_are_typed(fn):
    from attngen.plan import validate
    from attngen.runtime import kernel

    obj = {"compile": kernel.compile, "load": validate.load, "loads": validate.loads,
           "Kernel.__call__": kernel.Kernel.__call__}[fn]
    anns = _annotations(obj)
    assert all(a != str(inspect.Parameter.empty) for a in anns), anns
    # The first argument and the result say what they are (not Any in, Any out).
    assert anns[0] != "Any" and anns[-1] != "Any", anns
