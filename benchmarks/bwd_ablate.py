"""Where the wgmma backward's time goes (issue 14): the whole backward of a row timed with parts of
its dK/dV kernel's step taken out of the rendered source, one at a time. The ablated kernels compute
wrong gradients; only their time means anything, as the share of the step each part costs on the
critical path.

    python benchmarks/bwd_ablate.py [--out PATH] [--iters N] [--only ROW ...] [--ablations A ...]

Ablations (each a text edit of the rendered source, refused if its text is not found):
  base          the kernel as rendered;
  no_dq_red     the dQ product and its hand-off stay, the dQ warpgroup's bulk reduction of each
                row into ws_dq goes;
  no_dq         the whole dQ part goes: the barrier that publishes dS^T, the dQ product, the
                hand-off (the step's last wait stays);
  no_dq_bar     only that barrier goes (the dQ product reads dS^T half written);
  no_dq_store   the consumers' stores of their dQ rows into the shared buffer go; the barriers of
                the hand-off and the header stay (the dQ warpgroup adds stale rows);
  no_dq_handoff the whole hand-off goes (the EMPTY wait, the stores, the FULL arrive): the dQ
                product stays, and the dQ warpgroup sees only the stop header;
  no_loop_bar   the barrier at the top of each step goes (stage buffers race);
  no_exp        P = exp2(x) becomes P = x (the MUFU work of the softmax);
  no_steps      the dK/dV kernel's loop over its query tiles goes: what is left is each CTA's
                fixed cost (K/V in, the first walk, dK/dV out) and the pre and finish kernels;
  no_dkdv       the dK/dV kernel returns at once: the pre and finish kernels, the workspace
                clearing and the launches alone.
An ablation whose text the kernel lacks is recorded as skipped. The cuts that remove the hand-off
also keep the dQ buffer index at 0, so that the stop header lands in the buffer the dQ warpgroup
waits on first (an odd step count would hang it). The kernel's dQ reductions are its one mode
(docs/DECISIONS.md#dq-reductions).
Rows: the backward bench's D128 B2 H16 L16k dense and causal, its D128 B16 H16 L2k causal, and a
1024-key causal sliding window at D128 B2 H16 L16k.
Inputs random normal; every timed launch queued behind a spin kernel. Results: JSON to PATH
(default $OUT/h200_bwd_ablate.json if $OUT is set, else benchmarks/results/h200_bwd_ablate.json)
and a table.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from _queued import queued_ms  # noqa: E402  (beside this script)

from attngen.plan import bwd as plan_bwd  # noqa: E402

H, D = 16, 128
# row: (mask line, B, L)
ROWS = {"d128_l16k_dense": ("mask true", 2, 16384), "d128_l16k_causal": ("mask causal", 2, 16384),
        "d128_l2k_causal": ("mask causal", 16, 2048), "d128_l16k_window": ("mask causal && window(1023, 0)", 2, 16384)}

# the consumer warpgroups' named barrier (the dQ warpgroup stays out of it)
_BAR = "ag_nbar_sync(CONS_BAR, WG_THREADS);"
_DQ_START = f"  ag_fence_proxy_async();\n  {_BAR}\n  {{\n    float dq[DQ_N / 2];"
_DQ_END = "\n  }\n  ag_reg_fence(dv);"
# the dQ warpgroup's bulk reduction a row
_RED = "ag_bulk_reduce_add(p.ws_dq + (row0 + r) * D, base + SDQ_OFF + (unsigned)(buf * SDQ_BUF_BYTES + r * DQ_ROW_LD * 4), D * 4);"
# the consumers' stores of their dQ rows into the hand-off buffer
_STORE = ("#pragma unroll\n        for (int j = 0; j < DQ_N / 8; ++j) *reinterpret_cast<float2*>(r + j * 8) = "
          "make_float2(SCALE * dq[4 * j + 2 * half], SCALE * dq[4 * j + 2 * half + 1]);\n")
_WG_HANDOFF = ("    ag_nbar_sync(DQ_EMPTY_BAR + dq_buf, WG_CTA_THREADS);\n", "    ag_nbar_arrive(DQ_FULL_BAR + dq_buf, WG_CTA_THREADS);\n")
_WG_TURN = "    dq_buf ^= 1;\n"
_STEPS = "  while (cur < end) {\n    const int cp = ag_walk_pair(cur, off, end);"
_DKDV = "  const int k0 = blockIdx.x * WG_BLOCK_N, hk = blockIdx.y, b = blockIdx.z;\n  if (k0 >= p.Lk) return;"
_LOOP_BAR = ("    // This step's tiles have landed (and are visible to wgmma), and every warp is done with the\n"
             "    // previous step (its stage buffers and dS^T: each step waits for its products), so the next\n"
             f"    // step may load into the other stage.\n    {_BAR}\n")
_EXP = "ag_ex2(s[4 * j + e] * (SCALE * LOG2E) - sl[qc])"


def ablate(src: str, what: str) -> str:
    """`src` with the part `what` taken out (see the module doc); ValueError if its text is absent."""
    def need(s: str) -> None:
        if src.count(s) != 1:
            raise ValueError(f"ablation {what}: expected text found {src.count(s)} times: {s[:60]!r}")

    if what == "base":
        return src

    if what == "no_dq_red":
        need(_RED)
        return src.replace(_RED, ";")
    if what == "no_dq":  # the hand-off goes too: the dQ warpgroup sees only the last header
        need(_DQ_START)
        a = src.index(_DQ_START)
        e = src.index(_DQ_END, a)
        # the next step's loads, issued under the dQ product (WgPrefetch.UNDER_DQ), stay
        keep = "  prefetch();\n" if "    prefetch();\n" in src[a:e] else ""
        return src[:a] + keep + "  ag_wgmma_wait<0>();" + src[e + len("\n  }"):].replace(_WG_TURN, "")
    if what == "no_dq_bar":
        need(_DQ_START)
        return src.replace(_DQ_START, _DQ_START.replace(f"  {_BAR}\n", "", 1))
    if what == "no_dq_store":
        need(_STORE)
        return src.replace(_STORE, "")
    if what == "no_dq_handoff":
        for part in (*_WG_HANDOFF, _WG_TURN):
            need(part)
        a = src.index(_WG_HANDOFF[0])
        e = src.index(_WG_HANDOFF[1], a) + len(_WG_HANDOFF[1])
        return (src[:a] + src[e:]).replace(_WG_TURN, "")
    if what == "no_loop_bar":
        need(_LOOP_BAR)
        return src.replace(_LOOP_BAR, _LOOP_BAR.replace(f"    {_BAR}\n", ""))
    if what == "no_exp":
        need(_EXP)
        return src.replace(_EXP, "(s[4 * j + e] * (SCALE * LOG2E) - sl[qc])")
    if what == "no_steps":
        need(_STEPS)
        return src.replace(_STEPS, "  while (cur < 0) {  // ablation no_steps: never\n    const int cp = ag_walk_pair(cur, off, end);")
    if what == "no_dkdv":
        need(_DKDV)
        return src.replace(_DKDV, _DKDV + "\n  return;  // ablation no_dkdv")
    raise ValueError(f"unknown ablation {what}")


ABLATIONS = ("base", "no_dq_red", "no_dq", "no_dq_bar", "no_dq_store", "no_dq_handoff", "no_loop_bar", "no_exp", "no_steps",
             "no_dkdv")


def spec_text(name: str) -> str:
    return f"attention {name} {{\n  dtype bf16\n  head_dim {D}\n  heads {H}\n  {ROWS[name][0]}\n  output lse\n}}\n"


def _row(name: str, iters: int, ablations: tuple[str, ...] = ABLATIONS) -> list[dict]:
    import torch

    from attngen.cuda import render_bwd
    from attngen.lang import frontend
    from attngen.runtime import bwd as rbwd
    from attngen.runtime import kernel as runtime
    from attngen.tools.bench import visible_fraction

    v = frontend.loads(spec_text(name), "<bwd-ablate>").get()
    kern = runtime.compile(v)
    g = torch.Generator(device="cuda").manual_seed(0)
    _, B, L = ROWS[name]
    q, k, vv, dO = (torch.randn(B, H, L, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4))
    o, lse = kern(q, k, vv)
    # TFLOP/s of the visible work (the window's share counted exactly), as the other backward benches
    visible = float(visible_fraction(v, B, L, L, {}))
    flops = 2.5 * 4.0 * B * H * L * L * D * visible
    real = render_bwd.render_with_plan
    src, _ = real(v, kern.plan.arch)
    out = []
    try:
        for what in ablations:
            try:
                ablate(src, what)
            except ValueError as e:  # the kernel has no such part
                out.append({"row": name, "ablation": what, "skipped": str(e)})
                print(f"{name:18s} {what:12s} skipped: {e}", flush=True)
                continue
            rbwd._CACHE.clear()
            rbwd.render_with_plan = lambda *a, _w=what, **kw: (lambda sb: (ablate(sb[0], _w), sb[1]))(real(*a, **kw))
            ms = queued_ms(lambda: rbwd.backward(kern, q, k, vv, dO, o=o, lse=lse), iters)
            out.append({"row": name, "ablation": what, "ms": ms, "tflops": flops / ms / 1e9, "B": B, "H": H, "L": L, "D": D,
                        "visible": visible, "wg_dq": str(plan_bwd.wg_dq_mode(D, D).value), "device": torch.cuda.get_device_name()})
            print(f"{name:18s} {what:12s} {ms:8.3f} ms {flops / ms / 1e9:6.1f} TFLOP/s", flush=True)
    finally:
        rbwd.render_with_plan = real
        rbwd._CACHE.clear()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--only", choices=sorted(ROWS), nargs="*", default=None)
    ap.add_argument("--ablations", choices=ABLATIONS, nargs="*", default=None)
    args = ap.parse_args()
    from attngen.check import fuzz

    ok, why = fuzz.gpu_status()
    if not ok:
        print(f"bwd_ablate: no GPU ({why}); nothing to time", file=sys.stderr)
        return 2
    results = [r for name in args.only or list(ROWS) for r in _row(name, args.iters, tuple(args.ablations or ABLATIONS))]
    out = args.out or (os.path.join(os.environ["OUT"], "h200_bwd_ablate.json") if os.environ.get("OUT")
                       else str(ROOT / "benchmarks/results/h200_bwd_ablate.json"))
    Path(out).write_text(json.dumps(results, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
