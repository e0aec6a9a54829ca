"""The reference of quantized attention: the numerics order of docs/QUANT.md, emulated in NumPy.

Every quantized value is computed as a kernel must compute it: the operand in fp32, multiplied by
r in fp32 (np.float32 arithmetic, round-to-nearest-even), saturated and rounded to the quantized
type (`quantize`). The products and the softmax around them are then float64 on those values, as
the full-precision reference is; only the rounding the spec declares happens.

    quantize(x, dtype)            the quantizer rq: saturate, round to nearest even
    operand(v, op, x4, ...)       one input's quantized values and scales, [B, heads, L, D] views
    attention(v, q, k, v_, ...)   (O, LSE) of a quantized variant (reference.attention calls it)
    store_inputs(v, arrays)       full-precision q/k/v made into what a quantized spec takes:
                                  stored types and calibrated scale inputs (workload, fuzz, explain)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from attngen.ir import abi
from attngen.ir.dtypes import DType, ml_dtype
from attngen.ir.nodes import (
    BLOCK_TABLE,
    CACHE_LENS,
    IndexVar,
    Layout,
    NormKind,
    NormScope,
    NormTarget,
    Quant,
    QuantOperand,
    ScaleGranularity,
    ScaleSource,
    Variant,
    quant_scale_name,
)

G = ScaleGranularity
F32 = np.float32


def quantize(x: np.ndarray, dtype: DType) -> np.ndarray:
    """rq(x) of docs/QUANT.md for an fp32 array: fp8 saturates to ±qmax then rounds to the nearest
    value (ties to even, subnormals kept); i8 rounds to the nearest integer (ties to even) then
    saturates to ±127. Returned as float32 (every quantized value is exact in it)."""
    x = np.asarray(x, dtype=F32)
    qmax = F32(dtype.info.qmax)
    if dtype == DType.I8:
        return np.clip(np.rint(x), -qmax, qmax).astype(F32)
    return np.clip(x, -qmax, qmax).astype(ml_dtype(dtype)).astype(F32)


def stored_values(x: np.ndarray, dtype: DType) -> np.ndarray:
    """An input stored in quantized `dtype`, as fp32 (an array of another type is first rounded to it)."""
    a = np.asarray(x)
    if a.dtype == np.dtype(ml_dtype(dtype)):
        return a.astype(F32)
    return quantize(a.astype(F32), dtype)


def scale_pair(a: np.ndarray, qmax: float) -> tuple[np.ndarray, np.ndarray]:
    """(s, r) of groups with amax `a`: s = fp32(a / qmax), r = fp32(qmax / a); 1 and 1 where a = 0."""
    a = np.asarray(a, dtype=F32)
    zero = ~(a > 0)
    safe = np.where(zero, F32(1), a)
    s = np.where(zero, F32(1), (safe / F32(qmax)).astype(F32))
    r = np.where(zero, F32(1), (F32(qmax) / safe).astype(F32))
    return s.astype(F32), r.astype(F32)


# --------------------------------------------------------------------------------------------
# Groups: an amax (or a given scale) per group, as the scale input's shape, and back


def group_amax(x4: np.ndarray, qn: Quant, G_: int = 1) -> np.ndarray:
    """max |x| per group of `qn`'s granularity, shaped like its scale input, from a dense
    [B, heads, L, D] operand (q has heads = H and maps to Hkv in groups of G_ for `per head`)."""
    ax = np.abs(np.asarray(x4, dtype=F32))
    B, nh, L, _ = ax.shape
    g = qn.granularity
    if g == G.TENSOR:
        return np.array([ax.max() if ax.size else 0], dtype=F32)
    if g == G.HEAD:
        return ax.reshape(B, nh // G_, G_ * L * ax.shape[3]).max(axis=-1) if ax.size else np.zeros((B, nh // G_), F32)
    if g == G.TOKEN:
        return ax.max(axis=-1)
    if g == G.BLOCK:
        n = qn.block or 1
        nb = -(-L // n)
        pad = np.zeros((B, nh, nb * n, ax.shape[3]), F32)
        pad[:, :, :L] = ax
        return pad.reshape(B, nh, nb, n * ax.shape[3]).max(axis=-1)
    if g == G.CHANNEL:
        return ax.max(axis=2)
    raise ValueError(f"{qn.operand.value}: no dense groups for per {g.value if g else 'static'}")


def broadcast(s: np.ndarray, qn: Quant, shape: tuple[int, ...], G_: int = 1, table: np.ndarray | None = None,
              page: int | None = None) -> np.ndarray:
    """A scale-input-shaped array `s` as an array broadcastable to the dense [B, heads, L, D]
    operand `shape` (q's `per head` scale repeated over its G_ query heads; per-page scales
    gathered through the block table)."""
    s = np.asarray(s, dtype=F32)
    B, nh, L, _ = shape
    g = qn.granularity
    if g == G.TENSOR:
        return s.reshape(1, 1, 1, 1)
    if g == G.HEAD:
        if s.ndim == 1:  # a paged cache's [Hkv]
            return s.reshape(1, -1, 1, 1)
        return np.repeat(s, G_, axis=1)[:, :, None, None]
    if g == G.TOKEN:
        return s[..., None]
    if g == G.BLOCK:
        return s[:, :, np.arange(L) // (qn.block or 1)][..., None]
    if g == G.CHANNEL:
        return s[:, :, None, :]
    if g == G.PAGE:
        assert table is not None and page is not None
        pages = table[:, np.arange(L) // page]  # [B, L]
        return s[pages].transpose(0, 2, 1)[..., None]  # [B, Hkv, L, 1]
    raise ValueError(f"{qn.operand.value}: no scale to broadcast for per {g.value if g else 'static'}")


@dataclass(frozen=True)
class Operand:
    """One quantized input: `values` the quantized values (fp32, dense [B, heads, L, D]), `scale`
    broadcastable to them; the operand's value in its product is values * scale."""

    values: np.ndarray
    scale: np.ndarray

    def dequantized(self) -> np.ndarray:
        return self.values.astype(np.float64) * self.scale.astype(np.float64)


def _norm_parts(v: Variant, x4: np.ndarray, target: NormTarget, tensors: Mapping[str, np.ndarray]):
    """(x̂ in fp32, γ, β) of a fused pre-norm over a dense [B, heads, L, D] operand (γ, β
    broadcastable; token scope normalises the whole H*D row)."""
    from attngen.check.reference_eval import _normalise, _weights

    nm = v.norm(target)
    assert nm is not None
    w, b = _weights(tensors, target, nm.affine, nm.kind)
    x = np.asarray(x4, dtype=np.float64)
    B, nh, L, D = x.shape
    if nm.scope == NormScope.TOKEN:
        flat = x.transpose(0, 2, 1, 3).reshape(B, L, nh * D)
        xh = _normalise(flat, nm.kind, nm.eps, None, None).reshape(B, L, nh, D).transpose(0, 2, 1, 3)
        shape = (1, nh, 1, D)
    else:
        xh = _normalise(x, nm.kind, nm.eps, None, None)
        shape = (1, 1, 1, D)
    gamma = np.ones(shape, F32) if w is None else np.asarray(w, F32).reshape(shape)
    beta = np.zeros(shape, F32) if (b is None or nm.kind != NormKind.LAYERNORM) else np.asarray(b, F32).reshape(shape)
    return xh.astype(F32), gamma, beta


def _fma32(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """fp32 fma(a, b, c): a·b is exact in float64, the sum rounds once there and once to fp32 (a
    double rounding that differs from fma's only within 2⁻⁵³ of an fp32 midpoint)."""
    return (a.astype(np.float64) * b.astype(np.float64) + c.astype(np.float64)).astype(F32)


def operand(v: Variant, qn: Quant, x4: np.ndarray, tensors: Mapping[str, np.ndarray], stored: DType | None,
            table: np.ndarray | None = None) -> Operand:
    """The quantized values and scales of input `qn.operand` from its dense [B, heads, L, D] view
    `x4` (as stored: quantized values if `stored`, else the full-precision input)."""
    G_ = v.group_size if qn.operand == QuantOperand.Q else 1
    qmax = qn.dtype.info.qmax
    if stored is not None:
        s = broadcast(tensors[quant_scale_name(qn.operand)], qn, x4.shape, G_, table, v.page_size)
        return Operand(stored_values(x4, stored), s)
    x = np.asarray(x4).astype(F32)
    if qn.source == ScaleSource.INPUT:
        s = broadcast(tensors[quant_scale_name(qn.operand)], qn, x4.shape, G_, table, v.page_size)
        r = (F32(1) / s).astype(F32)
        return Operand(quantize(x * r, qn.dtype), s)
    target = {QuantOperand.Q: NormTarget.Q, QuantOperand.K: NormTarget.K}.get(qn.operand)
    if target is not None and v.norm(target) is not None:
        xh, gamma, beta = _norm_parts(v, x, target, tensors)
        y = _fma32(xh, gamma, beta)
        s_g, r_g = scale_pair(group_amax(y, qn, G_), qmax)
        r = broadcast(r_g, qn, x4.shape, G_)
        return Operand(quantize(_fma32(xh, (gamma * r).astype(F32), (beta * r).astype(F32)), qn.dtype),
                       broadcast(s_g, qn, x4.shape, G_))
    if qn.smooth is not None:
        mean = (x.astype(np.float64).sum(axis=2, keepdims=True) / max(1, x.shape[2])).astype(F32)
        x = (x - mean).astype(F32)
    s_g, r_g = scale_pair(group_amax(x, qn, G_), qmax)
    return Operand(quantize(x * broadcast(r_g, qn, x4.shape, G_), qn.dtype), broadcast(s_g, qn, x4.shape, G_))


def quantize_p(v: Variant, p: np.ndarray) -> np.ndarray:
    """P's values in P·V (float64) when p is quantized: p̃ (exp(s − m), float64) in fp32, times
    r_p, quantized, times s_p; r_p = c for `static(c)`, qmax / (the row's max p̃) for `amax per token`."""
    qn = v.quant(QuantOperand.P)
    assert qn is not None
    p32 = p.astype(F32)
    if qn.source == ScaleSource.STATIC:
        r = np.full(p32.shape[:-1] + (1,), F32(qn.static), F32)
        s = np.full_like(r, F32(1) / F32(qn.static))
    else:
        s, r = scale_pair(p32.max(axis=-1, keepdims=True) if p32.shape[-1] else np.zeros(p32.shape[:-1] + (1,), F32),
                          qn.dtype.info.qmax)
    return quantize(p32 * r, qn.dtype).astype(np.float64) * s.astype(np.float64)


# --------------------------------------------------------------------------------------------
# Attention


def attention(v: Variant, q: np.ndarray, k: np.ndarray, v_: np.ndarray, inputs: Mapping[str, np.ndarray] | None = None,
              **positions: int) -> tuple[np.ndarray, np.ndarray]:
    """(O in the output type and the variant's layout, LSE float32 [B, H, Lq]) of a quantized
    variant, in the numerics order of docs/QUANT.md."""
    from attngen.check import reference_eval as E

    if v.layout == Layout.VARLEN:
        raise ValueError("quant: expected layout bhsd or bshd, got varlen (the front end refuses it)")
    pos = abi.Positions(positions.get("q_offset", 0), positions.get("kv_offset", 0), positions.get("Lq_total"),
                        positions.get("Lk_total"))
    sizes = E._bind(v, q, k, v_, inputs, pos)
    tensors = E.prepare_tensors(v, inputs)
    pos = pos.resolve(sizes.Lq, sizes.Lk)
    env_sizes = E._size_map(v, abi.Sizes(sizes.B, int(pos.Lq_total), int(pos.Lk_total), sizes.symbols))  # type: ignore[arg-type]
    B, Lq, Lk, H = sizes.B, sizes.Lq, sizes.Lk, v.heads
    qd, kd, vd = dense_operands(v, q, k, v_, tensors)
    out = np.zeros(abi.o_shape(v, B, Lq), dtype=E.dtype_of(v.dtype))
    o4 = E._as_bhsd(out, v.layout, H)
    lse = np.full((B, H, Lq), -np.inf, dtype=np.float32)
    sink = np.asarray(tensors[v.sink], dtype=np.float64).reshape(-1) if v.sink is not None else None
    q_in = E._as_bhsd(q, v.layout, H)
    with np.errstate(all="ignore"):
        for b in range(B):
            _row(v, b, qd, kd, vd, q_in, o4, lse, tensors, env_sizes, pos.q_offset, pos.kv_offset, sink)
    return out, lse


def dense_operands(v: Variant, q, k, v_, tensors: Mapping[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q', K', V' as float64 [B, heads, L, D]: what each product reads (dequantized values of the
    quantized operands; the full-precision reference's operands otherwise)."""
    from attngen.check import reference_eval as E

    H, Hkv = v.heads, v.kv_heads
    q4 = E._as_bhsd(q, v.layout, H)
    table = None
    if v.page_size is not None:
        table = np.asarray(tensors[BLOCK_TABLE], dtype=np.int64)
        k4, v4 = E._unpage(np.asarray(k), table), E._unpage(np.asarray(v_), table)
        lens = tensors[CACHE_LENS]
        if lens.size:
            abi.check_cache_lens(int(lens.min()), int(lens.max()), q4.shape[2], k4.shape[2])
        past = np.arange(k4.shape[2])[None, :] >= lens.reshape(-1, 1)
        k4 = np.where(past[:, None, :, None], np.zeros((), k4.dtype), k4)
        v4 = np.where(past[:, None, :, None], np.zeros((), v4.dtype), v4)
    else:
        k4, v4 = E._as_bhsd(k, v.layout, Hkv), E._as_bhsd(v_, v.layout, Hkv)
    stored = {QuantOperand.Q: v.q_dtype, QuantOperand.K: v.k_dtype, QuantOperand.V: v.v_dtype}
    out = []
    for op, x4 in ((QuantOperand.Q, q4), (QuantOperand.K, k4), (QuantOperand.V, v4)):
        qn = v.quant(op)
        st = stored[op] if stored[op].info.quant else None
        if qn is None:
            if op == QuantOperand.Q:
                out.append(_plain_queries(v, q4, tensors))
            elif op == QuantOperand.K and v.norm(NormTarget.K) is not None:
                nm = v.norm(NormTarget.K)
                w, bias = E._weights(tensors, NormTarget.K, nm.affine, nm.kind)  # type: ignore[union-attr]
                out.append(E.round_to(E._normalise(E.round_to(x4, v.dtype), nm.kind, nm.eps, w, bias), v.dtype))  # type: ignore[union-attr]
            else:
                out.append(E.round_to(x4, v.dtype))
            continue
        o = operand(v, qn, x4 if st is not None else E.round_to(x4, v.dtype), tensors, st, table).dequantized()
        partner = {QuantOperand.Q: QuantOperand.K, QuantOperand.K: QuantOperand.Q, QuantOperand.V: QuantOperand.P}[op]
        if v.quant(partner) is None:  # dequantized as read: rounded to the output's type like an unquantized operand
            o = E.round_to(o.astype(F32), v.dtype)
        out.append(o)
    return out[0], out[1], out[2]


def _plain_queries(v: Variant, q4: np.ndarray, tensors: Mapping[str, np.ndarray]) -> np.ndarray:
    """Q' of an unquantized q (as the full-precision reference: rounded, pre-normed, rounded again)."""
    from attngen.check import reference_eval as E

    x = E.round_to(q4, v.dtype)
    qn = v.norm(NormTarget.Q)
    if qn is None:
        return x
    w, bias = E._weights(tensors, NormTarget.Q, qn.affine, qn.kind)
    if qn.scope == NormScope.HEAD:
        return E.round_to(E._normalise(x, qn.kind, qn.eps, w, bias), v.dtype)
    B, H, L, D = x.shape  # token scope: the whole H*D row
    flat = x.transpose(0, 2, 1, 3).reshape(B, L, H * D)
    return E.round_to(E._normalise(flat, qn.kind, qn.eps, w, bias), v.dtype).reshape(B, L, H, D).transpose(0, 2, 1, 3)


def _row(v: Variant, b: int, qd, kd, vd, q_in, o4, lse, tensors, env_sizes, q_offset: int, kv_offset: int, sink) -> None:
    """Batch row b: per kv head and query chunk, scores, mask, softmax, (quantized) P·V."""
    from attngen.check import reference_eval as E

    Lq, Lk, G_ = qd.shape[2], kd.shape[2], v.group_size
    cq = max(1, min(Lq, E.CHUNK_BYTES // (8 * max(1, G_ * Lk))))
    on = v.norm(NormTarget.O)
    pq = v.quant(QuantOperand.P) is not None
    for hk in range(v.kv_heads):
        heads = np.arange(hk * G_, (hk + 1) * G_)
        for q0 in range(0, Lq, cq):
            q1 = min(Lq, q0 + cq)
            s = np.matmul(qd[b, heads, q0:q1], kd[b, hk].T) * v.effective_scale
            env = E.Env({IndexVar.B: b, IndexVar.H: heads[:, None, None],
                         IndexVar.Q: np.arange(q0 + q_offset, q1 + q_offset)[None, :, None],
                         IndexVar.KV: np.arange(kv_offset, kv_offset + Lk)[None, None, :]}, env_sizes, tensors)
            for sc in v.scores:
                s = np.broadcast_to(E.evaluate(sc, E.Env(env.index, env.sizes, env.tensors, s)), s.shape).astype(np.float64)
            vis = np.broadcast_to(E.evaluate(v.visibility(), env), s.shape)
            s = np.where(vis, s, -np.inf)
            m = s.max(axis=-1, keepdims=True) if Lk else np.full(s.shape[:-1] + (1,), -np.inf)
            if sink is not None:
                m = np.maximum(m, sink[heads][:, None, None])
            empty = ~(m > -np.inf)
            m = np.where(empty, 0.0, m)
            p = np.exp(s - m)
            l = p.sum(axis=-1, keepdims=True)
            if sink is not None:
                l = l + np.exp(sink[heads][:, None, None] - m)
            pv = quantize_p(v, p) if pq else p
            o = np.where(empty, 0.0, np.matmul(pv, vd[b, hk]) / np.where(empty, 1.0, l))
            row_lse = np.where(empty[..., 0], -np.inf, m[..., 0] + np.log(np.where(empty, 1.0, l))[..., 0])
            if on is not None:
                w, bias = E._weights(tensors, NormTarget.O, on.affine, on.kind)
                o = E._normalise(o, on.kind, on.eps, w, bias)
            if v.residual:
                o = o + E.round_to(q_in[b, heads, q0:q1], v.dtype)
            o4[b, heads, q0:q1] = o.astype(o4.dtype)
            lse[b, heads, q0:q1] = row_lse.astype(np.float32)


# --------------------------------------------------------------------------------------------
# Tolerance: what a kernel may differ by (docs/QUANT.md, "What a flash kernel does differently")


def p_bound(v: Variant, v_max: float, n_keys: int) -> float:
    """The absolute bound 2·max|V'|·(u_p + δ_p·n) on |O_kernel − O_ref| from quantizing p against
    a running instead of the final row max (0 when p is not quantized): each element of P is
    within u_p·p̃ + δ_p of the exact p̃ in either, and l ≥ 1."""
    qn = v.quant(QuantOperand.P)
    if qn is None:
        return 0.0
    d = qn.dtype
    r = qn.static if qn.static is not None else d.info.qmax
    half_step = {DType.FP8_E4M3: 2.0**-10, DType.FP8_E5M2: 2.0**-17, DType.I8: 0.5}[d]
    u = d.info.unit_roundoff if d.info.is_float else 0.0
    return 2.0 * v_max * (u + half_step / r * n_keys)


def score_error(v: Variant, qd: np.ndarray, kd: np.ndarray) -> float:
    """The score error a kernel may make against the reference: fp32 accumulation on the product's
    operands (`tolerance.score_error`), plus one quantization step of q or k where the quantizer's
    input is itself computed in fp32 (a norm's output, a smoothed k) and may round the other way."""
    from attngen.check import tolerance

    err = tolerance.score_error(qd, kd, v.effective_scale)
    for op, x, partner in ((QuantOperand.Q, qd, kd), (QuantOperand.K, kd, qd)):
        qn = v.quant(op)
        target = NormTarget.Q if op == QuantOperand.Q else NormTarget.K
        if qn is None or qn.source != ScaleSource.AMAX or not (qn.smooth or v.norm(target) is not None) or not x.size:
            continue
        xm, pm = float(np.abs(x).max()), float(np.abs(partner).max()) if partner.size else 0.0
        step = xm / qn.dtype.info.qmax if qn.dtype == DType.I8 else 2 * qn.dtype.info.unit_roundoff * xm
        err += abs(v.effective_scale) * step * pm
    return err if np.isfinite(err) else 0.0


def reports(v: Variant, arrays: Mapping[str, np.ndarray], out: np.ndarray, lse: np.ndarray | None,
            ref: tuple[np.ndarray, np.ndarray]) -> list:
    """Tolerance reports of a quantized variant's kernel output (and LSE) against the reference."""
    from attngen.check import reference_eval as E
    from attngen.check import tolerance

    rest = {n: a for n, a in arrays.items() if n not in ("q", "k", "v")}
    tensors = E.prepare_tensors(v, rest)
    with np.errstate(all="ignore"):
        qd, kd, vd = dense_operands(v, arrays["q"], arrays["k"], arrays["v"], tensors)
    se = score_error(v, qd, kd)
    o_ref, lse_ref = ref
    extra = p_bound(v, float(np.abs(vd).max()) if vd.size else 0.0, kd.shape[2])
    rf = np.asarray(o_ref, np.float64)
    norm = float(np.linalg.norm(rf[np.isfinite(rf)]))
    rel = extra * np.sqrt(rf.size) / norm if norm > 0 else 0.0
    reps = [tolerance.check(out, o_ref, v.dtype, "O", score_err=se, extra_abs=extra, extra_rel_l2=rel)]
    if v.lse and lse is not None:
        reps.append(tolerance.check_lse(lse, lse_ref, v.dtype, "LSE", score_err=se))
    return reps


# --------------------------------------------------------------------------------------------
# Inputs


def store_inputs(v: Variant, arrays: dict[str, np.ndarray]) -> None:
    """Make full-precision q/k/v (any float arrays, in the variant's layout) into the call a
    quantized spec takes, in place: each input stored quantized becomes its quantized values with
    calibrated scales (amax of its groups / qmax, as a calibration pass would), and every other
    `input` scale is calibrated on its operand the same way."""
    from attngen.check import reference_eval as E

    H, Hkv = v.heads, v.kv_heads
    for op, stored, heads in ((QuantOperand.Q, v.q_dtype, H), (QuantOperand.K, v.k_dtype, Hkv), (QuantOperand.V, v.v_dtype, Hkv)):
        qn = v.quant(op)
        if qn is None or qn.source != ScaleSource.INPUT:
            continue
        name = op.value
        x = np.asarray(arrays[name]).astype(F32)
        qmax = qn.dtype.info.qmax
        G_ = v.group_size if op == QuantOperand.Q else 1
        if v.page_size is not None and op != QuantOperand.Q:
            ax = np.abs(x)  # [num_pages, N, Hkv, D]
            if qn.granularity == G.PAGE:
                a, shape = ax.max(axis=(1, 3)), (x.shape[0], 1, Hkv, 1)
            elif qn.granularity == G.HEAD:
                a, shape = ax.max(axis=(0, 1, 3)), (1, 1, Hkv, 1)
            else:
                a, shape = np.array([ax.max()], F32), (1, 1, 1, 1)
            s, r = scale_pair(a, qmax)
            if stored.info.quant:
                arrays[name] = quantize(x * r.reshape(shape), stored).astype(ml_dtype(stored))
            arrays[quant_scale_name(op)] = s.astype(F32)
            continue
        x4 = E._as_bhsd(x, v.layout, heads)
        s, r = scale_pair(group_amax(x4, qn, G_), qmax)
        if stored.info.quant:
            q4 = quantize(x4 * broadcast(r, qn, x4.shape, G_), stored).astype(ml_dtype(stored))
            arrays[name] = np.ascontiguousarray(q4 if v.layout == Layout.BHSD else q4.transpose(0, 2, 1, 3)).reshape(x.shape)
        arrays[quant_scale_name(op)] = s.astype(F32)


__all__ = ["Operand", "attention", "broadcast", "dense_operands", "group_amax", "operand", "p_bound", "quantize", "quantize_p",
           "reports", "scale_pair", "score_error", "store_inputs", "stored_values"]
