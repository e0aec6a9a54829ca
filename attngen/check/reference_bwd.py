"""What a variant's backward means, in NumPy: the oracle the backward kernels are compared against.

Float64 throughout, on the same rounded inputs as `reference.attention`; rounding steps of the
forward (the inputs, the normalised q/k) pass gradients straight through, as autograd of the same
composition in float64 does. Per (batch, kv head, query chunk):

    P      = exp(s - LSE) on visible keys (s the final score), 0 elsewhere
    dO'    = the gradient at the attention output, after the o post-norm's backward (if any)
    D      = rowsum(dO' * O')                              O' = the attention output before the norm
    dS     = P * (dO' V^T - D) * d(score)/ds0              the derivative from attngen.analysis.derivative
    dQ'    = scale * dS K'          dK' += scale * dS^T Q'   dV += P^T dO'   (summed over each group)

then the pre-norms' backward gives dq and dk (and dgamma/dbeta), the residual adds dO to dq, and
learnable inputs read by the scores receive dS * d(score)/d(element) scattered at the indices read.
Rows with nothing visible have P = 0 and so contribute zero gradients, never NaN. `layout varlen`:
each packed sequence on its own (positions from 0, its own lengths), as the forward reference runs it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np

from attngen.ir import abi
from attngen.analysis import derivative
from attngen.ir.nodes import (
    IndexVar,
    Layout,
    NormKind,
    NormScope,
    NormTarget,
    Variant,
    norm_bias_name,
    norm_weight_name,
)
from attngen.check.reference_eval import (
    CHUNK_BYTES,
    Env,
    _as_bhsd,
    _bind,
    _check_mask,
    _size_map,
    _weights,
    evaluate,
    cu_seqlens_values,
    prepare_tensors,
    round_to,
)


def learnable_inputs(v: Variant) -> tuple[str, ...]:
    """Runtime inputs that can receive a gradient, in ABI order: float tensors read by the scores
    (bias, alibi slopes, rel_bias tables, custom lookups) and the affine weights of the norms."""
    names = set(derivative.learnable_tensors(v.scores))
    for n in v.norms:
        if n.affine:
            names.add(norm_weight_name(n.target))
            if n.kind == NormKind.LAYERNORM:
                names.add(norm_bias_name(n.target))
    if v.sink is not None:
        names.add(v.sink)
    return tuple(d.name for d in v.runtime_inputs() if d.name in names)


# --------------------------------------------------------------------------------------------
# Norms, forward with saved statistics and backward


def _norm_fwd(x: np.ndarray, kind: NormKind, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """(xhat, rstd) over the last axis: xhat = (x - mean) * rstd (layernorm) or x * rstd (rms)."""
    if kind == NormKind.LAYERNORM:
        xc = x - x.mean(axis=-1, keepdims=True)
        rstd = 1.0 / np.sqrt((xc * xc).mean(axis=-1, keepdims=True) + eps)
        return xc * rstd, rstd
    rstd = 1.0 / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps)
    return x * rstd, rstd


def _affine(xhat: np.ndarray, w, bias) -> np.ndarray:
    y = xhat if w is None else xhat * w
    return y if bias is None else y + bias


def _norm_bwd(dy: np.ndarray, xhat: np.ndarray, rstd: np.ndarray, kind: NormKind, w) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(dx, dw, dbias) of y = affine(norm(x)) over the last axis; dw, dbias summed over the rest."""
    red = tuple(range(dy.ndim - 1))
    dw = (dy * xhat).sum(axis=red)
    db = dy.sum(axis=red)
    g = dy if w is None else dy * w
    proj = (g * xhat).mean(axis=-1, keepdims=True)
    if kind == NormKind.LAYERNORM:
        dx = rstd * (g - g.mean(axis=-1, keepdims=True) - xhat * proj)
    else:
        dx = rstd * (g - xhat * proj)
    return dx, dw, db


# --------------------------------------------------------------------------------------------
# The backward


def attention_backward(
    v: Variant,
    q: np.ndarray,
    k: np.ndarray,
    v_: np.ndarray,
    inputs: Mapping[str, np.ndarray] | None,
    dO: np.ndarray,
    *,
    wrt: Iterable[str] = (),
) -> dict[str, np.ndarray]:
    """Gradients of sum(dO * O) for O = `reference.attention(...)[0]`: a dict with "dq", "dk", "dv"
    (float64, the shapes of q, k, v as passed) and, for each name in `wrt` (see
    `learnable_inputs`), the gradient of that runtime input (float64, its shape)."""
    if v.quantized:  # rounding has no useful derivative; a full-precision gradient would be another spec's
        raise ValueError(f"variant {v.name}: quantized attention has no backward (docs/QUANT.md); differentiate the "
                         "spec without its `quant` statements")
    if v.page_size is not None:
        raise ValueError(f"variant {v.name}: `kv_cache paged` is inference state; the backward pass takes contiguous K/V")
    _check_mask(v)
    sizes = _bind(v, q, k, v_, inputs)
    wanted = tuple(wrt)
    allowed = learnable_inputs(v)
    for name in wanted:
        if name not in allowed:
            raise ValueError(f"wrt: expected one of the learnable inputs ({', '.join(allowed) or 'none'}), got {name!r}")
    o_shape = abi.o_shape(v, sizes.B, sizes.Lq)
    if tuple(np.shape(dO)) != tuple(o_shape):
        raise ValueError(f"dO: expected shape {tuple(o_shape)} (the output's), got {tuple(np.shape(dO))}")
    if v.residual and v.head_dim != v.value_head_dim:
        raise ValueError(f"residual: expected Dv == D, got D={v.head_dim}, Dv={v.value_head_dim}")
    tensors = prepare_tensors(v, inputs)
    env_sizes = _size_map(v, sizes)
    B, Lq, Lk = sizes.B, sizes.Lq, sizes.Lk
    H, Hkv = v.heads, v.kv_heads

    def view4(x: np.ndarray, heads: int) -> np.ndarray:
        if v.layout == Layout.VARLEN:  # packed [total, heads, D]: one batch row of all the sequences
            return np.asarray(x)[None].transpose(0, 2, 1, 3)
        return _as_bhsd(x, v.layout, heads)

    q4, k4, v4 = view4(q, H), view4(k, Hkv), view4(v_, Hkv)
    do4 = view4(np.asarray(dO, dtype=np.float64), H)

    dq = np.zeros(np.shape(q), dtype=np.float64)
    dk = np.zeros(np.shape(k), dtype=np.float64)
    dv = np.zeros(np.shape(v_), dtype=np.float64)
    dq4, dk4, dv4 = view4(dq, H), view4(dk, Hkv), view4(dv, Hkv)
    grads = {n: np.zeros(tensors[n].shape, dtype=np.float64) for n in wanted}

    kn, on = v.norm(NormTarget.K), v.norm(NormTarget.O)
    if kn is not None and kn.scope == NormScope.TOKEN:
        raise ValueError("norm k: expected scope head, got scope token (token scope is for q only)")
    if on is not None and on.scope == NormScope.TOKEN:
        raise ValueError("norm o: expected scope head, got scope token")

    with np.errstate(all="ignore"):
        if v.layout == Layout.VARLEN:
            # Each sequence on its own (positions from 0, its own lengths, batch index b), as
            # `reference.attention_varlen` computes the forward.
            cu_q, cu_k = cu_seqlens_values(v, tensors, Lq, Lk)
            for b in range(B):
                q0, q1, k0, k1 = int(cu_q[b]), int(cu_q[b + 1]), int(cu_k[b]), int(cu_k[b + 1])
                if q1 == q0:
                    continue
                if k1 == k0:  # no keys: every row sees nothing; only the residual's path remains
                    if v.residual:
                        dq4[:, :, q0:q1] += do4[:, :, q0:q1]
                    continue
                seq_sizes = _size_map(v, abi.Sizes(B, q1 - q0, k1 - k0, sizes.symbols))
                _backward_row(v, 0, b, q4[:, :, q0:q1], k4[:, :, k0:k1], v4[:, :, k0:k1], do4[:, :, q0:q1],
                              dq4[:, :, q0:q1], dk4[:, :, k0:k1], dv4[:, :, k0:k1], grads, tensors, seq_sizes)
        else:
            for b in range(B):
                _backward_row(v, b, b, q4, k4, v4, do4, dq4, dk4, dv4, grads, tensors, env_sizes)
    out = {"dq": dq, "dk": dk, "dv": dv}
    out.update(grads)
    return out


def _backward_row(v: Variant, b: int, b_index: int, q4: np.ndarray, k4: np.ndarray, v4: np.ndarray, do4: np.ndarray,
                  dq4: np.ndarray, dk4: np.ndarray, dv4: np.ndarray, grads: dict[str, np.ndarray],
                  tensors: Mapping[str, np.ndarray], env_sizes: Mapping) -> None:
    """The gradients of batch row b of the [B, heads, L, D] views, added into dq4, dk4, dv4 and
    `grads`; masks and scores see the batch index `b_index` (a varlen sequence's index, run as a
    batch of one)."""
    H, Hkv, G = v.heads, v.kv_heads, v.group_size
    D, Dv = v.head_dim, v.value_head_dim
    Lq, Lk = q4.shape[2], k4.shape[2]
    scale = v.effective_scale
    kn, on = v.norm(NormTarget.K), v.norm(NormTarget.O)
    ds_expr = derivative.score_derivative(v.scores)
    params = [(ld, de) for ld, de in derivative.param_derivatives(v.scores) if ld.tensor in grads]
    cq = max(1, min(Lq, CHUNK_BYTES // (8 * max(G * Lk, G * max(D, Dv)))))
    # Q' for all heads of this batch, with the pre-norm's statistics for its backward.
    qp, qsave = _q_prenorm(v, round_to(q4[b], v.dtype), tensors)
    dqp = np.zeros((H, Lq, D))
    for hk in range(Hkv):
        heads = np.arange(hk * G, (hk + 1) * G)
        xk = round_to(k4[b, hk], v.dtype)  # [Lk, D]
        ksave = None
        if kn is None:
            kp = xk
        else:
            w, bias = _weights(tensors, NormTarget.K, kn.affine, kn.kind)
            xhat_k, rstd_k = _norm_fwd(xk, kn.kind, kn.eps)
            kp = round_to(_affine(xhat_k, w, bias), v.dtype)
            ksave = (xhat_k, rstd_k, w)
        vv = round_to(v4[b, hk], v.dtype)  # [Lk, Dv]
        dkp = np.zeros((Lk, D))
        dvv = np.zeros((Lk, Dv))
        for q0 in range(0, Lq, cq):
            q1 = min(Lq, q0 + cq)
            qq = qp[heads, q0:q1]  # [G, cq, D]
            s0 = np.matmul(qq, kp.T) * scale  # [G, cq, Lk]
            env = Env(
                {
                    IndexVar.B: b_index,
                    IndexVar.H: heads[:, None, None],
                    IndexVar.Q: np.arange(q0, q1)[None, :, None],
                    IndexVar.KV: np.arange(Lk)[None, None, :],
                },
                env_sizes,
                tensors,
            )
            s = s0
            for sc in v.scores:
                s = np.broadcast_to(evaluate(sc, Env(env.index, env.sizes, env.tensors, s)), s.shape).astype(np.float64)
            vis = np.broadcast_to(evaluate(v.mask, env), s.shape) & (s > -np.inf)
            s = np.where(vis, s, -np.inf)
            m = s.max(axis=-1, keepdims=True)
            empty = ~(m > -np.inf)
            m = np.where(empty, 0.0, m)
            p = np.where(vis, np.exp(s - m), 0.0)
            l = p.sum(axis=-1, keepdims=True)
            psink = None
            if v.sink is not None:
                # The sink's logit joins the denominator (reference.attention): P and
                # the sink's own share both divide by l + exp(sink - m); empty rows stay 0.
                sk = np.asarray(tensors[v.sink], dtype=np.float64)[heads][:, None, None]
                es = np.where(empty, 0.0, np.exp(sk - m))
                l = l + es
                psink = np.where(empty, 0.0, es / np.where(empty, 1.0, l))
            p = np.where(empty, 0.0, p / np.where(empty, 1.0, l))
            o = np.matmul(p, vv)  # [G, cq, Dv], the attention output before the post-norm
            dout = do4[b, heads, q0:q1]
            if v.residual:
                dqp_res = dout  # the residual adds the (rounded) q input itself
                dq4[b, heads, q0:q1] += dqp_res
            if on is not None:
                w, bias = _weights(tensors, NormTarget.O, on.affine, on.kind)
                xhat_o, rstd_o = _norm_fwd(o, on.kind, on.eps)
                dout, dw, db = _norm_bwd(dout, xhat_o, rstd_o, on.kind, w)
                _add(grads, norm_weight_name(NormTarget.O), dw)
                _add(grads, norm_bias_name(NormTarget.O), db)
            drow = (dout * o).sum(axis=-1, keepdims=True)  # D = rowsum(dO' * O')
            if psink is not None and v.sink in grads:
                # dO/dsink = -P_sink * O, so d(loss)/dsink[h] = -sum over rows of P_sink * D.
                np.add.at(grads[v.sink], heads, -(psink * drow).sum(axis=(1, 2)))
            dp = np.matmul(dout, vv.T)
            ds = p * (dp - drow)  # d(loss)/d(final score), 0 where P = 0
            dvv += np.einsum("gqk,gqd->kd", p, dout)
            se = Env(env.index, env.sizes, env.tensors, s0)
            if ds_expr != derivative.ONE:
                g = np.broadcast_to(evaluate(ds_expr, se), s.shape)
                ds0 = np.where(p != 0, ds * g, 0.0)
            else:
                ds0 = ds
            for ld, de in params:
                _scatter(grads[ld.tensor], ld, np.where(p != 0, ds * evaluate(de, se), 0.0), env)
            dqp[heads, q0:q1] += scale * np.matmul(ds0, kp)
            dkp += scale * np.einsum("gqk,gqd->kd", ds0, qq)
        dv4[b, hk] += dvv
        if ksave is None:
            dk4[b, hk] += dkp
        else:
            dx, dw, db = _norm_bwd(dkp, ksave[0], ksave[1], kn.kind, ksave[2])
            dk4[b, hk] += dx
            _add(grads, norm_weight_name(NormTarget.K), dw)
            _add(grads, norm_bias_name(NormTarget.K), db)
    dq4[b] += dqp if qsave is None else _q_prenorm_backward(v, dqp, qsave, grads)


def _q_prenorm(v: Variant, xq: np.ndarray, tensors: Mapping[str, np.ndarray]) -> tuple[np.ndarray, tuple | None]:
    """Q' of every head of a batch row ([H, Lq, D], `xq` rounded to the dtype) and what the q
    pre-norm's backward needs (its normalised rows, rstd and weight; None without a q norm)."""
    qn = v.norm(NormTarget.Q)
    if qn is None:
        return xq, None
    H, Lq, D = xq.shape
    w, bias = _weights(tensors, NormTarget.Q, qn.affine, qn.kind)
    if qn.scope == NormScope.HEAD:
        xhat, rstd = _norm_fwd(xq, qn.kind, qn.eps)
        qp = round_to(_affine(xhat, w, bias), v.dtype)
    else:  # token scope: statistics over the whole H*D row
        rows = xq.transpose(1, 0, 2).reshape(Lq, H * D)
        xhat, rstd = _norm_fwd(rows, qn.kind, qn.eps)
        qp = round_to(_affine(xhat, w, bias), v.dtype).reshape(Lq, H, D).transpose(1, 0, 2)
    return qp, (xhat, rstd, w)


def _q_prenorm_backward(v: Variant, dqp: np.ndarray, qsave: tuple, grads: dict[str, np.ndarray]) -> np.ndarray:
    """dQ from dQ' ([H, Lq, D]) through the q pre-norm; its weight and bias gradients go into `grads`."""
    qn = v.norm(NormTarget.Q)
    assert qn is not None
    H, Lq, D = dqp.shape
    xhat, rstd, w = qsave
    if qn.scope == NormScope.HEAD:
        dx, dw, db = _norm_bwd(dqp, xhat, rstd, qn.kind, w)
    else:
        rows = dqp.transpose(1, 0, 2).reshape(Lq, H * D)
        dx, dw, db = _norm_bwd(rows, xhat, rstd, qn.kind, w)
        dx = dx.reshape(Lq, H, D).transpose(1, 0, 2)
    _add(grads, norm_weight_name(NormTarget.Q), dw)
    _add(grads, norm_bias_name(NormTarget.Q), db)
    return dx


def _add(grads: dict[str, np.ndarray], name: str, g: np.ndarray) -> None:
    if name in grads:
        grads[name] += g


def _scatter(grad: np.ndarray, ld, val: np.ndarray, env: Env) -> None:
    """grad[indices of the lookup] += val, over the broadcast block; indices outside the tensor
    read 0 in the forward and receive nothing here."""
    idx = [np.broadcast_to(np.asarray(evaluate(i, env), dtype=np.int64), val.shape) for i in ld.indices]
    inside = np.ones(val.shape, dtype=bool)
    for n, i in zip(grad.shape, idx):
        inside &= (i >= 0) & (i < n)
    np.add.at(grad, tuple(i[inside] for i in idx), val[inside])


__all__ = ["attention_backward", "learnable_inputs"]
