"""Host cost of a call, as users make them: decode steps and training steps, the peers in the same run.

    python benchmarks/host_bench.py [--calls 2000] [--out PATH] [--quick]

For each workload, three figures per implementation:
  host_us   the Python/driver time of one call: a loop of `--calls` calls, timed on the CPU in chunks
            queued behind a GPU spin (so the launch queue never fills and the GPU never waits on the
            host mid-chunk: what is measured is the host's own work, not the kernels);
  eager_us  CUDA-event time per call of back-to-back eager calls (the larger of host and device
            time: what an eager decode loop or training loop sees);
  graph_us  CUDA-event time per call of the same calls captured in one CUDA graph (the kernels alone).

Decode: bf16 D128 H32/Hkv8, Lq 1 (the spec of benchmarks/decode_bench.py), through `attngen.compile`'s
default dispatch and through the torch op under torch.no_grad() (the path Hugging Face `generate`
takes: it routes Lq 1 to the decode family too), at B1 Lk8k, B8 Lk32k, B64 Lk4k, B128 Lk1k, beside
torch SDPA's flash backend (FA2).
Training shapes, B8 H16 L2k D128 causal and B4 H16 L4k D64 causal, bf16: the forward alone through
the torch op (`attngen.torch.register`, under torch.no_grad()), and one forward + backward
(autograd.grad on q, k, v), each beside SDPA's cuDNN and flash backends. Rows go to PATH (default $OUT/host.jsonl when $OUT is set, else
benchmarks/results/host.jsonl), one JSON object a line; a table goes to stdout. About two minutes
on an H200 with a warm kernel cache (first compiles add NVRTC time).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from decode_bench import D, H, HKV, SPEC  # noqa: E402  (the decode rows' spec, beside this script)

DECODE_ROWS = [(1, 8192), (8, 32768), (64, 4096), (128, 1024)]
TRAIN_ROWS = [(8, 16, 2048, 128), (4, 16, 4096, 64)]  # B, H, L, D; causal
TRAIN_SPEC = "attention train_d{D} {{ dtype bf16; head_dim {D}; heads {H}; mask causal }}"


def host_us(fn, calls: int, chunk: int) -> float:
    """Host microseconds per call over `calls` calls, in chunks queued behind a GPU spin that outlasts
    each chunk's enqueueing (doubled and the chunk repeated when the GPU caught up)."""
    import torch

    fn()
    torch.cuda.synchronize()
    spin = 20_000_000
    total, done = 0.0, 0
    while done < calls:
        n = min(chunk, calls - done)
        torch.cuda._sleep(spin)
        held = torch.cuda.Event()
        held.record()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        t1 = time.perf_counter()
        caught_up = held.query()  # the spin ended before the chunk was queued: the GPU may have waited
        torch.cuda.synchronize()
        if caught_up and spin < 1 << 34:
            spin *= 2
            continue
        total += t1 - t0
        done += n
    return total / calls * 1e6


def eager_us(fn, reps: int) -> float:
    """CUDA-event microseconds per call of `reps` back-to-back eager calls."""
    import torch

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(reps):
        fn()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) / reps * 1e3


def graph_us(fn, per_graph: int, replays: int = 5) -> float:
    """CUDA-event microseconds per call of `per_graph` calls captured in one CUDA graph (warmed up
    on the capture stream first, as torch asks)."""
    import torch

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        for _ in range(per_graph):
            fn()
    g.replay()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(replays):
        g.replay()
    b.record()
    torch.cuda.synchronize()
    del g
    return a.elapsed_time(b) / (replays * per_graph) * 1e3


def measure(name: str, fn, calls: int, chunk: int, reps: int, per_graph: int) -> dict:
    """The three figures of one implementation; a failing figure is reported, not fatal."""
    row: dict = {"impl": name}
    for key, f in (("host_us", lambda: host_us(fn, calls, chunk)), ("eager_us", lambda: eager_us(fn, reps)),
                   ("graph_us", lambda: graph_us(fn, per_graph))):
        try:
            row[key] = round(f(), 2)
        except Exception as e:  # noqa: BLE001  (a peer that refuses a shape or capture is reported)
            row[key] = None
            row[f"{key}_error"] = f"{type(e).__name__}: {str(e)[:160]}"
    return row


def decode_rows(args, emit) -> None:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import attngen
    import attngen.torch as at

    kern = attngen.compile(SPEC % "")  # the default dispatch: Lq 1 goes to the decode family
    op = at.register(SPEC % "")  # the torch op: its inference calls route the same way
    for B, Lk in DECODE_ROWS:
        q = torch.randn(B, H, 1, D, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(B, HKV, Lk, D, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(B, HKV, Lk, D, device="cuda", dtype=torch.bfloat16)
        ours = kern(q, k, v)
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            ref = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        err = (ours.float() - ref.float()).abs().max().item()
        shape = dict(workload="decode", B=B, Lk=Lk, Lq=1, H=H, Hkv=HKV, D=D, dtype="bf16")
        emit({**shape, **measure("attngen", lambda: kern(q, k, v), args.calls, 200, 200, 20), "max_abs_diff_vs_fa2": err})
        with torch.no_grad():
            op_err = (op(q, k, v).float() - ref.float()).abs().max().item()
            emit({**shape, **measure("attngen (torch op)", lambda: op(q, k, v), args.calls, 200, 200, 20),
                  "max_abs_diff_vs_fa2": op_err})
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):  # the context once, outside the calls
            emit({**shape, **measure("fa2 (sdpa flash)", lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True),
                                     args.calls, 200, 200, 20)})
        torch.cuda.empty_cache()


def train_rows(args, emit) -> None:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import attngen.torch as at

    for B, nh, L, d in TRAIN_ROWS:
        op = at.register(TRAIN_SPEC.format(D=d, H=nh))
        q, k, v = (torch.randn(B, nh, L, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        g = torch.randn(B, nh, L, d, device="cuda", dtype=torch.bfloat16)

        def ours():
            return torch.autograd.grad(op(q, k, v), (q, k, v), g)

        def sdpa():
            return torch.autograd.grad(F.scaled_dot_product_attention(q, k, v, is_causal=True), (q, k, v), g)

        calls = max(50, args.calls // (4 if args.quick else 1))
        fwd_rows(op, q, k, v, dict(workload="fwd", B=B, H=nh, L=L, D=d, causal=True, dtype="bf16"), calls, emit)
        shape = dict(workload="fwd+bwd", B=B, H=nh, L=L, D=d, causal=True, dtype="bf16")
        try:
            ours_dq = ours()[0]
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                ref_dq = sdpa()[0]
            err = (ours_dq.float() - ref_dq.float()).abs().max().item()
        except Exception as e:  # noqa: BLE001
            err = f"{type(e).__name__}: {str(e)[:160]}"
        emit({**shape, **measure("attngen (torch op)", ours, calls, 10, 20, 4), "dq_max_abs_diff_vs_cudnn": err})
        for name, be in (("cudnn (sdpa)", SDPBackend.CUDNN_ATTENTION), ("fa2 (sdpa flash)", SDPBackend.FLASH_ATTENTION)):
            with sdpa_kernel(be):
                emit({**shape, **measure(name, sdpa, calls, 10, 20, 4)})
        torch.cuda.empty_cache()


def fwd_rows(op, q, k, v, shape: dict, calls: int, emit) -> None:
    """The forward alone (torch.no_grad(), as an inference or evaluation call makes it): the torch
    op beside SDPA's cuDNN and flash backends, O compared with cuDNN's first."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def ours():
        return op(q, k, v)

    def sdpa():
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    with torch.no_grad():
        try:
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                err = (ours().float() - sdpa().float()).abs().max().item()
        except Exception as e:  # noqa: BLE001
            err = f"{type(e).__name__}: {str(e)[:160]}"
        emit({**shape, **measure("attngen (torch op)", ours, calls, 20, 20, 10), "o_max_abs_diff_vs_cudnn": err})
        for name, be in (("cudnn (sdpa)", SDPBackend.CUDNN_ATTENTION), ("fa2 (sdpa flash)", SDPBackend.FLASH_ATTENTION)):
            with sdpa_kernel(be):
                emit({**shape, **measure(name, sdpa, calls, 20, 20, 10)})


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--out", default=None)
    ap.add_argument("--quick", action="store_true", help="a quarter of the training calls")
    ap.add_argument("--only", choices=("decode", "train"), default=None)
    args = ap.parse_args()
    import torch

    out = Path(args.out or (Path(os.environ["OUT"]) / "host.jsonl" if os.environ.get("OUT") else ROOT / "benchmarks/results/host.jsonl"))
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, calls=args.calls)
    rows: list[dict] = []

    def emit(row: dict) -> None:
        row = {**row, **meta}
        rows.append(row)
        with out.open("a") as f:
            f.write(json.dumps(row) + "\n")
        print(f"  {row['workload']:8s} {_shape(row):24s} {row['impl']:20s} host {_f(row['host_us'])}  "
              f"eager {_f(row['eager_us'])}  graph {_f(row['graph_us'])}", flush=True)

    print(f"{meta['device']}, torch {meta['torch']}: us per call (host: CPU time a call; eager: events, back to back; "
          f"graph: events, captured)")
    if args.only in (None, "decode"):
        decode_rows(args, emit)
    if args.only in (None, "train"):
        train_rows(args, emit)
    print(f"wrote {len(rows)} rows to {out}")
    return 0


def _shape(row: dict) -> str:
    if row["workload"] == "decode":
        return f"B{row['B']} Lk{row['Lk'] // 1024}k"
    return f"B{row['B']} H{row['H']} L{row['L'] // 1024}k D{row['D']}"


def _f(x) -> str:
    return "  failed" if x is None else f"{x:8.1f}"


if __name__ == "__main__":
    raise SystemExit(main())
