"""Ring-attention benchmark (run with `torchrun --standalone --nproc_per_node 2`): causal, D128,
H16, bf16, B1 at L = 128k and 256k. Per length:
  - 1 GPU: the attngen kernel on the whole sequence (rank 0's time);
  - ring: `attngen.distributed.ring_attention` over every rank (zigzag), the slowest rank's time;
  - compute only: the same launches without communication (own K/V standing in for remote blocks);
  - comm only: one K/V shard exchange (`batch_isend_irecv`), no compute;
  - peer: torch's `context_parallel` (ring SDPA, flash backend, alltoall rotation, load-balanced).
Aggregate TFLOP/s count causal as half (4 L^2 H D / 2). Rank 0 prints a table and writes JSON.

usage: torchrun --standalone --nproc_per_node 2 benchmarks/ring_bench.py [--out FILE] [--lengths 131072,262144]
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
        del qs, ks, vs
        try:
            if CPU:
                raise RuntimeError("no peer in a CPU dry run")
            row["peer_s"] = slowest(peer_time(q, k, v, world, args.reps))
        except Exception:
            row["peer_error"] = traceback.format_exc()[-800:]
        for key in ("one_gpu_s", "ring_s", "compute_only_s", "peer_s"):
            if key in row:
                row[key.replace("_s", "_tflops")] = flops / row[key] / 1e12
                row[key.replace("_s", "_tok_per_s")] = L / row[key]
        if "one_gpu_s" in row and "ring_s" in row:
            row["speedup_vs_1gpu"] = row["one_gpu_s"] / row["ring_s"]
        if "peer_s" in row and "ring_s" in row:
            row["speedup_vs_peer"] = row["peer_s"] / row["ring_s"]
        if "compute_only_s" in row and "ring_s" in row:
            row["ring_over_compute"] = row["ring_s"] / row["compute_only_s"]
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
            for key in ("one_gpu_error", "ring_error", "comm_error", "peer_error"):
                if key in r:
                    print(f"  {key}: {r[key].strip().splitlines()[-1]}")
        if args.out:
            Path(args.out).write_text(json.dumps(rows, indent=1))
    dist.barrier()
    dist.destroy_process_group()
    return 0


def peer_time(q, k, v, world: int, reps: int) -> float:
    """torch's context_parallel: ring SDPA (flash), alltoall rotation, load-balanced sharding."""
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
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION), context_parallel(mesh, buffers=[qt, kt, vt], buffer_seq_dims=[2, 2, 2]):
        return timed(lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=True), reps)


if __name__ == "__main__":
    sys.exit(main())
