"""`attngen check --json` and `attngen explain --json`: stable, machine-readable output for tools
and editors (schema in docs/JSON.md; SCHEMA_VERSION changes only when a field is removed or
changes meaning, never when one is added).

Keys are sorted and every document carries `schema_version` and `command`, so the same input
gives the same bytes.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from attngen.ir.nodes import Variant
from attngen.lang.diagnostics import Diagnostic
from attngen.plan.schedule import Arch

__all__ = ["SCHEMA_VERSION", "check_file", "diagnostic", "document", "dump", "explain_variant", "variant"]

SCHEMA_VERSION = 1


def dump(doc: dict[str, Any]) -> str:
    """The document as text: sorted keys, two-space indent, a final newline."""
    return json.dumps(doc, sort_keys=True, indent=2, ensure_ascii=False) + "\n"


def document(command: str, arch: Arch, **fields: Any) -> dict[str, Any]:
    """A top-level document of `command` ("check", "explain") for `arch`."""
    return {"schema_version": SCHEMA_VERSION, "command": command, "arch": arch.value, **fields}


def diagnostic(d: Diagnostic, path: str) -> dict[str, Any]:
    """One diagnostic: severity, message, help, and where (file, line, col, end_line, end_col;
    1-based, columns in characters; null for a diagnostic without a place)."""
    sp = d.span
    return {
        "severity": d.severity, "message": d.message, "help": d.help,
        "file": sp.path if sp is not None else path,
        "line": sp.line if sp is not None else None, "col": sp.col if sp is not None else None,
        "end_line": sp.end_line if sp is not None else None, "end_col": sp.end_col if sp is not None else None,
    }


def _dims(dims: Sequence[Any]) -> list[int | str]:
    return [d if isinstance(d, int) else str(getattr(d, "value", d)) for d in dims]


def variant(v: Variant, arch: Arch) -> dict[str, Any]:
    """What `check` says of one variant: its declaration, the family and tile that run it."""
    from attngen.plan import decode as plan_decode
    from attngen.plan.schedule import engine, variant_tile
    from attngen.tools import explain

    out: dict[str, Any] = {
        "name": v.name, "summary": explain.summary(v, arch), "dtype": v.dtype.value, "kind": v.kind.value,
        "layout": v.layout.value, "heads": v.heads, "kv_heads": v.kv_heads, "head_dim": v.head_dim,
        "value_head_dim": v.value_head_dim,
        "runtime_inputs": [{"name": d.name, "dtype": d.dtype.value, "shape": _dims(d.shape)} for d in v.runtime_inputs()],
    }
    if v.quantized and plan_decode.fp8_kv(v):  # an FP8 KV cache: the decode family reads it
        from attngen.tools.explain_quant import quant_json

        out.update(family="decode" if plan_decode.decode_unsupported(v, arch) is None else None, engine=None, tile=None,
                   quant=quant_json(v))
    elif v.quantized:  # the quantized forward where plan.quant_fwd takes it, else no CUDA kernel yet
        from attngen.plan.quant_fwd import cuda_problem, quant_tile, wgmma_q8
        from attngen.tools.explain_quant import quant_json

        t = quant_tile(v, arch) if cuda_problem(v, arch) is None else None
        out.update(family="forward" if t else None, engine=("wgmma" if wgmma_q8(v, arch) else "mma.sync") if t else None,
                   tile={"block_m": t.block_m, "block_n": t.block_n, "warps": t.warps, "stages": t.stages,
                         "auto": v.tile is None} if t else None, quant=quant_json(v))
    elif plan_decode.forward_unsupported(v) is not None:
        out.update(family="decode", engine=None, tile=None)
    else:
        t = variant_tile(v, arch)
        out.update(family="forward", engine=engine(v.dtype, v.head_dim, v.value_head_dim, t, arch).value,
                   tile={"block_m": t.block_m, "block_n": t.block_n, "warps": t.warps, "stages": t.stages,
                         "auto": v.tile is None})
    return out


def check_file(path: str, diagnostics: Sequence[Diagnostic], variants: Sequence[Variant], arch: Arch) -> dict[str, Any]:
    """One file of `check --json`: ok (no error-severity diagnostic), its diagnostics in source
    order, and the variants that checked out."""
    return {
        "path": path, "ok": not any(d.severity == "error" for d in diagnostics),
        "diagnostics": [diagnostic(d, path) for d in diagnostics],
        "variants": [variant(v, arch) for v in variants],
    }


def explain_variant(v: Variant, arch: Arch, shape: tuple[int, int, int], text: str) -> dict[str, Any]:
    """One variant of `explain --json`: `check`'s fields, the I/O shapes at `shape`, the tile
    advice, and the plain-words text `explain` prints."""
    from attngen.ir import abi
    from attngen.plan.tile_advice import engine_move, tile_statement
    from attngen.tools import explain

    B, Lq, Lk = shape
    out = variant(v, arch)
    io = {n: list(s) for n, s in explain.io_shapes(v, B, Lq, Lk).items() if n != "lse" or v.lse}
    sizes = explain.sample_sizes(v, B, Lk if v.kind.value == "self" else Lq, Lk)
    for d in v.runtime_inputs():
        try:
            io[d.name] = list(abi.input_shape(v, d, sizes))
        except ValueError:
            io[d.name] = None  # bound at run time (the text says so)
    move = None if v.quantized else engine_move(v, arch)
    out.update(
        shape={"B": B, "Lq": Lq, "Lk": Lk}, io=io, text=text,
        tile_advice=None if move is None else {
            "engine": move.engine.value, "auto_engine": move.auto_engine.value,
            "auto_tile": tile_statement(move.auto_tile), "why": move.why},
    )
    if v.quantized:
        from attngen.tools.explain_quant import json_fields

        out.update(json_fields(v))
    return out
