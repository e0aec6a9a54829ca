"""The reference's evaluator and array plumbing, shared by the forward oracle
(attngen.check.reference) and the backward one (attngen.check.reference_bwd): IR expressions in
float64 NumPy, the inputs' rounding to their spec dtype, binding sizes from arrays, layouts and
the norms' arithmetic."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from attngen.ir import abi
from attngen.ir.abi import Sizes
from attngen.ir.dtypes import ml_dtype
from attngen.ir.nodes import (
    COMPARE_OPS,
    Binary,
    BinOp,
    Builtin,
    Call,
    Const,
    DType,
    Expr,
    Func,
    Index,
    IndexVar,
    Layout,
    Load,
    NormKind,
    NormTarget,
    ScalarType,
    Score,
    Size,
    SizeSym,
    TensorRef,
    Unary,
    UnOp,
    Variant,
    norm_bias_name,
    norm_weight_name,
    uses_score,
    fp32_literal,
)

# Largest float64 block (bytes) one step builds; a handful of these live at once.
CHUNK_BYTES = 8 << 20


def dtype_of(d: DType) -> np.dtype:
    """The numpy dtype of an IR element type (ml_dtypes.bfloat16 for bf16)."""
    return np.dtype(ml_dtype(d))


def round_to(x: np.ndarray, d: DType) -> np.ndarray:
    """x rounded to element type d (round-to-nearest-even), returned as float64."""
    return np.asarray(x).astype(dtype_of(d)).astype(np.float64)


@dataclass(frozen=True, slots=True)
class Env:
    """Everything an expression can read. Index arrays broadcast against each other (e.g. q of
    shape (1, n, 1) and kv of shape (1, 1, m)); `sizes` maps every SizeSym to an int; `tensors`
    holds runtime inputs as int64 (integer dtypes) or float64 (float dtypes, already rounded)."""

    index: Mapping[IndexVar, np.ndarray | int]
    sizes: Mapping[SizeSym, int]
    tensors: Mapping[str, np.ndarray] = field(default_factory=dict)
    score: np.ndarray | None = None


def _as(x: np.ndarray, t: ScalarType) -> np.ndarray:
    if t == ScalarType.FLOAT:
        return np.asarray(x, dtype=np.float64)
    if t == ScalarType.INT:
        return np.asarray(x, dtype=np.int64)
    if t == ScalarType.BOOL:
        return np.asarray(x, dtype=bool)
    raise ValueError(f"expected a value type (bool, int, float), got {t}")


def _floor_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    zero = b == 0
    return np.where(zero, 0, np.floor_divide(a, np.where(zero, 1, b)))


def _floor_mod(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    zero = b == 0
    return np.where(zero, 0, np.mod(a, np.where(zero, 1, b)))


def _load(e: Load, env: Env) -> np.ndarray:
    if e.tensor not in env.tensors:
        raise ValueError(f"lookup {e.tensor}[...]: expected a runtime input named {e.tensor!r}, got none")
    t = env.tensors[e.tensor]
    if len(e.indices) != t.ndim:
        raise ValueError(f"lookup {e.tensor}[...]: expected {t.ndim} indices, got {len(e.indices)}")
    idx = [np.asarray(evaluate(i, env), dtype=np.int64) for i in e.indices]
    idx = np.broadcast_arrays(*idx) if idx else []
    inside = np.ones(np.shape(idx[0]) if idx else (), dtype=bool)
    clipped = []
    for n, i in zip(t.shape, idx):
        inside &= (i >= 0) & (i < n)
        clipped.append(np.clip(i, 0, max(n - 1, 0)))
    if t.size == 0:
        return _as(np.zeros(inside.shape), e.type)
    # Out of range reads 0, as the kernel does: never wrap around like Python indexing would.
    vals = t[tuple(clipped)]
    return _as(np.where(inside, vals, 0), e.type)


def evaluate(e: Expr, env: Env) -> np.ndarray:
    """Evaluate an IR expression, vectorised over the broadcast index arrays of `env`."""
    if isinstance(e, Const):
        if e.type == ScalarType.FLOAT:
            return np.asarray(fp32_literal(e.value), dtype=np.float64)
        return _as(np.asarray(e.value), e.type)
    if isinstance(e, Index):
        return np.asarray(env.index[e.var], dtype=np.int64)
    if isinstance(e, Size):
        return np.asarray(env.sizes[e.sym], dtype=np.int64)
    if isinstance(e, Score):
        if env.score is None:
            raise ValueError("`s` outside a score expression: expected a score in the environment, got none")
        return env.score
    if isinstance(e, Builtin):
        return evaluate(e.body, env)
    if isinstance(e, Load):
        return _load(e, env)
    if isinstance(e, TensorRef):
        raise ValueError(f"tensor {e.name!r} used as a value: expected a lookup {e.name}[...], got the bare name")
    if isinstance(e, Unary):
        x = evaluate(e.operand, env)
        if e.op == UnOp.NOT:
            return ~_as(x, ScalarType.BOOL)
        return -_as(x, e.type)
    if isinstance(e, Binary):
        return _binary(e, env)
    if isinstance(e, Call):
        return _call(e, env)
    raise ValueError(f"expected an IR expression, got {type(e).__name__}")


def _binary(e: Binary, env: Env) -> np.ndarray:
    a, b = evaluate(e.lhs, env), evaluate(e.rhs, env)
    op = e.op
    if op == BinOp.AND:
        return _as(a, ScalarType.BOOL) & _as(b, ScalarType.BOOL)
    if op == BinOp.OR:
        return _as(a, ScalarType.BOOL) | _as(b, ScalarType.BOOL)
    if op in COMPARE_OPS:
        # Mixed int/float comparisons compare values; bool == bool compares truth.
        if a.dtype != b.dtype and not (a.dtype == bool and b.dtype == bool):
            if a.dtype.kind == "f" or b.dtype.kind == "f":
                a, b = a.astype(np.float64), b.astype(np.float64)
        f = {
            BinOp.LT: np.less,
            BinOp.LE: np.less_equal,
            BinOp.GT: np.greater,
            BinOp.GE: np.greater_equal,
            BinOp.EQ: np.equal,
            BinOp.NE: np.not_equal,
        }[op]
        return f(a, b)
    a, b = _as(a, e.type), _as(b, e.type)
    if op == BinOp.ADD:
        return a + b
    if op == BinOp.SUB:
        return a - b
    if op == BinOp.MUL:
        return a * b
    if e.type == ScalarType.INT:
        return _floor_div(a, b) if op == BinOp.DIV else _floor_mod(a, b)
    # Float `/` is IEEE division; float `%` is floor modulo like Python's (NaN for a zero divisor).
    if op == BinOp.DIV:
        return a / b
    return a - np.floor(a / b) * b


def _call(e: Call, env: Env) -> np.ndarray:
    args = [evaluate(a, env) for a in e.args]
    f = e.func
    if f == Func.WHERE:
        c, x, y = args
        return np.where(_as(c, ScalarType.BOOL), _as(x, e.type), _as(y, e.type))
    if f == Func.MIN:
        return np.minimum(_as(args[0], e.type), _as(args[1], e.type))
    if f == Func.MAX:
        return np.maximum(_as(args[0], e.type), _as(args[1], e.type))
    if f == Func.ABS:
        return np.abs(_as(args[0], e.type))
    x = _as(args[0], ScalarType.FLOAT)
    return {Func.TANH: np.tanh, Func.EXP: np.exp, Func.LOG: np.log, Func.SQRT: np.sqrt}[f](x)


def _size_map(v: Variant, sizes: Sizes) -> dict[SizeSym, int]:
    return {s: abi.size_value(v, s, sizes) for s in SizeSym}


def prepare_tensors(v: Variant, inputs: Mapping[str, np.ndarray] | None) -> dict[str, np.ndarray]:
    """Runtime inputs as the reference reads them: declared float types rounded then float64,
    integer types int64. Integer inputs must hold integers (ValueError otherwise)."""
    out: dict[str, np.ndarray] = {}
    given = dict(inputs or {})
    for d in v.runtime_inputs():
        if d.name not in given:
            continue  # bind_sizes reports it
        a = np.asarray(given[d.name])
        if d.dtype.is_float:
            out[d.name] = round_to(a, d.dtype)
        else:
            if a.dtype.kind == "f" and not np.all(np.isfinite(a) & (a == np.round(a))):
                raise ValueError(f"{d.name}: expected integers for {d.dtype.value}, got non-integer floats")
            if a.dtype.kind not in "biuf":
                raise ValueError(f"{d.name}: expected an integer array for {d.dtype.value}, got dtype {a.dtype}")
            out[d.name] = a.astype(np.int64)
    return out


def _bind(v: Variant, q: np.ndarray, k: np.ndarray, vv: np.ndarray, inputs, positions: abi.Positions | None = None) -> Sizes:
    given = {n: (np.shape(a), np.asarray(a).dtype.name) for n, a in (inputs or {}).items()}
    return abi.bind_sizes(v, np.shape(q), np.shape(k), np.shape(vv), given, check_dtypes=False, positions=positions)


def _as_bhsd(x: np.ndarray, layout: Layout, heads: int) -> np.ndarray:
    """A [B, H, L, D] view (no copy) of a tensor in the given layout."""
    x = np.asarray(x)
    if x.ndim == 3:  # flat [B, L, H*D] hidden state
        x = x.reshape(x.shape[0], x.shape[1], heads, -1)
        return x.transpose(0, 2, 1, 3)
    return x if layout == Layout.BHSD else x.transpose(0, 2, 1, 3)


def _unpage(x: np.ndarray, table: np.ndarray) -> np.ndarray:
    """Paged K or V [num_pages, N, Hkv, D] gathered through the block table [B, P] into the
    logical [B, Hkv, P * N, D]; page ids outside [0, num_pages) are refused."""
    x = np.asarray(x)
    n = x.shape[0]
    if table.size and (table.min() < 0 or table.max() >= n):
        raise ValueError(f"block_table: expected page ids in [0, {n}), got values from {table.min()} to {table.max()}")
    g = x[table]  # [B, P, N, Hkv, D]
    B, P, N = g.shape[:3]
    return g.reshape(B, P * N, *x.shape[2:]).transpose(0, 2, 1, 3)


def _check_mask(v: Variant) -> None:
    if uses_score(v.mask):
        raise ValueError("mask: expected an expression of indices and inputs, got one that reads the score `s`")


def _weights(tensors: Mapping[str, np.ndarray], target: NormTarget, affine: bool, kind: NormKind):
    if not affine:
        return None, None
    w = tensors[norm_weight_name(target)]
    bias = tensors[norm_bias_name(target)] if kind == NormKind.LAYERNORM else None
    return w, bias


def _normalise(x: np.ndarray, kind: NormKind, eps: float, w, bias) -> np.ndarray:
    """Normalise over the last axis in float64, then the affine map."""
    if kind == NormKind.LAYERNORM:
        mu = x.mean(axis=-1, keepdims=True)
        var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
        y = (x - mu) / np.sqrt(var + eps)
    else:
        y = x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps)
    if w is not None:
        y = y * w
    if bias is not None:
        y = y + bias
    return y


def cu_seqlens_values(v: Variant, tensors: Mapping[str, np.ndarray], total_q: int, total_k: int) -> tuple[np.ndarray, np.ndarray]:
    """The cu_seqlens arrays of a varlen call (int64, for q and for k/v), checked as FlashAttention
    defines them: 0 first, never decreasing, the total last (ValueError naming the first break)."""
    out = []
    for name, total in zip(v.cu_seqlens_names, (total_q, total_k)):
        cu = np.asarray(tensors[name], dtype=np.int64).reshape(-1)
        if cu[0] != 0:
            raise ValueError(f"{name}: expected prefix sums starting at 0, got {name}[0] = {cu[0]}")
        drops = np.nonzero(np.diff(cu) < 0)[0]
        if drops.size:
            i = int(drops[0]) + 1
            raise ValueError(f"{name}: expected values that never decrease, but {name}[{i}] = {cu[i]} < {name}[{i - 1}] = {cu[i - 1]}")
        if cu[-1] != total:
            raise ValueError(f"{name}: expected the last value to be the total row count {total}, got {cu[-1]}")
        out.append(cu)
    return out[0], out[1]
