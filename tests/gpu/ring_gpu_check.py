"""Ring attention on GPUs (run with `torchrun --nproc_per_node N`): each rank's rows of
`attngen.distributed.ring_attention` against the single-GPU attngen kernel on the whole sequence,
for causal, sliding-window, packed-document, softcap and ALiBi masks, at lengths that do not
divide evenly, with zigzag and contiguous sharding; then each rank's shards of dq, dk, dv by autograd
through the ring against the single-GPU attngen backward on the whole sequence (BWD_CASES). Rank 0
prints one line a case and writes JSON.

usage: torchrun --standalone --nproc_per_node 2 tests/gpu/ring_gpu_check.py [--out FILE]
Exit status 0 when every case passes on every rank. `--cpu` runs the same script logic on CPUs
(gloo, the NumPy reference standing in for the kernel, lengths divided by 40): a dry run of the
script itself, for machines without GPUs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

SPEC = """
attention {name} {{
  dtype bf16; head_dim 128; heads 8 kv 4; layout {layout}
  {extra}
  mask {mask}
  {score}
  output lse
}}
"""

# name, layout, mask, score, extra, B, L, scheme
CASES = [
    ("causal", "bshd", "causal", "", "", 2, 4099, "zigzag"),
    ("causal_bhsd_contig", "bhsd", "causal", "", "", 1, 3001, "contiguous"),
    ("window", "bshd", "causal && window(700, 0)", "", "", 1, 5003, "zigzag"),
    ("document", "bshd", "document(doc_ids) && causal", "", "input doc_ids: i32[B, Lk] sorted", 2, 3333, "zigzag"),
    ("softcap", "bshd", "causal", "score softcap(30.0)", "", 1, 2051, "zigzag"),
    ("alibi", "bshd", "causal", "score alibi", "", 1, 2500, "zigzag"),
    ("full", "bshd", "true", "", "", 1, 1537, "zigzag"),
]


# The backward's cases: name, layout, mask, score, extra, B, L, scheme (bf16, GQA 8/4, D128).
BWD_CASES = [
    ("bwd_causal", "bshd", "causal", "", "", 2, 4099, "zigzag"),
    ("bwd_causal_bhsd_contig", "bhsd", "causal", "", "", 1, 3001, "contiguous"),
    ("bwd_window_softcap", "bshd", "causal && window(700, 0)", "score softcap(30.0)", "", 1, 5003, "zigzag"),
    ("bwd_full", "bshd", "true", "", "", 1, 1537, "zigzag"),
]


def _data(case, dev, cpu: bool):
    """(kernel, q, k, v, inputs, L) of a case, the same full tensors on every rank."""
    import torch

    import attngen
    from attngen.runtime import distributed as Dd

    name, layout, mask, score, extra, B, L, scheme = case
    spec = SPEC.format(name=f"ring_{name}", layout=layout, mask=mask, score=score, extra=extra)
    if cpu:
        kernel = Dd.ReferenceKernel(attngen.loads(spec).get())
        L = L // 40
    else:
        kernel = attngen.compile(spec)
    g = torch.Generator().manual_seed(L)
    H, Hkv, D = 8, 4, 128
    shp = (lambda h: (B, L, h, D)) if layout == "bshd" else (lambda h: (B, h, L, D))
    q, k, v = (torch.randn(shp(h), generator=g).to(torch.bfloat16).to(dev) for h in (H, Hkv, Hkv))
    ins = {}
    if "doc_ids" in extra:
        cuts = torch.sort(torch.randint(0, L, (B, 5), generator=g), dim=1).values
        ids = (torch.arange(L)[None, :, None] >= cuts[:, None, :]).sum(-1).to(torch.int32)
        ins["doc_ids"] = ids.to(dev)
    return kernel, q, k, v, ins, L


def run_bwd_case(case, rank, world, dev, cpu: bool = False):
    """The ring's gradients against the single-GPU backward (the NumPy reference backward in a
    --cpu dry run) on the whole sequence."""
    import numpy as np
    import torch

    from attngen.runtime import distributed as Dd

    kernel, q, k, v, ins, L = _data(case, dev, cpu)
    layout, scheme = case[1], case[7]
    sd = 2 if layout == "bhsd" else 1
    g = torch.Generator().manual_seed(L + 1)
    dO = torch.randn(q.shape, generator=g).to(torch.bfloat16).to(dev)
    if cpu:
        from attngen.check import reference_bwd

        host = lambda t: t.float().numpy()  # noqa: E731
        r = reference_bwd.attention_backward(kernel.variant, host(q), host(k), host(v), {n: t.numpy() for n, t in ins.items()}, host(dO))
        want = [torch.from_numpy(r[n]).float() for n in ("dq", "dk", "dv")]
    else:
        from attngen.runtime import bwd

        want = [t.float() for t in bwd.backward(kernel, q, k, v, dO, **ins)]
    shards = [Dd.shard(t, world, rank, sd, scheme).requires_grad_() for t in (q, k, v)]
    o, _ = Dd.ring_attention(kernel, *shards, seq_len=L, scheme=scheme, **ins)
    o.backward(Dd.shard(dO, world, rank, sd, scheme))
    if not cpu:
        torch.cuda.synchronize()
    # bf16: every block's gradients are rounded to bf16 before the fp32 sum over the ring, and the
    # single-GPU kernels round once; a few bf16 ulps (2^-8 relative) of the largest gradient.
    errs = []
    for n, t, w in zip(("dq", "dk", "dv"), shards, want):
        ref = Dd.shard(w, world, rank, sd, scheme)
        e = float((t.grad.float() - ref).abs().max()) / max(1.0, float(w.abs().max()))
        errs.append((n, e, bool(torch.isfinite(t.grad.float()).all()) and t.grad.dtype == torch.bfloat16))
    ok = all(e <= 2e-2 and fin for _, e, fin in errs)
    return ok, ", ".join(f"{n} rel err {e:.3g}" for n, e, _ in errs) + ("" if np.isfinite(errs[0][1]) else " (NaN)")


def run_case(case, rank, world, dev, cpu: bool = False):
    import torch

    from attngen.runtime import distributed as Dd

    kernel, q, k, v, ins, L = _data(case, dev, cpu)
    layout, scheme = case[1], case[7]
    o_full, lse_full = kernel(q, k, v, **ins)
    sd = 2 if layout == "bhsd" else 1
    o, lse = Dd.ring_attention(kernel, *(Dd.shard(t, world, rank, sd, scheme) for t in (q, k, v)), seq_len=L, scheme=scheme, **ins)
    if not cpu:
        torch.cuda.synchronize()
    want_o, want_lse = Dd.shard(o_full, world, rank, sd, scheme), Dd.shard(lse_full, world, rank, 2, scheme)
    err = float((o.float() - want_o.float()).abs().max())
    fin = ~torch.isneginf(want_lse)
    lerr = float((lse[fin] - want_lse[fin]).abs().max()) if fin.any() else 0.0
    same_inf = bool(torch.equal(torch.isneginf(lse), torch.isneginf(want_lse)))
    # bf16: partial outputs are rounded to bf16 before the fp32 merge; 1-2 bf16 ulps of |O| <= ~4.
    ok = err <= 3e-2 and lerr <= 2e-3 and same_inf and not torch.isnan(o.float()).any()
    return ok, f"max |dO| {err:.3g}, max |dLSE| {lerr:.3g}, -inf rows agree {same_inf}"


def main() -> int:
    import torch
    import torch.distributed as dist

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--cpu", action="store_true", help="dry run on CPUs: gloo, the NumPy reference as the kernel")
    args = ap.parse_args()
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if args.cpu:
        dist.init_process_group("gloo")
        dev = torch.device("cpu")
    else:
        torch.cuda.set_device(local)
        dev = torch.device("cuda", local)
        dist.init_process_group("nccl", device_id=dev)
    rank, world = dist.get_rank(), dist.get_world_size()
    results = []
    for case in CASES + BWD_CASES:
        try:
            ok, detail = (run_bwd_case if case in BWD_CASES else run_case)(case, rank, world, dev, args.cpu)
        except Exception:
            ok, detail = False, traceback.format_exc()[-1500:]
        flag = torch.tensor([1 if ok else 0], device=dev)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)  # every rank takes part, whatever happened
        results.append({"case": case[0], "L": case[6], "scheme": case[7], "ok_this_rank": ok, "ok_all": bool(flag.item()), "detail": detail})
        if rank == 0:
            print(f"ring check {case[0]:<24} L={case[6] // 40 if args.cpu else case[6]:<6} {case[7]:<10} {'PASS' if flag.item() else 'FAIL'}  (rank 0: {detail.splitlines()[-1]})", flush=True)
        elif not ok:
            print(f"rank {rank} {case[0]}: {detail}", flush=True)
    if rank == 0 and args.out:
        Path(args.out).write_text(json.dumps({"world": world, "results": results}, indent=1))
    dist.barrier()
    dist.destroy_process_group()
    return 0 if all(r["ok_all"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
