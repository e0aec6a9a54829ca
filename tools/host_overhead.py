"""Host time per call of the seed kernel (fp32 B4 H8 L128 D64, padding) in a loop of 2000 calls,
for each way of calling it, beside SDPA's efficient kernel with a mask in the same run; plus the cost of
the input check on a variant with a `sorted` input. Prints a table; writes host_overhead.json to
$OUT (or the current directory).

    python tools/host_overhead.py [--calls 2000]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DOC = """attention doc_check_bench {
  dtype fp16
  head_dim 64
  heads 8
  layout bhsd
  input doc: i32[B, Lk] sorted
  mask document(doc)
}
"""


def _loop(fn, calls: int) -> float:
    """Mean wall time per call (us) of `calls` back-to-back calls; the GPU finishes before and after."""
    import torch

    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / calls * 1e6


def _gpu_us(fn, reps: int = 200) -> float:
    """Device time per call (us) from CUDA events around `reps` calls."""
    import torch

    fn()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    a.record()
    for _ in range(reps):
        fn()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) / reps * 1e3


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=2000)
    args = ap.parse_args()
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import attngen
    import attngen.runtime.torch as at
    from attngen.runtime.binder import launch_driver

    torch.manual_seed(0)
    B, H, L, D = 4, 8, 128, 64
    q, k, v = (torch.randn(B, H, L, D, device="cuda") for _ in range(3))
    ql = torch.tensor([128, 100, 77, 64], dtype=torch.int32, device="cuda")
    kl = torch.tensor([128, 90, 120, 33], dtype=torch.int32, device="cuda")
    kern = attngen.compile(ROOT / "examples" / "seed_padded_fp32.attn")
    rows = []

    def row(name, fn, note=""):
        try:
            us = round(fn(), 2)
        except Exception as e:  # one path failing must not lose the others' figures
            us, note = None, f"failed: {type(e).__name__}: {e}"
        rows.append(dict(path=name, host_us_per_call=us, note=note))

    row("attngen Kernel, binder + cuLaunchKernel (ctypes)", lambda: _loop(lambda: kern(q, k, v, q_lens=ql, kv_lens=kl), args.calls),
        "default path; allocates the output each call")
    o = kern(q, k, v, q_lens=ql, kv_lens=kl)
    row("attngen Kernel, out= given", lambda: _loop(lambda: kern(q, k, v, out=o, q_lens=ql, kv_lens=kl), args.calls))

    def rebuilt():
        kern._bindings.clear()
        kern(q, k, v, q_lens=ql, kv_lens=kl)

    row("attngen Kernel, binding rebuilt every call", lambda: _loop(rebuilt, args.calls // 4),
        "the full validation and packing the binder caches")
    kern(q, k, v, q_lens=ql, kv_lens=kl)
    b = next(iter(kern._bindings.values()))
    sp = torch.cuda.current_stream().cuda_stream
    row("cuLaunchKernel alone (prebuilt buffer, no binding)", lambda: _loop(lambda: launch_driver(b.main[-1], sp), args.calls),
        "lower bound of the ctypes launch")
    op = at.register(ROOT / "examples" / "seed_padded_fp32.attn")
    row("attngen.torch op, eager route (op(q, k, v, ...))", lambda: _loop(lambda: op(q, k, v, kv_lens=kl, q_lens=ql), args.calls),
        "input matching and the requires_grad check on top of the binder")
    row("attngen.torch op dispatched (torch.ops.attngen.seed_padded_fp32)",
        lambda: _loop(lambda: op.op(q, k, v, kl, ql), args.calls), "custom_op dispatch on top of the binder")
    mask = (torch.arange(L, device="cuda")[None, :, None] < ql[:, None, None]) & (torch.arange(L, device="cuda")[None, None, :] < kl[:, None, None])
    mask = mask[:, None]

    def sdpa():
        with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    row("torch SDPA efficient, bool mask", lambda: _loop(sdpa, args.calls), "same tensors, same run (sdpa_kernel context each call)")
    sdpa_gpu = seed_gpu = float("nan")
    with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
        row("torch SDPA efficient, bool mask, context outside the loop",
            lambda: _loop(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask), args.calls), "the figure to compare")
        try:
            sdpa_gpu = _gpu_us(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
        except Exception as e:
            print(f"SDPA event timing failed: {type(e).__name__}: {e}")
    seed_gpu = _gpu_us(lambda: kern(q, k, v, out=o, q_lens=ql, kv_lens=kl))

    # The input check: a document mask over sorted ids (fp16, same sizes).
    dk = attngen.compile(DOC)
    qh, kh, vh = (x.half() for x in (q, k, v))
    doc = torch.sort(torch.randint(0, 4, (B, L), device="cuda"), dim=1).values.int()
    try:
        on = _loop(lambda: dk(qh, kh, vh, doc=doc), args.calls // 4)
        off = _loop(lambda: dk(qh, kh, vh, doc=doc, check_inputs=False), args.calls // 4)
        on_wall = _gpu_us(lambda: dk(qh, kh, vh, doc=doc, check_inputs=True))
        off_gpu = _gpu_us(lambda: dk(qh, kh, vh, doc=doc, check_inputs=False))
    except Exception as e:
        print(f"input-check timing failed: {type(e).__name__}: {e}")
        on = off = on_wall = off_gpu = float("nan")
    checks = dict(host_us_check_on=round(on, 2), host_us_check_off=round(off, 2),
                  event_us_check_on=round(on_wall, 2), event_us_check_off=round(off_gpu, 2),
                  note="check on: a check kernel plus an 8-byte read back (a stream sync) per call")
    w = max(len(r["path"]) for r in rows)
    print(f"seed case fp32 B{B} H{H} L{L} D{D} padding, {args.calls} calls; {torch.cuda.get_device_name()}")
    for r in rows:
        us = "failed" if r["host_us_per_call"] is None else f"{r['host_us_per_call']:8.2f} us"
        print(f"  {r['path'].ljust(w)}  {us}  {r['note']}")
    print(f"  CUDA-event time per call, back to back (the larger of host and device time): attngen {seed_gpu:.2f} us, "
          f"SDPA efficient {sdpa_gpu:.2f} us")
    print(f"  sorted-input check (doc mask fp16): host {on:.2f} us/call with, {off:.2f} without; "
          f"CUDA-event time per call {on_wall:.2f} us with (check kernel + sync), {off_gpu:.2f} us without")
    res = dict(case=dict(dtype="fp32", B=B, H=H, L=L, D=D, mask="padding", calls=args.calls),
               device=torch.cuda.get_device_name(), torch=torch.__version__, rows=rows,
               event_us_back_to_back=dict(attngen=round(seed_gpu, 2), sdpa_efficient=round(sdpa_gpu, 2)), input_check=checks)
    out = Path(os.environ.get("OUT", "."))
    (out / "host_overhead.json").write_text(json.dumps(res, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
