#!/usr/bin/env python3
"""The CPU backward against torch's CPU SDPA backward, same threads, same run (prints JSON lines).

    python benchmarks/cpu_bwd_bench.py [--threads N] [--repeats R]

Rows: fp32 B1 H8 D64 at L 1k, causal and dense. attngen's time is one backward call given the
forward's O and LSE (`kernel.backward(..., o=, lse=)`); torch's is `autograd.grad` through
`scaled_dot_product_attention` (its flash-attention CPU backward) with the graph kept. Each is the
minimum over `--repeats` calls after a warm-up: the wall time, and with `--threads 1` the calling
thread's CPU time too, which other processes' load barely moves (the fairer figure on a busy
machine). The gradients are compared with each other as a sanity check.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SPEC = "attention bwd_{name} {{ dtype fp32; head_dim {D}; heads {H}; {mask} }}"


def _time(fn, repeats: int, thread_cpu: bool) -> tuple[float, float | None]:
    fn()
    wall, cpu = [], []
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.thread_time()
        fn()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.thread_time() - c0)
    return min(wall) * 1e3, (min(cpu) * 1e3 if thread_cpu else None)


def row(B: int, H: int, L: int, D: int, causal: bool, threads: int, repeats: int) -> dict:
    import dataclasses

    import torch

    import attngen
    from attngen.lang import frontend

    torch.set_num_threads(threads)
    name = f"{'causal' if causal else 'dense'}_d{D}"
    v = frontend.loads(SPEC.format(name=name, D=D, H=H, mask="mask causal" if causal else ""), "<bench>").variants[0]
    kern = attngen.compile(v, device="cpu")
    fwd = attngen.compile(dataclasses.replace(v, lse=True), device="cpu")
    rng = np.random.default_rng(0)
    q, k, vv, dO = (rng.normal(size=(B, H, L, D)).astype(np.float32) for _ in range(4))
    o, lse = fwd(q, k, vv, num_threads=threads)
    ours = lambda: kern.backward(q, k, vv, dO, o=o, lse=lse, num_threads=threads)  # noqa: E731
    tq, tk, tv = (torch.from_numpy(x).requires_grad_() for x in (q, k, vv))
    to = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=causal)
    tdo = torch.from_numpy(dO)
    theirs = lambda: torch.autograd.grad(to, (tq, tk, tv), tdo, retain_graph=True)  # noqa: E731
    a, b = ours(), theirs()
    err = max(float(np.abs(x - y.numpy()).max() / (np.abs(y.numpy()).max() + 1e-30)) for x, y in zip(a, b))
    ow, oc = _time(ours, repeats, threads == 1)
    tw, tc = _time(theirs, repeats, threads == 1)
    out = dict(shape=f"B{B} H{H} L{L} D{D} {'causal' if causal else 'dense'} fp32", threads=threads, attngen_ms=round(ow, 2),
               torch_ms=round(tw, 2), speedup_wall=round(tw / ow, 2), max_rel_diff=err)
    if oc is not None:
        out.update(attngen_thread_cpu_ms=round(oc, 2), torch_thread_cpu_ms=round(tc, 2), speedup_cpu=round(tc / oc, 2))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    print(json.dumps(dict(env=True, cpu=os.cpu_count(), load=os.getloadavg())), flush=True)
    for causal in (True, False):
        print(json.dumps(row(1, 8, 1024, 64, causal, args.threads, args.repeats)), flush=True)


if __name__ == "__main__":
    main()
