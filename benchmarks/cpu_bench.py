#!/usr/bin/env python3
"""The CPU backend against torch's CPU SDPA, same threads, same run: writes benchmarks/results/cpu.jsonl.

    python benchmarks/cpu_bench.py [--threads N] [--quick] [--repeats R] [--out PATH]

Rows: dense and causal fp32 at D64/D128 and L 128 .. 2k (4k without --quick); custom masks
(sliding window, documents, ALiBi) against SDPA given the equivalent boolean or float mask; decode
(Lq 1, GQA 32/8, D128, fp32, Lk 4k); the seed case (fp32 B4 H8 L128 D64, padding). Each row is the
median wall time of `--repeats` calls after a warm-up, both implementations pinned to the same
thread count, and the two outputs compared under the fp32 tolerance. Timings on a shared machine
are indicative only: the env line records the CPU and the load average. With `--threads 1` each
row also has the calling thread's CPU time (`*_thread_cpu_ms`), which other processes' load barely
moves: the fairer comparison on a busy machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SPEC = """
attention {name} {{
  dtype fp32
  head_dim {D}
  heads {H} kv {HKV}
  kind {kind}
{extra}}}
"""


def _variant(name: str, D: int, H: int, HKV: int, kind: str = "self", extra: str = ""):
    from attngen.lang.frontend import loads

    return loads(SPEC.format(name=name, D=D, H=H, HKV=HKV, kind=kind, extra=extra)).get()


def _time(fn, repeats: int) -> tuple[float, float, float]:
    """Median and min wall ms, and the min CPU ms of the calling thread (the whole call's CPU time
    with one thread: it barely moves when other processes load the machine)."""
    fn()
    ts, cs = [], []
    for _ in range(repeats):
        c0, t0 = time.thread_time(), time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
        cs.append(time.thread_time() - c0)
    return float(np.median(ts)) * 1e3, float(np.min(ts)) * 1e3, float(np.min(cs)) * 1e3


def _cases(quick: bool):
    Ls = (128, 512, 2048) if quick else (128, 512, 2048, 4096)
    for D in (64, 128):
        for L in Ls:
            H = 16 if L <= 512 else 8
            B = 4 if L <= 512 else 1
            yield f"dense_d{D}_L{L}", _variant(f"dense_d{D}", D, H, H), B, L, L, None
            yield f"causal_d{D}_L{L}", _variant(f"causal_d{D}", D, H, H, extra="  mask causal\n"), B, L, L, "causal"
    yield "window256_d64_L2048", _variant("win", 64, 8, 8, extra="  mask causal && q - kv < 256\n"), 1, 2048, 2048, "window"
    yield "documents_d64_L2048", _variant("docs", 64, 8, 8, extra="  input doc: i32[B, Lk] sorted\n  mask document(doc)\n"), \
        1, 2048, 2048, "document"
    yield "alibi_causal_d64_L2048", _variant("alibi", 64, 8, 8, extra="  mask causal\n  score alibi\n"), 1, 2048, 2048, "alibi"
    yield "decode_gqa32x8_d128_Lk4096", _variant("dec", 128, 32, 8, kind="cross"), 1, 1, 4096, "decode"
    yield "seed_padding_d64_L128", _variant("seed", 64, 8, 8, extra="  mask padding\n"), 4, 128, 128, "padding"


def _torch_args(v, kind, arrays, torch):
    """SDPA's arguments for the same problem: q, k, v (k/v repeated for GQA) and the mask."""
    from attngen.check import reference

    q, k, vv = (torch.from_numpy(arrays[n]) for n in ("q", "k", "v"))
    if v.group_size > 1:
        k, vv = k.repeat_interleave(v.group_size, 1), vv.repeat_interleave(v.group_size, 1)
    rest = {n: a for n, a in arrays.items() if n not in ("q", "k", "v")}
    kw = {}
    if kind == "causal":
        kw["is_causal"] = True
    elif kind in ("window", "document", "padding"):
        from attngen.ir.abi import Sizes

        B, _, Lq, _ = q.shape
        m = reference.mask_matrix(v, Sizes(B, Lq, k.shape[2]), rest, h=0)  # [B, Lq, Lk]
        kw["attn_mask"] = torch.from_numpy(np.ascontiguousarray(m))[:, None]
    elif kind == "alibi":
        slopes = torch.tensor(reference.standard_alibi_slopes(v.heads), dtype=torch.float32)
        L = q.shape[2]
        pos = torch.arange(L)
        bias = slopes[:, None, None] * (pos[None, None, :] - pos[None, :, None]).float()
        bias = bias.masked_fill(pos[None, None, :] > pos[None, :, None], float("-inf"))
        kw["attn_mask"] = bias[None]
    return q, k, vv, kw


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="threads for both (default: the CPU count)")
    ap.add_argument("--quick", action="store_true", help="skip the 4k rows")
    ap.add_argument("--repeats", type=int, default=7, help="timed calls a row (the median is reported)")
    ap.add_argument("--only", default=None, help="run the rows whose name contains this")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "cpu.jsonl"), help="the JSON-lines file to write")
    args = ap.parse_args()

    import torch

    import attngen
    from attngen.check import tolerance, workload

    torch.set_num_threads(args.threads)
    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else platform.processor()
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    rows = [{"kind": "env", "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "cpu": cpu,
             "cpus": os.cpu_count(), "threads": args.threads, "loadavg": os.getloadavg(), "torch": torch.__version__,
             "commit": commit}]
    for name, v, B, Lq, Lk, kind in _cases(args.quick):
        if args.only and args.only not in name:
            continue
        k = attngen.compile(v, device="cpu")
        arrays = workload.make_inputs(v, B, Lq, Lk, np.random.default_rng(0))
        rest = {n: a for n, a in arrays.items() if n not in ("q", "k", "v")}
        ours_ms, ours_min, ours_cpu = _time(lambda: k(arrays["q"], arrays["k"], arrays["v"], num_threads=args.threads, **rest), args.repeats)
        o = k(arrays["q"], arrays["k"], arrays["v"], num_threads=args.threads, **rest)
        tq, tk, tv, kw = _torch_args(v, kind, arrays, torch)
        sdpa = torch.nn.functional.scaled_dot_product_attention
        with torch.no_grad():
            peer_ms, peer_min, peer_cpu = _time(lambda: sdpa(tq, tk, tv, **kw), args.repeats)
            peer = sdpa(tq, tk, tv, **kw).numpy()
        rep = tolerance.check(o, peer, v.dtype, "attngen vs sdpa")
        row = {"kind": "row", "workload": name, "B": B, "H": v.heads, "Hkv": v.kv_heads, "Lq": Lq, "Lk": Lk, "D": v.head_dim,
               "dtype": "fp32", "threads": args.threads, "attngen_ms": ours_ms, "attngen_min_ms": ours_min,
               "sdpa_ms": peer_ms, "sdpa_min_ms": peer_min, "speedup": peer_ms / ours_ms,
               **({"attngen_thread_cpu_ms": ours_cpu, "sdpa_thread_cpu_ms": peer_cpu, "speedup_cpu": peer_cpu / ours_cpu}
                  if args.threads == 1 else {}),
               "sdpa_mask": "is_causal" if kind == "causal" else ("attn_mask" if kw else "none"),
               "agrees": bool(rep.ok), "check": rep.summary()}
        rows.append(row)
        cpu_part = f"  cpu {ours_cpu:8.2f} / {peer_cpu:8.2f} ms x{peer_cpu / ours_cpu:5.2f}" if args.threads == 1 else ""
        print(f"{name:30s} attngen {ours_ms:9.2f} ms  sdpa {peer_ms:9.2f} ms  x{peer_ms / ours_ms:5.2f}{cpu_part}  "
              f"{'agrees' if rep.ok else 'DISAGREES'}", flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
