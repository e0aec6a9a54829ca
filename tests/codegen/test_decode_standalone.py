"""The decode family as a standalone `.cu` for C++ engines (`attngen compile --family decode`, the
default for paged caches): the split policy in C++ agrees with the Python runtime's, the header
declares what the .cu defines, and the CLI refuses what the family cannot run with located errors."""

from __future__ import annotations

import itertools
import shutil
import subprocess
from pathlib import Path

import pytest
from _codegen_util import ROOT

from attngen.cuda import compile as compile_cuda
from attngen.lang import frontend
from attngen.plan import decode as plan_decode
from attngen.plan.schedule import Arch
from attngen.tools import cli

PAGED = ROOT / "examples" / "paged_decode_llama3.attn"
MQA = ROOT / "examples" / "mqa_decode_cross.attn"


def _compile(capsys, *argv: str) -> tuple[int, str, str]:
    rc = cli.main(["compile", *argv])
    out = capsys.readouterr()
    assert "Traceback" not in out.err, out.err
    return rc, out.out, out.err


@pytest.mark.skipif(shutil.which("g++") is None, reason="no host C++ compiler (g++)")
@pytest.mark.parametrize("spec", [PAGED, MQA], ids=lambda p: p.stem)
def test_split_policy_in_cpp_matches_python(tmp_path, spec):
    dp = plan_decode.plan(frontend.load(spec).get())
    sizes = list(itertools.product((1, 2, 3, 8, 64, 129), (1, 2, 5, 16), (0, 1, 63, 64, 65, 1000, 8192, 131072, 10**6),
                                   (1, 8, 78, 132, 1000)))
    prog = tmp_path / "policy.cpp"
    prog.write_text(
        "#include <cstdio>\n"
        "void choose(int B, int Lq, int Lk, int sm_count, int* splits, int* ctas) {\n"
        + dp.split.splits_cpp() + "\n}\n"
        "int main() { int B, Lq, Lk, sm; while (std::scanf(\"%d %d %d %d\", &B, &Lq, &Lk, &sm) == 4) {\n"
        "  int s = 0, c = 0; choose(B, Lq, Lk, sm, &s, &c); std::printf(\"%d %d\\n\", s, c); } }\n")
    exe = tmp_path / "policy"
    subprocess.run(["g++", "-O1", "-o", str(exe), str(prog)], check=True)
    out = subprocess.run([str(exe)], input="".join(f"{b} {q} {k} {s}\n" for b, q, k, s in sizes),
                         capture_output=True, text=True, check=True).stdout.split("\n")
    for (b, q, k, s), line in zip(sizes, out):
        assert tuple(map(int, line.split())) == dp.split.schedule(b, q, k, s), (b, q, k, s)


def test_paged_spec_compiles_to_the_decode_family_by_default(capsys):
    rc, cu, err = _compile(capsys, str(PAGED), "--prefix", "eng")
    assert rc == 0, err
    name = "eng_paged_decode_llama3_decode"
    for sym in ("_launch(", "_workspace_bytes(", "_bind_workspace(", "_choose_splits(", "_combine("):
        assert f"{name}{sym}" in cu, sym
    assert "attngen_paged_decode_llama3" not in cu  # every symbol carries the prefix
    rc, forced, _ = _compile(capsys, str(PAGED), "--prefix", "eng", "--family", "decode")
    assert rc == 0 and forced == cu


def test_decode_family_for_a_contiguous_cache_on_request(capsys):
    rc, fwd, _ = _compile(capsys, str(MQA))
    rc2, dec, err = _compile(capsys, str(MQA), "--family", "decode")
    assert rc == rc2 == 0, err
    assert "_decode_launch(" in dec and "_decode_launch(" not in fwd


def test_refusals_are_located(capsys, tmp_path):
    rc, _, err = _compile(capsys, str(PAGED), "--family", "forward")
    assert rc == 1 and f"{PAGED.name}:7:1: error: --family forward does not read a `kv_cache paged` cache" in err
    fp32 = tmp_path / "f.attn"
    fp32.write_text("attention f {\n  dtype fp32\n  head_dim 64\n  heads 4\n}\n")
    rc, _, err = _compile(capsys, str(fp32), "--family", "decode")
    assert rc == 1 and "f.attn:1:1: error: the decode family cannot run `f`" in err and "fp16/bf16" in err
    rc, _, err = _compile(capsys, str(MQA), "--family", "decode", "--pass", "backward")
    assert rc == 2 and "--family decode has no backward pass" in err


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler (cc)")
def test_decode_and_forward_headers_in_one_c_file(capsys, tmp_path):
    rc, dec_h, err = _compile(capsys, str(PAGED), "--emit", "header")
    assert rc == 0, err
    rc, fwd_h, err = _compile(capsys, str(MQA), "--emit", "header")
    assert rc == 0, err
    (tmp_path / "dec.h").write_text(dec_h)
    (tmp_path / "fwd.h").write_text(fwd_h)
    n = "attngen_paged_decode_llama3_decode"
    (tmp_path / "main.c").write_text(
        '#include "dec.h"\n#include "fwd.h"\n'
        f"int main(void) {{ {n}_params p = {{0}}; size_t ws = {n}_workspace_bytes(1, 1, 64);\n"
        f"  {n}_bind_workspace(&p, (void*)0); (void)ws; return {n}_PAGE_SIZE + (int)sizeof(p) + "
        f"(int){n}_launch(&p, (cudaStream_t)0); }}\n")
    incs = [d for d in compile_cuda._cuda_include_dirs() if (Path(d) / "cuda_runtime_api.h").is_file()]
    if not incs:
        pytest.skip("no CUDA headers (cuda_runtime_api.h) found")
    r = subprocess.run(["cc", "-fsyntax-only", "-std=c99", f"-I{tmp_path}", f"-I{incs[0]}", str(tmp_path / "main.c")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


@pytest.mark.nvcc
@pytest.mark.parametrize("arch", [Arch.SM80, Arch.SM90A], ids=lambda a: a.value)
def test_decode_cu_builds_with_its_host_functions(capsys, tmp_path, arch):
    out = tmp_path / "d.o"
    rc, _, err = _compile(capsys, str(PAGED), "--arch", arch.value, "--emit", "cu", "-o", str(tmp_path / "d.cu"))
    assert rc == 0, err
    src = (tmp_path / "d.cu").read_text()
    obj, _ = compile_cuda.nvcc(src, arch, emit="obj")
    out.write_bytes(obj)
    syms = subprocess.run(["nm", str(out)], capture_output=True, text=True).stdout
    for sym in ("launch", "workspace_bytes", "bind_workspace", "choose_splits"):
        assert f" T attngen_paged_decode_llama3_decode_{sym}\n" in syms, sym


LAUNCH_CHECKS = r"""
#include <cstdio>
#include "d.h"
#define K_(name) attngen_paged_decode_llama3_decode_##name
int main() {
  // B 2, Lq 1, Lk 1000: 2 x 8 row blocks (one a KV head) x 16 chunks of 64 keys = 256 units.
  static float ws[1 << 16];
  static int counts[16];
  struct Case { int splits, ctas; bool ws; };
  const Case cases[] = {
    {1, 0, false},     // no CTAs
    {1, 257, false},   // more CTAs than units
    {1, 17, false},    // one slot, but a row block split between two CTAs
    {2, 17, true},     // 17 shares can put 3 CTAs on one row block: 2 slots are too few
    {2, 32, false},    // partials without a workspace
    {0, 16, false},    // no slots
  };
  for (const Case& c : cases) {
    K_(params) p = {};
    p.B = 2; p.Lq = 1; p.Lk = 1000; p.num_pages = 1;
    p.splits = c.splits; p.ctas = c.ctas;
    if (c.ws) { p.ws_o = ws; p.ws_lse = ws + (1 << 15); p.ws_count = counts; }
    std::printf("%d\n", (int)K_(launch)(&p, (cudaStream_t)0));
  }
  return 0;
}
"""


@pytest.mark.nvcc
def test_launcher_refuses_schedules_that_would_write_outside_the_workspace(capsys, tmp_path):
    """Host code only (every case is refused before any CUDA call, so no GPU is needed): the C++
    launcher's cheap checks of splits and ctas, cudaErrorInvalidValue (1) for each."""
    for emit, name in (("cu", "d.cu"), ("header", "d.h")):
        rc, _, err = _compile(capsys, str(PAGED), "--arch", "sm_80", "--emit", emit, "-o", str(tmp_path / name))
        assert rc == 0, err
    (tmp_path / "main.cu").write_text(LAUNCH_CHECKS)
    p = subprocess.run(["nvcc", "-std=c++17", "-gencode=arch=compute_80,code=sm_80", "main.cu", "d.cu", "-o", "prog"],
                       cwd=tmp_path, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    out = subprocess.run([str(tmp_path / "prog")], capture_output=True, text=True, timeout=60).stdout.split()
    assert out == ["1"] * 6, out
