"""Missing extras are named with their install line on every path (simulated: the modules are
hidden through sys.modules), and "no GPU" is said only when CuPy is there but the GPU is not."""

from __future__ import annotations

import subprocess
import sys
import types
from pathlib import Path

import pytest

from attngen.runtime import extras
from attngen.runtime.extras import Extra, GpuStatus, MissingExtra
from attngen.tools import cli

ROOT = Path(__file__).resolve().parents[2]
SEED = ROOT / "examples" / "seed_padded_fp32.attn"
CUDA_LINE = "pip install 'attngen[cuda]'"
TORCH_LINE = "pip install 'attngen[torch]'"


class _CudaRuntimeError(RuntimeError):
    def __init__(self, status: int) -> None:
        super().__init__(f"cudaError {status}")
        self.status = status


def _fake_cupy(monkeypatch, count=None, error=None):
    """A stand-in `cupy` whose runtime reports `count` devices or raises `error`."""
    def get_count():
        if error is not None:
            raise error
        return count

    rt = types.SimpleNamespace(getDeviceCount=get_count, getDeviceProperties=lambda i: {"name": b"Fake GPU"})
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(cuda=types.SimpleNamespace(runtime=rt)))


def test_install_lines():
    assert extras.install_line(Extra.CUDA) == CUDA_LINE
    assert extras.install_line(Extra.TORCH) == TORCH_LINE
    assert extras.extra_for_module("cupy.cuda") is Extra.CUDA and extras.extra_for_module("numpyx") is None


def test_require_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(MissingExtra) as e:
        extras.require_cupy("attngen.compile")
    assert str(e.value) == f"attngen.compile needs CuPy (the `cuda` extra), which is not installed: {CUDA_LINE}"
    assert isinstance(e.value, ModuleNotFoundError) and e.value.name == "cupy"
    with pytest.raises(MissingExtra, match=r"attngen\.torch needs PyTorch \(the `torch` extra\).*" + TORCH_LINE.replace("[", r"\[").replace("]", r"\]")):
        extras.require_torch("attngen.torch")


@pytest.mark.parametrize("count, error, status", [
    (1, None, GpuStatus.READY),
    (0, None, GpuStatus.NO_DEVICE),
    (None, _CudaRuntimeError(100), GpuStatus.NO_DEVICE),
    (None, _CudaRuntimeError(35), GpuStatus.NO_DRIVER),
    (None, OSError("libcuda.so.1: cannot open shared object file"), GpuStatus.NO_DRIVER),
])
def test_gpu_status_tells_machine_from_install(monkeypatch, count, error, status):
    _fake_cupy(monkeypatch, count, error)
    report = extras.gpu_check()
    assert report.status is status and extras.gpu_status() is status
    msg = report.message("`attngen bench`")
    if status is GpuStatus.READY:
        assert msg == "Fake GPU"
    else:
        assert "CuPy is installed" in msg and "pip install" not in msg
        assert msg.startswith("no GPU") == (status is GpuStatus.NO_DEVICE)


def test_gpu_status_without_cupy_is_not_no_gpu(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)
    report = extras.gpu_check()
    assert report.status is GpuStatus.NO_CUPY
    msg = report.message("`attngen bench`")
    assert CUDA_LINE in msg and "no GPU" not in msg


def test_gpu_status_with_a_broken_cupy(monkeypatch):
    class Broken:  # a finder that fails the way a CuPy built for another CUDA does
        def find_spec(self, name, path=None, target=None):
            if name == "cupy":
                raise ImportError("libcudart.so.12: cannot open shared object file")
            return None

    monkeypatch.delitem(sys.modules, "cupy", raising=False)
    monkeypatch.setattr(sys, "meta_path", [Broken(), *sys.meta_path])
    report = extras.gpu_check()
    assert report.status is GpuStatus.CUPY_BROKEN and "libcudart" in report.detail
    assert "installed but does not import" in report.message("x")


def test_compile_without_cupy_names_the_extra(monkeypatch):
    import attngen

    monkeypatch.setitem(sys.modules, "cupy", None)
    with pytest.raises(ModuleNotFoundError, match=r"attngen\.compile needs CuPy.*attngen\[cuda\]"):
        attngen.compile(SEED)


def test_bench_without_cupy_names_the_extra_not_no_gpu(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "cupy", None)
    rc = cli.main(["bench", str(SEED)])
    err = capsys.readouterr().err
    assert rc == 2 and CUDA_LINE in err and "no GPU" not in err, err


def test_bench_with_cupy_but_no_device_says_no_gpu(monkeypatch, capsys):
    _fake_cupy(monkeypatch, 0)
    rc = cli.main(["bench", str(SEED)])
    err = capsys.readouterr().err
    assert rc == 2 and "no GPU" in err and "pip install" not in err, err


def test_cli_names_the_extra_of_a_module_a_command_needs(monkeypatch, capsys):
    # A command whose module, or whose run, needs an extra's module that is not installed.
    def boom(args):
        raise ModuleNotFoundError("No module named 'torch'", name="torch")

    monkeypatch.setattr(cli, "cmd_bench", boom)  # build_parser reads it when main builds the parser
    rc = cli.main(["bench", str(SEED)])
    err = capsys.readouterr().err
    assert rc == 2 and TORCH_LINE in err and "internal error" not in err, err


def test_import_attngen_torch_without_torch_names_the_extra():
    code = ("import sys; sys.modules['torch'] = None\n"
            "try:\n    import attngen.torch\n"
            "except ModuleNotFoundError as e:\n    print(e)\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == f"attngen.torch needs PyTorch (the `torch` extra), which is not installed: {TORCH_LINE}"
