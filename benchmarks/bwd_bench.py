"""Backward benchmark (issue 14): attngen's backward against torch SDPA's backward under cuDNN and
FlashAttention-2 (SDPA flash), same run, bf16.

    python benchmarks/bwd_bench.py [--out PATH] [--iters N] [--only ROW --once] [--also-engine mma|wgmma]
                                   [--alt-templates DIR] [--also-loads tma|cp.async]

Rows: D128 B2 H16 L16k dense and causal, D64 B8 H16 L4k dense and causal, D128 B16 H16 L2k causal.
TFLOP/s count the backward as 2.5x the forward's 4 B H Lq Lk D (causal: half), the FlashAttention
convention. attngen's time is its whole backward (pre, dK/dV, finish kernels and the workspace
allocations of `attngen.runtime.bwd.backward`), given the forward's saved O and LSE; the peers'
is torch.autograd.grad through F.scaled_dot_product_attention with the graph retained. Inputs are
random normal (never zeros); every timed launch is queued behind a spin kernel, events around
them, median over rounds. attngen's dq, dk, dv are compared with cuDNN's (max error over the
largest magnitude) before timing. Results: JSON to PATH (default $OUT/h200_bwd.json if $OUT is
set, else benchmarks/results/h200_bwd.json) and a table on stdout. `--only ROW --once` runs one
backward of one row (for a profiler).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from _queued import queued_ms  # noqa: E402  (beside this script)

ROWS = {
    "d128_b2_h16_l16k_dense": (128, 2, 16, 16384, False),
    "d128_b2_h16_l16k_causal": (128, 2, 16, 16384, True),
    "d64_b8_h16_l4k_dense": (64, 8, 16, 4096, False),
    "d64_b8_h16_l4k_causal": (64, 8, 16, 4096, True),
    "d128_b16_h16_l2k_causal": (128, 16, 16, 2048, True),
}


def _spec(D: int, H: int, causal: bool) -> str:
    mask = "\n  mask causal" if causal else ""
    return f"attention bwdbench {{\n  dtype bf16\n  head_dim {D}\n  heads {H}{mask}\n  output lse\n}}\n"


def _row(name: str, iters: int, once: bool, also: tuple[str, ...] = (), alt: str | None = None,
         also_loads: str | None = None) -> dict:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from attngen.lang import frontend
    from attngen.plan.bwd import plan as plan_bwd
    from attngen.runtime import kernel as runtime
    from attngen.runtime.bwd import backward

    D, B, H, L, causal = ROWS[name]
    v = frontend.loads(_spec(D, H, causal), "<bwd-bench>").get()
    kern = runtime.compile(v)
    bp = plan_bwd(v, kern.plan.arch)
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, vv, dO = (torch.randn(B, H, L, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4))
    o, lse = kern(q, k, vv)
    ours = lambda: backward(kern, q, k, vv, dO, o=o, lse=lse)  # noqa: E731
    if once:
        ours()
        torch.cuda.synchronize()
        return {}
    fwd_flops = 4.0 * B * H * L * L * D * (0.5 if causal else 1.0)
    bwd_flops = 2.5 * fwd_flops
    res = {"row": name, "D": D, "B": B, "H": H, "L": L, "causal": causal, "dtype": "bf16",
           "engine": bp.engine.value, "wg_loads": bp.backward.wg_loads.value if bp.backward.wg_loads else None, "tc_block_n": bp.backward.tc_block_n, "tc_rotate": bp.backward.tc_rotate, "bwd_flops": bwd_flops, "torch": torch.__version__, "device": torch.cuda.get_device_name()}
    qg, kg, vg = (x.detach().clone().requires_grad_(True) for x in (q, k, vv))
    for label, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("fa2", SDPBackend.FLASH_ATTENTION)):
        try:
            with sdpa_kernel(backend):
                out = F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal)
                peer = lambda: torch.autograd.grad(out, (qg, kg, vg), dO, retain_graph=True)  # noqa: E731
                if label == "cudnn":
                    want = peer()
                    got = ours()
                    res["max_rel_err_vs_cudnn"] = {
                        n: float((a.float() - b.float()).abs().max() / b.float().abs().max()) for n, a, b in zip(("dq", "dk", "dv"), got, want)}
                    del want, got
                ms = queued_ms(peer, iters)
            res[f"{label}_ms"] = ms
            res[f"{label}_tflops"] = bwd_flops / ms / 1e9
            del out
        except Exception as e:  # a backend that refuses the shape: recorded, not fatal
            res[f"{label}_error"] = f"{type(e).__name__}: {e}"[:300]
    ms = queued_ms(ours, iters)
    res["attngen_ms"] = ms
    res["attngen_tflops"] = bwd_flops / ms / 1e9
    for label in ("cudnn", "fa2"):
        if f"{label}_ms" in res:
            res[f"attngen_vs_{label}"] = res[f"{label}_ms"] / ms
    # Other dK/dV engines of the same backward, timed the same way (--also-engine).
    from attngen.plan.bwd import BwdEngine

    for eng in also:
        e = BwdEngine(eng)
        other = lambda e=e: backward(kern, q, k, vv, dO, o=o, lse=lse, engine=e)  # noqa: E731
        try:
            if "cudnn_ms" in res:
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    out = F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal)
                    want = torch.autograd.grad(out, (qg, kg, vg), dO)
                got = other()
                res[f"{eng}_max_rel_err_vs_cudnn"] = {
                    n: float((a.float() - b.float()).abs().max() / b.float().abs().max()) for n, a, b in zip(("dq", "dk", "dv"), got, want)}
                del want, got, out
            ms_e = queued_ms(other, iters)
            res[f"{eng}_ms"] = ms_e
            res[f"{eng}_tflops"] = bwd_flops / ms_e / 1e9
        except Exception as ex:  # an engine that refuses the variant: recorded, not fatal
            res[f"{eng}_error"] = f"{type(ex).__name__}: {ex}"[:300]
    # The wgmma kernel with its tiles copied the other way (--also-loads: plan_bwd.WG_LOADS, which
    # keys the backward's kernel cache; keys loads_<name>_*), timed the same way; its dK and dV (no
    # atomics) compared bit for bit with the default kernel's on the same inputs, and the default
    # timed again after (attngen_after_tflops: the clocks' drift).
    if also_loads:
        from attngen.plan import bwd as pb
        from attngen.plan.schedule import WgmmaLoads

        key = f"loads_{WgmmaLoads(also_loads).value}"
        base_loads = pb.WG_LOADS
        ref = ours()
        pb.WG_LOADS = WgmmaLoads(also_loads)
        try:
            got = ours()
            loads = pb.plan(v, kern.plan.arch).backward.wg_loads
            res[f"{key}_plan"] = loads.value if loads else None
            res[f"{key}_dk_dv_bit_identical"] = bool(torch.equal(got[1], ref[1]) and torch.equal(got[2], ref[2]))
            res[f"{key}_dq_max_rel_diff"] = float((got[0].float() - ref[0].float()).abs().max() / ref[0].float().abs().max())
            del got, ref
            ms_o = queued_ms(ours, iters)
            res[f"{key}_ms"] = ms_o
            res[f"{key}_tflops"] = bwd_flops / ms_o / 1e9
        finally:
            pb.WG_LOADS = base_loads
        res["attngen_after_tflops"] = bwd_flops / queued_ms(ours, iters) / 1e9
    # The same backward rendered from another template tree (--alt-templates: an A/B of a template
    # change in one process, beside the peers), timed the same way (keys alt_ms, alt_tflops).
    if alt:
        from attngen.cuda import render_bwd
        from attngen.runtime import bwd as rbwd

        real_env = render_bwd._environment
        render_bwd._environment = lambda: _alt_environment(alt)
        rbwd._CACHE.clear()
        try:
            got = ours()
            if "cudnn_ms" in res:
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    out = F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal)
                    want = torch.autograd.grad(out, (qg, kg, vg), dO)
                res["alt_max_rel_err_vs_cudnn"] = {
                    n: float((a.float() - b.float()).abs().max() / b.float().abs().max()) for n, a, b in zip(("dq", "dk", "dv"), got, want)}
                del want, out
            del got
            ms_a = queued_ms(ours, iters)
            res["alt_templates"] = alt
            res["alt_ms"] = ms_a
            res["alt_tflops"] = bwd_flops / ms_a / 1e9
        finally:
            render_bwd._environment = real_env
            rbwd._CACHE.clear()
    torch.cuda.empty_cache()
    return res


@functools.cache
def _alt_environment(root: str):
    """A jinja environment like attngen's (attngen.cuda.render._environment) over the templates
    under `root` (a copy of backends/cuda)."""
    import jinja2

    from attngen.cuda import render

    return render._environment().overlay(loader=jinja2.FileSystemLoader(root))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--only", choices=sorted(ROWS), action="append")
    ap.add_argument("--once", action="store_true", help="one attngen backward of each --only row, nothing timed")
    ap.add_argument("--tc-block-n", type=int, choices=[64, 128], default=None,
                    help="experiment: force the tensor-core kernel's key tile (the plan's choice otherwise)")
    ap.add_argument("--also-engine", choices=["mma", "wgmma"], action="append", default=[],
                    help="also time attngen's backward with this dK/dV engine (keys <engine>_ms, <engine>_tflops)")
    ap.add_argument("--alt-templates", metavar="DIR", default=None,
                    help="A/B: also time the backward rendered from the templates under DIR (a copy of backends/cuda, "
                         "e.g. an earlier commit's), in the same process (keys alt_ms, alt_tflops)")
    ap.add_argument("--also-loads", choices=["tma", "cp.async"], default=None,
                    help="A/B: also time the wgmma kernel copying its tiles this way (plan_bwd.WG_LOADS; keys loads_<name>_ms, _tflops)")
    args = ap.parse_args()
    if args.tc_block_n:
        from attngen.plan import bwd as plan_bwd

        plan_bwd.TC_BLOCK_N_CHOICES = (args.tc_block_n,)
    rows = args.only or list(ROWS)
    results = []
    for name in rows:
        r = _row(name, args.iters, args.once, tuple(args.also_engine), args.alt_templates, args.also_loads)
        if args.once:
            continue
        results.append(r)
        print(f"{name:28s} engine {r['engine']:4s}  attngen {r['attngen_tflops']:6.1f} TFLOP/s  "
              f"cuDNN {r.get('cudnn_tflops', float('nan')):6.1f}  FA2 {r.get('fa2_tflops', float('nan')):6.1f}  "
              f"x cuDNN {r.get('attngen_vs_cudnn', float('nan')):.2f}  x FA2 {r.get('attngen_vs_fa2', float('nan')):.2f}  "
              f"err vs cuDNN {r.get('max_rel_err_vs_cudnn')}"
              + "".join(f"  | {e} {r[e + '_tflops']:6.1f} TFLOP/s err {r.get(e + '_max_rel_err_vs_cudnn')}" if e + "_tflops" in r
                        else f"  | {e} {r.get(e + '_error')}" for e in args.also_engine)
              + (f"  | alt {r['alt_tflops']:6.1f} TFLOP/s err {r.get('alt_max_rel_err_vs_cudnn')}" if "alt_tflops" in r else "")
              + "".join(f"  | {k[6:-7]} {r[k]:6.1f} TFLOP/s (default after {r.get('attngen_after_tflops', 0):6.1f}; dK dV bit-identical "
                        f"{r.get(k[:-7] + '_dk_dv_bit_identical')})" for k in r if k.startswith("loads_") and k.endswith("_tflops")), flush=True)
    if args.once:
        return 0
    out = args.out or (os.path.join(os.environ["OUT"], "h200_bwd.json") if os.environ.get("OUT") else str(ROOT / "benchmarks/results/h200_bwd.json"))
    Path(out).write_text(json.dumps(results, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
