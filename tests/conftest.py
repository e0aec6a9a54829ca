"""Shared test configuration: hypothesis profiles and the GPU / nvcc markers.

Profiles: `ci` (default; bounded, deterministic, no deadline), `dev` (quick), `gpu` (for the device
run: more examples). Pick one with HYPOTHESIS_PROFILE=name.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest
from hypothesis import HealthCheck, settings

# The test run keeps its caches (cubins, parser tables, compiled templates) to itself, not in the
# user's ~/.cache/attngen; an explicit ATTNGEN_CACHE_DIR still wins.
os.environ.setdefault("ATTNGEN_CACHE_DIR", tempfile.mkdtemp(prefix="attngen-test-cache-"))

settings.register_profile(
    "ci", max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("dev", max_examples=20, deadline=None)
settings.register_profile(
    "gpu", max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def _gpu_reason() -> str | None:
    try:
        import cupy  # noqa: F401
    except Exception as e:  # ImportError, or a CUDA library that fails to load
        return f"no GPU: CuPy is not importable ({type(e).__name__}: {e})"
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:
        return f"no GPU: the CUDA runtime reports no device ({type(e).__name__})"
    if n < 1:
        return "no GPU: the CUDA runtime reports 0 devices"
    return None


def pytest_collection_modifyitems(config, items):
    need_gpu = [it for it in items if it.get_closest_marker("gpu") is not None]
    if need_gpu:
        reason = _gpu_reason()
        if reason:
            for it in need_gpu:
                it.add_marker(pytest.mark.skip(reason=reason))
    if shutil.which("nvcc") is None:
        for it in items:
            if it.get_closest_marker("nvcc") is not None:
                it.add_marker(pytest.mark.skip(reason="nvcc is not on the PATH"))
