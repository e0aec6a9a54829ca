"""The mma.sync engines' mask split by axis (`emit.split_by_axis`) against the per-element form, on
the GPU: forward and backward, same process, outputs compared; and the wgmma backward's (the same
split, at head dim 64 inside the products).

    python benchmarks/mma_split_ab.py [--out PATH] [--iters N] [--head-dims 64,128]

The mma.sync forward (sm_80-89's engine; on an H200 the tile `128 x 64 x 4 warps`, sm_80's `tile
auto`, selects it), the mma.sync dK/dV backward (`engine=BwdEngine.MMA`) and the wgmma one
(`engine=BwdEngine.WGMMA`, sm_90a's default) of bf16 B8 H16 L4096
self attention under masks that read tensors: 16 random documents a row with causal (the suite's
document rows), documents of 1024 tokens, a prefix-LM (`causal || prefix(plen[b])`, a quarter of
each row a prefix) and padding (random lengths). Modes: `split` (the rendered default where the
head dim is at most `render.MMA_SPLIT_MAX_HEAD_DIM`, forced above it) and `plain` (the per-element
form: `render._fwd_split` / `render_bwd._bwd_split_ctx` answering None). Each mode compiles its
own variant name so that no cache hands one mode's kernel to the other. O, dK and dV (both
backward engines) are compared bit for bit against `plain` (the masks are the same booleans); dQ
by its max difference (fp32 sums in a different order). JSON lines; `results/` keeps the committed runs."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for p in (ROOT, ROOT / "benchmarks"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import numpy as np  # noqa: E402

from _queued import queued_ms  # noqa: E402
from suite import _documents  # noqa: E402

B, H, L = 8, 16, 4096
TILE = "tile block_m 128 block_n 64 warps 4 stages 2"


def _cases(rng: np.random.Generator) -> list[tuple[str, str, dict[str, np.ndarray]]]:
    """(label, the spec's input and mask lines, runtime inputs) of each case."""
    uniform = np.repeat(np.arange(L // 1024, dtype=np.int32), 1024)[None, :].repeat(B, 0).copy()
    return [
        ("doc_random", "input doc: i32[B, Lk] sorted; mask document(doc) && causal", _documents(None, B, L, L)),
        ("doc_uniform1024", "input doc: i32[B, Lk] sorted; mask document(doc) && causal", {"doc": uniform}),
        ("prefix_lm", "input plen: i32[B]; mask causal || prefix(plen[b])", {"plen": np.full(B, L // 4, np.int32)}),
        ("padding", "mask padding", {"q_lens": rng.integers(L // 2, L + 1, B).astype(np.int32),
                                      "kv_lens": rng.integers(L // 2, L + 1, B).astype(np.int32)}),
    ]


@contextlib.contextmanager
def _mode(mode: str):
    from attngen.cuda import render, render_bwd

    saved = (render._fwd_split, render_bwd._bwd_split_ctx, render.MMA_SPLIT_MAX_HEAD_DIM, render_bwd.MMA_SPLIT_MAX_HEAD_DIM)
    try:
        if mode == "plain":
            render._fwd_split = lambda *a: None
            render_bwd._bwd_split_ctx = lambda *a: None
        else:
            render.MMA_SPLIT_MAX_HEAD_DIM = render_bwd.MMA_SPLIT_MAX_HEAD_DIM = 1 << 30
        yield
    finally:
        render._fwd_split, render_bwd._bwd_split_ctx, render.MMA_SPLIT_MAX_HEAD_DIM, render_bwd.MMA_SPLIT_MAX_HEAD_DIM = saved


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "/tmp"), "mma_split_ab.jsonl"))
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--head-dims", default="64,128")
    args = ap.parse_args(argv)
    try:
        import torch
    except Exception as e:
        print(f"mma_split_ab: needs torch ({e})", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("mma_split_ab: no GPU", file=sys.stderr)
        return 2
    from attngen.lang import frontend
    from attngen.plan.bwd import BwdEngine
    from attngen.runtime import kernel as runtime
    from attngen.runtime.bwd import backward

    out = open(args.out, "w", encoding="utf-8")
    bad = 0
    for D in (int(x) for x in args.head_dims.split(",")):
        for label, mask, rt in _cases(np.random.default_rng(D)):
            g = torch.Generator(device="cuda").manual_seed(D)
            q, k, vv, dO = (torch.randn(B, H, L, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4))
            ins = {n: torch.from_numpy(a).cuda() for n, a in rt.items()}
            res = {}
            for mode in ("plain", "split"):
                text = f"attention mma_{mode}_{label}_d{D} {{ dtype bf16; head_dim {D}; heads {H}; {mask}; output lse; {TILE} }}"
                v = frontend.loads(text, "<mma_split_ab>").get()
                with _mode(mode):
                    kern = runtime.compile(v, family="forward")
                    src = kern.source if hasattr(kern, "source") else ""
                    o, lse = kern(q, k, vv, **ins)
                    grads = backward(kern, q, k, vv, dO, o=o, lse=lse, engine=BwdEngine.MMA, **ins)
                    torch.cuda.synchronize()
                    wg_grads = backward(kern, q, k, vv, dO, o=o, lse=lse, engine=BwdEngine.WGMMA, **ins)
                    torch.cuda.synchronize()
                    fwd_ms = queued_ms(lambda: kern(q, k, vv, check_inputs=False, **ins), args.iters)  # checked once above
                    bwd_ms = queued_ms(lambda: backward(kern, q, k, vv, dO, o=o, lse=lse, engine=BwdEngine.MMA, **ins), args.iters)
                    wg_ms = queued_ms(lambda: backward(kern, q, k, vv, dO, o=o, lse=lse, engine=BwdEngine.WGMMA, **ins), args.iters)
                res[mode] = dict(o=o, grads=grads, wg_grads=wg_grads, fwd_ms=fwd_ms, bwd_ms=bwd_ms, wg_ms=wg_ms,
                                 engine=kern.plan.engine.value, split_in_source=("emit.split_by_axis" in src) if src else None)
            p, s = res["plain"], res["split"]
            diff = {"o": float((p["o"].float() - s["o"].float()).abs().max())}
            for n, a, b in zip(("dq", "dk", "dv"), p["grads"], s["grads"]):
                diff[n] = float((a.float() - b.float()).abs().max())
            for n, a, b in zip(("wg_dq", "wg_dk", "wg_dv"), p["wg_grads"], s["wg_grads"]):
                diff[n] = float((a.float() - b.float()).abs().max())
            bad += any(diff[n] != 0 for n in ("o", "dk", "dv", "wg_dk", "wg_dv"))
            row = {"case": label, "D": D, "B": B, "H": H, "L": L, "tile": TILE, "engine": s["engine"],
                   "plain_fwd_ms": p["fwd_ms"], "split_fwd_ms": s["fwd_ms"], "fwd_speedup": p["fwd_ms"] / s["fwd_ms"],
                   "plain_bwd_ms": p["bwd_ms"], "split_bwd_ms": s["bwd_ms"], "bwd_speedup": p["bwd_ms"] / s["bwd_ms"],
                   "plain_wgmma_bwd_ms": p["wg_ms"], "split_wgmma_bwd_ms": s["wg_ms"], "wgmma_bwd_speedup": p["wg_ms"] / s["wg_ms"],
                   "maxdiff_split_vs_plain": diff, "split_in_source": s["split_in_source"],
                   "torch": torch.__version__, "device": torch.cuda.get_device_name()}
            out.write(json.dumps(row) + "\n")
            out.flush()
            print(f"D{D} {label:16s} fwd {p['fwd_ms']:.3f} -> {s['fwd_ms']:.3f} ms ({row['fwd_speedup']:.2f}x)  "
                  f"bwd {p['bwd_ms']:.3f} -> {s['bwd_ms']:.3f} ms ({row['bwd_speedup']:.2f}x)  "
                  f"wgmma bwd {p['wg_ms']:.3f} -> {s['wg_ms']:.3f} ms ({row['wgmma_bwd_speedup']:.2f}x)  diff {diff}", flush=True)
    out.close()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
