"""One backward each of our wgmma dK/dV kernel (dQ modes red2, tile, wg and wgbulk, some with parts of
their dQ path cut out by benchmarks/bwd_ablate.py) and of cuDNN's (torch SDPA), D128 B2 H16 L16k
dense bf16, for ncu (issue 14): where the dQ path's cost sits (L2 reduction traffic, memory-pipe
stalls, the tensor pipe idle); `--shape B H L D` and `--causal` profile another problem.

    ncu --profile-from-start off --kernel-name regex:'dkdv|cudnn|bprop|sm90' --section SpeedOfLight \\
        ... python3 tools/ncu_bwd.py [--only LABEL ...]
    python3 tools/ncu_bwd.py --list            # the cases, no GPU work

Each case compiles, runs one backward outside `cudaProfilerStart/Stop` (ncu's `--profile-from-start
off` skips it), checks its gradients against cuDNN's (the cut kernel is expected to disagree and is
reported, not failed), then runs one profiled backward. Inputs are random normal (never zeros)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for p in (ROOT, ROOT / "benchmarks"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

# (label, dQ mode, ablation of benchmarks/bwd_ablate.py)
CASES = (("red2", "red2", "base"), ("tile", "tile", "base"), ("red2_no_dq_red", "red2", "no_dq_red"),
         ("wg", "wg", "base"), ("wg_no_dq_red", "wg", "no_dq_red"), ("wg_no_dq_store", "wg", "no_dq_store"),
         ("wg_no_dq_handoff", "wg", "no_dq_handoff"), ("wg_no_dq", "wg", "no_dq"),
         ("wgbulk", "wgbulk", "base"), ("wgbulk_no_dq_store", "wgbulk", "no_dq_store"),
         ("wgbulk_no_dq_handoff", "wgbulk", "no_dq_handoff"), ("wgbulk_no_dq", "wgbulk", "no_dq"))
B, H, L, D = 2, 16, 16384, 128


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--list", action="store_true", help="print the cases and exit")
    p.add_argument("--only", nargs="+", choices=[c[0] for c in CASES], help="these cases (default: all)")
    p.add_argument("--shape", nargs=4, type=int, metavar=("B", "H", "L", "D"), default=(B, H, L, D),
                   help=f"the problem (default {B} {H} {L} {D})")
    p.add_argument("--causal", action="store_true", help="mask causal (default: dense)")
    args = p.parse_args(argv)
    b_, h_, l_, d_ = args.shape
    cases = [c for c in CASES if not args.only or c[0] in args.only]
    if args.list:
        for c in cases:
            print(c)
        return 0
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from attngen.cuda import render_bwd
    from attngen.lang import frontend
    from attngen.plan import bwd as plan_bwd
    from attngen.runtime import bwd as rbwd
    from attngen.runtime import kernel as runtime
    from bwd_ablate import ablate

    mask = "\n  mask causal" if args.causal else ""
    spec = f"attention ncubwd {{\n  dtype bf16\n  head_dim {d_}\n  heads {h_}{mask}\n  output lse\n}}\n"
    v = frontend.loads(spec, "<ncu-bwd>").get()
    kern = runtime.compile(v)
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, vv, dO = (torch.randn(b_, h_, l_, d_, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4))
    o, lse = kern(q, k, vv)
    qg, kg, vg = (x.detach().clone().requires_grad_(True) for x in (q, k, vv))
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        out = F.scaled_dot_product_attention(qg, kg, vg, is_causal=args.causal)
        peer = lambda: torch.autograd.grad(out, (qg, kg, vg), dO, retain_graph=True)  # noqa: E731
        want = peer()
    real = render_bwd.render_with_plan
    bad = 0
    try:
        for label, mode, what in cases:
            plan_bwd.force_wg_dq(mode)
            rbwd._CACHE.clear()
            rbwd.render_with_plan = lambda *a, _w=what, **kw: (lambda sb: (ablate(sb[0], _w), sb[1]))(real(*a, **kw))
            got = rbwd.backward(kern, q, k, vv, dO, o=o, lse=lse)
            torch.cuda.synchronize()
            err = max(float((a.float() - b.float()).abs().max() / b.float().abs().max()) for a, b in zip(got, want))
            ok = err < 0.01
            if what == "base" and not ok:
                bad += 1
            print(f"{label}: max error / max |cuDNN| over dq, dk, dv = {err:.3g} "
                  f"({'ok' if ok else 'expected: dQ cut' if what != 'base' else 'DISAGREE'})", flush=True)
            del got
            torch.cuda.cudart().cudaProfilerStart()
            rbwd.backward(kern, q, k, vv, dO, o=o, lse=lse)
            torch.cuda.synchronize()
            torch.cuda.cudart().cudaProfilerStop()
    finally:
        rbwd.render_with_plan = real
        rbwd._CACHE.clear()
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        torch.cuda.cudart().cudaProfilerStart()
        peer()
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()
    print("cudnn: one profiled backward", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
