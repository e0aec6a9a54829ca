"""The optional extras (`attngen[cuda]`, `attngen[torch]`) and whether a GPU is usable.

Every path that needs an extra asks here, so that a missing one is reported the same way
everywhere: which extra, and the exact `pip install` line. `gpu_status` tells "CuPy is missing"
(an install problem) apart from "no GPU or no driver" (a machine problem), so a user with a GPU
is never told there is none. Standard library only: the command line imports this before it
knows whether NumPy or CuPy are there.
"""

from __future__ import annotations

import enum
import importlib
from dataclasses import dataclass
from types import ModuleType

__all__ = [
    "Extra", "GpuReport", "GpuStatus", "MissingExtra", "extra_for_module", "gpu_check", "gpu_status",
    "install_line", "require_cupy", "require_torch",
]


class Extra(enum.Enum):
    """An optional dependency group of the package (pyproject's optional-dependencies)."""

    CUDA = "cuda"  # CuPy, NVRTC and the CUDA headers: compiling and running kernels
    TORCH = "torch"  # torch tensors in and out, the torch op
    BENCH = "bench"  # matplotlib, for `attngen bench --plot`
    TEST = "test"  # pytest and hypothesis


# The top-level module each extra provides (what an ImportError's `name` says).
_MODULE_EXTRA = {"cupy": Extra.CUDA, "cupy_backends": Extra.CUDA, "torch": Extra.TORCH,
                 "matplotlib": Extra.BENCH, "pytest": Extra.TEST}
_WHAT = {Extra.CUDA: "CuPy", Extra.TORCH: "PyTorch", Extra.BENCH: "matplotlib", Extra.TEST: "pytest"}


def install_line(extra: Extra) -> str:
    """The command that installs `extra`, quoted for a POSIX shell."""
    return f"pip install 'attngen[{extra.value}]'"


def extra_for_module(name: str | None) -> Extra | None:
    """The extra that provides the (possibly dotted) module `name`; None for one no extra provides."""
    return _MODULE_EXTRA.get((name or "").split(".")[0])


class MissingExtra(ModuleNotFoundError):
    """A module of an optional extra is not installed; the message names the extra and the
    install line. A ModuleNotFoundError, so code that handles a missing import still does."""

    def __init__(self, extra: Extra, needed_by: str, module: str) -> None:
        self.extra = extra
        super().__init__(
            f"{needed_by} needs {_WHAT[extra]} (the `{extra.value}` extra), which is not installed: "
            f"{install_line(extra)}", name=module)


def _require(module: str, needed_by: str) -> ModuleType:
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        extra = extra_for_module(e.name)
        if extra is None or (e.name or "").split(".")[0] != module.split(".")[0]:
            raise  # a dependency of the extra's own module: not the extra's absence
        raise MissingExtra(extra, needed_by, module) from None


def require_cupy(needed_by: str = "running kernels") -> ModuleType:
    """`cupy`, or MissingExtra naming `attngen[cuda]` (`needed_by` says what wanted it)."""
    return _require("cupy", needed_by)


def require_torch(needed_by: str = "this") -> ModuleType:
    """`torch`, or MissingExtra naming `attngen[torch]` (`needed_by` says what wanted it)."""
    return _require("torch", needed_by)


class GpuStatus(enum.Enum):
    """Whether kernels can run here, and if not, whose problem it is."""

    READY = "ready"  # CuPy imports and the CUDA runtime sees at least one device
    NO_CUPY = "no-cupy"  # the `cuda` extra is not installed
    CUPY_BROKEN = "cupy-broken"  # CuPy is installed but does not import (a CUDA library mismatch)
    NO_DRIVER = "no-driver"  # no NVIDIA driver, or one too old for this CuPy
    NO_DEVICE = "no-device"  # a driver, but no GPU


@dataclass(frozen=True, slots=True)
class GpuReport:
    """`gpu_check`'s answer: the status, and the device name or what went wrong."""

    status: GpuStatus
    detail: str

    @property
    def ok(self) -> bool:
        return self.status is GpuStatus.READY

    def message(self, needed_by: str) -> str:
        """One line for a user of `needed_by` (e.g. "`attngen bench`") saying what is missing and
        what to do; the device name when READY."""
        s = self.status
        if s is GpuStatus.READY:
            return self.detail
        if s is GpuStatus.NO_CUPY:
            return f"{needed_by} needs CuPy (the `cuda` extra), which is not installed: {install_line(Extra.CUDA)}"
        if s is GpuStatus.CUPY_BROKEN:
            return (f"{needed_by} needs CuPy, which is installed but does not import ({self.detail}); reinstall it "
                    f"to match this machine's CUDA: {install_line(Extra.CUDA)}")
        if s is GpuStatus.NO_DRIVER:
            return f"{needed_by} needs an NVIDIA driver: CuPy is installed, but {self.detail}"
        return f"no GPU: CuPy is installed, but {self.detail}; {needed_by} runs kernels on a CUDA device"


# The cudaError_t of a machine without a GPU; any other failure to count devices is the driver's
# (cudaErrorInsufficientDriver, cudaErrorStubLibrary, a libcuda that does not load, ...).
_NO_DEVICE_ERRORS = {100}  # cudaErrorNoDevice


def gpu_check() -> GpuReport:
    """What `gpu_status` says, with the device name (READY) or the reason (otherwise)."""
    try:
        import cupy
    except ModuleNotFoundError as e:
        if extra_for_module(e.name) is Extra.CUDA:
            return GpuReport(GpuStatus.NO_CUPY, "CuPy is not installed")
        return GpuReport(GpuStatus.CUPY_BROKEN, f"{type(e).__name__}: {e}")
    except Exception as e:  # an ImportError from CuPy's own CUDA libraries
        return GpuReport(GpuStatus.CUPY_BROKEN, f"{type(e).__name__}: {e}")
    try:
        n = int(cupy.cuda.runtime.getDeviceCount())
    except Exception as e:
        code = getattr(e, "status", None)
        if code in _NO_DEVICE_ERRORS:
            return GpuReport(GpuStatus.NO_DEVICE, "the CUDA runtime reports no device")
        return GpuReport(GpuStatus.NO_DRIVER, f"the CUDA runtime cannot start ({type(e).__name__}: {e})")
    if n < 1:
        return GpuReport(GpuStatus.NO_DEVICE, "the CUDA runtime reports 0 devices")
    try:
        props = cupy.cuda.runtime.getDeviceProperties(0)
        name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    except Exception:
        name = "CUDA device 0"
    return GpuReport(GpuStatus.READY, name)


def gpu_status() -> GpuStatus:
    """Whether a CUDA device is usable through CuPy, and if not, why (see GpuStatus)."""
    return gpu_check().status
