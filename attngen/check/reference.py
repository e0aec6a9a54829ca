"""What a variant means, in NumPy: the oracle every backend is compared against.

Independent of any backend by construction: it reads only the IR (evaluating each `Builtin` by its
`body`) and the arrays. Arithmetic is float64 on inputs rounded to the spec dtype, so the only
rounding in the reference is the rounding the contract prescribes (inputs, normalised q/k, output).
Work proceeds per (batch, kv head, query chunk) so memory stays bounded for long sequences.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

import numpy as np

from attngen.ir import abi
from attngen.check import tolerance
from attngen.ir.abi import Sizes
from attngen.ir.nodes import (
    BLOCK_TABLE,
    CACHE_LENS,
    Index,
    IndexVar,
    Layout,
    NormScope,
    NormTarget,
    SizeSym,
    Variant,
    cache_lens_decl,
    fp32_literal,
    walk,
)
from attngen.check.reference_eval import (  # noqa: F401 (also read as reference.X)
    CHUNK_BYTES,
    Env,
    _as_bhsd,
    _bind,
    _check_mask,
    _normalise,
    _size_map,
    _unpage,
    _weights,
    cu_seqlens_values,
    dtype_of,
    evaluate,
    prepare_tensors,
    round_to,
)


def standard_alibi_slopes(heads: int) -> tuple[float, ...]:
    """ALiBi slopes as BLOOM computes them: a geometric sequence for a power-of-two head count,
    interleaved with the next power's odd terms otherwise."""
    if heads < 1:
        raise ValueError(f"alibi: expected heads >= 1, got {heads}")

    def pow2(n: int) -> list[float]:
        start = 2.0 ** (-(2.0 ** -(math.log2(n) - 3)))
        return [start ** (i + 1) for i in range(n)]

    p = 2 ** int(math.floor(math.log2(heads)))
    slopes = pow2(p)
    if p != heads:
        slopes += pow2(2 * p)[0::2][: heads - p]
    return tuple(slopes)


# --------------------------------------------------------------------------------------------
# Masks


def unpaged(v: Variant) -> Variant:
    """The same attention over the gathered (contiguous) cache [B, Hkv, max_pages * N, D]: the
    paged cache's length bound joins the mask, and cache_lens becomes a declared input (builtin
    bodies already read it). `v` itself when it is not paged."""
    if v.page_size is None:
        return v
    declared = any(d.name == CACHE_LENS for d in v.inputs)
    inputs = v.inputs if declared else (*v.inputs, cache_lens_decl())
    return dataclasses.replace(v, page_size=None, mask=v.visibility(), inputs=inputs)


def mask_matrix(
    v: Variant,
    sizes: Sizes,
    inputs: Mapping[str, np.ndarray] | None,
    b: int | None = None,
    h: int | None = None,
) -> np.ndarray:
    """The visibility matrix, bool [B, H, Lq, Lk]; with `b` and/or `h` given, those axes are
    dropped (e.g. [Lq, Lk] for both). Meant for tests and small sizes: it is built whole."""
    _check_mask(v)
    bs = range(sizes.B) if b is None else [b]
    hs = np.arange(v.heads) if h is None else np.array([h])
    env_sizes = _size_map(v, sizes)
    tensors = prepare_tensors(v, inputs)
    rows = []
    for bi in bs:
        env = Env(
            {
                IndexVar.B: bi,
                IndexVar.H: hs[:, None, None],
                IndexVar.Q: np.arange(sizes.Lq)[None, :, None],
                IndexVar.KV: np.arange(sizes.Lk)[None, None, :],
            },
            env_sizes,
            tensors,
        )
        m = np.broadcast_to(evaluate(v.visibility(), env), (len(hs), sizes.Lq, sizes.Lk))
        rows.append(np.asarray(m, dtype=bool))
    out = np.stack(rows)
    if h is not None:
        out = out[:, 0]
    if b is not None:
        out = out[0]
    return out


def count_visible(v: Variant, sizes: Sizes, inputs: Mapping[str, np.ndarray] | None) -> int:
    """How many (b, h, q, kv) are visible, counted in bounded chunks (for any size)."""
    _check_mask(v)
    env_sizes = _size_map(v, sizes)
    tensors = prepare_tensors(v, inputs)
    # Batch rows and heads the mask does not index look alike: count one and multiply (a causal
    # mask at 4096 heads costs what it costs at one).
    uses = {n.var for n in walk(v.visibility()) if isinstance(n, Index)}
    nb = sizes.B if IndexVar.B in uses else 1
    nh = v.heads if IndexVar.H in uses else 1
    cq = max(1, min(sizes.Lq, CHUNK_BYTES // max(1, nh * sizes.Lk * 8)))
    hs = np.arange(nh)[:, None, None]
    total = 0
    for b in range(nb):
        for q0 in range(0, sizes.Lq, cq):
            q1 = min(sizes.Lq, q0 + cq)
            env = Env(
                {
                    IndexVar.B: b,
                    IndexVar.H: hs,
                    IndexVar.Q: np.arange(q0, q1)[None, :, None],
                    IndexVar.KV: np.arange(sizes.Lk)[None, None, :],
                },
                env_sizes,
                tensors,
            )
            m = np.broadcast_to(evaluate(v.visibility(), env), (nh, q1 - q0, sizes.Lk))
            total += int(np.count_nonzero(m))
    return total * (sizes.B // nb) * (v.heads // nh)


# --------------------------------------------------------------------------------------------
# Attention


def attention(
    v: Variant,
    q: np.ndarray,
    k: np.ndarray,
    v_: np.ndarray,
    inputs: Mapping[str, np.ndarray] | None = None,
    *,
    q_offset: int = 0,
    kv_offset: int = 0,
    Lq_total: int | None = None,
    Lk_total: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Compute (O, LSE): O in the spec dtype and the variant's layout (4-D, also when q is passed
    as a flat hidden state), LSE float32 [B, H, Lq] (-inf for rows with nothing visible).

    With offsets or totals, q, k and v are a shard of a longer sequence (`abi.Positions`): the
    mask and the scores see global positions and lengths, and runtime inputs sized Lq or Lk hold
    the whole sequence. The result is then the shard's rows of attention over the shard's keys.

    `layout varlen`: O [total_q, H, Dv] and LSE [H, total_q], each sequence computed on its own
    (`attention_varlen`)."""
    _check_mask(v)
    if v.quantized:  # the numerics order of docs/QUANT.md
        from attngen.check import quant

        return quant.attention(v, q, k, v_, inputs, q_offset=q_offset, kv_offset=kv_offset, Lq_total=Lq_total, Lk_total=Lk_total)  # type: ignore[arg-type]
    if v.layout == Layout.VARLEN:
        return attention_varlen(v, q, k, v_, inputs, positions=abi.Positions(q_offset, kv_offset, Lq_total, Lk_total))
    pos_given = abi.Positions(q_offset, kv_offset, Lq_total, Lk_total)
    sizes = _bind(v, q, k, v_, inputs, pos_given)
    pos = pos_given.resolve(sizes.Lq, sizes.Lk)
    tensors = prepare_tensors(v, inputs)
    env_sizes = _size_map(v, abi.Sizes(sizes.B, int(pos.Lq_total), int(pos.Lk_total), sizes.symbols))  # type: ignore[arg-type]
    B, Lq, Lk = sizes.B, sizes.Lq, sizes.Lk
    H, Hkv, G = v.heads, v.kv_heads, v.group_size
    D, Dv = v.head_dim, v.value_head_dim

    q4 = _as_bhsd(q, v.layout, H)
    if v.page_size is not None:
        lens = tensors[CACHE_LENS]
        if lens.size:
            abi.check_cache_lens(int(lens.min()), int(lens.max()), Lq, Lk)
        k4, v4 = _unpage(k, tensors[BLOCK_TABLE]), _unpage(v_, tensors[BLOCK_TABLE])
        # Slots past a row's length are never read (the kernels zero-fill them): stale contents,
        # NaN included, must not reach P @ V through a zero weight.
        past = np.arange(Lk)[None, :] >= lens.reshape(-1, 1)  # [B, Lk]
        k4 = np.where(past[:, None, :, None], np.zeros((), k4.dtype), k4)
        v4 = np.where(past[:, None, :, None], np.zeros((), v4.dtype), v4)
    else:
        k4 = _as_bhsd(k, v.layout, Hkv)
        v4 = _as_bhsd(v_, v.layout, Hkv)
    out = np.zeros(abi.o_shape(v, B, Lq), dtype=dtype_of(v.dtype))
    o4 = _as_bhsd(out, v.layout, H)
    lse = np.full((B, H, Lq), -np.inf, dtype=np.float32)

    kn, on = v.norm(NormTarget.K), v.norm(NormTarget.O)
    if kn is not None and kn.scope == NormScope.TOKEN:
        raise ValueError("norm k: expected scope head, got scope token (token scope is for q only)")
    if on is not None and on.scope == NormScope.TOKEN:
        raise ValueError("norm o: expected scope head, got scope token")
    if v.residual and D != Dv:
        raise ValueError(f"residual: expected Dv == D, got D={D}, Dv={Dv}")

    sink = np.asarray(tensors[v.sink], dtype=np.float64).reshape(-1) if v.sink is not None else None
    with np.errstate(all="ignore"):
        for b in range(B):
            _attend_row(v, b, b, q4, k4, v4, o4, lse, tensors, env_sizes, pos.q_offset, pos.kv_offset, sink)
    return out, lse


def attention_varlen(v: Variant, q: np.ndarray, k: np.ndarray, v_: np.ndarray, inputs: Mapping[str, np.ndarray] | None = None,
                     *, positions: abi.Positions | None = None) -> tuple[np.ndarray, np.ndarray]:
    """`layout varlen`: q [total_q, H, D], k [total_k, Hkv, D], v [total_k, Hkv, Dv] split into B
    sequences by the cu_seqlens inputs; each sequence is attention on its own (positions from 0,
    its own Lq and Lk, batch index b its place in the batch). Returns O [total_q, H, Dv] in the spec
    dtype and LSE float32 [H, total_q]."""
    sizes = _bind(v, q, k, v_, inputs, positions)
    tensors = prepare_tensors(v, inputs)
    cu_q, cu_k = cu_seqlens_values(v, tensors, sizes.Lq, sizes.Lk)
    q, k, v_ = np.asarray(q), np.asarray(k), np.asarray(v_)
    out = np.zeros(abi.o_shape(v, sizes.B, sizes.Lq), dtype=dtype_of(v.dtype))
    lse = np.full(abi.lse_shape(v, sizes.B, sizes.Lq), -np.inf, dtype=np.float32)
    sink = np.asarray(tensors[v.sink], dtype=np.float64).reshape(-1) if v.sink is not None else None

    def one(x: np.ndarray, a: int, e: int) -> np.ndarray:
        return x[a:e].transpose(1, 0, 2)[None]  # [1, heads, L, D] view of rows a..e-1

    with np.errstate(all="ignore"):
        for b in range(sizes.B):
            q0, q1, k0, k1 = int(cu_q[b]), int(cu_q[b + 1]), int(cu_k[b]), int(cu_k[b + 1])
            if q1 == q0:
                continue
            o4 = np.zeros((1, v.heads, q1 - q0, v.value_head_dim), dtype=out.dtype)
            l3 = np.full((1, v.heads, q1 - q0), -np.inf, dtype=np.float32)
            env_sizes = _size_map(v, abi.Sizes(sizes.B, q1 - q0, k1 - k0, sizes.symbols))
            _attend_row(v, 0, b, one(q, q0, q1), one(k, k0, k1), one(v_, k0, k1), o4, l3, tensors, env_sizes, 0, 0, sink)
            out[q0:q1] = o4[0].transpose(1, 0, 2)
            lse[:, q0:q1] = l3[0]
    return out, lse

def _attend_row(v: Variant, b: int, b_index: int, q4: np.ndarray, k4: np.ndarray, v4: np.ndarray, o4: np.ndarray,
                lse: np.ndarray, tensors: Mapping[str, np.ndarray], env_sizes: Mapping[SizeSym, int], q_offset: int,
                kv_offset: int, sink: np.ndarray | None) -> None:
    """One batch row b of q4/k4/v4 ([B, heads, L, D] views) into o4 and lse ([B, H, Lq]); masks and
    scores see the batch index `b_index` (a varlen sequence's index, run as a batch of one)."""
    Lq, Lk = q4.shape[2], k4.shape[2]
    H, Hkv, G = v.heads, v.kv_heads, v.group_size
    D, Dv = v.head_dim, v.value_head_dim
    kn, on = v.norm(NormTarget.K), v.norm(NormTarget.O)
    # Query rows per step: bounded by the score block (G x cq x Lk) and the token-norm row block.
    cq = max(1, min(Lq, CHUNK_BYTES // (8 * max(G * Lk, H * D, G * max(D, Dv)))))
    scale = v.effective_scale
    for hk in range(Hkv):
        heads = np.arange(hk * G, (hk + 1) * G)
        kk = round_to(k4[b, hk], v.dtype)  # [Lk, D]
        if kn is not None:
            w, bias = _weights(tensors, NormTarget.K, kn.affine, kn.kind)
            kk = round_to(_normalise(kk, kn.kind, kn.eps, w, bias), v.dtype)
        vv = round_to(v4[b, hk], v.dtype)  # [Lk, Dv]
        for q0 in range(0, Lq, cq):
            q1 = min(Lq, q0 + cq)
            qq = _queries(v, q4, tensors, b, heads, q0, q1)  # [G, cq, D]
            s = np.matmul(qq, kk.T) * scale  # [G, cq, Lk]
            env = Env(
                {
                    IndexVar.B: b_index,
                    IndexVar.H: heads[:, None, None],
                    IndexVar.Q: np.arange(q0 + q_offset, q1 + q_offset)[None, :, None],
                    IndexVar.KV: np.arange(kv_offset, kv_offset + Lk)[None, None, :],
                },
                env_sizes,
                tensors,
            )
            for sc in v.scores:
                s = np.broadcast_to(
                    evaluate(sc, Env(env.index, env.sizes, env.tensors, s)), s.shape
                ).astype(np.float64)
            vis = np.broadcast_to(evaluate(v.visibility(), env), s.shape)
            # A score of -inf on a visible key counts as invisible, so a row whose visible
            # scores are all -inf is empty (O = 0, LSE = -inf) rather than 0/0 = NaN.
            s = np.where(vis, s, -np.inf)
            m = s.max(axis=-1, keepdims=True) if Lk else np.full(s.shape[:-1] + (1,), -np.inf)
            if sink is not None:
                # exp(sink[h]) joins the denominator: the max runs over it too, and a row
                # with nothing visible has O = 0 and LSE = sink[h].
                m = np.maximum(m, sink[heads][:, None, None])
            empty = ~(m > -np.inf)
            m = np.where(empty, 0.0, m)
            p = np.exp(s - m)
            l = p.sum(axis=-1, keepdims=True)
            if sink is not None:
                l = l + np.exp(sink[heads][:, None, None] - m)
            o = np.matmul(p, vv) / np.where(empty, 1.0, l)
            o = np.where(empty, 0.0, o)
            row_lse = np.where(empty[..., 0], -np.inf, m[..., 0] + np.log(np.where(empty, 1.0, l))[..., 0])
            if on is not None:
                w, bias = _weights(tensors, NormTarget.O, on.affine, on.kind)
                o = _normalise(o, on.kind, on.eps, w, bias)
            if v.residual:
                o = o + round_to(q4[b, heads, q0:q1], v.dtype)
            o4[b, heads, q0:q1] = o.astype(o4.dtype)
            lse[b, heads, q0:q1] = row_lse.astype(np.float32)


def score_error(v: Variant, q: np.ndarray, k: np.ndarray, inputs: Mapping[str, np.ndarray] | None = None) -> float:
    """The tolerance's score error estimate (`tolerance.score_error`) for a variant's inputs.

    With a pre-norm on q or k the kernel computes the normalised operand in fp32 and the reference
    in float64; both round it to the spec dtype, and an element whose exact value lies within fp32
    error of a rounding midpoint rounds one ulp apart. One such flip moves a score by up to
    |scale| * max|q'| * max|k'| * ulp (2^-7 relative for bf16, 2^-10 for fp16), which is added per
    normalised operand. The fp32 accumulation part uses the normalised operands' magnitudes."""
    qn, kn = v.norm(NormTarget.Q), v.norm(NormTarget.K)
    scale = v.effective_scale
    if qn is None and kn is None:
        return tolerance.score_error(q, k, scale)
    tensors = prepare_tensors(v, inputs)
    H, Hkv = v.heads, v.kv_heads
    q4 = _as_bhsd(q, v.layout, H)
    k4 = _as_bhsd(k, v.layout, Hkv)
    with np.errstate(all="ignore"):
        if qn is not None:
            qq = np.concatenate([_queries(v, q4, tensors, b, np.arange(H), 0, q4.shape[2]) for b in range(q4.shape[0])])
        else:
            qq = round_to(q4, v.dtype)
        kk = round_to(k4, v.dtype)
        if kn is not None:
            w, bias = _weights(tensors, NormTarget.K, kn.affine, kn.kind)
            kk = round_to(_normalise(kk, kn.kind, kn.eps, w, bias), v.dtype)
    err = tolerance.score_error(qq, kk, scale)
    ulp = 2 * v.dtype.info.rounding_beyond_fp32
    if ulp and qq.size and kk.size:
        flips = (qn is not None) + (kn is not None)
        err += flips * abs(scale) * float(np.abs(qq).max()) * float(np.abs(kk).max()) * ulp
    return err if np.isfinite(err) else 0.0


def _queries(v: Variant, q4: np.ndarray, tensors, b: int, heads: np.ndarray, q0: int, q1: int) -> np.ndarray:
    """Q' for heads × rows [q0, q1) of batch b: rounded input, pre-normed and rounded again."""
    qn = v.norm(NormTarget.Q)
    if qn is None:
        return round_to(q4[b, heads, q0:q1], v.dtype)
    w, bias = _weights(tensors, NormTarget.Q, qn.affine, qn.kind)
    if qn.scope == NormScope.HEAD:
        return round_to(_normalise(round_to(q4[b, heads, q0:q1], v.dtype), qn.kind, qn.eps, w, bias), v.dtype)
    # Token scope: statistics over the whole H*D row, then take these heads' slices.
    rows = round_to(q4[b, :, q0:q1], v.dtype).transpose(1, 0, 2)  # [cq, H, D]
    flat = rows.reshape(rows.shape[0], -1)
    y = round_to(_normalise(flat, qn.kind, qn.eps, w, bias), v.dtype)
    y = y.reshape(rows.shape).transpose(1, 0, 2)  # [H, cq, D]
    return y[heads]


def attention_backward(v: Variant, q, k, v_, inputs, dO, *, wrt=()) -> dict[str, np.ndarray]:
    """Gradients of sum(dO * O) (dq, dk, dv and the inputs named in `wrt`): see
    `attngen.check.reference_bwd`, where the backward oracle lives."""
    from attngen.check.reference_bwd import attention_backward as backward

    return backward(v, q, k, v_, inputs, dO, wrt=wrt)


__all__ = [
    "attention_backward",
    "score_error",
    "Env",
    "attention",
    "count_visible",
    "dtype_of",
    "evaluate",
    "fp32_literal",
    "mask_matrix",
    "prepare_tensors",
    "round_to",
    "standard_alibi_slopes",
]
