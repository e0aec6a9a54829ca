"""CUDA source → machine code (stage: compile), with an on-disk cache.

Two compilers, same flags: NVRTC through CuPy (no toolkit needed beyond the CUDA runtime wheels)
and `nvcc` (what a C++ engine uses; also gives ptxas resource reports). The cache key hashes the
rendered source, the target, the compiler and its version, the options and CACHE_FORMAT_VERSION;
entries are written to a temporary file and renamed into place, and an unreadable entry is a miss.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from attngen.plan.schedule import Arch
from attngen.resources import cache_dir, cache_write

CACHE_FORMAT_VERSION = 1
NVCC_FLAGS = ("-std=c++17", "-O3", "--use_fast_math")
NVRTC_FLAGS = ("-std=c++17", "--use_fast_math")


class CompileError(RuntimeError):
    """The CUDA compiler rejected generated source (a bug in attngen: please report it)."""


@dataclass(frozen=True, slots=True)
class Binary:
    cubin: bytes
    compiler: str  # "nvrtc 13.0" or "nvcc 13.0"
    seconds: float  # 0.0 on a cache hit
    cached: bool
    log: str


@dataclass(frozen=True, slots=True)
class Resources:
    kernel: str
    registers: int
    spill_stores: int
    spill_loads: int
    stack_bytes: int
    static_smem: int


def _gencode(arch: Arch) -> str:
    # sm_90a needs the -gencode form: `-arch=sm_90a` also runs a plain sm_90 pass.
    num = arch.value.split("_")[1]
    return f"-gencode=arch=compute_{num},code=sm_{num}"


def nvcc_version() -> str | None:
    exe = shutil.which("nvcc")
    if not exe:
        return None
    out = subprocess.run([exe, "--version"], capture_output=True, text=True, check=False).stdout
    m = re.search(r"release (\d+\.\d+)", out)
    return f"nvcc {m.group(1)}" if m else "nvcc unknown"


def nvrtc_version() -> str | None:
    try:
        from cupy_backends.cuda.libs import nvrtc  # type: ignore

        major, minor = nvrtc.getVersion()
        return f"nvrtc {major}.{minor}"
    except Exception:
        return None


def _key(source: str, arch: Arch, compiler: str, flags: tuple[str, ...]) -> str:
    fields = {
        "arch": arch.value,
        "compiler": compiler,
        "flags": list(flags),
        "format": CACHE_FORMAT_VERSION,
        "source_sha256": hashlib.sha256(source.encode()).hexdigest(),
    }
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()


def _cache_get(key: str) -> bytes | None:
    path = cache_dir() / f"{key}.cubin"
    try:
        data = path.read_bytes()
    except OSError:
        return None
    # A cubin is an ELF file; anything else (truncated, overwritten) is a miss.
    return data if data[:4] == b"\x7fELF" and len(data) > 64 else None


def _cache_put(key: str, data: bytes) -> None:
    cache_write(f"{key}.cubin", data)


def _wheel_include_dirs() -> list[str]:
    """Headers of NVIDIA's CUDA 13 runtime wheel (the `cuda` extra's nvidia-cuda-runtime), which
    installs cuda_fp16.h and cuda_bf16.h under site-packages/nvidia/cu13/include: with the NVRTC
    wheel beside it that is all NVRTC needs for generated kernels (whose host launcher and
    <cuda_runtime.h> are hidden from NVRTC; NVRTC has <nv/target> built in)."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        return []
    out = []
    for root in (spec.submodule_search_locations or []) if spec else []:
        inc = os.path.join(root, "cu13", "include")
        if os.path.isfile(os.path.join(inc, "cuda_fp16.h")):
            out.append(inc)
    return out


def _cuda_include_dirs() -> list[str]:
    """Where NVRTC finds cuda_fp16.h and friends: an explicit CUDA_PATH or CUDA_HOME first, then
    the `cuda` extra's wheels (whose NVRTC CuPy loads first, so headers and compiler match), then
    a toolkit (nvcc's, /usr/local/cuda, CuPy's guess). A directory counts only if it has
    cuda_fp16.h."""
    dirs = []
    for env in ("CUDA_PATH", "CUDA_HOME"):
        if os.environ.get(env):
            dirs.append(os.path.join(os.environ[env], "include"))
    dirs += _wheel_include_dirs()
    nvcc = shutil.which("nvcc")
    if nvcc:
        dirs.append(str(Path(nvcc).resolve().parent.parent / "include"))
    dirs.append("/usr/local/cuda/include")
    try:
        import cupy  # type: ignore

        p = cupy.cuda.get_cuda_path()
        if p:
            dirs.append(os.path.join(p, "include"))
    except Exception:
        pass
    seen, out = set(), []
    for d in dirs:
        if d not in seen and os.path.isfile(os.path.join(d, "cuda_fp16.h")):
            seen.add(d)
            out.append(d)
    return out


def _compile_nvrtc(source: str, arch: Arch) -> tuple[bytes, str]:
    from cupy_backends.cuda.libs import nvrtc  # type: ignore

    opts = [*NVRTC_FLAGS, f"--gpu-architecture={arch.value}"] + [f"-I{d}" for d in _cuda_include_dirs()]
    prog = nvrtc.createProgram(source, "attngen.cu", (), ())
    try:
        try:
            nvrtc.compileProgram(prog, tuple(opts))
        except Exception as e:
            log = nvrtc.getProgramLog(prog)
            raise CompileError(f"NVRTC rejected the generated source:\n{log}") from e
        return nvrtc.getCUBIN(prog), nvrtc.getProgramLog(prog)
    finally:
        nvrtc.destroyProgram(prog)


def nvcc(source: str, arch: Arch, emit: str = "cubin", extra: tuple[str, ...] = ()) -> tuple[bytes, str]:
    """Runs nvcc on `source`; `emit` is cubin, ptx or obj. Returns (output bytes, compiler log)."""
    exe = shutil.which("nvcc")
    if not exe:
        raise CompileError("nvcc is not on the PATH")
    flag = {"cubin": "-cubin", "ptx": "-ptx", "obj": "-c"}[emit]
    with tempfile.TemporaryDirectory(prefix="attngen-") as tmp:
        src = os.path.join(tmp, "kernel.cu")
        out = os.path.join(tmp, f"kernel.{emit}")
        Path(src).write_text(source)
        cmd = [exe, *NVCC_FLAGS, _gencode(arch), flag, *extra, src, "-o", out]
        r = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if r.returncode != 0:
            raise CompileError(f"nvcc failed ({' '.join(cmd[1:-3])}):\n{r.stderr}")
        return Path(out).read_bytes(), r.stderr


def compile_source(source: str, arch: Arch, *, prefer: str | None = None, use_cache: bool = True) -> Binary:
    """Compiles to a cubin for `arch`, through the on-disk cache.

    `prefer` is "nvrtc" or "nvcc"; by default NVRTC when CuPy is importable, else nvcc
    (override with ATTNGEN_COMPILER)."""
    prefer = prefer or os.environ.get("ATTNGEN_COMPILER")
    order = [prefer] if prefer else ["nvrtc", "nvcc"]
    errors = []
    for which in order:
        version = nvrtc_version() if which == "nvrtc" else nvcc_version()
        if version is None:
            errors.append(f"{which} is not available")
            continue
        flags = NVRTC_FLAGS if which == "nvrtc" else NVCC_FLAGS
        key = _key(source, arch, version, flags)
        if use_cache:
            hit = _cache_get(key)
            if hit is not None:
                return Binary(hit, version, 0.0, True, "")
        t0 = time.perf_counter()
        cubin, log = _compile_nvrtc(source, arch) if which == "nvrtc" else nvcc(source, arch, "cubin")
        dt = time.perf_counter() - t0
        if use_cache:
            _cache_put(key, cubin)
        return Binary(cubin, version, dt, False, log)
    raise CompileError("no CUDA compiler found: " + "; ".join(errors) + " (install cupy-cuda13x or put nvcc on the PATH)")


_RES = re.compile(
    r"Compiling entry function '(?P<name>[^']+)'.*?"
    r"(?P<stack>\d+) bytes stack frame, (?P<st>\d+) bytes spill stores, (?P<ld>\d+) bytes spill loads.*?"
    r"Used (?P<regs>\d+) registers(?:, used \d+ barriers)?(?:, (?P<cstack>\d+) bytes cumulative stack size)?"
    r"(?:, (?P<smem>\d+) bytes smem)?",
    re.S,
)


def resources(source: str, arch: Arch) -> list[Resources]:
    """ptxas's report (registers, spills, stack, static shared memory) for every kernel."""
    _, log = nvcc(source, arch, "cubin", extra=("-Xptxas", "-v"))
    out = []
    for m in _RES.finditer(log):
        out.append(
            Resources(
                kernel=m.group("name"),
                registers=int(m.group("regs")),
                spill_stores=int(m.group("st")),
                spill_loads=int(m.group("ld")),
                stack_bytes=int(m.group("stack")),
                static_smem=int(m.group("smem") or 0),
            )
        )
    return out
