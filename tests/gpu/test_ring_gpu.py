"""Ring attention across GPUs: runs tests/gpu/ring_gpu_check.py under torchrun on every visible
GPU (at least 2): each rank's rows against the single-GPU kernel on the whole sequence."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _gpus() -> int:
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except ImportError:
        return 0


@pytest.mark.gpu
@pytest.mark.skipif(_gpus() < 2, reason="ring attention across GPUs needs torch and at least 2 CUDA GPUs")
def test_ring_matches_the_single_gpu_kernel(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={_gpus()}",
                        str(ROOT / "tests/gpu/ring_gpu_check.py"), "--out", str(tmp_path / "ring.json")],
                       capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert r.returncode == 0, (r.stdout + r.stderr)[-6000:]
    assert r.stdout.count("PASS") >= 7, r.stdout
