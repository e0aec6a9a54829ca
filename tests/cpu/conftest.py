"""The CPU backend's tests: kernels built once a session (`cpu_kernel`), skipped without a C++
compiler (with the reason)."""

from __future__ import annotations

import pytest


def _compiler_reason() -> str | None:
    from attngen.cpu.compile import CompilerNotFound, find_compiler

    try:
        find_compiler()
    except CompilerNotFound as e:
        return str(e)
    return None


def pytest_collection_modifyitems(config, items):
    reason = _compiler_reason()
    if reason:
        for it in items:
            if "tests/cpu" in str(it.fspath).replace("\\", "/"):
                it.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session")
def cpu_kernel():
    """`cpu_kernel(variant)`: the variant's CPU kernel, built (or read from the cache) once a session."""
    from attngen.cpu.kernel import compile_cpu

    built: dict = {}

    def get(v):
        if v not in built:
            built[v] = compile_cpu(v)
        return built[v]

    return get
