"""One launch each of our forward kernel and cuDNN's (torch SDPA) at the sweep's shapes, for ncu.

    ncu --kernel-name regex:'attngen|cudnn|sm90|fmha' --section SpeedOfLight ... python3 tools/ncu_fwd.py
    python3 tools/ncu_fwd.py --list            # the cases, no GPU work

Each case compiles our kernel and runs one warm-up launch of each implementation outside
`cudaProfilerStart/Stop` (so ncu's `--profile-from-start off` skips them), then one profiled launch
each, ours first. Inputs are random normal (never zeros); outputs are compared once, so a profile
of a wrong kernel cannot pass unnoticed. The cases are the length sweep's (bf16, H16, B*L = 32k)
cells where issue 16's bars are missed."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# (sweep config label, heads, kv heads, head dim, causal, L)
CASES = (
    ("d128_dense", 16, 16, 128, False, 1024),
    ("d64_causal", 16, 16, 64, True, 1024),
    ("d128_causal", 16, 16, 128, True, 2048),
    ("d128_dense", 16, 16, 128, False, 16384),
)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--list", action="store_true", help="print the cases and exit")
    args = p.parse_args(argv)
    if args.list:
        for c in CASES:
            print(c)
        return 0
    import torch

    from attngen.check import fuzz
    from attngen.lang import frontend
    from attngen.runtime import kernel as runtime
    from attngen.tools import bench
    from attngen.tools.bench_peers import sdpa_peer
    from benchmarks.sweep import TOKENS, spec

    bad = 0
    for label, heads, kv, d, causal, L in CASES:
        v = frontend.loads(spec(label, heads, kv, d, causal), f"<ncu:{label}>").get()
        kernel = runtime.compile(v)
        B = TOKENS // L
        ins = bench.device_qkv(v, B, L, L, seed=7)
        peer = sdpa_peer(v, "cudnn", L, L)
        run_peer = peer.make(ins)
        out = kernel(ins["q"], ins["k"], ins["v"])  # warm-up: lazy module load, the runtime's caches
        ref = run_peer()
        torch.cuda.synchronize()
        err = (torch.as_tensor(out, device="cuda").float() - ref.float()).abs().max().item()
        ok = err < 0.06
        bad += not ok
        k = kernel.short if kernel.short is not None and L <= kernel.short_max_lk else kernel
        t = k.tile
        print(f"{label} B{B} L{L}: max |ours - cuDNN| = {err:.3g} ({'ok' if ok else 'DISAGREE'}); our tile "
              f"{t.block_m} x {t.block_n} x {t.stages} stages, {t.warps} warps"
              f"{' (the short-loop kernel)' if k is not kernel else ''}", flush=True)
        torch.cuda.cudart().cudaProfilerStart()
        kernel(ins["q"], ins["k"], ins["v"])
        run_peer()
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()
        del ins, out, ref
        fuzz.synchronize()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
