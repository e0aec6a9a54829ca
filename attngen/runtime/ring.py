"""The ring of context parallelism (`attngen.runtime.distributed.ring_attention`, whose module doc
describes the algorithm and the sharding schemes): sharding, the per-call `Ring`, the forward ring
and the exchange the backward ring (`distributed_bwd`) shares."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Sequence
from typing import Any

from attngen.ir import abi
from attngen.analysis.intervals import Tri, classify
from attngen.ir.nodes import Index, IndexVar, Layout, NormTarget, Variant, walk


class Sharding(enum.Enum):
    """How the sequence is split over the ranks."""

    ZIGZAG = "zigzag"  # 2W chunks, rank r holds chunks r and 2W-1-r (balanced under causal masks)
    CONTIGUOUS = "contiguous"  # W chunks, rank r holds chunk r


def chunk_bounds(length: int, n: int) -> list[tuple[int, int]]:
    """`length` rows split into `n` consecutive [start, end) chunks; the first `length % n` chunks
    are one row longer."""
    if n < 1 or length < 0:
        raise ValueError(f"chunk_bounds: expected n >= 1 and length >= 0, got n={n}, length={length}")
    base, extra = divmod(length, n)
    out, start = [], 0
    for i in range(n):
        end = start + base + (1 if i < extra else 0)
        out.append((start, end))
        start = end
    return out


def shard_ranges(length: int, world: int, rank: int, scheme: Sharding | str = Sharding.ZIGZAG) -> tuple[tuple[int, int], ...]:
    """The global [start, end) position ranges rank `rank` holds, in the order its shard stores them."""
    scheme = Sharding(scheme)
    if not 0 <= rank < world:
        raise ValueError(f"shard_ranges: expected 0 <= rank < world, got rank {rank}, world {world}")
    if scheme == Sharding.ZIGZAG:
        c = chunk_bounds(length, 2 * world)
        return (c[rank], c[2 * world - 1 - rank])
    return (chunk_bounds(length, world)[rank],)


def shard(x: Any, world: int, rank: int, dim: int, scheme: Sharding | str = Sharding.ZIGZAG) -> Any:
    """Rank `rank`'s shard of a whole-sequence tensor (torch or NumPy): its ranges along `dim`,
    concatenated (a copy)."""
    ranges = shard_ranges(x.shape[dim], world, rank, scheme)
    parts = [_narrow(x, dim, a, b) for a, b in ranges]
    if type(x).__module__.startswith("torch"):
        import torch

        return torch.cat(parts, dim=dim)
    import numpy as np

    return np.concatenate(parts, axis=dim)


def unshard(shards: Sequence[Any], dim: int, scheme: Sharding | str = Sharding.ZIGZAG) -> Any:
    """The whole-sequence tensor from every rank's shard (the inverse of `shard`)."""
    world = len(shards)
    length = sum(s.shape[dim] for s in shards)
    pieces: list[tuple[int, Any]] = []
    for r, s in enumerate(shards):
        at = 0
        for a, b in shard_ranges(length, world, r, scheme):
            pieces.append((a, _narrow(s, dim, at, at + (b - a))))
            at += b - a
    pieces.sort(key=lambda t: t[0])
    if type(shards[0]).__module__.startswith("torch"):
        import torch

        return torch.cat([p for _, p in pieces], dim=dim)
    import numpy as np

    return np.concatenate([p for _, p in pieces], axis=dim)


def _narrow(x: Any, dim: int, a: int, b: int) -> Any:
    idx = [slice(None)] * x.ndim
    idx[dim] = slice(a, b)
    return x[tuple(idx)]


# ---------------------------------------------------------------------------------------------
# Merging partial results


def merge_partials(o_a: Any, lse_a: Any, o_b: Any, lse_b: Any, seq_dim: int) -> tuple[Any, Any]:
    """Two partial attention results over disjoint key sets → the result over their union, in fp32.

    `o_*` hold the rows in the variant's layout (sequence axis `seq_dim`), `lse_*` are [B, H, n].
    The safe form: with m = max(lse_a, lse_b) (0 where both are -inf), weights exp(lse - m) <= 1
    never overflow; a partial with LSE = -inf (nothing visible) has weight 0, so merging it leaves
    the other partial bit for bit as it was, and two empty partials give O = 0, LSE = -inf."""
    import torch

    m = torch.maximum(lse_a, lse_b)
    m = torch.where(torch.isneginf(m), torch.zeros_like(m), m)
    wa, wb = torch.exp(lse_a - m), torch.exp(lse_b - m)
    s = wa + wb
    lse = m + torch.log(s)  # log 0 = -inf: still empty
    inv = torch.where(s > 0, 1.0 / s, torch.zeros_like(s))
    ca, cb = _lse_as_o(wa * inv, seq_dim), _lse_as_o(wb * inv, seq_dim)
    o = o_a.float() * ca
    o.addcmul_(o_b, cb)
    return o, lse


def _merge_into(acc: Any, acc_lse: Any, o: Any, lse: Any, seq_dim: int) -> None:
    """`merge_partials` in place on an fp32 accumulator (two passes over it, no temporaries of its size)."""
    import torch

    m = torch.maximum(acc_lse, lse)
    m = torch.where(torch.isneginf(m), torch.zeros_like(m), m)
    wa, wb = torch.exp(acc_lse - m), torch.exp(lse - m)
    s = wa + wb
    inv = torch.where(s > 0, 1.0 / s, torch.zeros_like(s))
    acc.mul_(_lse_as_o(wa * inv, seq_dim))
    acc.addcmul_(o, _lse_as_o(wb * inv, seq_dim))
    acc_lse.copy_(m + torch.log(s))


def _lse_as_o(x: Any, seq_dim: int) -> Any:
    """[B, H, n] per-row values broadcast against O ([B, n, H, Dv] when seq_dim is 1, else [B, H, n, Dv])."""
    return x.transpose(1, 2).unsqueeze(-1) if seq_dim == 1 else x.unsqueeze(-1)


# ---------------------------------------------------------------------------------------------
# The local attention a ring runs


class ReferenceKernel:
    """The NumPy reference with the runtime Kernel's call signature, on CPU torch tensors: the
    local attention of CPU ring tests (gloo), and a model of what a ring asks of a kernel."""

    def __init__(self, variant: Variant) -> None:
        self.variant = variant if variant.lse else dataclasses.replace(variant, lse=True)

    def __call__(self, q: Any, k: Any, v: Any, *, q_offset: int = 0, kv_offset: int = 0,
                 Lq_total: int | None = None, Lk_total: int | None = None, **inputs: Any) -> tuple[Any, Any]:
        import numpy as np
        import torch

        from attngen.check import reference

        def host(x: Any) -> Any:
            return x.float().numpy() if x.is_floating_point() else x.numpy()

        o, lse = reference.attention(self.variant, host(q), host(k), host(v), {n: host(x) for n, x in inputs.items()},
                                     q_offset=q_offset, kv_offset=kv_offset, Lq_total=Lq_total, Lk_total=Lk_total)
        return torch.from_numpy(np.asarray(o, dtype=np.float32)).to(q.dtype), torch.from_numpy(lse)


def _local_kernel(kernel: Any, device: str = "cuda") -> Any:
    """A callable that returns (o, lse): the kernel itself when its variant has `output lse`, else
    the same variant with the LSE added, compiled (a ring cannot merge without the LSE). A Variant
    or spec is compiled for `device` ("cuda", or "cpu": the CPU backend); a CPU backend kernel
    without the LSE is recompiled on the CPU backend."""
    var = getattr(kernel, "variant", None)
    if isinstance(kernel, Variant) or not callable(kernel):
        if device == "cpu":
            from attngen import backend

            return _local_kernel(backend.compile(kernel, device="cpu"), device)
        from attngen.runtime import kernel as runtime

        return _local_kernel(runtime.compile(kernel))
    if var is None:
        raise ValueError("ring_attention: expected an attngen Kernel (attngen.compile), a Variant or a spec, "
                         f"got {type(kernel).__name__}")
    if not var.lse:
        if getattr(kernel, "target", None) == "cpu":
            from attngen import backend

            return backend.compile(dataclasses.replace(var, lse=True), device="cpu")
        from attngen.runtime import kernel as runtime

        return runtime.compile(dataclasses.replace(var, lse=True), arch=getattr(getattr(kernel, "plan", None), "arch", None))
    return kernel


def _check_variant(var: Variant) -> None:
    """Refuse what a ring cannot merge: a partial's post-norm or residual is not linear in its
    share of the keys, so merged partials would differ from the whole."""
    if var.norm(NormTarget.O) is not None:
        raise ValueError(f"ring_attention: variant {var.name} has `norm o`, which cannot be applied to partial outputs; "
                         "drop it from the spec and apply the norm to the ring's output")
    if var.residual:
        raise ValueError(f"ring_attention: variant {var.name} has `residual`, which partial outputs cannot carry; "
                         "drop it from the spec and add the residual to the ring's output")
    if var.sink is not None:
        raise ValueError(f"ring_attention: variant {var.name} has a sink ({var.sink}), which would join the "
                         "denominator of every partial and so count once per ring step; drop it from the spec")


def _block_visible(var: Variant, B: int, length: int, q: tuple[int, int], kv: tuple[int, int]) -> bool:
    """False when the mask is NEVER on the whole block q x kv (global ranges) for every b and h,
    by interval classification (a mask that reads runtime inputs is taken as MAYBE: launched)."""
    uses = {n.var for n in walk(var.mask) if isinstance(n, Index)}
    bs = range(B) if IndexVar.B in uses else [0]
    hs = range(var.heads) if IndexVar.H in uses else [0]
    sizes = abi.Sizes(B, length, length)
    for b in bs:
        for h in hs:
            if classify(var.mask, b, h, q[0], q[1] - 1, kv[0], kv[1] - 1, sizes, variant=var) != Tri.NEVER:
                return True
    return False


# ---------------------------------------------------------------------------------------------
# The ring


@dataclasses.dataclass(frozen=True, slots=True)
class Ring:
    """One call's ring, the same for its forward and its backward: the local kernel and its
    variant, the sequence axis, this rank's place and peers (global ranks), the whole length, every
    rank's position ranges, and this rank's query ranges with where each starts in its shard."""

    fn: Any
    var: Variant
    seq_dim: int
    group: Any
    world: int
    rank: int
    succ: int
    pred: int
    seq_len: int
    ranges: list[tuple[tuple[int, int], ...]]
    q_parts: list[tuple[tuple[int, int], int]]

    def rows(self, r: int) -> int:
        """How many rows rank r's shard holds."""
        return sum(b - a for a, b in self.ranges[r])


def make_ring(kernel: Any, q: Any, k: Any, v: Any, group: Any, seq_len: int | None, scheme: Sharding) -> Ring:
    """The checked `Ring` of one call (an all-reduce finds `seq_len` when not given)."""
    import torch.distributed as dist

    fn = _local_kernel(kernel, "cuda" if q.is_cuda else "cpu")
    var: Variant = fn.variant
    _check_variant(var)
    if abi.q_token_flat(var) and q.dim() == 3:
        raise ValueError("ring_attention: pass q as [B, L, H, D] (the flat hidden-state form is not sharded here)")
    seq_dim = 2 if var.layout == Layout.BHSD else 1
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    # P2POp names peers by their global rank, also inside a subgroup.
    succ, pred = ((rank + 1) % world, (rank - 1) % world)
    if group is not None:
        succ, pred = dist.get_global_rank(group, succ), dist.get_global_rank(group, pred)
    seq_len, ranges = _ring_ranges(q, k, v, seq_dim, seq_len, scheme, group, world, rank)
    # Where each of this rank's query ranges sits in its shard.
    q_parts, at = [], 0
    for a, b in ranges[rank]:
        q_parts.append(((a, b), at))
        at += b - a
    return Ring(fn, var, seq_dim, group, world, rank, succ, pred, seq_len, ranges, q_parts)


def ring_buffers(ring: Ring, like: Sequence[Any], dtypes: Sequence[Any], count: int) -> list[list[Any]]:
    """`count` sets of flat buffers, one per tensor of `like` (a shard, rows along the sequence
    axis) in the dtype given, each sized for the largest shard of the ring."""
    import torch

    n_local = max(like[0].shape[ring.seq_dim], 1)
    most = max(ring.rows(r) for r in range(ring.world))
    return [[torch.empty(most * (t.numel() // n_local), dtype=dt, device=t.device) for t, dt in zip(like, dtypes)]
            for _ in range(count)]


def shaped(ring: Ring, flat: Any, like: Any, n: int) -> Any:
    """A view of the flat buffer `flat` as a shard of `n` rows shaped like `like`."""
    shape = list(like.shape)
    shape[ring.seq_dim] = n
    return flat[: like.numel() // max(like.shape[ring.seq_dim], 1) * n].view(shape)


def step_blocks(ring: Ring, src: int, B: int) -> list[tuple[tuple[int, int], int, int, tuple[int, int], int]]:
    """The blocks of the step at which this rank holds rank `src`'s K/V: (key range, where it
    starts in that shard, query part index, query range, where it starts in this shard) for every
    pair the mask does not rule out for the whole block."""
    out, kv_at = [], 0
    for kr in ring.ranges[src]:
        nk = kr[1] - kr[0]
        if nk == 0:
            continue
        for i, (qr, q_at) in enumerate(ring.q_parts):
            if qr[1] > qr[0] and _block_visible(ring.var, B, ring.seq_len, qr, kr):
                out.append((kr, kv_at, i, qr, q_at))
        kv_at += nk
    return out


def ring_forward(ring: Ring, q: Any, k: Any, v: Any, exchange: bool, inputs: dict[str, Any]) -> tuple[Any, Any]:
    """The forward ring (see the module doc): this rank's (out, lse), no autograd graph."""
    import torch

    fn, var, seq_dim, world, rank = ring.fn, ring.var, ring.seq_dim, ring.world, ring.rank
    acc: list[Any] = [None] * len(ring.q_parts)
    acc_lse: list[Any] = [None] * len(ring.q_parts)

    cuda = q.is_cuda
    compute = torch.cuda.current_stream(q.device) if cuda else None
    comm = torch.cuda.Stream(device=q.device) if cuda and world > 1 else None
    ready = torch.cuda.Event() if comm is not None else None
    if ready is not None:
        ready.record(compute)
    # K and V travel as flat buffers sized for the largest shard: two, used alternately (one is
    # received into while the kernel reads the other).
    kc, vc = k.contiguous(), v.contiguous()
    bufs = ring_buffers(ring, (k, v), (k.dtype, v.dtype), 2 if world > 2 else (1 if world == 2 else 0))

    cur_k, cur_v = kc, vc
    prev_reqs: list[Any] = []
    for step in range(world):
        src = (rank - step) % world
        reqs: list[Any] = []
        nxt = None
        if step + 1 < world and exchange:
            n_next = ring.rows((rank - step - 1) % world)
            fk, fv = bufs[step % len(bufs)]
            nxt = (shaped(ring, fk, k, n_next), shaped(ring, fv, v, n_next))
            reqs = _post_exchange(ring.group, (cur_k, cur_v), nxt, ring.rows(src) > 0, n_next > 0,
                                  ring.succ, ring.pred, comm, ready, prev_reqs)
        # This step's blocks: every (query range, key range) pair the mask does not rule out.
        for kr, kv_at, i, qr, q_at in step_blocks(ring, src, q.shape[0]):
            nk, nq = kr[1] - kr[0], qr[1] - qr[0]
            kb, vb = _narrow(cur_k, seq_dim, kv_at, kv_at + nk), _narrow(cur_v, seq_dim, kv_at, kv_at + nk)
            o, lse = fn(_narrow(q, seq_dim, q_at, q_at + nq), kb, vb, q_offset=qr[0], kv_offset=kr[0],
                        Lq_total=ring.seq_len, Lk_total=ring.seq_len, **inputs)
            if acc[i] is None:
                acc[i], acc_lse[i] = o.float(), lse.float().clone()
            else:
                _merge_into(acc[i], acc_lse[i], o, lse, seq_dim)
        if ready is not None:
            ready.record(compute)
        for r in reqs:
            r.wait()  # on a GPU: the compute stream waits for the block before the next step reads it
        prev_reqs = reqs
        if nxt is not None:
            cur_k, cur_v = nxt

    return _assemble(var, q, seq_dim, [r for r, _ in ring.q_parts], acc, acc_lse)


def _ring_ranges(q: Any, k: Any, v: Any, seq_dim: int, seq_len: int | None, scheme: Sharding, group: Any,
                 world: int, rank: int) -> tuple[int, list[tuple[tuple[int, int], ...]]]:
    """The whole sequence's length (an all-reduce of the shard lengths when not given) and every
    rank's position ranges; shards of unequal q/k/v length, or not this scheme's, are refused."""
    import torch
    import torch.distributed as dist

    n_local = q.shape[seq_dim]
    if k.shape[seq_dim] != n_local or v.shape[seq_dim] != n_local:
        raise ValueError(f"ring_attention: expected q, k and v shards of one sequence (equal lengths along dim {seq_dim}), "
                         f"got {q.shape[seq_dim]}, {k.shape[seq_dim]}, {v.shape[seq_dim]}")
    if seq_len is None:
        t = torch.tensor([n_local], dtype=torch.int64, device=q.device)
        dist.all_reduce(t, group=group)
        seq_len = int(t.item())
    ranges = [shard_ranges(seq_len, world, r, scheme) for r in range(world)]
    if n_local != sum(b - a for a, b in ranges[rank]):
        raise ValueError(f"ring_attention: rank {rank} of {world} holds {n_local} rows, but a {scheme.value} shard of "
                         f"seq_len {seq_len} has {sum(b - a for a, b in ranges[rank])}")
    return seq_len, ranges


def _post_exchange(group: Any, send: Sequence[Any], recv: Sequence[Any], sending: bool, receiving: bool,
                   succ: int, pred: int, comm: Any, ready: Any, prev_reqs: list[Any], tag: int = 0) -> list[Any]:
    """Post one ring step's transfers: the tensors `send` on to the successor (`sending`), the
    next ones from the predecessor into `recv` (`receiving`); tensor i travels with tag `tag + i`
    (gloo pairs messages by tag; NCCL by order, which every rank keeps the same). On a GPU they
    run on the `comm` stream once the compute stream reached `ready`. Returns the requests to wait on."""
    import torch
    import torch.distributed as dist

    ops = []
    if sending:
        ops += [dist.P2POp(dist.isend, t, succ, group, tag + i) for i, t in enumerate(send)]
    if receiving:
        ops += [dist.P2POp(dist.irecv, t, pred, group, tag + i) for i, t in enumerate(recv)]
    if not ops:
        return []
    if comm is None:
        return dist.batch_isend_irecv(ops)
    with torch.cuda.stream(comm):
        # The buffer received into was read by the previous step's kernels, and
        # the block sent on arrived with the previous step's receive.
        comm.wait_event(ready)
        for r in prev_reqs:
            r.wait()
        return dist.batch_isend_irecv(ops)


def _assemble(var: Variant, q: Any, seq_dim: int, q_ranges: list[tuple[int, int]], acc: list[Any],
              acc_lse: list[Any]) -> tuple[Any, Any]:
    """This rank's (out, lse) from the merged partials of its query ranges, in shard order; rows
    that saw no key anywhere get O = 0 and LSE = -inf."""
    import torch

    B = q.shape[0]
    outs, lses = [], []
    for i, (a, b) in enumerate(q_ranges):
        n = b - a
        if n == 0:
            continue
        if acc[i] is None:  # nothing visible to these rows anywhere: O = 0, LSE = -inf
            shape = list(abi.o_shape(var, B, n))
            outs.append(torch.zeros(shape, dtype=q.dtype, device=q.device))
            lses.append(torch.full((B, var.heads, n), float("-inf"), dtype=torch.float32, device=q.device))
        else:
            outs.append(acc[i].to(q.dtype))
            lses.append(acc_lse[i])
    if not outs:
        return (torch.empty(list(abi.o_shape(var, B, 0)), dtype=q.dtype, device=q.device),
                torch.empty((B, var.heads, 0), dtype=torch.float32, device=q.device))
    return torch.cat(outs, dim=seq_dim), torch.cat(lses, dim=2)


__all__ = ["Sharding", "chunk_bounds", "shard_ranges", "shard", "unshard", "merge_partials", "ReferenceKernel"]
