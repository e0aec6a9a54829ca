"""The plan stage's check of a lowered program: what an arch can run.

The front end (attngen.lang) says what a spec means and imports no backend; this module holds the
backend's side of `attngen check`. It hands lowering the few backend facts it checks in place
(`target`: head dims, heads, bf16, so that they are reported among the spec's other errors), then
resolves each variant's `tile` hint for the arch and checks it and the kernel's limits (parameter
space, threads, shared memory). Every problem is a located diagnostic against the spec.

    loads(text, path, arch)   parse, lower, validate; raises SpecError
    load(path, arch)          the same for a file
    validate(program, arch)   the plan-stage checks of a lowered program
"""

from __future__ import annotations

import os

from attngen.ir.dtypes import TENSOR_CORE_DTYPES
from attngen.ir.nodes import Program, QuantOperand, TileConfig, Variant
from attngen.lang import frontend
from attngen.lang.diagnostics import Diagnostic, SpecError
from attngen.lang.lower import Target
from attngen.plan import limits
from attngen.plan.schedule import (DEFAULT_ARCH, SUPPORTED_HEAD_DIMS, WIDE_HEAD_DIMS, Arch, describe_head_dims, q_token_norm,
                                   validate_tile, variant_tile)

__all__ = ["load", "loads", "quant_tile_problems", "resolve", "target", "validate", "variant_problems"]


def target(arch: Arch = DEFAULT_ARCH) -> Target:
    """The backend facts lowering checks in place, for `arch`."""
    return Target(name=arch.value, head_dims=SUPPORTED_HEAD_DIMS, max_heads=limits.MAX_HEADS, cc=arch.cc,
                  wide_head_dims=WIDE_HEAD_DIMS, wide_dtypes=TENSOR_CORE_DTYPES, head_dims_text=describe_head_dims())


def variant_problems(v: Variant, arch: Arch = DEFAULT_ARCH) -> list[Diagnostic]:
    """Every reason `v` cannot be built and launched on `arch`, located at the spec: its tile hint
    (completed with the auto choice), then the kernel's limits once the tile is sound."""
    if v.quantized:
        from attngen.plan import quant_fwd

        if quant_fwd.forward_problem(v) is None:
            # The quantized forward's own tile (its INT8 rows carry their scales, so scale blocks
            # need not tile it); other quantized specs keep the scale-block check of the tile.
            why = quant_fwd.tile_problem(v, quant_fwd.quant_tile(v, arch), arch)
            return [Diagnostic(f"bad tile: {why}", v.tile.span if v.tile is not None else v.span, None)] if why else []
        return quant_tile_problems(v, variant_tile(v, arch))
    if v.tile is not None:
        tile = variant_tile(v, arch)
        bad = validate_tile(v.dtype, v.head_dim, v.value_head_dim, tile, arch, token_norm=q_token_norm(v))
        if bad:
            return [Diagnostic(f"bad tile: {p}", v.tile.span, None) for p in bad]
    from attngen.plan.forward import plan

    try:
        kp = plan(v, arch)
    except ValueError:
        kp = None  # a tile this arch cannot take: the tile check reports it (and `compile --arch`)
    return [Diagnostic(p.message, p.span, p.help) for p in limits.check(v, arch, kp)]


def quant_tile_problems(v: Variant, tile: TileConfig) -> list[Diagnostic]:
    """A `per block(N)` scale must tile the kernel's tile: N divides block_m (q) or block_n (k),
    so each tile's rows or keys hold whole scale blocks. (Lowering checks a `tile` hint's given
    fields; this checks the tile the plan resolved for an arch.)"""
    out = []
    for qn, field in ((v.quant(QuantOperand.Q), "block_m"), (v.quant(QuantOperand.K), "block_n")):
        size = getattr(tile, field)
        if qn is not None and qn.block is not None and size % qn.block:
            out.append(Diagnostic(f"scale block {qn.block} does not divide the tile's {field} {size}", qn.span or v.span,
                                  f"use `per block(N)` with N dividing {size}, or a `tile` with {field} a multiple of {qn.block}"))
    return out


def validate(program: Program, arch: Arch = DEFAULT_ARCH, source: str | None = None) -> Program:
    """`program` when every variant can run on `arch`; else a SpecError listing every problem."""
    diags = [d for v in program.variants for d in variant_problems(v, arch)]
    if diags:
        raise SpecError(diags, source=source, path=program.path)
    return program


def loads(text: str, path: str = "<string>", arch: Arch = DEFAULT_ARCH) -> Program:
    """Parse, lower and validate .attn source for `arch`; raises SpecError (never a traceback)."""
    return validate(frontend.loads(text, path, target=target(arch)), arch, text)


def load(path: str | os.PathLike, arch: Arch = DEFAULT_ARCH) -> Program:
    """Read, lower and validate a .attn file for `arch`; an unreadable file is a SpecError too."""
    return loads(frontend.read_spec(path), os.fspath(path), arch)


def resolve(spec: Variant | Program | str | os.PathLike, variant: str | None = None) -> Variant:
    """The variant a compile call means: `spec` itself, or `variant` of a Program, a `.attn` path
    or `.attn` source text (text holds a `{`; the only variant where `variant` is None)."""
    if isinstance(spec, Variant):
        return spec
    if isinstance(spec, Program):
        return spec.get(variant)
    if isinstance(spec, os.PathLike) or (isinstance(spec, str) and "{" not in spec):
        return load(spec).get(variant)
    return loads(str(spec)).get(variant)
