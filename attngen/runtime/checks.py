"""Input checks run on the device before a launch (stage: render + compile of the check kernels).

A kernel trusts a few properties of its runtime inputs that their shapes cannot show. Lookups are
bounds-checked in the kernel itself (an out-of-range index reads 0, as in the reference), so the
only promise it takes on trust is `sorted`: tile classification reads a sorted input only at a
tile's two ends. `check_kernels(arch)` gives one small CUDA module with a sortedness check for each
element type; the runtime launches it before the attention kernel unless `check_inputs=False`.
"""

from __future__ import annotations

from dataclasses import dataclass

from attngen import __version__
from attngen.ir.dtypes import INPUT_DTYPES
from attngen.ir.nodes import DType
from attngen.cuda.render import _environment

CHECK_THREADS = 256
CHECK_MAX_BLOCKS = 1024
NO_ERROR = (1 << 63) - 1  # the initial value of a check's error word (LLONG_MAX; atomicMin lowers it)



@dataclass(frozen=True, slots=True)
class SortedCheck:
    """The launch of one sortedness check: a runtime input of `rank` dims, viewed as leading dims
    padded to three, then its last dim."""

    input: str
    kernel: str
    rank: int


def check_kernel_name(dtype: DType) -> str:
    """The entry point checking a sorted input of element type `dtype`."""
    return f"attngen_check_sorted_{dtype.info.suffix}"


def render_checks() -> str:
    """The check kernels' CUDA source (stable bytes)."""
    env = _environment()
    # Every element type a sorted input may have, the integer ones first (the source's stable order).
    types = [dict(suffix=d.info.suffix, ctype=d.info.cuda) for d in sorted(INPUT_DTYPES, key=lambda d: d.is_float)]
    return env.get_template("common/checks.cu.j2").render(version=__version__, types=types, threads=CHECK_THREADS)


def check_grid(pairs: int) -> int:
    """Blocks for a check over `pairs` adjacent pairs (grid-stride: any grid is correct)."""
    return max(1, min(-(-pairs // CHECK_THREADS), CHECK_MAX_BLOCKS))


def check_args(shape: tuple[int, ...], strides: tuple[int, ...]) -> tuple[int, ...]:
    """The scalar arguments (n0, n1, n2, n, s0, s1, s2, s3) for an input of this shape and strides
    (elements): leading dims beyond three fold into the first (they are contiguous in C order only
    when the caller's strides say so, so fold only dims of size 1)."""
    lead, lstr = list(shape[:-1]), list(strides[:-1])
    while len(lead) > 3:  # fold leading dims of size 1; shapes with more real dims are refused by the caller
        i = lead.index(1) if 1 in lead else None
        if i is None:
            raise ValueError(f"a sorted input has at most 4 dimensions of size > 1, got shape {shape}")
        del lead[i], lstr[i]
    while len(lead) < 3:
        lead.insert(0, 1)
        lstr.insert(0, 0)
    return (*lead, shape[-1], *lstr, strides[-1])


def flat_to_index(flat: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The multi-index of a C-order flat index into `shape`."""
    out = []
    for n in reversed(shape):
        out.append(flat % n)
        flat //= n
    return tuple(reversed(out))
