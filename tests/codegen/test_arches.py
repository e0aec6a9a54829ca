"""Every GPU gets code built for it: the targets, the device -> target map, sm_75's Turing path
(no cp.async, no bf16, fp16 as two m16n8k8 MMAs), --prefix and the launcher's workspace functions."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys

import pytest
from _codegen_util import ROOT

from attngen.tools import cli
from attngen.cuda import compile as compile_cuda, render as render_cuda
from attngen.lang.diagnostics import SpecError
from attngen.plan.validate import load  # the front end, then the plan stage for the arch
from attngen.ir.nodes import TileConfig
from attngen.plan.schedule import Arch, arch_for_cc, spill_budget

EX = ROOT / "examples"
FP16 = EX / "gpt2_causal_fp16.attn"
FP32 = EX / "seed_padded_fp32.attn"
BF16 = EX / "llama3_gqa_causal.attn"
QWEN = EX / "qwen3_qk_norm.attn"


@pytest.mark.parametrize(("cc", "arch"), [
    (75, Arch.SM75), (80, Arch.SM80), (86, Arch.SM86), (87, Arch.SM86), (89, Arch.SM89), (90, Arch.SM90A),
    (100, Arch.SM100), (103, Arch.SM100), (120, Arch.SM120), (121, Arch.SM120),
])
def test_each_device_gets_its_own_major_target(cc, arch):
    assert arch_for_cc(cc) == arch
    # and never code of another major version, which cannot load there
    assert arch.cc // 10 == cc // 10


@pytest.mark.parametrize(("cc", "words"), [(70, "7.5 or newer"), (61, "7.5 or newer"), (110, "no target for compute capability 11.0"),
                                           (130, "no target for compute capability 13.0")])
def test_devices_without_a_target_are_refused(cc, words):
    with pytest.raises(ValueError, match=re.escape(words)):
        arch_for_cc(cc)


def test_every_arch_parses_on_the_command_line():
    for a in Arch:
        assert cli._parse_arch(a.value) is a
    assert cli._parse_arch("90") is Arch.SM90 and cli._parse_arch("90a") is Arch.SM90A


def test_sm90_is_hopper_without_wgmma():
    v = load(FP16).get()
    assert "wgmma" in render_cuda.render(v, Arch.SM90A)
    src = render_cuda.render(v, Arch.SM90)
    assert "wgmma" not in src and "mma.sync.aligned.m16n8k16" in src
    assert render_cuda.plan(v, Arch.SM90).engine.value == "mma.sync"


def test_turing_loads_synchronously_and_splits_the_fp16_mma():
    v = load(FP16, arch=Arch.SM75).get()
    src = render_cuda.render(v, Arch.SM75)
    assert 'asm volatile("cp.async' not in src and "st.shared.v4.u32" in src
    assert "mma.sync.aligned.m16n8k16" not in src and src.count("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32") == 2
    ampere = render_cuda.render(load(FP16).get(), Arch.SM80)
    assert 'asm volatile("cp.async.cg.shared.global' in ampere and "m16n8k8" not in ampere


def test_turing_fp32_gets_a_tile_that_fits_64_kib():
    v = load(FP32, arch=Arch.SM75).get()
    kp = render_cuda.plan(v, Arch.SM75)
    assert kp.smem_bytes <= 65536 and kp.tile == TileConfig(16, 64, 4, 1)
    assert 'asm volatile("cp.async' not in render_cuda.render(v, Arch.SM75)
    # elsewhere the measured 8-warp tile stays
    assert render_cuda.plan(load(FP32).get(), Arch.SM80).tile == TileConfig(16, 128, 8, 1)


def test_bf16_on_turing_is_a_located_error():
    with pytest.raises(SpecError) as e:
        load(BF16, arch=Arch.SM75)
    text = e.value.render()
    assert "llama3_gqa_causal.attn:4:3" in text and "bf16 needs sm_80 or newer" in text
    p = subprocess.run([sys.executable, "-m", "attngen", "check", "--arch", "sm_75", str(BF16)], capture_output=True, text=True)
    assert p.returncode == 1 and "bf16 needs sm_80 or newer" in p.stderr and "Traceback" not in p.stderr


def test_prefix_renames_every_symbol_and_default_is_unchanged():
    v = load(QWEN).get()
    base = render_cuda.render(v, Arch.SM80)
    assert render_cuda.render(v, Arch.SM80, prefix="attngen") == base
    src = render_cuda.render(v, Arch.SM80, prefix="eng_a100")
    assert "attngen_" not in src and src == base.replace("attngen_", "eng_a100_")
    assert {"eng_a100_qwen3_qk_norm_launch", "eng_a100_qwen3_qk_norm_prep_q", "eng_a100_qwen3_qk_norm_workspace_bytes"} <= set(
        re.findall(r"\w+", src))
    with pytest.raises(ValueError, match="not a C identifier"):
        render_cuda.render(v, Arch.SM80, prefix="9lives")


def test_prefix_on_the_command_line(tmp_path, capsys):
    assert cli.main(["compile", str(FP16), "--arch", "sm_80", "--prefix", "x86", "--emit", "header", "-o", str(tmp_path / "h.h")]) == 0
    h = (tmp_path / "h.h").read_text()
    assert "x86_gpt2_causal_fp16_launch(" in h and "attngen_" not in h and "#ifndef x86_gpt2_causal_fp16_H" in h
    assert cli.main(["compile", str(FP16), "--prefix", "a-b"]) == 2
    assert "not a C identifier" in capsys.readouterr().err


def test_launcher_sets_up_each_device_once():
    src = render_cuda.render(load(BF16).get(), Arch.SM90A)
    launcher = src[src.index('extern "C" cudaError_t attngen_llama3_gqa_causal_launch('):]
    start = launcher.index("if (sms == 0) {")
    setup = launcher[start:launcher.index("\n  }\n", start)]
    # the attribute calls run only on a device's first launch
    assert launcher.count("cudaFuncSetAttribute") == 1 and "cudaFuncSetAttribute" in setup
    assert launcher.count("cudaDeviceGetAttribute") == 1 and "cudaDeviceGetAttribute" in setup


# --------------------------------------------------------------------------------------------
# nvcc: the targets compile; the workspace functions compute what the header says


def _resources(path, arch):
    v = load(path, arch=arch).get()
    kp = render_cuda.plan(v, arch)
    res = compile_cuda.resources(render_cuda.render(v, arch), arch)
    return kp, {r.kernel: r for r in res}


@pytest.mark.nvcc
@pytest.mark.parametrize(("path", "arch"), [(FP16, Arch.SM75), (FP32, Arch.SM75), (FP16, Arch.SM90), (BF16, Arch.SM100),
                                            (FP16, Arch.SM120)])
def test_targets_compile_within_the_spill_budget(path, arch):
    kp, res = _resources(path, arch)
    main = res[kp.kernel_name]
    assert main.spill_stores <= spill_budget(kp.engine, kp.tile), main


MAIN = r"""
#include "q.h"
#include <cstdio>
int main() {
  attngen_qwen3_qk_norm_params p = {};
  p.B = 2; p.Lq = 100; p.Lk = 50;
  const size_t n = attngen_qwen3_qk_norm_workspace_bytes(p.B, p.Lq, p.Lk);
  attngen_qwen3_qk_norm_bind_workspace(&p, (void*)4096);
  std::printf("%zu %zu %zu %zu\n", n, (size_t)p.ws_q, (size_t)p.ws_k, attngen_qwen3_qk_norm_workspace_bytes(0, 1, 1));
  return 0;
}
"""


@pytest.mark.nvcc
def test_workspace_query_and_bind(tmp_path):
    for emit, name in (("cu", "q.cu"), ("header", "q.h")):
        assert cli.main(["compile", str(QWEN), "--arch", "sm_80", "--emit", emit, "-o", str(tmp_path / name)]) == 0
    (tmp_path / "main.cu").write_text(MAIN)
    p = subprocess.run(["nvcc", "-std=c++17", "-gencode=arch=compute_80,code=sm_80", "main.cu", "q.cu", "-o", "prog"],
                       cwd=tmp_path, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    # Host code only: runs without a GPU.
    out = subprocess.run([str(tmp_path / "prog")], capture_output=True, text=True, timeout=60).stdout.split()
    ws_q = 2 * 32 * 100 * 128 * 2  # B * H * Lq * D bf16 elements
    ws_k = 2 * 8 * 50 * 128 * 2  # B * Hkv * Lk * D
    assert [int(x) for x in out] == [ws_q + ws_k, 4096, 4096 + ws_q, 0]


@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake is not on the PATH")
def test_cpp_example_configures_builds_and_links(tmp_path):
    """examples/cpp: attngen compile for sm_80 and sm_90a under two prefixes, nvcc, one binary
    (built, not run: CI has no GPU; tools/device_install_check.sh runs it)."""
    import os

    build = tmp_path / "build"
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    cmd = f"{sys.executable};-m;attngen"
    p = subprocess.run(["cmake", "-S", str(EX / "cpp"), "-B", str(build), f"-DATTNGEN_COMMAND={cmd}"],
                       capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    p = subprocess.run(["cmake", "--build", str(build), "-j", "2"], capture_output=True, text=True, env=env, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    assert (build / "attn_demo").is_file() and (build / "paged_decode_demo").is_file()
    syms = subprocess.run(["nm", str(build / "attn_demo")], capture_output=True, text=True).stdout
    for prefix in ("demo_sm80", "demo_sm90a"):
        assert re.search(rf"\bT {prefix}_attn_demo_launch$", syms, re.M), prefix
    syms = subprocess.run(["nm", str(build / "paged_decode_demo")], capture_output=True, text=True).stdout
    for fn in ("launch", "workspace_bytes", "bind_workspace"):
        assert re.search(rf"\bT pdec_paged_decode_llama3_decode_{fn}$", syms, re.M), fn
