"""Device harness: correctness spot checks and timings of generated kernels in one process.

Run on a GPU machine: prints one line per case and a short table last.
Writes JSON lines to $OUT/gpu_check.jsonl when OUT is set.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np
import torch

import attngen
from attngen.check import reference, tolerance
from attngen.lang.frontend import loads
from attngen.check.workload import make_inputs

OUT = os.environ.get("OUT")
LOG = open(os.path.join(OUT, "gpu_check.jsonl"), "w") if OUT else None


def emit(**kw):
    if LOG:
        LOG.write(json.dumps(kw) + "\n")
        LOG.flush()


def to_torch(x: np.ndarray) -> torch.Tensor:
    if x.dtype.name == "bfloat16":
        return torch.from_numpy(x.view(np.uint16).copy()).view(torch.bfloat16).cuda()
    return torch.from_numpy(np.ascontiguousarray(x)).cuda()


def to_numpy(t: torch.Tensor, like_dtype) -> np.ndarray:
    if t.dtype == torch.bfloat16:
        return t.view(torch.uint16).cpu().numpy().view(like_dtype)
    return t.cpu().numpy()


def spec(name, dtype="bf16", D=128, H=16, Hkv=None, mask=None, score=None, extra="", tile=None, kind="self", layout="bhsd"):
    lines = [f"attention {name} {{", f"  dtype {dtype}", f"  head_dim {D}", f"  heads {H}" + (f" kv {Hkv}" if Hkv else ""),
             f"  kind {kind}", f"  layout {layout}", "  output lse"]
    if mask:
        lines.append(f"  mask {mask}")
    if score:
        lines.append(f"  score {score}")
    if extra:
        lines.append(extra)
    if tile:
        lines.append(f"  tile block_m {tile[0]} block_n {tile[1]} warps {tile[2]} stages {tile[3]}")
    lines.append("}")
    return "\n".join(lines)


def check_case(text: str, B: int, Lq: int, Lk: int, seed: int, dist: str = "normal") -> dict:
    v = loads(text).variants[0]
    k = attngen.compile(v)
    rng = np.random.default_rng(seed)
    inp = make_inputs(v, B, Lq, Lk, rng, dist)
    ref_o, ref_lse = reference.attention(v, inp["q"], inp["k"], inp["v"], {n: a for n, a in inp.items() if n not in ("q", "k", "v")})
    dev = {n: to_torch(a) for n, a in inp.items()}
    out = torch.full(ref_o.shape, float("nan"), dtype=dev["q"].dtype, device="cuda")
    res = k(dev["q"], dev["k"], dev["v"], out=out, **{n: a for n, a in dev.items() if n not in ("q", "k", "v")})
    o, lse = (res if v.lse else (res, None))
    torch.cuda.synchronize()
    o_np = to_numpy(o, ref_o.dtype)
    # The suite's tolerance policy: the score error estimate (fp32 accumulation, and one-ulp
    # rounding flips of pre-normalised operands) widens the bounds.
    rest = {n: a for n, a in inp.items() if n not in ("q", "k", "v")}
    se = reference.score_error(v, inp["q"], inp["k"], rest)
    rep = tolerance.check(o_np, ref_o, v.dtype, score_err=se)
    ok = rep.ok
    msg = str(rep) if hasattr(rep, "__str__") else ""
    if v.lse and lse is not None:
        rl = tolerance.check_lse(lse.cpu().numpy(), ref_lse, v.dtype, score_err=se)
        ok = ok and rl.ok
        msg += " | " + str(rl)
    return dict(name=v.name, B=B, Lq=Lq, Lk=Lk, dist=dist, ok=bool(ok), detail=msg[:400], compile_s=k.compile_seconds)


def bench(fn, rotate=3, warmup=5, reps=20) -> float:
    for _ in range(warmup):
        fn(0)
    torch.cuda.synchronize()
    times = []
    for i in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn(i % rotate)
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e))
    return float(np.median(times))


def perf_case(text: str, B: int, L: int, causal_frac: float | None = None, Lk: int | None = None, peers=True) -> dict:
    v = loads(text).variants[0]
    k = attngen.compile(v)
    Lk = Lk or L
    H, D = v.heads, v.head_dim
    tdt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[v.dtype.value]
    sets = []
    for r in range(3):
        g = torch.Generator(device="cuda").manual_seed(r)
        if v.layout.value == "bhsd":
            q = torch.randn(B, H, L, D, device="cuda", dtype=tdt, generator=g)
            kk = torch.randn(B, v.kv_heads, Lk, D, device="cuda", dtype=tdt, generator=g)
        else:
            q = torch.randn(B, L, H, D, device="cuda", dtype=tdt, generator=g)
            kk = torch.randn(B, Lk, v.kv_heads, D, device="cuda", dtype=tdt, generator=g)
        vv = torch.randn_like(kk)
        sets.append((q, kk, vv))
    if v.runtime_inputs():
        raise ValueError(f"{v.name}: perf_case times variants without runtime inputs; use benchmarks/suite.py")
    extra: dict = {}
    frac = causal_frac if causal_frac is not None else 1.0
    flops = 4 * B * H * L * Lk * D * frac
    ms = bench(lambda i: k(*sets[i], **extra))
    row = dict(name=v.name, B=B, H=H, L=L, Lk=Lk, D=D, ms=ms, tflops=flops / ms / 1e9, tile=str(k.tile), regs=None)
    if peers and v.layout.value == "bhsd" and v.dtype.value != "fp32":
        from torch.nn.attention import SDPBackend, sdpa_kernel

        is_causal = "causal" in text and "window" not in text
        for name, be in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
            try:
                with sdpa_kernel(be):
                    t = bench(lambda i: torch.nn.functional.scaled_dot_product_attention(*sets[i], is_causal=is_causal, enable_gqa=v.kv_heads != H))
                row[name + "_tflops"] = flops / t / 1e9
            except Exception:  # backend unavailable for this shape
                row[name + "_tflops"] = None
    emit(kind="perf", **row)
    return row


def graph_us(fn, n: int = 100) -> float:
    """GPU time of one call in µs: n calls captured in a CUDA graph, replayed between events (host
    overhead of the Python call is excluded, which is what a C++ engine or a graph sees)."""
    from attngen.tools import bench as _bench

    t = _bench.time_graph(lambda i: fn(), 1, repeats=n)
    if t is None:
        raise RuntimeError("the call could not be captured in a CUDA graph")
    return t.median_ms * 1000


def seed_case(tiles=((16, 32, 4, 1), (16, 64, 4, 1), (16, 128, 4, 1), (32, 64, 8, 1))) -> dict:
    """The seed case (fp32, B4 H8 L128 D64, padding) in GPU time for a few fp32 tiles, each output
    checked against the reference first, next to torch SDPA efficient."""
    from attngen.lang.frontend import print_program
    from attngen.ir.nodes import Program

    base = attngen.load(os.path.join(os.path.dirname(__file__), "..", "examples", "seed_padded_fp32.attn")).get(None)
    inp = make_inputs(base, 4, 128, 128, np.random.default_rng(3))
    dev = {n: to_torch(a) for n, a in inp.items()}
    rt = {n: a for n, a in dev.items() if n not in ("q", "k", "v")}
    ref_o, _ = reference.attention(base, inp["q"], inp["k"], inp["v"], {n: a for n, a in inp.items() if n not in ("q", "k", "v")})
    row = {}
    for t in (None, *tiles):
        text = print_program(Program((base,))).rstrip().rstrip("}")
        if t is not None:
            text += f"  tile block_m {t[0]} block_n {t[1]} warps {t[2]} stages {t[3]}\n"
        v = loads(text + "}").variants[0]
        k = attngen.compile(v)
        o = k(dev["q"], dev["k"], dev["v"], **rt)
        torch.cuda.synchronize()
        ok = tolerance.check(to_numpy(o, ref_o.dtype), ref_o, v.dtype).ok
        us = graph_us(lambda: k(dev["q"], dev["k"], dev["v"], **rt))
        row[str(k.tile)] = (us, ok)
        print(f"seed fp32 {k.tile}: {us:.1f} us GPU time (CUDA graph), {'correct' if ok else 'WRONG'}", flush=True)
    mask = torch.arange(128, device="cuda")[None, :] < dev["kv_lens"][:, None]
    am = mask[:, None, None, :].expand(4, 8, 128, 128)
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
        peer = graph_us(lambda: torch.nn.functional.scaled_dot_product_attention(dev["q"], dev["k"], dev["v"], attn_mask=am))
    print(f"seed fp32: SDPA efficient {peer:.1f} us", flush=True)
    emit(kind="seed", tiles={k: v[0] for k, v in row.items()}, sdpa_efficient_us=peer)
    return row


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--perf", action="store_true")
    ap.add_argument("--tiles", action="store_true")
    ap.add_argument("--no-check", action="store_true")
    ap.add_argument("--seed", action="store_true")
    ap.add_argument("--preln", action="store_true", help="tile sweep of the pre-LN cross attention workload")
    ap.add_argument("--wgmma", action="store_true", help="tile sweep of the Hopper wgmma engine against mma.sync tiles")
    args = ap.parse_args()
    fails = 0
    cases = [
        (spec("dense_bf16"), 2, 300, 300),
        (spec("causal_bf16", mask="causal"), 2, 517, 517),
        (spec("causal_fp16", dtype="fp16", D=64, mask="causal"), 1, 1000, 1000),
        (spec("gqa_bf16", H=8, Hkv=2, mask="causal"), 2, 129, 129),
        (spec("cross_bf16", kind="cross", layout="bshd"), 2, 77, 333),
        (spec("window_fp16", dtype="fp16", mask="causal && window(100, 0)"), 1, 700, 700),
        (spec("softcap_bf16", mask="causal", score="softcap(30.0)"), 1, 400, 400),
        (spec("pad_fp16", dtype="fp16", D=96, mask="padding"), 3, 200, 200),
        (spec("seed_fp32", dtype="fp32", D=64, H=8, mask="padding"), 4, 128, 128),
        (spec("fp32_causal", dtype="fp32", D=128, H=4, mask="causal"), 2, 333, 333),
        (spec("d32_bf16", D=32, H=4, mask="causal"), 2, 1, 1),
        (spec("d32_cross", D=32, H=4, kind="cross"), 2, 17, 1),
        (spec("mt2", tile=(128, 64, 4, 2), mask="causal"), 1, 300, 300),
        (spec("st1", tile=(64, 32, 4, 1), mask="causal"), 1, 300, 300),
        (spec("st3", tile=(128, 64, 8, 3), mask="causal"), 1, 1000, 1000),
        # wgmma engine edges: 12-warp D64 tiles, 160-key tiles (the widest that fits the consumers' registers), a token-scope norm on the swizzled Q tile, L = 1.
        (spec("w12_causal", D=64, tile=(192, 128, 12, 2), mask="causal"), 2, 1000, 1000),
        (spec("w12_cross", dtype="fp16", D=64, H=8, Hkv=2, kind="cross", tile=(192, 64, 12, 3)), 2, 333, 77),
        (spec("n160_causal", tile=(128, 160, 8, 2), mask="causal"), 1, 700, 700),
        (spec("preln_wg", D=64, kind="cross", layout="bshd", tile=(128, 128, 8, 2),
              extra="  norm q layernorm(1e-5) scope token affine true\n  residual\n"), 2, 300, 200),
        (spec("tiny_wg", D=64), 1, 1, 1),
        # The producer's token-scope norm: head dim 128 (one Q buffer), RMSNorm without affine
        # weights on the 12-warp tile (two Q buffers), many work tiles a CTA.
        (spec("preln_wg128", D=128, kind="cross", layout="bshd", tile=(128, 128, 8, 3),
              extra="  norm q layernorm(1e-5) scope token affine true\n  residual\n"), 2, 300, 200),
        (spec("preln_rms_w12", D=64, H=16, kind="cross", layout="bshd", tile=(192, 128, 12, 3),
              extra="  norm q rmsnorm(1e-6) scope token\n  residual\n"), 4, 1000, 77),
    ]
    ex_dir = os.path.join(os.path.dirname(__file__), "..", "examples")
    for fn in sorted(os.listdir(ex_dir)):
        if fn.endswith(".attn"):
            try:
                prog = attngen.load(os.path.join(ex_dir, fn))
            except Exception as e:
                print(f"LOAD FAIL {fn}: {e}")
                fails += 1
                continue
            for v in prog.variants:
                from attngen.lang.frontend import print_program
                from attngen.ir.nodes import Program
                L = 200
                cases.append((print_program(Program((v,))), 2, L, L if v.kind.value == "self" else 150))
    for i, (text, B, Lq, Lk) in enumerate([] if args.no_check else cases):
        try:
            r = check_case(text, B, Lq, Lk, seed=i)
        except Exception as e:
            import traceback

            r = dict(name=text.split()[1], ok=False, detail=f"{type(e).__name__}: {e}"[:600])
            traceback.print_exc(limit=3)
        emit(kind="check", **r)
        fails += not r["ok"]
        print(("PASS " if r["ok"] else "FAIL ") + f"{r['name']} B{B} Lq{Lq} Lk{Lk}: {r.get('detail', '')[:300]}", flush=True)
    print(f"correctness: {len(cases) - fails} passed, {fails} failed", flush=True)
    rows = []
    if args.seed:
        seed_case()
    if args.perf:
        rows.append(perf_case(spec("dense128"), 2, 16384))
        rows.append(perf_case(spec("causal128", mask="causal"), 2, 16384, causal_frac=0.5))
        rows.append(perf_case(spec("dense64", D=64), 8, 4096))
        rows.append(perf_case(spec("causal64", D=64, mask="causal"), 8, 4096, causal_frac=0.5))
        if args.tiles:
            def nolse(t):
                return t.replace("  output lse\n", "")
            # Spill-free 32-key tiles against the auto choices (which spill at D = 128).
            for t in ((128, 48, 4, 2), (128, 32, 4, 3), (128, 32, 4, 4)):
                rows.append(perf_case(nolse(spec("d128_t", tile=t)), 2, 16384, peers=False))
            for t in ((128, 64, 4, 2), (128, 32, 4, 2), (128, 32, 4, 3)):
                rows.append(perf_case(nolse(spec("c128_t", tile=t, mask="causal")), 2, 16384, causal_frac=0.5, peers=False))
            for t in ((128, 128, 4, 2), (128, 64, 4, 2), (128, 96, 4, 2), (128, 64, 4, 3)):
                rows.append(perf_case(nolse(spec("d64_t", D=64, tile=t)), 8, 4096, peers=False))
            for t in ((128, 64, 4, 2), (128, 64, 4, 3), (128, 32, 4, 2)):
                rows.append(perf_case(nolse(spec("c64_t", D=64, tile=t, mask="causal")), 8, 4096, causal_frac=0.5, peers=False))
    if args.wgmma:
        def nolse(t):
            return t.replace("  output lse\n", "")
        # wgmma tiles: 128 x N with 8 consumer warps, 64 x N with 4 (two CTAs an SM), 192 x N with 12
        # (head dim 64); the 4-warp 128-row tiles are mma.sync.
        for t in ((128, 128, 8, 2), (128, 160, 8, 2), (128, 48, 4, 2)):
            rows.append(perf_case(nolse(spec("d128_t", tile=t)), 2, 16384, peers=False))
        for t in ((128, 128, 8, 2), (128, 64, 4, 2)):
            rows.append(perf_case(nolse(spec("c128_t", tile=t, mask="causal")), 2, 16384, causal_frac=0.5, peers=False))
        for t in ((64, 128, 4, 3), (64, 128, 4, 2), (64, 64, 4, 3), (192, 128, 12, 3), (128, 128, 4, 2)):
            rows.append(perf_case(nolse(spec("d64_t", D=64, tile=t)), 8, 4096, peers=False))
        for t in ((64, 128, 4, 3), (64, 128, 4, 2), (64, 64, 4, 3), (192, 128, 12, 3), (128, 64, 4, 2)):
            rows.append(perf_case(nolse(spec("c64_t", D=64, tile=t, mask="causal")), 8, 4096, causal_frac=0.5, peers=False))
    if args.preln:
        # B32 H16 Lq2048 Lk512 D64: plain cross attention, then with the token norm and residual.
        for t in ((128, 128, 8, 3), (64, 128, 4, 2)):
            rows.append(perf_case(spec("cross64", D=64, kind="cross", layout="bshd", tile=t).replace("  output lse\n", ""), 32, 2048, Lk=512, peers=False))
        for t in ((64, 128, 4, 2), (64, 64, 4, 3), (128, 128, 8, 3), (64, 32, 4, 2)):
            text = spec("preln_t", D=64, kind="cross", layout="bshd", tile=t,
                        extra="  norm q layernorm(1e-5) scope token affine false\n  residual\n").replace("  output lse\n", "")
            rows.append(perf_case(text, 32, 2048, Lk=512, peers=False))
    if rows:
        for r in rows:
            print(f"{r['name']:14s} {r['tile']:60s} {r['ms']:8.3f} ms {r['tflops']:6.1f} TF/s "
                  f"flash {r.get('flash_tflops') or 0:6.1f} cudnn {r.get('cudnn_tflops') or 0:6.1f}", flush=True)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
