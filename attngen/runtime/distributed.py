"""Context parallelism: ring attention over torch.distributed with attngen kernels, forward and
backward. The entry point lives here; the ring itself (sharding, the forward ring, the exchange) in
`attngen.runtime.ring`, the backward ring in `attngen.runtime.distributed_bwd`.

The sequence is sharded over the ranks of a process group. Each rank keeps its query shard and
passes its K/V shard around the ring (`batch_isend_irecv`, NCCL on GPUs, gloo on CPUs); at every
step it runs the attngen kernel on (its queries, the K/V block it holds) and merges the partial
output into an fp32 accumulator by the partials' LSE. The kernel sees global positions through its
`q_offset` / `kv_offset` / `Lq_total` / `Lk_total` arguments (`abi.Positions`), so every mask the
spec can say (causal, window, document, prefix, padding, ALiBi, ...) means on a shard exactly what
it means on the whole sequence. A block that tile classification proves invisible for every batch
and head is skipped on the host, without a launch.

Sharding (`Sharding`): ZIGZAG (the default, as in Llama 3's context parallelism) splits the
sequence into 2W chunks and gives rank r chunks r and 2W-1-r, so that under a causal mask every
rank does the same work (an early chunk with little to see paired with a late one that sees
much); CONTIGUOUS gives rank r the r-th of W chunks (balanced for masks without a causal
direction). Lengths that do not divide evenly give the first chunks one row more.
"""

from __future__ import annotations

from typing import Any

from attngen.runtime import distributed_bwd
from attngen.runtime.ring import (  # noqa: F401 (the public names, and those the tests reach)
    ReferenceKernel,
    Ring,
    Sharding,
    _block_visible,
    _check_variant,
    chunk_bounds,
    make_ring,
    merge_partials,
    ring_forward,
    shard,
    shard_ranges,
    unshard,
)

__all__ = ["Sharding", "chunk_bounds", "shard_ranges", "shard", "unshard", "merge_partials", "ring_attention", "ReferenceKernel"]


def ring_attention(
    kernel: Any,
    q: Any,
    k: Any,
    v: Any,
    group: Any = None,
    *,
    seq_len: int | None = None,
    scheme: Sharding | str = Sharding.ZIGZAG,
    _exchange: bool = True,
    **inputs: Any,
) -> tuple[Any, Any]:
    """This rank's rows of attention over the whole sharded sequence: (out, lse), differentiable.

    `kernel`: a compiled variant (`attngen.compile(...)`), a Variant or spec (compiled here), or any
    callable with the Kernel's signature and a `.variant` (e.g. `ReferenceKernel`). `q`, `k`, `v`:
    this rank's shards (torch tensors in the variant's layout; `shard` cuts them), holding the
    positions `shard_ranges(seq_len, world, rank, scheme)` in that order. `seq_len`: the whole
    sequence's length (found by an all-reduce when not given). `inputs`: the variant's runtime
    inputs for the WHOLE sequence (e.g. `doc_ids` [B, seq_len]; small), identical on every rank.
    (`_exchange=False` is for benchmarks only: the same launches, forward and backward, with this
    rank's own K/V standing in for every remote block, no communication; it needs shards of equal
    size and gives wrong outputs and gradients.)
    Every rank of `group` must call this together. Returns `out` in the variant's dtype and layout
    and `lse` fp32 [B, H, n] for this rank's n rows. When autograd records (q, k or v requires
    grad), `out` and `lse` carry a graph whose backward is a second ring
    (`attngen.runtime.distributed_bwd`): every rank must then run its backward together too."""
    import torch

    ring = make_ring(kernel, q, k, v, group, seq_len, Sharding(scheme))
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        return distributed_bwd.attention_with_grad(ring, q, k, v, _exchange, inputs)
    return ring_forward(ring, q, k, v, _exchange, inputs)
