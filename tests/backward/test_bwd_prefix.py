"""`attngen compile --pass backward --prefix NAME`: every exported symbol of the backward source
under the prefix, the default prefix's bytes unchanged, and (with nvcc) two prefixes of one
variant in one translation unit."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from attngen.cuda import compile as compile_cuda, render_bwd
from attngen.lang import frontend
from attngen.plan import bwd as plan_bwd
from attngen.plan.schedule import Arch

ROOT = Path(__file__).resolve().parents[2]
LLAMA = ROOT / "examples" / "llama3_gqa_causal.attn"


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "attngen", *args], capture_output=True, text=True, cwd=ROOT, check=False)


def test_prefix_renames_every_symbol():
    v = frontend.load(LLAMA).get()
    default = render_bwd.render(v, Arch.SM90A)
    assert render_bwd.render(v, Arch.SM90A, prefix="attngen") == default
    src, bp = render_bwd.render_with_plan(v, Arch.SM90A, prefix="mylib", deterministic=True)
    assert bp.base_name == f"mylib_{v.name}_bwd" and bp.launcher == f"mylib_{v.name}_bwd_launch"
    assert [k.name for k in bp.kernels] == [k.name.replace("attngen_", "mylib_", 1)
                                           for k in plan_bwd.plan(v, Arch.SM90A, deterministic=True).kernels]
    assert f"attngen_{v.name}" not in src
    for k in bp.kernels:
        assert re.search(rf"\b{k.name}\(", src), k.name
    with pytest.raises(ValueError, match="not a C identifier"):
        render_bwd.render(v, prefix="9bad")


def test_cli_pass_backward_prefix():
    r = _cli("compile", str(LLAMA), "--pass", "backward", "--prefix", "mylib")
    assert r.returncode == 0, r.stderr
    assert "mylib_llama3_gqa_causal_bwd_dkdv" in r.stdout and "attngen_llama3" not in r.stdout
    bad = _cli("compile", str(LLAMA), "--pass", "backward", "--prefix", "no-dash")
    assert bad.returncode == 2 and "not a C identifier" in bad.stderr


@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on the PATH")
def test_two_prefixes_compile_in_one_unit():
    v = frontend.load(LLAMA).get()
    unit = render_bwd.render(v, Arch.SM80, prefix="a80") + render_bwd.render(v, Arch.SM80, prefix="b80", deterministic=True)
    names = {r.kernel for r in compile_cuda.resources(unit, Arch.SM80)}
    assert {f"a80_{v.name}_bwd_dkdv", f"b80_{v.name}_bwd_dq"} <= names, sorted(names)
