"""Per-kernel GPU time of suite rows through torch.profiler (the kernels of one call: norm prep
kernels and the attention kernel), to say where a row's time goes.

    python3 tools/profile_suite_row.py qk_norm_causal_d128 causal_d128 [--iters 5]

Each row's inputs are the suite's (random normal, runtime inputs from its workload); one warm-up
call, then `--iters` profiled calls; prints each kernel's mean time per call."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("rows", nargs="+")
    p.add_argument("--iters", type=int, default=5)
    args = p.parse_args(argv)
    import torch
    from torch.profiler import ProfilerActivity, profile

    import suite
    from attngen.check import fuzz
    from attngen.lang import frontend
    from attngen.runtime import kernel as runtime
    from attngen.tools import bench

    work = {w.name: w for w in suite.WORKLOADS}
    for name in args.rows:
        wl = work[name]
        v = frontend.loads(suite.SPECS[wl.spec], "<suite>").get()
        k = runtime.compile(v, family="forward")
        ins = bench.device_qkv(v, wl.B, wl.Lq, wl.Lk, 0)
        # The suite's runtime inputs: its workload's own where it has them, else bench_shape's default.
        host = wl.inputs(v, wl.B, wl.Lq, wl.Lk) if wl.inputs else bench.host_runtime_inputs(v, wl.B, wl.Lq, wl.Lk, 0)
        rt = {n: fuzz.to_device(a) for n, a in host.items()}
        k(ins["q"], ins["k"], ins["v"], **rt)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(args.iters):
                k(ins["q"], ins["k"], ins["v"], **rt)
            torch.cuda.synchronize()
        tot = 0.0
        print(f"{name} (B{wl.B} Lq{wl.Lq} Lk{wl.Lk}), mean per call over {args.iters}:")
        for e in prof.key_averages():
            t = e.device_time_total / args.iters if hasattr(e, "device_time_total") else e.cuda_time_total / args.iters
            if t <= 0:
                continue
            tot += t
            print(f"  {t:9.1f} us  x{e.count // args.iters}  {e.key[:90]}")
        print(f"  {tot:9.1f} us  in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
