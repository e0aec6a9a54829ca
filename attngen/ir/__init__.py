"""The semantic IR (frozen nodes) and the kernel ABI derived from it.

`attngen.ir` was one module; its public names still resolve here (lazily, so importing a
sibling does not load attngen.ir.nodes).
"""

# relayout: forwards attngen.ir.nodes
from __future__ import annotations

import importlib
from typing import Any

_FORWARDED = frozenset((
    "ALIBI_SLOPES",
    "ARITH_OPS",
    "ATTENTION_DTYPES",
    "AttnKind",
    "BLOCK_TABLE",
    "BLOCK_TABLE_PAGES",
    "BinOp",
    "Binary",
    "Builtin",
    "BuiltinName",
    "CACHE_LENS",
    "COMPARE_OPS",
    "CU_SEQLENS",
    "CU_SEQLENS_DIM",
    "CU_SEQLENS_K",
    "CU_SEQLENS_Q",
    "Call",
    "Const",
    "DType",
    "Dim",
    "Expr",
    "FP32_MAX",
    "FP32_MIN_NORMAL",
    "Func",
    "Index",
    "IndexVar",
    "LOGIC_OPS",
    "Layout",
    "Load",
    "MASK_BUILTINS",
    "Norm",
    "NormKind",
    "NormScope",
    "NormTarget",
    "PADDING_KV_LENS",
    "PADDING_Q_LENS",
    "PAGE_SIZES",
    "Program",
    "SCORE_BUILTINS",
    "ScalarType",
    "Score",
    "Size",
    "SizeSym",
    "Span",
    "TRUE",
    "TensorDecl",
    "TensorRef",
    "TileConfig",
    "TileHint",
    "UnOp",
    "Unary",
    "Variant",
    "children",
    "fp32_literal",
    "norm_bias_name",
    "norm_weight_name",
    "strip_sugar",
    "tensors_used",
    "uses_score",
    "walk",
))


def __getattr__(name: str) -> Any:
    if name not in _FORWARDED:
        raise AttributeError(f"module 'attngen.ir' has no attribute {name!r}")
    return getattr(importlib.import_module("attngen.ir.nodes"), name)
