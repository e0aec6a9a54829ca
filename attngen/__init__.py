"""attngen: a compiler for fused attention kernels.

Public API (imported lazily, so `import attngen` is cheap and works without a GPU):

    attngen.load(path) -> Program             parse and validate a .attn file
    attngen.loads(text, path) -> Program      the same from text
    attngen.compile(spec_or_path, variant=None, arch=None) -> Kernel   (needs the `attngen[cuda]` extra and a GPU;
                                              device="cpu": the CPU backend)
    attngen.raise_pending()                   raise an error deferred calls left on the device
    attngen.SpecError                         what load/loads raise for a bad spec (file:line:col diagnostics)
    attngen.torch                             variants as torch.library custom ops (import attngen.torch)
    attngen.reference                         the NumPy reference (attngen.reference.attention)
    attngen.distributed                       context-parallel ring attention (attngen.distributed.ring_attention)
    attngen.__version__
"""

import importlib as _importlib
import typing as _typing

__version__ = "0.1.0"

# name -> (module, attribute or None for the module itself); unannotated, so that the module has
# no __annotations__ to show in dir()
_LAZY = {
    "load": ("attngen.plan.validate", "load"),
    "loads": ("attngen.plan.validate", "loads"),
    "compile": ("attngen.backend", "compile"),
    "raise_pending": ("attngen.runtime.kernel", "raise_pending"),
    "SpecError": ("attngen.lang.diagnostics", "SpecError"),
    "reference": ("attngen.reference", None),
    "distributed": ("attngen.distributed", None),
    "torch": ("attngen.torch", None),
}

__all__ = ["__version__", "SpecError", "compile", "distributed", "load", "loads", "raise_pending", "reference", "torch"]

if _typing.TYPE_CHECKING:  # what the lazy names are, for type checkers and editors
    from attngen import distributed, reference, torch
    from attngen.lang.diagnostics import SpecError
    from attngen.plan.validate import load, loads
    from attngen.backend import compile
    from attngen.runtime.kernel import raise_pending


def __getattr__(name: str) -> object:
    # Lazy so that the parser's lark, the runtime's CuPy and NumPy load only when asked for.
    try:
        module, attr = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'attngen' has no attribute {name!r}") from None
    mod = _importlib.import_module(module)
    value = mod if attr is None else getattr(mod, attr)
    if attr is not None:
        globals()[name] = value  # cache; a submodule binds itself on import
    return value


def __dir__() -> list[str]:
    # The public names and the loaded submodules; not this module's own helpers.
    return sorted(set(__all__) | {n for n in globals() if not n.startswith("_") or n.startswith("__")})
