"""Valid random inputs for a variant: q, k, v and every runtime input with meaningful contents.

"Valid" follows what each input is for, read off the IR: padding lengths lie in [0, L] and include
the edge cases 0 and L, a paged cache's lengths lie in [Lq, capacity] and include both, document
ids are sorted with few documents, block-sparse masks are about half full, norm weights sit near
1, ALiBi slopes are positive. GPU tests, the fuzzer and the benchmarks all draw from here so that
they agree on what a sensible call looks like.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from attngen.ir import abi
from attngen.ir.abi import Sizes
from attngen.ir.nodes import (
    BLOCK_TABLE,
    BLOCK_TABLE_PAGES,
    CACHE_LENS,
    CU_SEQLENS_DIM,
    PADDING_KV_LENS,
    PADDING_Q_LENS,
    BuiltinName,
    Builtin,
    DType,
    Expr,
    Layout,
    NormTarget,
    TensorDecl,
    Variant,
    norm_bias_name,
    norm_weight_name,
    walk,
)
from attngen.check.reference import dtype_of
from attngen.lang.builtins import BUILTINS, block_sizes, sorted_ids

DISTS = ("normal", "large", "uniform")
DEFAULT_FREE_DIM = 16


def _role_of_tensors(v: Variant) -> dict[str, tuple[BuiltinName, tuple[Expr, ...]]]:
    """Which builtin (if any) each runtime tensor feeds, with that builtin's arguments."""
    roles: dict[str, tuple[BuiltinName, tuple[Expr, ...]]] = {}
    for e in (v.mask, *v.scores):
        for node in walk(e):
            if isinstance(node, Builtin):
                for r in BUILTINS[node.name].tensors_read(node.args):
                    roles.setdefault(r, (node.name, node.args))
    return roles


def default_symbols(v: Variant, Lq: int, Lk: int) -> dict[str, int]:
    """Values for the free dims of declared inputs: block counts for block-sparse masks (so every
    query and key block has an entry), a small constant otherwise."""
    roles = _role_of_tensors(v)
    out: dict[str, int] = {}
    for d in v.inputs:
        role = roles.get(d.name)
        for i, dim in enumerate(d.shape):
            if not isinstance(dim, str) or dim in out:
                continue
            if role is not None and role[0] == BuiltinName.BLOCK_SPARSE and i >= len(d.shape) - 2:
                bq, bk = block_sizes(role[1])
                out[dim] = math.ceil(Lq / bq) if i == len(d.shape) - 2 else math.ceil(Lk / bk)
            else:
                out[dim] = DEFAULT_FREE_DIM
    return out


def _lengths(rng: np.random.Generator, B: int, L: int) -> np.ndarray:
    """Lengths in [0, L], with a full one and (for B >= 3) an empty one among them."""
    x = rng.integers(0, L + 1, size=B)
    if B >= 2:
        x[0] = L
        x[-1] = 0 if B >= 3 else x[-1]
    else:
        x[0] = L if rng.random() < 0.5 else x[0]
    return x.astype(np.int32)


def cache_lengths(rng: np.random.Generator, B: int, Lq: int, capacity: int) -> np.ndarray:
    """A paged cache's lengths (i32[B]) in [Lq, capacity], each row's Lq new tokens included: a
    full row and (for B >= 3) a row of only the new tokens among them."""
    x = rng.integers(Lq, capacity + 1, size=B)
    if B >= 2:
        x[0] = capacity
        x[-1] = Lq if B >= 3 else x[-1]
    return x.astype(np.int32)


def _cast(x: np.ndarray, d: DType) -> np.ndarray:
    return np.asarray(x).astype(dtype_of(d))


def _fill(v: Variant, decl: TensorDecl, shape: tuple[int, ...], role, rng: np.random.Generator, L: dict) -> np.ndarray:
    name, d = decl.name, decl.dtype
    builtin = BUILTINS[role[0]] if role else None
    if name in (PADDING_Q_LENS, PADDING_KV_LENS):
        return _cast(_lengths(rng, shape[0], L["q" if name == PADDING_Q_LENS else "kv"]), d)
    for t in NormTarget:
        if name == norm_weight_name(t):
            return _cast(1.0 + 0.1 * rng.standard_normal(shape), d)
        if name == norm_bias_name(t):
            return _cast(0.1 * rng.standard_normal(shape), d)
    # The builtin's own filler (attngen.lang.builtins); a `sorted` integer input gets sorted ids
    # unless the builtin's contents say otherwise.
    if builtin is not None and builtin.fill is not None and (builtin.fill_over_sorted or not (decl.sorted and not d.is_float)):
        return _cast(builtin.fill(rng, shape, L), d)
    if decl.sorted and not d.is_float:
        return _cast(sorted_ids(rng, shape, L), d)
    if d.is_float:
        x = rng.standard_normal(shape)
        if decl.sorted:
            x = np.sort(x, axis=-1)
        return _cast(x, d)
    lo, hi = (0, 4) if d == DType.U8 else (-4, 8)
    x = rng.integers(lo, hi + 1, size=shape)
    return _cast(np.sort(x, axis=-1) if decl.sorted else x, d)


def _qkv(rng: np.random.Generator, shape: tuple[int, ...], dist: str, dtype: DType) -> np.ndarray:
    if dist == "normal":
        x = rng.standard_normal(shape)
    elif dist == "uniform":
        x = rng.uniform(-1.0, 1.0, size=shape)
    else:
        # Large enough that exp of a raw score overflows, small enough for the type's range.
        m = dtype.info.large_magnitude
        x = rng.uniform(-m, m, size=shape)
    if not np.any(x):
        x = x + 1.0  # an all-zero draw would make every test trivial
    return _cast(x, dtype)


def make_inputs(
    v: Variant,
    B: int,
    Lq: int,
    Lk: int,
    rng: np.random.Generator,
    dist: str = "normal",
    symbols: Mapping[str, int] | None = None,
) -> dict[str, np.ndarray]:
    """Random q, k, v (spec dtype, variant layout) and valid contents for every runtime input."""
    if dist not in DISTS:
        raise ValueError(f"dist: expected one of {', '.join(DISTS)}, got {dist!r}")
    if B < 1 or Lq < 1 or Lk < 1:
        raise ValueError(f"sizes: expected B, Lq, Lk >= 1, got B={B}, Lq={Lq}, Lk={Lk}")
    if v.kind.value == "self" and Lq != Lk:
        raise ValueError(f"sizes: expected Lq == Lk for self attention, got Lq={Lq}, Lk={Lk}")
    syms = default_symbols(v, Lq, Lk)
    syms.update(symbols or {})
    num_pages = None
    if v.page_size is not None:
        # Paged K/V: Lk rounds up to whole pages (at least the Lq new tokens: they are the last Lq
        # of a row's cache); the pages of all rows, plus a few spare ones no row uses, are
        # shuffled so that no row's pages are adjacent or in order.
        pages = -(-max(Lk, Lq) // v.page_size)
        Lk = pages * v.page_size
        syms[BLOCK_TABLE_PAGES] = pages
        num_pages = B * pages + 3
    if v.layout == Layout.VARLEN:
        syms[CU_SEQLENS_DIM] = B + 1
    sizes = Sizes(B, Lq, Lk, tuple(sorted(syms.items())))
    out = {
        "q": _qkv(rng, abi.q_shape(v, B, Lq), dist, v.dtype),
        "k": _qkv(rng, abi.kv_shape(v, B, Lk, value=False, num_pages=num_pages), dist, v.dtype),
        "v": _qkv(rng, abi.kv_shape(v, B, Lk, value=True, num_pages=num_pages), dist, v.dtype),
    }
    if num_pages is not None:
        out[BLOCK_TABLE] = rng.permutation(num_pages)[: B * syms[BLOCK_TABLE_PAGES]].reshape(B, -1).astype(np.int32)
        out[CACHE_LENS] = cache_lengths(rng, B, Lq, Lk)
    if v.quantized:  # stored types and calibrated scale inputs (attngen.check.quant)
        from attngen.check import quant

        quant.store_inputs(v, out)
    roles = _role_of_tensors(v)
    lengths = {"q": Lq, "kv": Lk}
    for decl in v.runtime_inputs():
        if decl.name in out:
            continue
        shape = abi.input_shape(v, decl, sizes)
        out[decl.name] = _fill(v, decl, shape, roles.get(decl.name), rng, lengths)
    if v.layout == Layout.VARLEN:
        # B sequences: a random split of each total (empty sequences included), q's and k/v's
        # drawn apart for kind cross.
        cu_q, cu_k = v.cu_seqlens_names
        out[cu_q] = varlen_split(rng, Lq, B)
        out[cu_k] = out[cu_q] if cu_k == cu_q else varlen_split(rng, Lk, B)
    return out


def varlen_split(rng: np.random.Generator, total: int, B: int) -> np.ndarray:
    """cu_seqlens (i32[B+1]: 0, the running sums, total) of a random split of `total` rows into B
    sequences, some possibly empty."""
    cuts = np.sort(rng.integers(0, total + 1, B - 1))
    return np.concatenate([[0], cuts, [total]]).astype(np.int32)


def cu_seqlens_of(lengths: Sequence[int]) -> np.ndarray:
    """cu_seqlens (i32[B+1]) of the given sequence lengths."""
    return np.concatenate([[0], np.cumsum(np.asarray(lengths, dtype=np.int64))]).astype(np.int32)
