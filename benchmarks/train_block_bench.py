"""Training-step benchmark (issue 14): a fused attngen block trained end to end (forward + backward
through the torch op, `attngen.runtime.torch`) against the same block unfused in torch under
torch.compile, and eager with SDPA pinned to cuDNN and to FlashAttention-2, in one run, bf16.

    python benchmarks/train_block_bench.py [--out PATH] [--iters N] [--only ROW] [--profile]

Rows:
  preln_cross  examples/whisper_preln_cross.attn (pre-LN cross attention: q = LayerNorm(x) over
               the H*D row, + x), B32 H16 Lq2048 Lk512 D64. Torch: F.layer_norm (fp32) -> SDPA -> + x.
  qk_norm      examples/qwen3_qk_norm.attn (RMSNorm per head on q and k, GQA 32/8, causal), B2
               L4096 D128. Torch: F.rms_norm (fp32) on q and k -> SDPA(is_causal, enable_gqa).

A step is y = block(inputs); torch.autograd.grad(y, every input, dY): the gradients of q (or the
hidden state x), k, v and the norm weights (and bias). Inputs random normal (never zeros), norm
weights 1 + 0.1 N(0, 1). Before timing, attngen's gradients are compared with the compiled torch
block's (max error over the largest magnitude, recorded). Every timed step is queued behind a spin
kernel, events around them, median over rounds. The issue's bar: attngen >= 1.5x torch.compile.
--profile adds each step's GPU kernels (torch.profiler, CUPTI: it sees CuPy's launches too), the
microseconds a step per kernel name for attngen and torch.compile, so a miss says where the time goes.
Results: JSON to PATH (default $OUT/train_block.json if $OUT is set, else
benchmarks/results/h200_train_block.json) and a table on stdout.
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

ROWS = {
    "preln_cross": ("whisper_preln_cross.attn", dict(B=32, Lq=2048, Lk=512)),
    "qk_norm": ("qwen3_qk_norm.attn", dict(B=2, Lq=4096, Lk=4096)),
}


def _inputs(name: str, v, B: int, Lq: int, Lk: int):
    """(the op's leaves by name, the torch block, dY)."""
    import torch
    import torch.nn.functional as F

    g = torch.Generator(device="cuda").manual_seed(0)
    bf = torch.bfloat16
    H, Hkv, D = v.heads, v.kv_heads, v.head_dim

    def rnd(*shape, dtype=bf):
        return torch.randn(*shape, device="cuda", dtype=dtype, generator=g)

    if name == "preln_cross":
        eps = v.norms[0].eps
        leaves = {"q": rnd(B, Lq, H * D), "k": rnd(B, Lk, Hkv, D), "v": rnd(B, Lk, Hkv, D),
                  "q_norm_weight": 1 + 0.1 * rnd(H * D, dtype=torch.float32), "q_norm_bias": 0.1 * rnd(H * D, dtype=torch.float32)}

        def block(q, k, vv, q_norm_weight, q_norm_bias):
            qn = F.layer_norm(q.float(), (H * D,), q_norm_weight, q_norm_bias, eps).to(bf)
            o = F.scaled_dot_product_attention(qn.view(B, Lq, H, D).transpose(1, 2), k.transpose(1, 2), vv.transpose(1, 2))
            return o.transpose(1, 2) + q.view(B, Lq, H, D)

        dY = rnd(B, Lq, H, D)
    else:
        eps = v.norms[0].eps
        leaves = {"q": rnd(B, H, Lq, D), "k": rnd(B, Hkv, Lk, D), "v": rnd(B, Hkv, Lk, D),
                  "q_norm_weight": 1 + 0.1 * rnd(D, dtype=torch.float32), "k_norm_weight": 1 + 0.1 * rnd(D, dtype=torch.float32)}

        def block(q, k, vv, q_norm_weight, k_norm_weight):
            qn = F.rms_norm(q.float(), (D,), q_norm_weight, eps).to(bf)
            kn = F.rms_norm(k.float(), (D,), k_norm_weight, eps).to(bf)
            return F.scaled_dot_product_attention(qn, kn, vv, is_causal=True, enable_gqa=True)

        dY = rnd(B, H, Lq, D)
    for t in leaves.values():
        t.requires_grad_(True)
    return leaves, block, dY


def _kernel_times(step, steps: int = 3) -> list[dict]:
    """GPU kernel time a step, per kernel name, heaviest first (after one untimed warm-up step)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    per: dict[str, list[float]] = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            t = per.setdefault(e.name, [0.0, 0])
            t[0] += e.time_range.elapsed_us()
            t[1] += 1
    rows = [{"kernel": n[:120], "us_per_step": round(t / steps, 1), "launches_per_step": c / steps} for n, (t, c) in per.items()]
    return sorted(rows, key=lambda r: -r["us_per_step"])


def _row(name: str, iters: int, profile_kernels: bool = False) -> dict:
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import attngen.runtime.torch as at
    from attngen.lang import frontend

    file, sizes = ROWS[name]
    v = frontend.load(ROOT / "examples" / file).get()
    B, Lq, Lk = sizes["B"], sizes["Lq"], sizes["Lk"]
    leaves, block, dY = _inputs(name, v, B, Lq, Lk)
    op = at.register(v)
    order = ["q", "k", "v", *op.input_names]
    args = [leaves[n] for n in order]
    torch_args = [leaves[n] for n in ("q", "k", "v")] + [leaves[n] for n in leaves if n not in ("q", "k", "v")]

    def step_attngen():
        return torch.autograd.grad(op(*args[:3], **dict(zip(op.input_names, args[3:]))), args, dY)

    compiled = torch.compile(block)

    def step_compiled():
        return torch.autograd.grad(compiled(*torch_args), torch_args, dY)

    def step_eager(backend):
        def run():
            with sdpa_kernel(backend):
                return torch.autograd.grad(block(*torch_args), torch_args, dY)
        return run

    # Correctness first: attngen's gradients against the compiled torch block's.
    got = dict(zip(order, step_attngen()))
    want = dict(zip(["q", "k", "v", *[n for n in leaves if n not in ("q", "k", "v")]], step_compiled()))
    errors = {}
    for n in want:
        a, b = got[n].float(), want[n].float()
        errors[n] = float((a - b).abs().max()) / max(1e-12, float(b.abs().max()))
    res = {"row": name, "spec": f"examples/{file}", **sizes, "H": v.heads, "Hkv": v.kv_heads, "D": v.head_dim,
           "grad_rel_error_vs_torch_compile": errors}
    res["attngen_ms"] = queued_ms(step_attngen, iters)
    res["torch_compile_ms"] = queued_ms(step_compiled, iters)
    for label, backend in (("torch_eager_cudnn_ms", SDPBackend.CUDNN_ATTENTION), ("torch_eager_flash_ms", SDPBackend.FLASH_ATTENTION)):
        try:
            res[label] = queued_ms(step_eager(backend), iters)
        except RuntimeError as e:  # a backend that does not take this shape (recorded, not fatal)
            res[label] = None
            res[label.replace("_ms", "_error")] = str(e).splitlines()[0][:200]
    if profile_kernels:
        res["attngen_kernels"] = _kernel_times(step_attngen)
        res["torch_compile_kernels"] = _kernel_times(step_compiled)
    res["speedup_vs_torch_compile"] = res["torch_compile_ms"] / res["attngen_ms"]
    res["meets_issue_bar_1_5x"] = res["speedup_vs_torch_compile"] >= 1.5
    return res


def main() -> int:
    import torch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--only", choices=sorted(ROWS), default=None)
    ap.add_argument("--profile", action="store_true", help="record each step's kernels (torch.profiler)")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("train_block_bench: needs a CUDA GPU", file=sys.stderr)
        return 2
    rows = [_row(n, a.iters, a.profile) for n in ([a.only] if a.only else ROWS)]
    out = Path(a.out) if a.out else (Path(os.environ["OUT"]) / "train_block.json" if os.environ.get("OUT")
                                     else ROOT / "benchmarks" / "results" / "h200_train_block.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "dtype": "bf16", "rows": rows}
    out.write_text(json.dumps(meta, indent=2) + "\n")
    print(f"{'row':<12} {'attngen ms':>11} {'compile ms':>11} {'cudnn ms':>9} {'flash ms':>9} {'x compile':>9}  max rel grad err")
    for r in rows:
        fmt = lambda x: f"{x:9.3f}" if isinstance(x, float) else f"{'-':>9}"  # noqa: E731
        print(f"{r['row']:<12} {r['attngen_ms']:11.3f} {r['torch_compile_ms']:11.3f} {fmt(r['torch_eager_cudnn_ms'])} "
              f"{fmt(r['torch_eager_flash_ms'])} {r['speedup_vs_torch_compile']:9.2f}  {max(r['grad_rel_error_vs_torch_compile'].values()):.3g}")
    for r in rows:
        for side in ("attngen_kernels", "torch_compile_kernels"):
            if side in r:
                print(f"-- {r['row']} {side} (us a step, launches):")
                for k in r[side][:10]:
                    print(f"   {k['us_per_step']:9.1f} {k['launches_per_step']:5.1f}  {k['kernel'][:90]}")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
