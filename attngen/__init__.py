"""attngen: a compiler for fused attention kernels.

Public API (imported lazily, so `import attngen` is cheap and works without a GPU):

    attngen.load(path) -> Program             parse and validate a .attn file
    attngen.loads(text, path) -> Program      the same from text
    attngen.compile(spec_or_path, variant=None, arch=None) -> Kernel   (needs CuPy and a GPU)
    attngen.raise_pending()                   raise an error deferred calls left on the device
    attngen.torch                             variants as torch.library custom ops (import attngen.torch)
    attngen.reference                         the NumPy reference (attngen.reference.attention)
    attngen.__version__
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# name -> (module, attribute or None for the module itself)
_LAZY: dict[str, tuple[str, str | None]] = {
    "load": ("attngen.plan.validate", "load"),
    "loads": ("attngen.plan.validate", "loads"),
    "compile": ("attngen.runtime.kernel", "compile"),
    "raise_pending": ("attngen.runtime.kernel", "raise_pending"),
    "reference": ("attngen.check.reference", None),
    "SpecError": ("attngen.lang.diagnostics", "SpecError"),
    "derivative": ("attngen.analysis.derivative", None),
    "distributed": ("attngen.runtime.distributed", None),
    "intervals": ("attngen.analysis.intervals", None),
    "runtime_bwd": ("attngen.runtime.bwd", None),
    "torch": ("attngen.runtime.torch", None),
    "workload": ("attngen.check.workload", None),
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    # Lazy so that the parser's lark, the runtime's CuPy and NumPy load only when asked for.
    try:
        module, attr = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'attngen' has no attribute {name!r}") from None
    mod = importlib.import_module(module)
    value = mod if attr is None else getattr(mod, attr)
    if attr is not None:
        globals()[name] = value  # cache; a submodule binds itself on import
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
