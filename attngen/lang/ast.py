"""The syntax tree of a .attn file: what was written, with spans, before any checking.

`parse_attn` builds it, `lower` checks it and turns it into IR, `fmt` prints it back with the
comments. Numbers keep their source text so that `fmt` never rewrites a literal and `lower` can
report a malformed one at its place.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Union

from attngen.ir.nodes import Span


@dataclass(frozen=True, slots=True)
class Word:
    """An identifier or value word (`bf16`, `q`, `ids`), where it was written."""

    text: str
    span: Span


@dataclass(frozen=True, slots=True)
class Num:
    """A numeric literal as written (`128`, `1e-5`; possibly malformed, e.g. `12x8`)."""

    text: str
    span: Span
    negative: bool = False  # only for the signed literals of `scale` and norm eps


# --------------------------------------------------------------------------------------------
# Expressions


@dataclass(frozen=True, slots=True)
class NameE:
    name: str
    span: Span


@dataclass(frozen=True, slots=True)
class NumE:
    text: str
    span: Span


@dataclass(frozen=True, slots=True)
class BoolE:
    value: bool
    span: Span


@dataclass(frozen=True, slots=True)
class UnaryE:
    op: str  # "-" or "!"
    operand: "AExpr"
    span: Span


@dataclass(frozen=True, slots=True)
class BinaryE:
    op: str  # one of ir.BinOp's values
    lhs: "AExpr"
    rhs: "AExpr"
    span: Span
    op_span: Span


@dataclass(frozen=True, slots=True)
class CallE:
    func: Word
    args: tuple["AExpr", ...]
    span: Span


@dataclass(frozen=True, slots=True)
class LookupE:
    tensor: Word
    indices: tuple["AExpr", ...]
    span: Span


AExpr = Union[NameE, NumE, BoolE, UnaryE, BinaryE, CallE, LookupE]


# --------------------------------------------------------------------------------------------
# Statements


class StmtKind(enum.Enum):
    """Statement keywords, as written."""

    DTYPE = "dtype"
    HEAD_DIM = "head_dim"
    HEADS = "heads"
    KIND = "kind"
    LAYOUT = "layout"
    SCALE = "scale"
    INPUT = "input"
    MASK = "mask"
    SCORE = "score"
    NORM = "norm"
    RESIDUAL = "residual"
    NAN_CHECK = "nan_check"
    OUTPUT = "output"
    SINK = "sink"
    KV_CACHE = "kv_cache"
    TILE = "tile"
    QUANT = "quant"


@dataclass(frozen=True, slots=True)
class WordStmt:
    """`dtype W`, `kind W`, `layout W`, `output W`, `sink W`."""

    kind: StmtKind
    value: Word
    span: Span


@dataclass(frozen=True, slots=True)
class PairStmt:
    """`head_dim N [value M]`, `heads N [kv M]`."""

    kind: StmtKind
    first: Num
    second: Num | None
    span: Span


@dataclass(frozen=True, slots=True)
class ScaleStmt:
    value: Num | None  # None: `scale auto`
    span: Span
    kind: StmtKind = StmtKind.SCALE


@dataclass(frozen=True, slots=True)
class InputStmt:
    name: Word
    dtype: Word
    dims: tuple[Union[Num, Word], ...]
    sorted: bool
    span: Span
    kind: StmtKind = StmtKind.INPUT


@dataclass(frozen=True, slots=True)
class ExprStmt:
    """`mask EXPR`, `score EXPR`."""

    kind: StmtKind
    expr: AExpr
    span: Span


@dataclass(frozen=True, slots=True)
class NormOption:
    key: str  # "scope" or "affine"
    value: Word
    span: Span


@dataclass(frozen=True, slots=True)
class NormStmt:
    target: Word
    norm_kind: Word
    eps: Num
    options: tuple[NormOption, ...]
    span: Span
    kind: StmtKind = StmtKind.NORM


@dataclass(frozen=True, slots=True)
class KvCacheStmt:
    """`kv_cache paged(N)`: K/V live in pages of N tokens, found through a block table."""

    layout: Word
    page_size: Num
    span: Span
    kind: StmtKind = StmtKind.KV_CACHE


@dataclass(frozen=True, slots=True)
class DTypeStmt:
    """`dtype T [TENSOR T]...`: T for q, k, v and the output, then per-tensor overrides."""

    value: Word
    overrides: tuple[tuple[Word, Word], ...]  # (tensor: q/k/v/out, type), as written
    span: Span
    kind: StmtKind = StmtKind.DTYPE


@dataclass(frozen=True, slots=True)
class QuantStmt:
    """`quant OPERAND TYPE SOURCE[(c)] [per GRANULARITY[(N)]] [smooth HOW]`."""

    operand: Word
    qtype: Word
    source: Word
    source_arg: Num | None  # c of `static(c)`
    per: Word | None  # the granularity word
    per_arg: Num | None  # N of `block(N)`
    smooth: Word | None
    span: Span
    kind: StmtKind = StmtKind.QUANT


@dataclass(frozen=True, slots=True)
class FlagStmt:
    """`residual`, `nan_check`."""

    kind: StmtKind
    span: Span


@dataclass(frozen=True, slots=True)
class TileField:
    key: Word  # block_m, block_n, warps, stages
    value: Num
    span: Span


@dataclass(frozen=True, slots=True)
class TileStmt:
    fields: tuple[TileField, ...]  # empty: `tile auto`
    span: Span
    kind: StmtKind = StmtKind.TILE


Stmt = Union[WordStmt, PairStmt, ScaleStmt, InputStmt, ExprStmt, NormStmt, FlagStmt, TileStmt, KvCacheStmt, DTypeStmt, QuantStmt]


@dataclass(frozen=True, slots=True)
class VariantDecl:
    name: Word
    stmts: tuple[Stmt, ...]
    span: Span  # the whole `attention NAME { ... }`
    header_span: Span  # `attention NAME {`
    close_span: Span  # the closing `}`


@dataclass(frozen=True, slots=True)
class Comment:
    text: str  # including the leading `#`, trailing whitespace removed
    line: int
    col: int


@dataclass(frozen=True, slots=True)
class File:
    variants: tuple[VariantDecl, ...]
    comments: tuple[Comment, ...]
    path: str
