"""Arrays in, kernels launched: argument binding, launches, and the front ends over them.

`attngen.runtime` was one module; its public names still resolve here (lazily, so importing a
sibling does not load attngen.runtime.kernel).
"""

# relayout: forwards attngen.runtime.kernel
from __future__ import annotations

import importlib
from typing import Any

_FORWARDED = frozenset((
    "COUNTER_BLOCK",
    "InputCheckError",
    "Kernel",
    "NaNCheckError",
    "compile",
    "device_arch",
    "raise_pending",
))


def __getattr__(name: str) -> Any:
    if name not in _FORWARDED:
        raise AttributeError(f"module 'attngen.runtime' has no attribute {name!r}")
    return getattr(importlib.import_module("attngen.runtime.kernel"), name)
