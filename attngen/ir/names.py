"""The C++ names generated from spec names, and the rule that keeps that mapping injective.

`render_cuda` and the templates derive identifiers from the names a spec gives:

    input N      in_N (pointer), in_N_n<i> (size of dim i), in_N_s<i> (stride of dim i), ag_ld_N (loader)
    variant V    attngen_V (kernel), attngen_V_launch, attngen_V_impl (namespace),
                 attngen_V_prep_q / _prep_k / _prep_qstats (prep kernels), attngen_V_params (C header)

These are today's names, kept byte for byte (generated sources are compared by hash). Appending a
suffix is injective as long as no spec name already ends in a suffix the mangling appends: the
reserved suffixes below. Proof for inputs: in every generated input field, `_n<digits>` or
`_s<digits>` at the end is the maximal trailing run of digits and the letter before it, so a field
name determines its suffix (none, or which letter and which index); what remains is `in_N`, which
determines N. Two different (name, role) pairs therefore never give one identifier, and a pointer
field `in_N` can only equal a size or stride field of another input if N ended in such a suffix,
which `reserved_suffix` refuses. Variant names work the same way with their fixed word suffixes.
Implied inputs (`q_lens`, `q_norm_weight`, ...) end in none of the reserved suffixes.
"""

from __future__ import annotations

import re

# Suffixes the mangling appends to an input's name: `_n0`, `_s12`, ...
INPUT_SUFFIX_RE = re.compile(r"_[ns][0-9]+\Z")
# Suffixes appended to a variant's kernel name (the C header's struct is `<kernel>_params`).
VARIANT_SUFFIXES = ("_launch", "_impl", "_params", "_prep_q", "_prep_k", "_prep_qstats")


def input_field(name: str) -> str:
    """The Params field (and kernel argument) holding input `name`'s pointer."""
    return f"in_{name}"


def input_size_field(name: str, dim: int) -> str:
    return f"in_{name}_n{dim}"


def input_stride_field(name: str, dim: int) -> str:
    return f"in_{name}_s{dim}"


def input_loader(name: str) -> str:
    return f"ag_ld_{name}"


def input_identifiers(name: str, rank: int) -> tuple[str, ...]:
    """Every identifier generated for an input of this name and rank."""
    return (
        input_field(name),
        *(input_size_field(name, i) for i in range(rank)),
        *(input_stride_field(name, i) for i in range(rank)),
        input_loader(name),
    )


def variant_identifiers(name: str) -> tuple[str, ...]:
    """Every global identifier generated for a variant of this name."""
    kernel = f"attngen_{name}"
    return (kernel, *(kernel + s for s in VARIANT_SUFFIXES))


def reserved_input_suffix(name: str) -> str | None:
    """The reserved suffix an input name ends in (e.g. `_n0`), or None."""
    m = INPUT_SUFFIX_RE.search(name)
    return m.group(0) if m else None


def reserved_variant_suffix(name: str) -> str | None:
    """The reserved suffix a variant name ends in (e.g. `_launch`), or None."""
    for s in sorted(VARIANT_SUFFIXES, key=len, reverse=True):
        if name.endswith(s):
            return s
    return None
