"""Ring-attention benchmark (run with `torchrun --standalone --nproc_per_node 2`): causal, D128,
H16, bf16, B1 at L = 128k and 256k, eager calls as a user makes them. Per length, the forward alone
and forward+backward (the backward through autograd, as training runs it):
  - 1 GPU: the attngen kernel on the whole sequence (rank 0's time); forward+backward: the kernel,
    then `attngen.runtime.bwd.backward` with its saved O and LSE;
  - ring: `attngen.distributed.ring_attention` over every rank (zigzag), the slowest rank's time;
    forward+backward: `out.backward(dO)` through the ring (a second ring carries dK/dV);
  - compute only: the same launches without communication (own K/V standing in for remote blocks);
  - comm only: one K/V shard exchange (`batch_isend_irecv`), no compute;
  - peer: torch's `context_parallel` (ring SDPA, flash backend, alltoall rotation, load-balanced),
    forward and forward+backward.
Aggregate TFLOP/s count causal as half (4 L^2 H D / 2 for the forward, 2.5 times that for the
backward). Rank 0 prints a table and writes JSON.

usage: torchrun --standalone --nproc_per_node 2 benchmarks/ring_bench.py [--out FILE] [--lengths 131072,262144] [--no-backward]
`--cpu --lengths 256` is a dry run of the script on CPUs (gloo, the NumPy reference as the kernel,
no peer): it checks the script, not speed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

H, D = 16, 128
SPEC = "attention ring_bench_causal { dtype bf16; head_dim 128; heads 16; layout bshd; mask causal; output lse }"


CPU = False  # --cpu: a dry run on CPUs


def sync() -> None:
    import torch

    if not CPU:
        torch.cuda.synchronize()


def timed(fn, reps: int, sync_group=True) -> float:
    """Median seconds of `fn` over `reps` runs after one warm-up; ranks start each run together."""
    import torch.distributed as dist

    fn()
    sync()
    ts = []
    for _ in range(reps):
        if sync_group:
            dist.barrier()
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        ts.append(time.perf_counter() - t0)
    ts.sort()
    return ts[len(ts) // 2]


def slowest(t: float) -> float:
    import torch
    import torch.distributed as dist

    x = torch.tensor([t], dtype=torch.float64, device="cpu" if CPU else "cuda")
    dist.all_reduce(x, op=dist.ReduceOp.MAX)
    return float(x.item())


def main() -> int:
    import torch
    import torch.distributed as dist

    import attngen
    from attngen.runtime import distributed as Dd

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--lengths", default="131072,262144")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--cpu", action="store_true", help="dry run on CPUs: gloo, the NumPy reference as the kernel, no peer")
    ap.add_argument("--no-backward", action="store_true", help="time the forward only")
    args = ap.parse_args()
    global CPU
    CPU = args.cpu
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if CPU:
        dev = torch.device("cpu")
        dist.init_process_group("gloo")
        kernel = Dd.ReferenceKernel(attngen.loads(SPEC).get())
    else:
        torch.cuda.set_device(local)
        dev = torch.device("cuda", local)
        dist.init_process_group("nccl", device_id=dev)
        kernel = attngen.compile(SPEC)
    rank, world = dist.get_rank(), dist.get_world_size()
    rows = []
    for L in (int(x) for x in args.lengths.split(",")):
        row: dict = {"L": L, "world": world}
        flops = 4.0 * L * L * H * D / 2
        g = torch.Generator(device=dev).manual_seed(L)
        q = torch.randn((1, L, H, D), generator=g, device=dev, dtype=torch.bfloat16)
        k = torch.randn((1, L, H, D), generator=g, device=dev, dtype=torch.bfloat16)
        v = torch.randn((1, L, H, D), generator=g, device=dev, dtype=torch.bfloat16)
        try:
            t1 = timed(lambda: kernel(q, k, v), args.reps)  # every rank runs it; rank 0's figure is reported
            row["one_gpu_s"] = t1
        except Exception:
            row["one_gpu_error"] = traceback.format_exc()[-800:]
        qs, ks, vs = (Dd.shard(t, world, rank, 1) for t in (q, k, v))
        try:
            row["ring_s"] = slowest(timed(lambda: Dd.ring_attention(kernel, qs, ks, vs, seq_len=L), args.reps))
            row["compute_only_s"] = slowest(timed(lambda: Dd.ring_attention(kernel, qs, ks, vs, seq_len=L, _exchange=False), args.reps))
        except Exception:
            row["ring_error"] = traceback.format_exc()[-800:]
        try:
            rk, rv = torch.empty_like(ks), torch.empty_like(vs)

            def exchange():
                ops = [dist.P2POp(dist.isend, ks, (rank + 1) % world), dist.P2POp(dist.isend, vs, (rank + 1) % world),
                       dist.P2POp(dist.irecv, rk, (rank - 1) % world), dist.P2POp(dist.irecv, rv, (rank - 1) % world)]
                for w in dist.batch_isend_irecv(ops):
                    w.wait()

            row["comm_only_s"] = slowest(timed(exchange, args.reps))
        except Exception:
            row["comm_error"] = traceback.format_exc()[-800:]
        if not args.no_backward:
            time_backward(row, kernel, q, k, v, qs, ks, vs, L, world, rank, args.reps)
        del qs, ks, vs
        try:
            if CPU:
                raise RuntimeError("no peer in a CPU dry run")
            row["peer_s"] = slowest(peer_time(q, k, v, world, args.reps))
            if not args.no_backward:
                row["peer_fb_s"] = slowest(peer_time(q, k, v, world, args.reps, backward=True))
        except Exception:
            row["peer_error"] = traceback.format_exc()[-800:]
        for key in ("one_gpu_s", "ring_s", "compute_only_s", "peer_s"):
            for k_, f in ((key, flops), (key.replace("_s", "_fb_s"), 3.5 * flops)):
                if k_ in row:
                    row[k_.replace("_s", "_tflops")] = f / row[k_] / 1e12
                    row[k_.replace("_s", "_tok_per_s")] = L / row[k_]
        for sfx in ("", "_fb"):
            if f"one_gpu{sfx}_s" in row and f"ring{sfx}_s" in row:
                row[f"speedup{sfx}_vs_1gpu"] = row[f"one_gpu{sfx}_s"] / row[f"ring{sfx}_s"]
            if f"peer{sfx}_s" in row and f"ring{sfx}_s" in row:
                row[f"speedup{sfx}_vs_peer"] = row[f"peer{sfx}_s"] / row[f"ring{sfx}_s"]
            if f"compute_only{sfx}_s" in row and f"ring{sfx}_s" in row:
                row[f"ring{sfx}_over_compute"] = row[f"ring{sfx}_s"] / row[f"compute_only{sfx}_s"]
        rows.append(row)
        del q, k, v
        if not CPU:
            torch.cuda.empty_cache()
    if rank == 0:
        print(f"\nring attention, causal D{D} H{H} bf16 B1, {world} GPUs (aggregate TFLOP/s, causal counted as half)")
        print(f"{'L':>7} | {'1 GPU':>13} | {'ring':>13} | {'compute only':>13} | {'comm only':>9} | {'peer CP':>13} | ring/1GPU | ring/peer | ring/compute")
        for r in rows:
            def f(key):
                return f"{r[key] * 1e3:7.1f}ms {r[key.replace('_s', '_tflops')]:4.0f}" if key in r else f"{'n/a':>13}"
            comm = f"{r['comm_only_s'] * 1e3:7.2f}ms" if "comm_only_s" in r else f"{'n/a':>9}"
            sp = lambda key: f"{r[key]:9.2f}x" if key in r else f"{'n/a':>10}"
            print(f"{r['L']:>7} | {f('one_gpu_s')} | {f('ring_s')} | {f('compute_only_s')} | {comm} | {f('peer_s')} | {sp('speedup_vs_1gpu')} | {sp('speedup_vs_peer')} | {sp('ring_over_compute')}")
        if not args.no_backward:
            print(f"\nforward+backward (TFLOP/s with the backward as 2.5x the forward)")
            print(f"{'L':>7} | {'1 GPU':>13} | {'ring':>13} | {'compute only':>13} | {'peer CP':>13} | ring/1GPU | ring/peer | ring/compute")
            for r in rows:
                def g(key):
                    return f"{r[key] * 1e3:7.1f}ms {r[key.replace('_s', '_tflops')]:4.0f}" if key in r else f"{'n/a':>13}"
                sp = lambda key: f"{r[key]:9.2f}x" if key in r else f"{'n/a':>10}"
                print(f"{r['L']:>7} | {g('one_gpu_fb_s')} | {g('ring_fb_s')} | {g('compute_only_fb_s')} | {g('peer_fb_s')} | {sp('speedup_fb_vs_1gpu')} | {sp('speedup_fb_vs_peer')} | {sp('ring_fb_over_compute')}")
        for r in rows:
            for key in ("one_gpu_error", "ring_error", "comm_error", "peer_error", "one_gpu_fb_error", "ring_fb_error"):
                if key in r:
                    print(f"  L={r['L']} {key}: {r[key].strip().splitlines()[-1]}")
        if args.out:
            Path(args.out).write_text(json.dumps(rows, indent=1))
    dist.barrier()
    dist.destroy_process_group()
    return 0


def time_backward(row: dict, kernel, q, k, v, qs, ks, vs, L: int, world: int, rank: int, reps: int) -> None:
    """Forward+backward times into `row`: one GPU (the kernel, then its backward with the saved O
    and LSE), the ring through autograd, and the ring's launches without communication."""
    import torch

    from attngen.runtime import distributed as Dd

    g = torch.Generator(device=q.device).manual_seed(L + 1)
    dO = torch.randn(q.shape, generator=g, device=q.device, dtype=q.dtype)
    try:
        if CPU:
            from attngen.runtime.distributed_bwd import reference_step_backward

            def one():
                o, lse = kernel(q, k, v)
                reference_step_backward(kernel.variant, q, k, v, o, dO, lse)
        else:
            from attngen.runtime import bwd

            def one():
                o, lse = kernel(q, k, v)
                bwd.backward(kernel, q, k, v, dO, o=o, lse=lse)

        row["one_gpu_fb_s"] = timed(one, reps)
    except Exception:
        row["one_gpu_fb_error"] = traceback.format_exc()[-800:]
    dOs = Dd.shard(dO, world, rank, 1)
    leaves = [t.detach().requires_grad_() for t in (qs, ks, vs)]

    def ring(exchange: bool):
        def run():
            for t in leaves:
                t.grad = None
            o, _ = Dd.ring_attention(kernel, *leaves, seq_len=L, _exchange=exchange)
            o.backward(dOs)
        return run

    try:
        row["ring_fb_s"] = slowest(timed(ring(True), reps))
        row["compute_only_fb_s"] = slowest(timed(ring(False), reps))
    except Exception:
        row["ring_fb_error"] = traceback.format_exc()[-800:]


def peer_time(q, k, v, world: int, reps: int, backward: bool = False) -> float:
    """torch's context_parallel: ring SDPA (flash), alltoall rotation, load-balanced sharding;
    with `backward`, forward and backward through autograd."""
    import torch
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel
    from torch.nn.attention import SDPBackend, sdpa_kernel

    try:
        from torch.distributed.tensor.experimental._attention import set_rotate_method

        set_rotate_method("alltoall")
    except Exception:
        pass
    mesh = init_device_mesh("cuda", (world,))
    qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (q, k, v))  # [B, H, L, D] for SDPA
    dt = torch.randn_like(qt) if backward else None
    bufs = [qt, kt, vt] + ([dt] if backward else [])
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION), context_parallel(mesh, buffers=bufs, buffer_seq_dims=[2] * len(bufs)):
        if not backward:
            return timed(lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=True), reps)
        for t in (qt, kt, vt):
            t.requires_grad_()  # after context_parallel sharded them in place

        def step():
            for t in (qt, kt, vt):
                t.grad = None
            F.scaled_dot_product_attention(qt, kt, vt, is_causal=True).backward(dt)

        return timed(step, reps)


if __name__ == "__main__":
    sys.exit(main())
