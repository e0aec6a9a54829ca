"""Accepted specs must compile: render each variant and run nvcc on it (for `fuzz --specs` and tests).

A spec that `check` accepts but whose `.cu` nvcc rejects (clashing C++ names, an overflowed
parameter space, a ptxas that never finishes) is a bug in attngen that no CPU-side check sees.
`NvccChecker` renders every accepted variant for each target, skips sources it has compiled already
(many generated specs render alike), and compiles the rest on a pool of worker threads (nvcc runs
in its own process, so threads give real parallelism). A compile that runs past `timeout_s` counts
as a failure: ptxas spending minutes on a kernel is the defect.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from attngen.cuda.compile import NVCC_FLAGS, _gencode
from attngen.ir.nodes import Variant
from attngen.plan.schedule import Arch

# The targets of the two tensor-core engines: wgmma (sm_90a) and mma.sync (sm_80).
DEFAULT_ARCHS: tuple[Arch, ...] = (Arch.SM90A, Arch.SM80)
DEFAULT_TIMEOUT_S = 240.0


def available() -> bool:
    """Whether nvcc is on the PATH."""
    return shutil.which("nvcc") is not None


def default_jobs() -> int:
    return max(1, os.cpu_count() or 1)


def compile_check(source: str, arch: Arch, timeout_s: float = DEFAULT_TIMEOUT_S) -> str | None:
    """nvcc `source` to a cubin for `arch`: None when it compiles, else what nvcc said."""
    exe = shutil.which("nvcc")
    if exe is None:
        return "nvcc is not on the PATH"
    with tempfile.TemporaryDirectory(prefix="attngen-nvcc-") as tmp:
        src = os.path.join(tmp, "kernel.cu")
        Path(src).write_text(source, encoding="utf-8")
        cmd = [exe, *NVCC_FLAGS, _gencode(arch), "-cubin", src, "-o", os.path.join(tmp, "kernel.cubin")]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return f"nvcc for {arch.value} ran past {timeout_s:.0f} s"
        if r.returncode != 0:
            return f"nvcc for {arch.value} failed (exit {r.returncode}):\n{r.stderr.strip()[-4000:]}"
    return None


@dataclass
class NvccFailure:
    """One accepted variant whose source nvcc rejected."""

    spec_text: str
    variant: str
    arch: Arch
    message: str


@dataclass
class NvccChecker:
    """Compiles the accepted variants submitted to it, in the background, `jobs` at a time."""

    archs: tuple[Arch, ...] = DEFAULT_ARCHS
    jobs: int = field(default_factory=default_jobs)
    timeout_s: float = DEFAULT_TIMEOUT_S
    specs: int = 0  # accepted specs submitted
    compiled: int = 0  # distinct sources nvcc compiled cleanly
    skipped_arch: int = 0  # variants whose tile does not fit one of the targets (refused up front, exit 1)
    failures: list[NvccFailure] = field(default_factory=list)
    # Where to write each failure's reproducer at once (spec.attn, FAILURE.txt), and a running
    # tally every `report_every` compiles: a long campaign leaves evidence even if it is cut short.
    out_dir: str | None = None
    report_every: int = 0

    def __post_init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=max(1, self.jobs), thread_name_prefix="nvcc")
        self._seen: set[str] = set()
        self._futures: list[Future] = []
        self._lock = threading.Lock()

    def submit(self, spec_text: str, variants: tuple[Variant, ...]) -> None:
        """Render each variant for each target and queue the sources not compiled before."""
        from attngen.cuda.render_decode import render_family as render

        self.specs += 1
        for v in variants:
            for arch in self.archs:
                try:
                    source = render(v, arch)
                except ValueError:
                    # resolve_tile: a tile checked against sm_90a that does not fit this arch is a
                    # located refusal of `compile --arch`, not a source that fails to build.
                    self.skipped_arch += 1
                    continue
                key = hashlib.sha256(f"{arch.value}\0{source}".encode()).hexdigest()
                if key in self._seen:
                    continue
                self._seen.add(key)
                # Back-pressure: a generator far ahead of nvcc would only pile up sources in memory
                # (and a run cut short would leave them uncompiled and uncounted).
                while self.pending >= 4 * max(1, self.jobs):
                    oldest = next((f for f in self._futures if not f.done()), None)
                    if oldest is not None:
                        oldest.result()
                self._futures.append(self._pool.submit(self._one, spec_text, v.name, arch, source))

    def _one(self, spec_text: str, variant: str, arch: Arch, source: str) -> None:
        problem = compile_check(source, arch, self.timeout_s)
        with self._lock:
            if problem is None:
                self.compiled += 1
            else:
                failure = NvccFailure(spec_text, variant, arch, problem)
                self.failures.append(failure)
                self._write(failure)
            done = self.compiled + len(self.failures)
            if self.report_every and done % self.report_every == 0:
                print(f"  nvcc: {done} sources done ({self.compiled} compiled, {len(self.failures)} failed), "
                      f"{self.specs} accepted specs submitted", file=sys.stderr, flush=True)

    def _write(self, f: NvccFailure) -> None:
        if self.out_dir is None:
            return
        d = Path(self.out_dir) / f"nvcc-{hashlib.sha1(f.spec_text.encode()).hexdigest()[:10]}-{f.arch.value}"
        try:
            d.mkdir(parents=True, exist_ok=True)
            (d / "spec.attn").write_text(f.spec_text, encoding="utf-8")
            (d / "FAILURE.txt").write_text(f"variant {f.variant}, {f.arch.value}:\n{f.message}\n", encoding="utf-8")
        except OSError:
            pass

    def reproducer_dir(self, f: NvccFailure) -> Path | None:
        if self.out_dir is None:
            return None
        return Path(self.out_dir) / f"nvcc-{hashlib.sha1(f.spec_text.encode()).hexdigest()[:10]}-{f.arch.value}"

    @property
    def pending(self) -> int:
        self._futures = [f for f in self._futures if not f.done() or f.exception() is not None]
        return sum(not f.done() for f in self._futures)

    def wait(self) -> None:
        """Block until every queued compile has finished."""
        for f in self._futures:
            f.result()
        self._pool.shutdown(wait=True)

    def summary(self) -> str:
        archs = " and ".join(a.value for a in self.archs)
        return (f"nvcc ({archs}): {self.specs} accepted specs, {self.compiled} distinct sources compiled, "
                f"{len(self.failures)} failed" + (f", {self.skipped_arch} renders refused for a target's tile budget"
                                                   if self.skipped_arch else ""))
