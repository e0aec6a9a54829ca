"""Varlen prefill benchmark (issue 15): attngen `layout varlen` against attngen dense on equal work
and against torch's varlen peer, same run.

    python benchmarks/varlen_bench.py [--out PATH] [--iters N] [--seeds 3] [--tokens 32768]

Causal self attention, bf16, D128, H16 (examples/varlen_causal_training.attn). A batch is
sequence lengths drawn uniformly from 100 to 8192 until they sum to --tokens (the last one cut to
fit, and merged into its neighbour if that leaves it under 100); one batch a seed. Work = the
visible (q, kv) pairs, 4 * D flops each (Q.K^T and P.V): sum_b L_b (L_b + 1) / 2 * H * 4 * D.

Columns:
  attngen varlen   the packed kernel, cu_seqlens given, check_inputs=False (the device check of
                   cu_seqlens reads a status word back, a sync; an engine checks its batch once)
  attngen dense    the same spec with `layout bshd` on Bd sequences of one length Ld, chosen so
                   that Bd * Ld = tokens and Ld = sum L_b^2 / sum L_b rounded to 128 (about the
                   same work, and the same tokens); TFLOP/s from its own work
  torch varlen     torch.nn.attention.varlen.varlen_attn (causal), else
                   torch.ops.aten._flash_attention_forward with cum_seq (is_causal); a missing
                   peer is reported and skipped
Every peer's output is compared with ours first (max abs difference, printed). Timing: a spin
kernel holds the GPU while every timed launch is queued (events measure GPU time, not Python
launch cost); launches rotate over input copies of >= 256 MB in all (the H200's L2 is 60 MB);
inputs random normal, never zeros. Results: JSON to PATH (default $OUT/varlen_bench.json, else
benchmarks/results/h200_varlen.json) and a table on stdout.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import sys
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from _queued import queued_time  # noqa: E402  (beside this script)

H, D = 16, 128
SPEC = ROOT / "examples" / "varlen_causal_training.attn"


def draw_lengths(seed: int, tokens: int, lo: int = 100, hi: int = 8192) -> list[int]:
    """Lengths uniform in [lo, hi] summing to `tokens` (the last one cut to fit; a remainder
    under lo is merged into the previous length)."""
    import random

    rnd = random.Random(seed)
    out: list[int] = []
    while sum(out) < tokens:
        out.append(rnd.randint(lo, hi))
    out[-1] -= sum(out) - tokens
    if out[-1] < lo and len(out) > 1:
        out[-2] += out.pop()
    return out


def causal_flops(lengths: list[int]) -> float:
    return float(sum(L * (L + 1) // 2 for L in lengths)) * H * 4 * D




def torch_varlen_peer():
    """(name, fn(q, k, v, cu, max_len) -> o) for torch's varlen attention, or (None, why not)."""
    import torch

    try:
        from torch.nn.attention.varlen import varlen_attn

        params = inspect.signature(varlen_attn).parameters
        if "is_causal" in params:
            return "torch.nn.attention.varlen.varlen_attn(is_causal=True)", (
                lambda q, k, v, cu, m: varlen_attn(q, k, v, cu, cu, m, m, is_causal=True))
        if "window_size" in params:  # newer releases: causal is the window (-1, 0)
            return "torch.nn.attention.varlen.varlen_attn(window_size=(-1, 0))", (
                lambda q, k, v, cu, m: varlen_attn(q, k, v, cu, cu, m, m, window_size=(-1, 0)))
        why = f"varlen_attn has neither is_causal nor window_size: {list(params)}"
    except Exception as e:  # noqa: BLE001 - any import problem means: try the next peer
        why = f"torch.nn.attention.varlen: {type(e).__name__}: {e}"
    op = getattr(torch.ops.aten, "_flash_attention_forward", None)
    if op is not None:
        return "torch.ops.aten._flash_attention_forward(cum_seq, is_causal=True)", (
            lambda q, k, v, cu, m: op(q, k, v, cu, cu, m, m, 0.0, True, False)[0])
    return None, why + "; torch.ops.aten._flash_attention_forward is missing too"


def main() -> int:
    import torch

    import attngen
    from attngen.lang import frontend

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=32768)
    args = ap.parse_args()
    out_path = args.out or (os.path.join(os.environ["OUT"], "varlen_bench.json") if os.environ.get("OUT")
                            else str(ROOT / "benchmarks/results/h200_varlen.json"))
    dev = torch.device("cuda")
    torch.manual_seed(0)
    spec = SPEC.read_text()
    v_var = frontend.loads(spec, str(SPEC)).get()
    v_dense = frontend.loads(spec.replace("layout varlen", "layout bshd"), "<dense>").get()
    k_var = attngen.compile(v_var)
    k_dense = attngen.compile(v_dense, family="forward")
    print(f"attngen varlen: engine {k_var.plan.engine.value}, tile {k_var.plan.tile.block_m}x{k_var.plan.tile.block_n}; "
          f"dense: engine {k_dense.plan.engine.value}", flush=True)
    peer_name, peer = torch_varlen_peer()
    print(f"torch varlen peer: {peer_name}" if peer else f"torch varlen peer: skipped ({peer_name})", flush=True)

    T = args.tokens
    bytes_per_set = 3 * T * H * D * 2
    n_sets = max(2, min(8, -(-(256 << 20) // bytes_per_set)))
    rows = []
    for seed in range(args.seeds):
        lens = draw_lengths(seed, T)
        cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device=dev)
        sets = [tuple(torch.randn(T, H, D, device=dev, dtype=torch.bfloat16) for _ in range(3)) for _ in range(n_sets)]
        flops = causal_flops(lens)
        row: dict = dict(seed=seed, B=len(lens), tokens=T, max_len=max(lens), lengths=lens, flops=flops)
        try:
            q, k, v = sets[0]
            o_ours, _ = k_var(q, k, v, cu_seqlens=cu)  # checked call (the device check of cu_seqlens)
            # Correctness against fp32 SDPA on a few sequences (each on its own, causal).
            err = 0.0
            for b in sorted({0, len(lens) // 2, len(lens) - 1}):
                a, e = int(cu[b]), int(cu[b + 1])
                ref = torch.nn.functional.scaled_dot_product_attention(
                    *(x[a:e].transpose(0, 1).float() for x in (q, k, v)), is_causal=True).transpose(0, 1)
                err = max(err, (o_ours[a:e].float() - ref).abs().max().item())
            row["max_abs_err_vs_fp32_sdpa"] = err
            t, tmin = queued_time(lambda q, k, v: k_var(q, k, v, cu_seqlens=cu, check_inputs=False), sets, args.iters)
            row["attngen_varlen_us"], row["attngen_varlen_min_us"] = t, tmin
            row["attngen_varlen_tflops"] = flops / t / 1e6
        except Exception as e:  # noqa: BLE001 - reported in the table, not fatal
            traceback.print_exc()
            row["attngen_varlen_error"] = f"{type(e).__name__}: {str(e)[:200]}"
        # Dense on about equal work and the same tokens.
        Ld = max(128, round(sum(L * L for L in lens) / sum(lens) / 128) * 128)
        Bd = max(1, round(T / Ld))
        row["dense_B"], row["dense_L"] = Bd, Ld
        dflops = causal_flops([Ld] * Bd)
        try:
            dsets = [tuple(x[: Bd * Ld].reshape(Bd, Ld, H, D) if Bd * Ld <= T else
                           torch.randn(Bd, Ld, H, D, device=dev, dtype=torch.bfloat16) for x in s) for s in sets]
            t, _ = queued_time(lambda q, k, v: k_dense(q, k, v), dsets, args.iters)
            row["attngen_dense_us"], row["attngen_dense_tflops"] = t, dflops / t / 1e6
            del dsets
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            row["attngen_dense_error"] = f"{type(e).__name__}: {str(e)[:200]}"
        if peer is not None:
            try:
                q, k, v = sets[0]
                o_p = peer(q, k, v, cu, max(lens))
                row["peer_max_abs_diff_vs_attngen"] = (o_p.float() - o_ours.float()).abs().max().item()
                t, _ = queued_time(lambda q, k, v: peer(q, k, v, cu, max(lens)), sets, args.iters)
                row["torch_varlen_us"], row["torch_varlen_tflops"] = t, flops / t / 1e6
            except Exception as e:  # noqa: BLE001
                traceback.print_exc()
                row["torch_varlen_error"] = f"{type(e).__name__}: {str(e)[:200]}"
        rows.append(row)
        print(f"seed {seed}: B={row['B']} max_len={row['max_len']} done", flush=True)
        del sets
        torch.cuda.empty_cache()

    env = dict(device=torch.cuda.get_device_name(0), torch=torch.__version__, peer=peer_name,
               engine=k_var.plan.engine.value, tile=[k_var.plan.tile.block_m, k_var.plan.tile.block_n])
    Path(out_path).parent.mkdir(parents=True, exist_ok=True)
    with open(out_path, "w") as f:
        json.dump(dict(env=env, rows=rows), f, indent=1)

    def cell(r, key):
        return f"{r[key + '_us']:8.1f} us {r[key + '_tflops']:6.1f} TF/s" if key + "_us" in r else f"{'n/a':>22}"

    print()
    print(f"varlen prefill, causal bf16 D{D} H{H}, {T} tokens a batch ({env['device']}, torch {env['torch']})")
    print(f"{'seed':>4} | {'B':>3} | {'max L':>5} | {'attngen varlen':>22} | {'attngen dense (Bd x Ld)':>34} | {'torch varlen':>22} | "
          f"{'varlen/dense':>12} | {'varlen/torch':>12} | err vs fp32, peer diff")
    for r in rows:
        ratio_d = (f"{r['attngen_varlen_tflops'] / r['attngen_dense_tflops']:12.3f}"
                   if "attngen_varlen_tflops" in r and "attngen_dense_tflops" in r else f"{'n/a':>12}")
        ratio_t = (f"{r['torch_varlen_us'] / r['attngen_varlen_us']:12.3f}"
                   if "attngen_varlen_us" in r and "torch_varlen_us" in r else f"{'n/a':>12}")
        dense = f"{cell(r, 'attngen_dense')} ({r['dense_B']}x{r['dense_L']})"
        errs = f"{r.get('max_abs_err_vs_fp32_sdpa', float('nan')):.4f}, {r.get('peer_max_abs_diff_vs_attngen', float('nan')):.4f}"
        print(f"{r['seed']:>4} | {r['B']:>3} | {r['max_len']:>5} | {cell(r, 'attngen_varlen')} | {dense:>34} | "
              f"{cell(r, 'torch_varlen')} | {ratio_d} | {ratio_t} | {errs}")
        for key in ("attngen_varlen_error", "attngen_dense_error", "torch_varlen_error"):
            if key in r:
                print(f"     {key}: {r[key]}")
    print("varlen/dense: TFLOP/s ratio (bar >= 0.9); varlen/torch: torch time / attngen time (bar > 1)")
    print(f"results: {out_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
