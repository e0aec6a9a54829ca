"""examples/cpp's CPU target, end to end with no GPU: render the header and source with the
command line, build them with main_cpu.cpp (cmake when present, else the C++ compiler directly),
run the program, and hold what it printed and wrote to the NumPy reference."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import ml_dtypes  # noqa: F401  (the reference's bf16 support; fp16 here)
import numpy as np
import pytest

from attngen.check import reference, tolerance
from attngen.cpu.compile import find_compiler
from attngen.plan.validate import load

ROOT = Path(__file__).resolve().parents[2]
CPP = ROOT / "examples" / "cpp"
B, L = 2, 77


def _attngen(*args: str) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    subprocess.run([sys.executable, "-m", "attngen", *args], check=True, env=env, cwd=ROOT, capture_output=True, timeout=120)


def _build(tmp: Path) -> Path:
    if shutil.which("cmake"):
        env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        cmd = f"{sys.executable};-m;attngen"
        subprocess.run(["cmake", "-S", str(CPP), "-B", str(tmp / "build"), "-DATTNGEN_CPU_ONLY=ON", "-DCMAKE_BUILD_TYPE=Release",
                        f"-DATTNGEN_COMMAND={cmd}"], check=True, env=env, capture_output=True, timeout=180)
        subprocess.run(["cmake", "--build", str(tmp / "build")], check=True, env=env, capture_output=True, timeout=300)
        return tmp / "build" / "attn_demo_cpu"
    _attngen("compile", str(CPP / "attention.attn"), "--target", "cpu", "--prefix", "demo", "-o", str(tmp / "demo_cpu.cpp"))
    _attngen("compile", str(CPP / "attention.attn"), "--target", "cpu", "--prefix", "demo", "--emit", "header",
             "-o", str(tmp / "demo_cpu.h"))
    exe = tmp / "attn_demo_cpu"
    subprocess.run([*find_compiler(), "-std=c++17", "-O2", "-fopenmp", f"-I{tmp}", str(CPP / "main_cpu.cpp"),
                    str(tmp / "demo_cpu.cpp"), "-o", str(exe)], check=True, capture_output=True, timeout=300)
    return exe


def test_cpp_cpu_example_builds_runs_and_matches_the_reference(tmp_path):
    exe = _build(tmp_path)
    out_dir = tmp_path / "arrays"
    out_dir.mkdir()
    r = subprocess.run([str(exe), str(out_dir)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "PASS" in r.stdout, r.stdout + r.stderr
    v = load(CPP / "attention.attn").get()
    H, HKV, D = v.heads, v.kv_heads, v.head_dim

    def read(name, dt, shape):
        return np.fromfile(out_dir / f"{name}.bin", dtype=dt).reshape(shape)

    q = read("q", np.float16, (B, H, L, D))
    k = read("k", np.float16, (B, HKV, L, D))
    vv = read("v", np.float16, (B, HKV, L, D))
    w = read("w", np.float32, (D,))
    o = read("o", np.float16, (B, H, L, D))
    inputs = {"q_norm_weight": w}
    ref, _ = reference.attention(v, q, k, vv, inputs)
    rep = tolerance.check(o, ref, v.dtype, score_err=reference.score_error(v, q, k, inputs))
    assert rep.ok, rep.summary()
    # What it printed: the checksum of its output, which the reference's must match.
    printed = float(re.search(r"checksum (-?[0-9.]+)", r.stdout).group(1))
    assert printed == pytest.approx(float(np.asarray(ref, np.float64).sum()), rel=1e-3, abs=0.05)
