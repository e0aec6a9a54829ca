"""Backend limits, checked on the kernel plan by the plan stage after a spec is lowered
(attngen.plan.validate), so `check` refuses what could never build or launch, with a located error,
instead of nvcc or the driver failing later.

Checked here: the kernel's parameter space (every Params field is a kernel argument), the launch
grid's heads dimension, the block size and the dynamic shared memory of the chosen tile. Each
problem names the spec construct that causes it.
"""

from __future__ import annotations

from dataclasses import dataclass

from attngen.ir import names
from attngen.ir.nodes import Span, Variant
from attngen.plan.op_plan import OpPlan
from attngen.plan.schedule import Arch

# A __global__ function's arguments may take 32,764 bytes (CUDA 12.1+, Volta and later; the
# classic limit was 4 KiB). Past it ptxas stops with "Formal parameter space overflowed".
MAX_PARAM_BYTES = 32764
# Query heads are the grid's y dimension (at most 65,535) in the non-persistent engines; the
# persistent ones would take more, but one limit for every engine keeps a spec portable.
MAX_HEADS = 65535
MAX_THREADS = 1024


@dataclass(frozen=True, slots=True)
class Problem:
    message: str
    span: Span | None
    help: str | None = None


def _field_size(ctype: str) -> int:
    """Bytes of a kernel argument of this C++ type on the 64-bit ABI: pointers and `long long` 8, `int` 4."""
    t = ctype.replace("__restrict__", "").strip()
    if t.endswith("*") or t == "long long":
        return 8
    if t == "int":
        return 4
    raise ValueError(f"no size known for kernel argument type {ctype!r}")


def param_bytes(ctypes: list[str]) -> list[int]:
    """The running end offset of each argument, natural alignment (what the parameter space holds)."""
    off, ends = 0, []
    for t in ctypes:
        size = _field_size(t)
        off = (off + size - 1) // size * size + size
        ends.append(off)
    return ends


def check(v: Variant, arch: Arch, kp: OpPlan | None) -> list[Problem]:
    """Every backend limit `v` breaks on `arch` under its plan `kp` (empty when it can build and
    launch). `kp` None: no plan for this arch (a tile it cannot take, which the tile check reports)."""
    if kp is None:
        return []
    out: list[Problem] = []
    ends = param_bytes([f.ctype for f in kp.fields])
    if ends and ends[-1] > MAX_PARAM_BYTES:
        # Locate the first input whose fields pass the limit: the declaration to drop or merge.
        first = next(i for i, e in enumerate(ends) if e > MAX_PARAM_BYTES)
        field = kp.fields[first].name
        owner = {i: d for d in v.runtime_inputs() for i in names.input_identifiers(d.name, len(d.shape))}
        decl = owner.get(field)
        span = decl.span if decl is not None and decl.span is not None else v.span
        n_inputs = len(v.runtime_inputs())
        out.append(Problem(
            f"the kernel's arguments need {ends[-1]} bytes, more than the {MAX_PARAM_BYTES} a CUDA kernel may take",
            span,
            f"{n_inputs} runtime inputs each pass a pointer, a size and a stride per dimension; the limit is "
            f"passed at {'input `' + decl.name + '`' if decl is not None else 'field `' + field + '`'}: "
            "declare fewer inputs, or pack several into one tensor of higher rank",
        ))
    if kp.threads > MAX_THREADS:
        out.append(Problem(f"the tile needs {kp.threads} threads a block, more than {MAX_THREADS}",
                           v.tile.span if v.tile is not None else v.span, "use fewer warps"))
    if kp.smem_bytes > arch.smem_budget:
        out.append(Problem(f"the tile needs {kp.smem_bytes} bytes of shared memory, more than {arch.value}'s "
                           f"{arch.smem_budget}", v.tile.span if v.tile is not None else v.span,
                           "use smaller blocks or fewer stages"))
    return out
