"""The generated .cu builds with nvcc alone, and a C++ engine can include the emitted header, call
the launcher and link against it (marker `nvcc`; link only, nothing is run)."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest
from _codegen_util import ROOT

from attngen.plan.schedule import Arch

pytestmark = pytest.mark.nvcc

SPEC = ROOT / "examples" / "llama3_gqa_causal.attn"
KERNEL = "attngen_llama3_gqa_causal"
GENCODE = "-gencode=arch=compute_90a,code=sm_90a"


def _sh(cmd, cwd):
    p = subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True)
    assert p.returncode == 0, f"{' '.join(map(str, cmd))} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}"
    return p


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    d = tmp_path_factory.mktemp("standalone")
    attngen = [sys.executable, "-m", "attngen", "compile", SPEC, "--arch", Arch.SM90A.value]
    _sh([*attngen, "-o", d / "x.cu"], cwd=ROOT)
    _sh([*attngen, "--emit", "header", "-o", d / "x.h"], cwd=ROOT)
    return d


def test_cu_compiles_standalone(built):
    p = _sh(["nvcc", "-std=c++17", GENCODE, "-c", "x.cu", "-o", "x.o"], cwd=built)
    assert (built / "x.o").stat().st_size > 0
    assert "warning" not in p.stderr, p.stderr


def test_fp32_cu_compiles_without_warnings(tmp_path):
    # The FFMA path declares none of the tensor-core paths' constants it does not use.
    spec = ROOT / "examples" / "seed_padded_fp32.attn"
    _sh([sys.executable, "-m", "attngen", "compile", spec, "--arch", Arch.SM80.value, "-o", tmp_path / "f.cu"], cwd=ROOT)
    p = _sh(["nvcc", "-std=c++17", "-gencode=arch=compute_80,code=sm_80", "-c", "f.cu", "-o", "f.o"], cwd=tmp_path)
    assert "warning" not in p.stderr, p.stderr


MAIN = f"""\
#include "x.h"
#include <cstdio>

int main() {{
  {KERNEL}_params p = {{}};
  p.B = 1; p.Lq = 1; p.Lk = 1; p.Lq_total = 1; p.Lk_total = 1;
  cudaError_t err = {KERNEL}_launch(&p, (cudaStream_t)0);
  std::printf("%d %d\\n", (int)err, {KERNEL}_SMEM_BYTES);
  return 0;
}}
"""


def test_engine_includes_header_and_links(built):
    (built / "main.cu").write_text(MAIN)
    _sh(["nvcc", "-std=c++17", GENCODE, "main.cu", "x.cu", "-o", "prog"], cwd=built)
    assert (built / "prog").exists()


def test_header_is_plain_c(built):
    (built / "use.c").write_text(f'#include "x.h"\nint size_of_params(void) {{ return (int)sizeof({KERNEL}_params); }}\n')
    _sh(["nvcc", "-Xcompiler", "-std=c11", "-c", "use.c", "-o", "use.o"], cwd=built)


def test_header_layout_matches_params(built):
    """The header's struct and the .cu's Params agree field by field (size and offset), checked
    by the compiler in one translation unit (the header's prototypes that take the struct renamed
    out of the way)."""
    from attngen.lang.frontend import load
    from attngen.cuda.render import plan

    fields = plan(load(str(SPEC)).get(), Arch.SM90A).fields
    checks = "\n".join(
        f"static_assert(offsetof(P, {f.name}) == offsetof(H, {f.name}) && sizeof(P::{f.name}) == sizeof(H::{f.name}), \"{f.name}\");"
        for f in fields
    )
    (built / "layout.cu").write_text(
        '#include <cstddef>\n#include "x.cu"\n'
        f"#define {KERNEL}_launch {KERNEL}_launch_as_declared_by_header\n"
        f"#define {KERNEL}_bind_workspace {KERNEL}_bind_workspace_as_declared_by_header\n"
        '#include "x.h"\n'
        f"typedef {KERNEL}_impl::Params P;\ntypedef {KERNEL}_params H;\n"
        "static_assert(sizeof(P) == sizeof(H) && alignof(P) == alignof(H), \"sizeof\");\n"
        f"{checks}\n"
    )
    _sh(["nvcc", "-std=c++17", GENCODE, "-c", "layout.cu", "-o", "layout.o"], cwd=built)


def test_nvcc_on_path():
    assert shutil.which("nvcc")
