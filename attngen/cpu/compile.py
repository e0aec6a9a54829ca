"""C++ source → a shared library for this machine (stage: compile), with an on-disk cache.

The compiler is `CXX` (split like a shell word list), else the first of g++, clang++, c++ on the
PATH. Flags: `-O3 -march=native -fno-math-errno -fopenmp` (and `-mprefer-vector-width=512` on x86-64); where OpenMP is missing (clang without libomp) the
build falls back to `-fopenmp-simd` (the vectorisation pragmas without threads), then to neither.
The cache is the NVRTC path's (`attngen.cuda.compile`): the key hashes explicit sorted fields (the
source, the compiler and its version, the flags, the host's CPU features, which `-march=native`
reads, and CACHE_FORMAT_VERSION); entries are written to a temporary file and renamed into place;
an entry that is not a shared library is a miss.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import shlex
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from attngen.resources import cache_dir, cache_write

CACHE_FORMAT_VERSION = 1
# -fno-math-errno: libm calls that set no errno are pure, so a score's per-head constant (the
# standard ALiBi slope, an expf of h) leaves the key loop (ALiBi + causal D64 L2k, one thread:
# 110 -> 59 ms); no value changes.
BASE_FLAGS = ("-std=c++17", "-O3", "-march=native", "-fno-math-errno", "-shared", "-fPIC")
# x86-64 compilers keep AVX-512 code at 256 bits by default; the micro-kernels want 512 (20% on
# causal D128 L2k, one thread). A no-op without AVX-512.
X86_FLAGS = ("-mprefer-vector-width=512",)
# Tried in order: threads and SIMD pragmas, SIMD pragmas only, plain (the pragmas ignored).
OPENMP_FLAGS = (("-fopenmp",), ("-fopenmp-simd",), ())
_MAGIC = (b"\x7fELF", b"\xcf\xfa\xed\xfe", b"MZ")  # ELF, Mach-O 64, PE


class CompilerNotFound(RuntimeError):
    """No C++ compiler to build the CPU backend with."""


class CompileError(RuntimeError):
    """The C++ compiler rejected generated source (a bug in attngen: please report it)."""


@dataclass(frozen=True, slots=True)
class Library:
    path: str  # the shared library in the cache (or a temporary directory when uncached)
    compiler: str  # "g++ 12.2.0"
    flags: tuple[str, ...]
    openmp: bool  # built with -fopenmp (threads); else one thread
    seconds: float  # 0.0 on a cache hit
    cached: bool


def find_compiler() -> list[str]:
    """The compiler command: CXX, else g++, clang++ or c++ from the PATH (CompilerNotFound)."""
    env = os.environ.get("CXX")
    if env:
        cmd = shlex.split(env)
        if cmd and shutil.which(cmd[0]):
            return cmd
        raise CompilerNotFound(f"CXX={env!r} is not an executable on the PATH: the cpu target needs a C++17 compiler")
    for exe in ("g++", "clang++", "c++"):
        if shutil.which(exe):
            return [exe]
    raise CompilerNotFound("no C++ compiler found: the cpu target needs one (install g++ or clang++, or set CXX)")


@functools.lru_cache(maxsize=8)
def compiler_version(cmd: tuple[str, ...]) -> str:
    """The compiler's first `--version` line (part of the cache key)."""
    r = subprocess.run([*cmd, "--version"], capture_output=True, text=True, check=False)
    line = (r.stdout or r.stderr).strip().splitlines()
    return line[0] if line else " ".join(cmd)


@functools.cache
def _host_features() -> str:
    """What `-march=native` reads: the machine and, on Linux, the CPU's feature flags."""
    flags = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                flags = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{platform.machine()} {platform.processor()} {hashlib.sha256(flags.encode()).hexdigest()}"


def _key(source: str, compiler: str, flags: tuple[str, ...]) -> str:
    fields = {
        "compiler": compiler,
        "flags": list(flags),
        "format": CACHE_FORMAT_VERSION,
        "host": _host_features(),
        "source_sha256": hashlib.sha256(source.encode()).hexdigest(),
        "target": "cpu",
    }
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()


def _cached(key: str) -> str | None:
    path = cache_dir() / f"cpu-{key}.so"
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError:
        return None
    return str(path) if any(head.startswith(m) for m in _MAGIC) and path.stat().st_size > 64 else None


def _build(cmd: list[str], source: str, flags: tuple[str, ...]) -> tuple[bytes | None, str]:
    with tempfile.TemporaryDirectory(prefix="attngen-cpu-") as tmp:
        src, out = os.path.join(tmp, "kernel.cpp"), os.path.join(tmp, "kernel.so")
        Path(src).write_text(source)
        r = subprocess.run([*cmd, *flags, src, "-o", out], capture_output=True, text=True, check=False)
        if r.returncode != 0:
            return None, r.stderr
        return Path(out).read_bytes(), r.stderr


def compile_source(source: str, *, use_cache: bool = True) -> Library:
    """Builds `source` into a shared library through the on-disk cache (CompilerNotFound,
    CompileError)."""
    cmd = find_compiler()
    version = compiler_version(tuple(cmd))
    errors = []
    arch = X86_FLAGS if platform.machine().lower() in ("x86_64", "amd64") else ()
    for omp in OPENMP_FLAGS:
        flags = (*BASE_FLAGS, *arch, *omp)
        key = _key(source, version, flags)
        if use_cache:
            hit = _cached(key)
            if hit is not None:
                return Library(hit, version, flags, omp == ("-fopenmp",), 0.0, True)
        t0 = time.perf_counter()
        data, log = _build(cmd, source, flags)
        if data is None:
            errors.append(f"{' '.join(cmd)} {' '.join(flags)}:\n{log}")
            continue
        dt = time.perf_counter() - t0
        name = f"cpu-{key}.so"
        if use_cache:
            cache_write(name, data)
            if _cached(key) is not None:
                return Library(str(cache_dir() / name), version, flags, omp == ("-fopenmp",), dt, False)
        # An uncached build (or an unwritable cache) lives in a directory of its own.
        d = tempfile.mkdtemp(prefix="attngen-cpu-")
        path = os.path.join(d, name)
        Path(path).write_bytes(data)
        return Library(path, version, flags, omp == ("-fopenmp",), dt, False)
    raise CompileError("the C++ compiler rejected the generated source (a bug in attngen, please report it):\n" + errors[-1])


__all__ = ["compile_source", "find_compiler", "compiler_version", "CompileError", "CompilerNotFound", "Library", "CACHE_FORMAT_VERSION"]
