"""The backward of ring attention (`attngen.runtime.distributed`): a second ring over the same
shards, run by autograd when `ring_attention`'s outputs are differentiated.

Every rank keeps its query shard and its saved forward results (O and the global LSE of its rows)
and accumulates dQ locally in fp32. The K/V shards travel around the ring again as in the forward,
and each K/V block travels with an fp32 dK/dV accumulator: at step s rank r holds the block of rank
r-s, adds its share of that block's gradients into the accumulator it received, and sends block and
accumulator on to r+1; after the last step the accumulator goes one hop further, home to its owner.
The next K/V block is posted before the step's compute and the accumulator right after it, so both
transfers overlap compute (on GPUs on a separate CUDA stream, ordered by events, as in the forward).

A step's share is the backward of one (query range, key range) block with the GLOBAL softmax: P is
recomputed as exp(s - LSE) from the merged forward's LSE and dS = P * (dO V^T - D) with
D = rowsum(dO * O) from the merged output (minus a gradient at the LSE, which enters as D - dLSE),
so the blocks' gradients sum to the single-device backward. Blocks the mask rules out for the whole
block are skipped without a launch, as in the forward. `step_backward` is the one function that
computes a share: on CUDA tensors the attngen backward kernels (`attngen.runtime.bwd.backward`,
which take the saved O and LSE and the block's positions); on CPU tensors
`reference_step_backward`, a float64 NumPy implementation of the same block backward with the
LSE given (the CPU backend has no backward kernel; once it has one with the same arguments, the
CPU branch of `step_backward` is the one line to switch).

No gradient reaches the runtime inputs (documents, biases, slopes) through the ring.
"""

from __future__ import annotations

import functools
from typing import Any

from attngen.ir import abi
from attngen.ir.nodes import IndexVar, NormTarget, Variant
from attngen.runtime.distributed import Ring, _narrow, _post_exchange, ring_buffers, ring_forward, shaped, step_blocks


def attention_with_grad(ring: Ring, q: Any, k: Any, v: Any, exchange: bool, inputs: dict[str, Any]) -> tuple[Any, Any]:
    """`ring_forward` recorded by autograd: (out, lse) whose backward runs `ring_backward`. What
    the backward would refuse is refused here, before the forward runs."""
    if not q.is_cuda:
        _check_cpu(ring.var)
    return _function().apply(q, k, v, ring, exchange, inputs)


def _check_cpu(var: Variant) -> None:
    """Refuse what `reference_step_backward` does not cover: q and k pre-norms."""
    if var.norm(NormTarget.Q) is not None or var.norm(NormTarget.K) is not None:
        raise ValueError(f"ring_attention backward on CPU: variant {var.name} has a q or k pre-norm, which the CPU "
                         "block backward does not cover; run the ring on CUDA tensors")


@functools.cache
def _function() -> Any:
    """The autograd Function (built on first use: torch is imported only by callers that have it)."""
    import torch

    class RingAttention(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, q: Any, k: Any, v: Any, ring: Ring, exchange: bool, inputs: dict[str, Any]) -> Any:
            out, lse = ring_forward(ring, q, k, v, exchange, inputs)
            ctx.save_for_backward(q, k, v, out, lse)
            ctx.ring, ctx.exchange, ctx.inputs = ring, exchange, inputs
            ctx.set_materialize_grads(False)  # an unused output's gradient arrives as None, not zeros
            return out, lse

        @staticmethod
        def backward(ctx: Any, dout: Any, dlse: Any) -> Any:
            q, k, v, out, lse = ctx.saved_tensors
            if dout is None:
                dout = torch.zeros_like(out)
            dq, dk, dv = ring_backward(ctx.ring, q, k, v, out, lse, dout, dlse, ctx.exchange, ctx.inputs)
            return dq, dk, dv, None, None, None

    return RingAttention


def ring_backward(ring: Ring, q: Any, k: Any, v: Any, out: Any, lse: Any, dout: Any, dlse: Any, exchange: bool,
                  inputs: dict[str, Any]) -> tuple[Any, Any, Any]:
    """This rank's (dq, dk, dv) in the dtypes and shapes of its shards; see the module doc. Every
    rank of the ring calls it together. `dlse` (or None): a gradient at the LSE output."""
    import torch

    seq_dim, world, rank = ring.seq_dim, ring.world, ring.rank
    # This rank's query parts, contiguous, with their rows of O, dO, the LSE and dLSE.
    parts = []
    for (a, b), at in ring.q_parts:
        rows = (at, at + b - a)
        parts.append((*(_narrow(x, seq_dim, *rows).contiguous() for x in (q, out, dout)),
                      lse[:, :, rows[0]:rows[1]].contiguous(),
                      None if dlse is None else dlse[:, :, rows[0]:rows[1]].contiguous()))
    dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)

    cuda = q.is_cuda
    compute = torch.cuda.current_stream(q.device) if cuda else None
    comm = torch.cuda.Stream(device=q.device) if cuda and world > 1 else None
    ready = torch.cuda.Event() if comm is not None else None
    if ready is not None:
        ready.record(compute)
    kv_bufs = ring_buffers(ring, (k, v), (k.dtype, v.dtype), 2 if world > 2 else (1 if world == 2 else 0))
    # The travelling dK/dV accumulators: one is sent on while the next is received into the other.
    g_bufs = ring_buffers(ring, (k, v), (torch.float32, torch.float32), 2 if world > 1 else 1)
    cur_k, cur_v = k.contiguous(), v.contiguous()
    prev_kv: list[Any] = []
    g_reqs: list[Any] = []
    acc = None
    for step in range(world):
        src = (rank - step) % world
        n_src, n_next = ring.rows(src), ring.rows((src - 1) % world)
        nxt, kv_reqs = None, []
        if step + 1 < world and exchange:
            fk, fv = kv_bufs[step % len(kv_bufs)]
            nxt = (shaped(ring, fk, k, n_next), shaped(ring, fv, v, n_next))
            kv_reqs = _post_exchange(ring.group, (cur_k, cur_v), nxt, n_src > 0, n_next > 0,
                                     ring.succ, ring.pred, comm, ready, prev_kv)
        shares = []
        for kr, kv_at, i, qr, q_at in step_blocks(ring, src, q.shape[0]):
            nk, nq = kr[1] - kr[0], qr[1] - qr[0]
            kb = _narrow(cur_k, seq_dim, kv_at, kv_at + nk).contiguous()
            vb = _narrow(cur_v, seq_dim, kv_at, kv_at + nk).contiguous()
            gq, gk, gv = step_backward(ring, parts[i][0], kb, vb, *parts[i][1:], q_offset=qr[0], kv_offset=kr[0],
                                       inputs=inputs)
            _narrow(dq, seq_dim, q_at, q_at + nq).add_(gq)
            shares.append((kv_at, nk, gk, gv))
        # Block src's accumulator: the one received (zero at the first step) plus this step's shares.
        gk_buf, gv_buf = g_bufs[step % len(g_bufs)]
        acc = (shaped(ring, gk_buf, k, n_src), shaped(ring, gv_buf, v, n_src))
        if step == 0 or not exchange:
            acc[0].zero_()
            acc[1].zero_()
        else:
            for r in g_reqs:
                r.wait()
        for kv_at, nk, gk, gv in shares:
            _narrow(acc[0], seq_dim, kv_at, kv_at + nk).add_(gk)
            _narrow(acc[1], seq_dim, kv_at, kv_at + nk).add_(gv)
        if ready is not None:
            ready.record(compute)
        if exchange and world > 1:
            # On to the successor; after the last step this is the hop home to the block's owner.
            nk_buf, nv_buf = g_bufs[(step + 1) % len(g_bufs)]
            g_reqs = _post_exchange(ring.group, acc, (shaped(ring, nk_buf, k, n_next), shaped(ring, nv_buf, v, n_next)),
                                    n_src > 0, n_next > 0, ring.succ, ring.pred, comm, ready, [], tag=2)
        for r in kv_reqs:
            r.wait()  # on a GPU: the compute stream waits for the block before the next step reads it
        prev_kv = kv_reqs
        if nxt is not None:
            cur_k, cur_v = nxt
    if exchange and world > 1:
        for r in g_reqs:
            r.wait()
        gk_buf, gv_buf = g_bufs[world % len(g_bufs)]
        n_own = ring.rows(rank)
        acc = (shaped(ring, gk_buf, k, n_own), shaped(ring, gv_buf, v, n_own))
    assert acc is not None
    return dq.to(q.dtype), acc[0].to(k.dtype), acc[1].to(v.dtype)


def step_backward(ring: Ring, q: Any, k: Any, v: Any, o: Any, dO: Any, lse: Any, dlse: Any, *, q_offset: int,
                  kv_offset: int, inputs: dict[str, Any]) -> tuple[Any, Any, Any]:
    """One block's share of the gradients (dq, dk, dv), with the global `lse` and `o` of the
    queries' rows: the attngen backward kernels on CUDA tensors, else `reference_step_backward`
    (the switch to a CPU backward kernel, when the CPU backend has one, is here)."""
    where = dict(q_offset=q_offset, kv_offset=kv_offset, Lq_total=ring.seq_len, Lk_total=ring.seq_len)
    if q.is_cuda:
        from attngen.runtime import bwd

        return bwd.backward(ring.fn, q, k, v, dO, o=o, lse=lse, dlse=dlse, **where, **inputs)
    return reference_step_backward(ring.var, q, k, v, o, dO, lse, dlse, **where, **inputs)


def reference_step_backward(var: Variant, q: Any, k: Any, v: Any, o: Any, dO: Any, lse: Any, dlse: Any = None, *,
                            q_offset: int = 0, kv_offset: int = 0, Lq_total: int | None = None,
                            Lk_total: int | None = None, **inputs: Any) -> tuple[Any, Any, Any]:
    """The block backward with a given LSE, in float64 NumPy on CPU torch tensors: (dq, dk, dv)
    fp32 in the shapes of q, k, v. P = exp(s - lse) on the keys the mask shows (s the final score
    at global positions, `abi.Positions`), D = rowsum(dO * o) - dlse, dS = P * (dO V^T - D) times
    d(score)/d(q.k), then dq = scale dS K, dk = scale dS^T Q, dv = P^T dO summed over each kv
    group. Variants with a q or k pre-norm are refused (their per-block backward is not written
    here; the CUDA kernels have it)."""
    import numpy as np
    import torch

    from attngen.analysis import derivative
    from attngen.check.reference_eval import Env, _as_bhsd, _bind, _size_map, evaluate, prepare_tensors, round_to

    _check_cpu(var)

    def host(x: Any) -> Any:
        return x.detach().double().numpy() if x.is_floating_point() else x.detach().numpy()

    qa, ka, va, oa, doa = (host(x) for x in (q, k, v, o, dO))
    ins = {n: host(x) for n, x in inputs.items()}
    sizes = _bind(var, qa, ka, va, ins, abi.Positions(q_offset, kv_offset, Lq_total, Lk_total))
    pos = abi.Positions(q_offset, kv_offset, Lq_total, Lk_total).resolve(sizes.Lq, sizes.Lk)
    tensors = prepare_tensors(var, ins)
    env_sizes = _size_map(var, abi.Sizes(sizes.B, int(pos.Lq_total), int(pos.Lk_total), sizes.symbols))
    H, Hkv, G, scale = var.heads, var.kv_heads, var.group_size, var.effective_scale
    q4, k4, v4 = _as_bhsd(qa, var.layout, H), _as_bhsd(ka, var.layout, Hkv), _as_bhsd(va, var.layout, Hkv)
    do4, o4 = _as_bhsd(doa, var.layout, H), _as_bhsd(oa, var.layout, H)
    lse64 = lse.detach().double().numpy()
    delta = (do4 * o4).sum(axis=-1)  # [B, H, nq]
    if dlse is not None:
        delta = delta - dlse.detach().double().numpy()
    dq, dk, dv = np.zeros(qa.shape), np.zeros(ka.shape), np.zeros(va.shape)
    dq4, dk4, dv4 = _as_bhsd(dq, var.layout, H), _as_bhsd(dk, var.layout, Hkv), _as_bhsd(dv, var.layout, Hkv)
    ds_expr = derivative.score_derivative(var.scores)
    nq, nk = q4.shape[2], k4.shape[2]
    with np.errstate(all="ignore"):
        for b in range(sizes.B):
            for hk in range(Hkv):
                heads = np.arange(hk * G, (hk + 1) * G)
                qq = round_to(q4[b, heads], var.dtype)  # [G, nq, D]
                kk, vv = round_to(k4[b, hk], var.dtype), round_to(v4[b, hk], var.dtype)
                s0 = np.matmul(qq, kk.T) * scale
                env = Env({IndexVar.B: b, IndexVar.H: heads[:, None, None],
                           IndexVar.Q: np.arange(pos.q_offset, pos.q_offset + nq)[None, :, None],
                           IndexVar.KV: np.arange(pos.kv_offset, pos.kv_offset + nk)[None, None, :]}, env_sizes, tensors)
                s = s0
                for sc in var.scores:
                    s = np.broadcast_to(evaluate(sc, Env(env.index, env.sizes, env.tensors, s)), s.shape).astype(np.float64)
                row_lse = lse64[b, heads][:, :, None]
                vis = np.broadcast_to(evaluate(var.visibility(), env), s.shape) & (s > -np.inf) & (row_lse > -np.inf)
                p = np.where(vis, np.exp(s - row_lse), 0.0)
                dout = do4[b, heads]
                ds = p * (np.matmul(dout, vv.T) - delta[b, heads][:, :, None])
                if ds_expr != derivative.ONE:
                    g = np.broadcast_to(evaluate(ds_expr, Env(env.index, env.sizes, env.tensors, s0)), s.shape)
                    ds = np.where(p != 0, ds * g, 0.0)
                dq4[b, heads] += scale * np.matmul(ds, kk)
                dk4[b, hk] += scale * np.einsum("gqk,gqd->kd", ds, qq)
                dv4[b, hk] += np.einsum("gqk,gqd->kd", p, dout)
    return tuple(torch.from_numpy(x.astype(np.float32)) for x in (dq, dk, dv))  # type: ignore[return-value]


__all__ = ["attention_with_grad", "reference_step_backward", "ring_backward", "step_backward"]
