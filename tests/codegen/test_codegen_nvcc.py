"""Every example variant compiles with nvcc for sm_80 and sm_90a with no spills, no stack frame and
dynamic shared memory within the arch's budget (marker `nvcc`: skipped where nvcc is absent).

Each (variant, arch) is compiled once per session: the first test submits every pair the session
selected to a 2-worker thread pool (nvcc is single-threaded; two keep CI machines responsive) and
each test then waits for its own result."""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor

import pytest
from _codegen_util import VARIANT_IDS, VARIANTS, variant

from attngen.cuda import compile as compile_cuda, render as render_cuda
from attngen.plan.schedule import Arch, spill_budget


def v_dtype(path, name):
    return variant(path, name).dtype

ARCHS = [Arch.SM80, Arch.SM90A]

_POOL: ThreadPoolExecutor | None = None
_FUTURES: dict[tuple[str, str, str], Future] = {}
_LOCK = threading.Lock()


def _compile(path, name, arch):
    v = variant(path, name)
    src, kp = render_cuda.render_with_plan(v, arch)
    return kp, compile_cuda.resources(src, arch)


def _submit(path, name, arch) -> Future:
    global _POOL
    key = (str(path), name, arch.value)
    with _LOCK:
        if key not in _FUTURES:
            if _POOL is None:
                _POOL = ThreadPoolExecutor(max_workers=2, thread_name_prefix="nvcc")
            _FUTURES[key] = _POOL.submit(_compile, path, name, arch)
        return _FUTURES[key]


@pytest.fixture(scope="module", autouse=True)
def _prefetch(request):
    """Queue every pair this test run will ask for, in collection order, so nvcc runs ahead."""
    for item in request.session.items:
        cs = getattr(item, "callspec", None)
        if item.module is not request.module or cs is None:
            continue
        if {"path", "name", "arch"} <= cs.params.keys():
            _submit(cs.params["path"], cs.params["name"], cs.params["arch"])
    yield
    global _POOL
    if _POOL is not None:
        _POOL.shutdown(wait=True, cancel_futures=True)
        _POOL = None
    _FUTURES.clear()


@pytest.mark.nvcc
@pytest.mark.parametrize("arch", ARCHS, ids=[a.value for a in ARCHS])
@pytest.mark.parametrize("path,name", VARIANTS, ids=VARIANT_IDS)
def test_compiles_without_spills(path, name, arch):
    kp, res = _submit(path, name, arch).result()
    expected = sorted([kp.kernel_name, *(pr.kernel for pr in kp.preps)])
    assert sorted(r.kernel for r in res) == expected, f"ptxas reported {[r.kernel for r in res]}"
    for pr in (r for r in res if r.kernel != kp.kernel_name):
        # Prep kernels are simple row loops: no spills, no stack, no shared memory.
        assert pr.spill_stores == pr.spill_loads == pr.stack_bytes == pr.static_smem == 0, pr
    r = next(r for r in res if r.kernel == kp.kernel_name)
    figures = (
        f"{kp.kernel_name} on {arch.value}: {r.registers} registers, {r.spill_stores} B spill stores, "
        f"{r.spill_loads} B spill loads, {r.stack_bytes} B stack, {r.static_smem} B static smem, "
        f"{kp.smem_bytes} B dynamic smem (budget {arch.smem_budget})"
    )
    # Zero spills, except the documented budgets of wgmma and of two-row-tile MMA schedules (schedule.spill_budget).
    budget = spill_budget(kp.engine, kp.tile)
    assert r.spill_stores <= budget and r.spill_loads <= budget, figures + f" (spill budget {budget} B)"
    assert r.stack_bytes <= budget, figures + f" (spill budget {budget} B)"
    assert kp.smem_bytes <= arch.smem_budget, figures
    assert kp.smem_bytes + r.static_smem <= arch.smem_budget, figures
    assert r.registers <= 255, figures
