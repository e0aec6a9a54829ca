"""Quantized attention on the GPU (issue 44): the FP8 forward against our bf16 forward, and its accuracy.

    python benchmarks/quant_bench.py [--out PATH] [--repeats N] [--L 16384] [--acc-L 1024] [--fp8-stages 2|3|4]

Speed (TFLOP/s of the visible work, 4 B H Lq Lk D times the visible fraction; median of `repeats`
rounds of queued launches, benchmarks/_queued.py), eager calls and CUDA-graph replays:
- FP8 (e4m3 Q/K/V per (batch, kv head) descales, FP8 P·V: `quant p fp8_e4m3 static(448.0)`) and FP8
  Q·Kᵀ with V dequantized (P·V in bf16), against our bf16 forward and torch SDPA (flash) bf16:
  B1 H16 D128, L = 16384, dense and causal.
- Sage-style INT8 Q·Kᵀ (q i8 amax per token, k i8 amax per block(64); P·V bf16), without and with
  K smoothing (`smooth mean`), against the same bf16 forward, same shapes, and its accuracy beside
  FP8's (the INT8 time includes its prep kernels, which quantize q and k, and average k, on every call).
- The seed pre-LN INT8 cross attention (B32 H16 Lq2048 Lk512 D64; layernorm fused into q's
  quantization, residual) against our bf16 pre-LN (examples/whisper_preln_cross.attn).
- A case the CUDA backend has no kernel for is recorded with its refusal (the reason printed). No
  figure is made up for a kernel that did not run.
Accuracy at B1 Lq = Lk = acc-L (H16 D128; the pre-LN INT8 block at Lq = acc-L, Lk = 512), N(0,1) inputs and with 0.1% of channels x20
(attngen.check.quant_accuracy): relative L2 error against the float64 unquantized truth of the
kernel, of its NumPy emulation (attngen.check.quant), of the bf16 spec's emulation, and of torch
SDPA bf16 run on the GPU; `within_bar` says whether the kernel stays within 1.1x its emulation.
Results: JSON to PATH (default $OUT/quant_bench.json, else benchmarks/results/quant_bench.json) and
a table on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
for p in (ROOT, ROOT / "benchmarks"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from _queued import queued_ms  # noqa: E402


def spec(name: str, *, causal: bool, quant: str, D: int = 128, H: int = 16, stages: int | None = None) -> str:
    """A self-attention spec: `quant` is "bf16", "fp8_pv" (FP8 P·V), "fp8_vdeq" (V dequantized), "int8"
    (Sage-style INT8 Q·Kᵀ) or "sage" (the same with K smoothing). `stages`: FP8 P·V's ring stages on
    the sm_90a wgmma engine (a tile hint of its 128 x 128 x 8-warp shape), else its default."""
    head = {"bf16": "dtype bf16", "fp8_pv": "dtype fp8_e4m3 out bf16", "fp8_vdeq": "dtype fp8_e4m3 out bf16",
            "int8": "dtype bf16", "sage": "dtype bf16"}[quant]
    lines = [f"attention {name} {{", f"  {head}", f"  head_dim {D}", f"  heads {H}", "  layout bshd"]
    if causal:
        lines.append("  mask causal")
    if quant.startswith("fp8"):
        lines += [f"  quant {t} fp8_e4m3 input per head" for t in "qkv"]
    if quant == "fp8_pv":
        lines.append("  quant p fp8_e4m3 static(448.0)")
        if stages is not None:
            lines.append(f"  tile block_m 128 block_n 128 warps 8 stages {stages}")
    if quant in ("int8", "sage"):
        lines += ["  quant q i8 amax per token", "  quant k i8 amax per block(64)" + (" smooth mean" if quant == "sage" else "")]
    return "\n".join(lines + ["}", ""])


PRELN_INT8 = """attention preln_int8 {
  dtype bf16
  head_dim 64
  heads 16
  kind cross
  layout bshd
  norm q layernorm(1e-5) scope token
  residual
  quant q i8 amax per token
  quant k i8 amax per token
}
"""


def to_torch(a: np.ndarray):
    """A NumPy array (ml_dtypes fp8 / bf16 included) as a CUDA tensor with the same bits."""
    import torch

    name = a.dtype.name
    if name in ("float8_e4m3fn", "float8_e5m2", "bfloat16"):
        t = torch.from_numpy(np.ascontiguousarray(a).view(np.int16 if name == "bfloat16" else np.uint8))
        return t.view(getattr(torch, name)).cuda()
    return torch.from_numpy(np.ascontiguousarray(a)).cuda()


def fp8_inputs(B: int, L: int, H: int, D: int, seed: int):
    """N(0,1) bf16 q/k/v [B, L, H, D] and their e4m3 copies with per-(batch, head) descales
    (amax / 448, as attngen.check.quant.store_inputs calibrates), made on the GPU."""
    import torch

    g = torch.Generator(device="cuda").manual_seed(seed)
    full = [torch.randn(B, L, H, D, device="cuda", generator=g, dtype=torch.float32) for _ in range(3)]
    q8, scales = [], {}
    for n, x in zip("qkv", full):
        s = (x.abs().amax(dim=(1, 3)) / 448.0).clamp_min(1e-12)  # [B, H]
        q8.append((x / s[:, None, :, None]).clamp(-448, 448).to(torch.float8_e4m3fn))
        scales[f"{n}_scale"] = s.float().contiguous()
    return [x.to(torch.bfloat16) for x in full], q8, scales


def time_call(fn, repeats: int) -> dict:
    """Milliseconds per call, eager (queued launches) and replayed from a CUDA graph."""
    import torch

    eager = queued_ms(fn, iters=10, repeats=repeats)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return {"eager_ms": eager, "graph_ms": queued_ms(g.replay, iters=10, repeats=repeats)}


def speed(L: int, repeats: int, fp8_stages: int | None = None) -> list[dict]:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import attngen

    B, H, D = 1, 16, 128
    full, q8, scales = fp8_inputs(B, L, H, D, seed=0)
    rows = []
    for causal in (False, True):
        flops = 4.0 * B * H * L * L * D * ((L + 1) / (2 * L) if causal else 1.0)
        tag = "causal" if causal else "dense"
        for quant in ("bf16", "fp8_pv", "fp8_vdeq", "int8", "sage"):
            kern = attngen.compile(spec(f"{quant}_{tag}", causal=causal, quant=quant, stages=fp8_stages))
            fn = (lambda k=kern: k(*full)) if quant in ("bf16", "int8", "sage") else (lambda k=kern: k(*q8, **scales))
            t = time_call(fn, repeats)
            tl = kern.plan.tile  # the engine and tile that ran (FP8 P·V: wgmma on sm_90a, else mma.sync)
            rows.append({"case": f"D128 L{L} {tag}", "impl": f"attngen {quant}", **t, "engine": kern.plan.engine.value,
                         "tile": f"{tl.block_m}x{tl.block_n}x{tl.warps}w{tl.stages}s",
                         "tflops_eager": flops / t["eager_ms"] / 1e9, "tflops_graph": flops / t["graph_ms"] / 1e9})
        qt, kt, vt = (x.transpose(1, 2) for x in full)

        def sdpa(c=causal):
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                return F.scaled_dot_product_attention(qt, kt, vt, is_causal=c)
        t = time_call(sdpa, repeats)
        rows.append({"case": f"D128 L{L} {tag}", "impl": "sdpa-flash bf16", **t,
                     "tflops_eager": flops / t["eager_ms"] / 1e9, "tflops_graph": flops / t["graph_ms"] / 1e9})
        torch.cuda.empty_cache()
    return rows


def refused_and_preln(repeats: int) -> list[dict]:
    """Pre-LN cross attention, INT8 and bf16, timed (a refusal recorded where no kernel runs); smoothed Sage's refusal."""
    import attngen
    from attngen.check import workload
    from attngen.lang import frontend
    from attngen.plan.quant_fwd import cuda_problem
    from attngen.runtime.kernel import device_arch

    rows = []
    arch = device_arch()
    for name, text in (("sage int8 smooth D128", spec("sage", causal=True, quant="sage")), ("pre-LN int8 cross", PRELN_INT8)):
        v = frontend.loads(text, "<bench>").variants[0]
        why = cuda_problem(v, arch)
        if why:
            rows.append({"case": name, "impl": "attngen int8", "refused": why})
    bf16 = frontend.loads((ROOT / "examples" / "whisper_preln_cross.attn").read_text(), "whisper").variants[0]
    i8 = frontend.loads(PRELN_INT8, "<bench>").variants[0]
    B, Lq, Lk = 32, 2048, 512
    arrays = workload.make_inputs(bf16, B, Lq, Lk, np.random.default_rng(0))
    t = {n: to_torch(np.asarray(a)) for n, a in arrays.items()}
    rest = {n: x for n, x in t.items() if n not in ("q", "k", "v")}
    for impl, v in (("attngen bf16", bf16), ("attngen int8", i8)):
        if cuda_problem(v, arch) is not None and v.quantized:
            continue  # recorded above
        kern = attngen.compile(v)
        tm = time_call(lambda k=kern: k(t["q"], t["k"], t["v"], **rest), repeats)
        flops = 4.0 * B * v.heads * Lq * Lk * v.head_dim
        rows.append({"case": "pre-LN cross B32 H16 Lq2048 Lk512 D64", "impl": impl, **tm,
                     "tflops_eager": flops / tm["eager_ms"] / 1e9, "tflops_graph": flops / tm["graph_ms"] / 1e9})
    return rows


def accuracy(L: int) -> list[dict]:
    """Kernel, emulation, bf16-emulation and SDPA bf16 errors against the float64 truth (SDPA: the
    self-attention specs only; the pre-LN block is not one SDPA call)."""
    import torch
    import torch.nn.functional as F

    import attngen
    from attngen.check import quant_accuracy as qa
    from attngen.check import reference
    from attngen.lang import frontend

    cases = [(quant, causal, frontend.loads(spec(f"acc_{quant}_{int(causal)}", causal=causal, quant=quant), "<acc>").variants[0], L)
             for quant in ("fp8_pv", "fp8_vdeq", "int8", "sage") for causal in (False, True)]
    cases.append(("preln_int8", False, frontend.loads(PRELN_INT8, "<acc>").variants[0], 512))
    rows = []
    for quant, causal, v, lk in cases:
        kern = attngen.compile(v)
        for outliers in (False, True):
            arrays = qa.inputs(v, 1, L, lk, seed=0, outliers=outliers)
            truth = qa.truth(v, arrays)
            call = qa.quantized_call(v, arrays)
            rest = {n: a for n, a in call.items() if n not in ("q", "k", "v")}
            emu, _ = reference.attention(v, call["q"], call["k"], call["v"], rest)
            o = kern(*(to_torch(call[n]) for n in "qkv"), **{n: to_torch(a) for n, a in rest.items()})
            torch.cuda.synchronize()
            ok, ke, ee = qa.within_bar(o.float().cpu().numpy(), truth, np.asarray(emu, np.float64))
            fp = qa.full_precision(v)
            full_rest = {n: a for n, a in arrays.items() if n not in ("q", "k", "v")}
            base, _ = reference.attention(fp, *(arrays[n] for n in "qkv"), full_rest)
            sd = None
            if not v.norms:
                qb, kb, vb = (torch.from_numpy(np.asarray(arrays[n], np.float32)).cuda().to(torch.bfloat16).transpose(1, 2) for n in "qkv")
                out = F.scaled_dot_product_attention(qb, kb, vb, is_causal=causal).transpose(1, 2).float().cpu().numpy()
                sd = qa.error(out, truth).rel_l2
            rows.append({"spec": quant, "mask": "causal" if causal else "dense", "inputs": "outliers" if outliers else "N(0,1)",
                         "kernel": ke.rel_l2, "emulation": ee.rel_l2, "within_bar": ok,
                         "bf16_emulation": qa.error(base, truth).rel_l2, "sdpa_bf16": sd})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--L", type=int, default=16384, help="sequence length of the speed cases")
    ap.add_argument("--acc-L", type=int, default=1024, help="sequence length of the accuracy cases (NumPy float64 truth)")
    ap.add_argument("--fp8-stages", type=int, default=None, choices=(2, 3, 4),
                    help="ring stages of FP8 P·V on the sm_90a wgmma engine (default: its plan's)")
    args = ap.parse_args(argv)
    out = Path(args.out) if args.out else (Path(os.environ["OUT"]) / "quant_bench.json" if os.environ.get("OUT")
                                           else ROOT / "benchmarks" / "results" / "quant_bench.json")
    import torch

    res = {"device": torch.cuda.get_device_name(), "speed": speed(args.L, args.repeats, args.fp8_stages),
           "int8": refused_and_preln(args.repeats), "accuracy": accuracy(args.acc_L)}
    for r in res["speed"] + res["int8"]:
        if "refused" in r or "note" in r:
            print(f"{r['case']:<40} {r['impl']:<20} {r.get('refused') or r.get('note')}")
        else:
            print(f"{r['case']:<40} {r['impl']:<20} eager {r['eager_ms']:8.3f} ms {r['tflops_eager']:7.1f} TFLOP/s"
                  f"   graph {r['graph_ms']:8.3f} ms {r['tflops_graph']:7.1f} TFLOP/s" + (f"   {r['engine']} {r['tile']}" if "engine" in r else ""))
    print("\nrelative L2 error against the float64 unquantized truth")
    for r in res["accuracy"]:
        print(f"{r['spec']:<9} {r['mask']:<7} {r['inputs']:<9} kernel {r['kernel']:.3g}  emulation {r['emulation']:.3g}"
              f"  (within 1.1x: {r['within_bar']})  bf16 emulation {r['bf16_emulation']:.3g}  SDPA bf16 "
              + ("-" if r["sdpa_bf16"] is None else f"{r['sdpa_bf16']:.3g}"))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2) + "\n")
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
