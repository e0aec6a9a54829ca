"""Backends behind one interface: what the command line and the runtime need from a target.

A `Backend` has a name, the targets (arches) it accepts, and four stages over a validated Variant:
why it cannot run one (`unsupported`), its source (`render`), its C header (`header`), and the
kernel built and loaded as a callable (`load`). The CUDA backend (attngen.cuda, attngen.runtime)
and the CPU backend (attngen.cpu) implement it as thin adapters over their own functions, and
`BACKENDS` holds them by name: `attngen compile --target NAME` and `attngen.compile(device=NAME)`
look the backend up there. Nothing of a backend is imported until it is used, so that
`import attngen.backend` needs neither CuPy nor a host compiler.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, Protocol

from attngen.ir.nodes import Program, Variant

DEFAULT_PREFIX = "attngen"  # attngen.cuda.render.DEFAULT_PREFIX, without importing jinja2


@dataclass(frozen=True, slots=True)
class Options:
    """What a caller chooses of a backend's output. `arch`: one of the backend's `targets()`
    (None: its default; the CUDA runtime's is the current device). `family` and `softmax` choose
    among the CUDA backend's kernels; a backend without such choices refuses them set."""

    prefix: str = DEFAULT_PREFIX
    arch: Any = None
    family: str = "auto"
    softmax: Any = None
    verbose: bool = False


class Backend(Protocol):
    """A code-generation target: its name, the targets it accepts and its stages."""

    name: str

    def targets(self) -> tuple[str, ...]:
        """The target names (`--arch` values) it builds for; () where it builds for the host."""
        ...

    def unsupported(self, v: Variant) -> str | None:
        """Why it has no kernel for `v` (None when it has one)."""
        ...

    def render(self, v: Variant, options: Options) -> str:
        """The kernel's source text, self-contained."""
        ...

    def header(self, v: Variant, options: Options) -> str:
        """A C header declaring the rendered source's parameter struct and entry points."""
        ...

    def load(self, v: Variant, options: Options) -> Callable[..., Any]:
        """The kernel compiled, loaded and callable on this machine's arrays."""
        ...


class CudaBackend:
    """NVIDIA GPUs: attngen.cuda renders and compiles, attngen.runtime loads and launches."""

    name = "cuda"

    def targets(self) -> tuple[str, ...]:
        from attngen.plan.schedule import Arch

        return tuple(a.value for a in Arch)

    @staticmethod
    def _decode(v: Variant, options: Options) -> bool:
        # A paged cache runs on the decode family only; the forward family is the default otherwise.
        return options.family == "decode" or (options.family == "auto" and v.page_size is not None)

    @staticmethod
    def _arch(options: Options) -> Any:
        from attngen.plan.schedule import DEFAULT_ARCH, Arch

        return Arch(options.arch) if isinstance(options.arch, str) else (options.arch or DEFAULT_ARCH)

    def unsupported(self, v: Variant) -> str | None:
        from attngen.plan import decode as plan_decode

        return plan_decode.decode_unsupported(v) if v.page_size is not None else plan_decode.forward_unsupported(v)

    def render(self, v: Variant, options: Options) -> str:
        if self._decode(v, options):
            from attngen.cuda.render_decode import render_decode

            return render_decode(v, self._arch(options), prefix=options.prefix)[0]
        from attngen.cuda import render as render_cuda

        return render_cuda.render_with_plan(v, self._arch(options), prefix=options.prefix, softmax=options.softmax)[0]

    def header(self, v: Variant, options: Options) -> str:
        from attngen.cuda.header import render_decode_header, render_header

        return (render_decode_header if self._decode(v, options) else render_header)(v, self._arch(options), options.prefix)

    def load(self, v: Variant, options: Options) -> Callable[..., Any]:
        from attngen.runtime.kernel import compile as compile_cuda

        return compile_cuda(v, arch=options.arch, verbose=options.verbose, family=options.family, softmax=options.softmax)


class CpuBackend:
    """The host CPU: attngen.cpu renders one C++17 file, builds it with the host compiler and loads it."""

    name = "cpu"

    def targets(self) -> tuple[str, ...]:
        return ()

    def unsupported(self, v: Variant) -> str | None:
        from attngen.cpu import render as render_cpu

        return render_cpu.unsupported(v)

    def render(self, v: Variant, options: Options) -> str:
        from attngen.cpu import render as render_cpu

        return render_cpu.render(v, options.prefix)

    def header(self, v: Variant, options: Options) -> str:
        from attngen.cpu import render as render_cpu

        return render_cpu.render_header(v, options.prefix)

    def load(self, v: Variant, options: Options) -> Callable[..., Any]:
        from attngen.cpu.kernel import compile_cpu

        if options.arch is not None or options.family != "auto" or options.softmax is not None:
            raise ValueError("device='cpu': arch, family and softmax choose GPU kernels; leave them unset")
        return compile_cpu(v, verbose=options.verbose)


BACKENDS: dict[str, Backend] = {b.name: b for b in (CudaBackend(), CpuBackend())}


def get(name: str) -> Backend:
    """The backend called `name`; a ValueError naming the others for any other name."""
    try:
        return BACKENDS[name]
    except (KeyError, TypeError):
        raise ValueError(f"device: expected {' or '.join(repr(n) for n in BACKENDS)}, got {name!r}") from None


def compile(spec: Variant | Program | str | os.PathLike[str], variant: str | None = None, *,
            arch: Any = None, verbose: bool = False, family: str = "auto", softmax: Any = None,
            device: str = "cuda") -> Callable[..., Any]:
    """Parse (if needed), render, compile and load one variant on the backend `device` names.

    `spec` is a Variant, a Program, a path to a `.attn` file, or `.attn` source text. "cuda" (the
    default) builds for the current CUDA device (`attngen.runtime.kernel.compile`: `arch`, `family`
    and `softmax` choose among its kernels; without CuPy, a MissingExtra naming
    `pip install 'attngen[cuda]'`); "cpu" builds the CPU backend (`attngen.cpu.kernel.CpuKernel`:
    NumPy arrays or torch CPU tensors; `arch`, `family` and `softmax` are the GPU's and are refused)."""
    from attngen.plan.validate import resolve

    backend = get(device)
    return backend.load(resolve(spec, variant), Options(arch=arch, family=family, softmax=softmax, verbose=verbose))


__all__ = ["Backend", "BACKENDS", "CpuBackend", "CudaBackend", "Options", "compile", "get"]
