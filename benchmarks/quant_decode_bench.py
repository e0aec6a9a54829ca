"""FP8 paged KV cache decode against our bf16 paged decode (issue 44's bar: >= 1.7x at B8 Lk32k and
B1 Lk128k, D128 H32/Hkv8), same run.

    python benchmarks/quant_decode_bench.py [--out PATH] [--iters N] [--rows B:Lk,...] [--scales head,page]

Both kernels: bf16 q and output, `kind cross`, `mask causal`, `kv_cache paged(16)`, Lq = 1, every
row's cache full (cache_lens = Lk), pages shuffled (a random permutation of the pool). The FP8
cache stores e4m3 pages with a scale per kv head (the gallery's examples/quant/fp8_paged_decode.attn)
or per (page, kv head), calibrated on random normal K/V (amax / 448), never zeros. Before timing,
the FP8 kernel's output is compared with the bf16 kernel's on the dequantized cache (they agree bit
for bit: the split-KV kernel adds no rounding of its own).

Timing, both without the per-call page-id check (an engine validates a block table once):
  eager  the GPU held busy by a spin kernel while every launch is queued (benchmarks/_queued.py);
  graph  the same calls captured in one CUDA graph and replayed.
Launches rotate through copies of the cache totalling >= 256 MB (the H200's L2 is 60 MB).

Bytes read a call: K and V of the visible tokens (B * Lk * Hkv * D * 2 at their itemsize), q, the
block-table entries and the scales; TB/s = those bytes / time (`kv_tbs` counts K and V alone). The
partial O of the split kernel's workspace is the kernels' own traffic and is not counted.
Results: JSON to PATH (default $OUT/quant_decode_bench.json, else
benchmarks/results/quant_decode.json) and a table on stdout.
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

from _queued import queued_time  # noqa: E402  (beside this script)

H, HKV, D, PAGE = 32, 8, 128, 16
ROWS = [(8, 32768), (1, 131072)]
SPEC = """
attention {name} {{
  dtype bf16{kv}
  head_dim 128
  heads 32 kv 8
  kind cross
  kv_cache paged(16)
  mask causal{quant}
}}
"""
E4M3_MAX = 448.0


def spec(scales: str | None) -> str:
    """The bf16 paged decode spec, or its FP8 cache with scales per `scales` (head or page)."""
    if scales is None:
        return SPEC.format(name="bf16_paged", kv="", quant="")
    return SPEC.format(name=f"fp8_paged_{scales}", kv=" k fp8_e4m3 v fp8_e4m3",
                       quant=f"\n  quant k fp8_e4m3 input per {scales}\n  quant v fp8_e4m3 input per {scales}")


def quantize(x, scales: str):
    """(e4m3 pages, f32 scales) of bf16 pages x [pages, PAGE, Hkv, D]: scale = amax / 448 per kv
    head ([Hkv]) or per (page, kv head) ([pages, Hkv])."""
    import torch

    ax = x.float().abs()
    amax = ax.amax(dim=(0, 1, 3)) if scales == "head" else ax.amax(dim=(1, 3))
    s = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))
    view = s.view(1, 1, HKV, 1) if scales == "head" else s.view(-1, 1, HKV, 1)
    return (x.float() / view).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn), s.contiguous()


def dequantize(xq, s, scales: str):
    """The values the FP8 kernel computes with: fp32(x_q * s) rounded to bf16 (docs/QUANT.md)."""
    import torch

    view = s.view(1, 1, HKV, 1) if scales == "head" else s.view(-1, 1, HKV, 1)
    return (xq.float() * view).to(torch.bfloat16)


def graph_us(fn, sets, per_graph: int = 20, replays: int = 5) -> float:
    """CUDA-event microseconds per call of `per_graph` calls (rotating `sets`) captured in one CUDA
    graph, warmed up on the capture stream first."""
    import torch

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for i in range(3):
            fn(*sets[i % len(sets)])
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        for i in range(per_graph):
            fn(*sets[i % len(sets)])
    g.replay()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(replays):
        g.replay()
    b.record()
    torch.cuda.synchronize()
    del g
    return a.elapsed_time(b) / (replays * per_graph) * 1e3


def bench_row(B: int, Lk: int, scale_kinds: list[str], kernels: dict, iters: int) -> dict:
    """One (B, Lk) row: bf16 and each FP8 cache, eager and graph, with their bytes and TB/s."""
    import torch

    dev = torch.device("cuda")
    pages = Lk // PAGE
    pool = B * pages + 3  # spare pages no row uses
    bf16_bytes = 2 * B * Lk * HKV * D * 2
    n = max(2, min(8, -(-(256 << 20) // (bf16_bytes // 2))))
    q = torch.randn(B, H, 1, D, device=dev, dtype=torch.bfloat16)
    lens = torch.full((B,), Lk, dtype=torch.int32, device=dev)
    common = dict(q_bytes=q.numel() * 2, table_bytes=B * pages * 4)
    row: dict = dict(B=B, Lk=Lk, Lq=1, copies=n)
    sets_bf16, sets_fp8 = [], {k: [] for k in scale_kinds}
    for _ in range(n):
        k = torch.randn(pool, PAGE, HKV, D, device=dev, dtype=torch.bfloat16)
        v = torch.randn(pool, PAGE, HKV, D, device=dev, dtype=torch.bfloat16)
        table = torch.randperm(pool, device=dev)[: B * pages].to(torch.int32).reshape(B, pages)
        sets_bf16.append((q, k, v, table))
        for kind in scale_kinds:
            kq, ks = quantize(k, kind)
            vq, vs = quantize(v, kind)
            sets_fp8[kind].append((q, kq, vq, table, ks, vs))
        del k, v
    kb = kernels["bf16"]

    def run_bf16(q, k, v, t):
        return kb(q, k, v, cache_lens=lens, block_table=t, check_pages=False)

    reads = bf16_bytes + common["q_bytes"] + common["table_bytes"]
    row["bf16"] = _timed(run_bf16, sets_bf16, iters, reads, bf16_bytes)
    for kind in scale_kinds:
        kf = kernels[kind]

        def run_fp8(q, k, v, t, ks, vs, kf=kf):
            return kf(q, k, v, cache_lens=lens, block_table=t, k_scale=ks, v_scale=vs, check_pages=False)

        q0, kq, vq, t0, ks, vs = sets_fp8[kind][0]
        got = run_fp8(q0, kq, vq, t0, ks, vs)
        want = run_bf16(q0, dequantize(kq, ks, kind), dequantize(vq, vs, kind), t0)
        scale_bytes = 2 * 4 * (HKV if kind == "head" else B * pages * HKV)
        fp8_bytes = bf16_bytes // 2
        r = _timed(run_fp8, sets_fp8[kind], iters, fp8_bytes + common["q_bytes"] + common["table_bytes"] + scale_bytes, fp8_bytes)
        r["max_err_vs_bf16_on_dequantized"] = (got.float() - want.float()).abs().max().item()
        r["bit_equal_to_bf16_on_dequantized"] = bool(torch.equal(got, want))
        r["speedup_eager"] = row["bf16"]["eager_us"] / r["eager_us"]
        r["speedup_graph"] = row["bf16"]["graph_us"] / r["graph_us"]
        row[f"fp8_{kind}"] = r
    del sets_bf16, sets_fp8
    torch.cuda.empty_cache()
    return row


def _timed(fn, sets, iters: int, read_bytes: int, kv_bytes: int) -> dict:
    eager, eager_min = queued_time(fn, sets, iters)
    graph = graph_us(fn, sets)
    return dict(eager_us=eager, eager_min_us=eager_min, graph_us=graph, bytes_read=read_bytes, kv_bytes=kv_bytes,
                eager_tbs=read_bytes / eager / 1e6, graph_tbs=read_bytes / graph / 1e6,
                kv_tbs_eager=kv_bytes / eager / 1e6, kv_tbs_graph=kv_bytes / graph / 1e6)


def main() -> int:
    import torch

    import attngen
    from attngen.lang import frontend

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--rows", default=",".join(f"{b}:{lk}" for b, lk in ROWS), help="B:Lk pairs, comma-separated")
    ap.add_argument("--scales", default="head,page", help="FP8 scale granularities: head, page or both")
    args = ap.parse_args()
    rows = [tuple(int(x) for x in r.split(":")) for r in args.rows.split(",") if r]
    kinds = [s for s in args.scales.split(",") if s]
    if any(k not in ("head", "page") for k in kinds) or any(lk % PAGE for _, lk in rows):
        ap.error("--scales takes head and/or page; every Lk must be a multiple of 16")
    out_path = args.out or (os.path.join(os.environ["OUT"], "quant_decode_bench.json") if os.environ.get("OUT")
                            else str(ROOT / "benchmarks/results/quant_decode.json"))
    torch.manual_seed(0)
    kernels = {"bf16": attngen.compile(frontend.loads(spec(None), "<bench>").get())}
    for kind in kinds:
        kernels[kind] = attngen.compile(frontend.loads(spec(kind), "<bench>").get())
    results = [bench_row(B, Lk, kinds, kernels, args.iters) for B, Lk in rows]
    sm = torch.cuda.get_device_properties(0).multi_processor_count
    env = dict(device=torch.cuda.get_device_name(0), torch=torch.__version__, sms=sm,
               splits={f"{B}:{Lk}": kernels["bf16"].plan.split.schedule(B, 1, Lk, sm)[0] for B, Lk in rows})
    Path(out_path).parent.mkdir(parents=True, exist_ok=True)
    with open(out_path, "w") as f:
        json.dump(dict(env=env, rows=results), f, indent=1)
    print(f"{env['device']}, {sm} SMs; D{D} H{H}/{HKV}, paged(16), causal, Lq 1 (-> {out_path})")
    for r in results:
        b = r["bf16"]
        print(f"B={r['B']} Lk={r['Lk']}: bf16 eager {b['eager_us']:.1f} us ({b['eager_tbs']:.2f} TB/s), "
              f"graph {b['graph_us']:.1f} us ({b['graph_tbs']:.2f} TB/s)")
        for kind in kinds:
            x = r[f"fp8_{kind}"]
            print(f"    fp8 per {kind}: eager {x['eager_us']:.1f} us ({x['eager_tbs']:.2f} TB/s, {x['speedup_eager']:.2f}x), "
                  f"graph {x['graph_us']:.1f} us ({x['graph_tbs']:.2f} TB/s, {x['speedup_graph']:.2f}x); "
                  f"vs bf16 on the dequantized cache: max err {x['max_err_vs_bf16_on_dequantized']:.1e}"
                  f"{' (bit-equal)' if x['bit_equal_to_bf16_on_dequantized'] else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
