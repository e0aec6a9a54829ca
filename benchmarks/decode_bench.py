"""Decode benchmark (issue 15): the decode family against SDPA flash and cuDNN, same run.

    python benchmarks/decode_bench.py [--out PATH] [--iters N] [--quick] [--paged-only]

bf16, D128, H32, Hkv8, `kind cross`, Lq = 1 (and a speculative-decoding row, Lq = 4), at the
issue's (B, Lk) rows, plus the cache-length-masked variant. Every peer's output is compared with
ours first. Timing: the GPU is held busy by a spin kernel while every timed launch is queued, so
the events measure back-to-back GPU time, not Python launch overhead (the same for every column);
launches rotate through K/V copies totalling >= 256 MB (the H200's L2 is 60 MB), inputs random
normal, never zeros. Bandwidth = K+V bytes read / time. Each row also sweeps the split kernel's
schedule through the runtime's overrides: `s<N>` is N equal splits of every row block (N x row
blocks CTAs, the grain before the equal-share schedule), `c<N>` N equal shares of all units.
`--quick` drops the tile sweep and the paged rows' 64/256 page sizes. Results: JSON to PATH
(default $OUT/decode_bench.json, else benchmarks/results/h200_decode.json) and a table on stdout.
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

ROWS = [(1, 8192), (1, 131072), (8, 32768), (64, 4096), (128, 1024)]
SPEC = """
attention dec {
  dtype bf16
  head_dim 128
  heads 32 kv 8
  kind cross
  %s
}
"""
H, HKV, D = 32, 8, 128




def main() -> int:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import attngen
    from attngen.lang import frontend

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--paged-only", action="store_true", help="only the paged rows (and their split sweep)")
    ap.add_argument("--quick", action="store_true", help="no tile sweep; paged rows at page 16 only")
    args = ap.parse_args()
    out_path = args.out or (os.path.join(os.environ["OUT"], "decode_bench.json") if os.environ.get("OUT")
                            else str(ROOT / "benchmarks/results/h200_decode.json"))
    torch.manual_seed(0)
    dev = torch.device("cuda")
    v_plain = frontend.loads(SPEC % "output lse", "<bench>").get()
    v_cache = frontend.loads(SPEC % "input cache_lens: i32[B]\n  mask causal && kv < cache_lens[b]", "<bench>").get()
    dec = attngen.compile(v_plain, family="decode")
    fwd = attngen.compile(v_plain, family="forward")
    dec_cache = attngen.compile(v_cache, family="decode")
    # The same cache token-major ([B, Lk, Hkv, D]: a KV head's rows interleaved with the other
    # heads', as in a page), to tell the paged layout's cost from the page lookups'.
    dec_cache_bshd = attngen.compile(frontend.loads(
        SPEC % "layout bshd\n  input cache_lens: i32[B]\n  mask causal && kv < cache_lens[b]", "<bench>").get(), family="decode")
    sm = torch.cuda.get_device_properties(0).multi_processor_count
    results = []
    rows = [] if args.paged_only else [(B, Lk, 1) for B, Lk in ROWS] + [(8, 32768, 4)]
    for B, Lk, Lq in rows:
        kv_bytes = 2 * B * HKV * Lk * D * 2
        n = max(2, min(8, -(-(256 << 20) // kv_bytes)))
        sets = []
        for _ in range(n):
            q = torch.randn(B, H, Lq, D, device=dev, dtype=torch.bfloat16)
            k = torch.randn(B, HKV, Lk, D, device=dev, dtype=torch.bfloat16)
            v = torch.randn(B, HKV, Lk, D, device=dev, dtype=torch.bfloat16)
            sets.append((q, k, v))
        q, k, v = sets[0]
        lens = torch.full((B,), Lk, dtype=torch.int32, device=dev)
        o_ours, lse_ours = dec(q, k, v)
        splits, ctas = dec.plan.split.schedule(B, Lq, Lk, sm)
        row = dict(B=B, Lk=Lk, Lq=Lq, H=H, Hkv=HKV, D=D, kv_bytes=kv_bytes, splits=splits, ctas=ctas)

        def sdpa(q, k, v, backend):
            with sdpa_kernel(backend):
                # bottom-right causal would be needed for Lq > 1 with a mask; these rows have none.
                return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)

        ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), enable_gqa=True).to(torch.bfloat16)
        err = (o_ours.float() - ref.float()).abs().max().item()
        row["max_abs_err_vs_fp32_sdpa"] = err
        t, tmin = queued_time(lambda q, k, v: dec(q, k, v), sets, args.iters)
        row["ours_us"], row["ours_min_us"] = t, tmin
        t, _ = queued_time(lambda q, k, v: dec_cache(q, k, v, cache_lens=lens), sets, args.iters)
        row["ours_cache_lens_us"] = t
        if splits > 1:  # the other merge: a combine launch instead of the split kernel's last CTA a row block
            row["ours_combine_us"], _ = queued_time(lambda q, k, v: dec(q, k, v, fused=False), sets, args.iters)
            row["ours_combine_err_vs_ours"] = (dec(q, k, v, fused=False)[0].float() - o_ours.float()).abs().max().item()
        t, _ = queued_time(lambda q, k, v: fwd(q, k, v), sets, max(5, args.iters // 4), repeats=3)
        row["forward_family_us"] = t
        for name, be in (("sdpa_flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
            try:
                o_p = sdpa(q, k, v, be)
                row[f"{name}_err_vs_ours"] = (o_p.float() - o_ours.float()).abs().max().item()
                t, _ = queued_time(lambda q, k, v, be=be: sdpa(q, k, v, be), sets, args.iters)
                row[f"{name}_us"] = t
            except Exception as e:  # a backend that refuses the shape is reported, not fatal
                row[f"{name}_error"] = f"{type(e).__name__}: {str(e)[:120]}"
        # Schedule sweep through the overrides: equal splits of every row block (s<N>) and equal
        # shares of all units (c<N>), against the launch-time schedule.
        n_chunks = -(-Lk // dec.plan.split.chunk)
        units = dec.plan.split.units(B, Lq, Lk)
        sweep = {}
        for s in (1, 2, 4, 8, 16):
            if s <= n_chunks:
                sweep[f"s{s}"], _ = queued_time(lambda q, k, v, s=s: dec(q, k, v, splits=s), sets, args.iters, repeats=3)
        for c in (sm, 2 * sm, 4 * sm):
            if c <= units:
                sweep[f"c{c}"], _ = queued_time(lambda q, k, v, c=c: dec(q, k, v, ctas=c), sets, args.iters, repeats=3)
        row["schedule_sweep_us"] = sweep
        results.append(row)
        del sets
        torch.cuda.empty_cache()
    # Schedule sweep: (keys a warp, ring stages) of the split kernel, at two rows.
    from attngen.runtime import decode as runtime_decode
    from attngen.runtime.kernel import device_arch

    tile_rows = []
    for B, Lk in () if args.paged_only or args.quick else ((8, 32768), (1, 131072)):
        kv_bytes = 2 * B * HKV * Lk * D * 2
        sets = [(torch.randn(B, H, 1, D, device=dev, dtype=torch.bfloat16),
                 torch.randn(B, HKV, Lk, D, device=dev, dtype=torch.bfloat16),
                 torch.randn(B, HKV, Lk, D, device=dev, dtype=torch.bfloat16)) for _ in range(2)]
        ref = F.scaled_dot_product_attention(sets[0][0].float(), sets[0][1].float(), sets[0][2].float(), enable_gqa=True)
        trow = dict(B=B, Lk=Lk, kv_bytes=kv_bytes, tiles={})
        for tile in ((16, 2), (16, 3), (16, 4), (32, 2), (32, 3)):
            try:
                kt = runtime_decode.compile_decode(v_plain, device_arch(), tile=tile)
                err = (kt(*sets[0])[0].float() - ref).abs().max().item()
                t, _ = queued_time(lambda q, k, v, kt=kt: kt(q, k, v), sets, args.iters, repeats=3)
            except Exception as e:  # a schedule that fails is reported, not fatal
                print(f"tile {tile}: {type(e).__name__}: {str(e)[:200]}")
                continue
            trow["tiles"][f"{tile[0]}x{tile[1]}"] = dict(us=t, err=err, ctas_per_sm=kt.plan.split.ctas_per_sm(),
                                                        ctas=kt.plan.split.schedule(B, 1, Lk, sm)[1])
        tile_rows.append(trow)
        del sets
        torch.cuda.empty_cache()
    # Paged caches (shuffled pages) against the contiguous cache, same mask, same cache lengths.
    paged_rows = []
    for B, Lk in ((8, 32768), (1, 131072), (64, 4096)):
        kv_bytes = 2 * B * HKV * Lk * D * 2
        n = max(2, min(8, -(-(256 << 20) // kv_bytes)))
        q = torch.randn(B, H, 1, D, device=dev, dtype=torch.bfloat16)
        lens = torch.full((B,), Lk, dtype=torch.int32, device=dev)
        csets = [(q, torch.randn(B, HKV, Lk, D, device=dev, dtype=torch.bfloat16),
                  torch.randn(B, HKV, Lk, D, device=dev, dtype=torch.bfloat16)) for _ in range(n)]
        t_contig, _ = queued_time(lambda q, k, v: dec_cache(q, k, v, cache_lens=lens), csets, args.iters)
        del csets
        qt = q.transpose(1, 2).contiguous()  # [B, 1, H, D]
        tsets = [(qt, torch.randn(B, Lk, HKV, D, device=dev, dtype=torch.bfloat16),
                  torch.randn(B, Lk, HKV, D, device=dev, dtype=torch.bfloat16)) for _ in range(n)]
        t_tok, _ = queued_time(lambda q, k, v: dec_cache_bshd(q, k, v, cache_lens=lens), tsets, args.iters)
        del tsets
        prow = dict(B=B, Lk=Lk, kv_bytes=kv_bytes, contiguous_us=t_contig, contiguous_token_major_us=t_tok)
        pages_timed = (16,) if args.quick else (16, 64, 256)
        for page in pages_timed:
            vp = frontend.loads(SPEC % f"input cache_lens: i32[B]\n  kv_cache paged({page})\n  mask causal && kv < cache_lens[b]", "<bench>").get()
            kp = attngen.compile(vp)
            pages = Lk // page
            psets = []
            for _ in range(n):
                kpg = torch.randn(B * pages, page, HKV, D, device=dev, dtype=torch.bfloat16)
                vpg = torch.randn(B * pages, page, HKV, D, device=dev, dtype=torch.bfloat16)
                table = torch.randperm(B * pages, device=dev).to(torch.int32).reshape(B, pages)
                psets.append((q, kpg, vpg, table))
            # correctness: paged equals the contiguous kernel on the gathered cache
            q0, k0, v0, t0 = psets[0]
            kc = k0[t0.long()].reshape(B, Lk, HKV, D).transpose(1, 2).contiguous()
            vc = v0[t0.long()].reshape(B, Lk, HKV, D).transpose(1, 2).contiguous()
            prow[f"paged{page}_err_vs_contiguous"] = (kp(q0, k0, v0, cache_lens=lens, block_table=t0).float()
                                                      - dec_cache(q0, kc, vc, cache_lens=lens).float()).abs().max().item()
            del kc, vc
            # Timed without the per-call page-id check (it synchronises the stream; an engine
            # validates a block table once when it builds it).
            prow[f"paged{page}_us"], _ = queued_time(lambda q, k, v, t: kp(q, k, v, cache_lens=lens, block_table=t, check_pages=False),
                                               psets, args.iters)
            if page == 16:
                # Other schedules: equal splits of every row block, equal shares of the units.
                c0 = kp.plan.split.schedule(B, 1, Lk, sm)[1]
                prow["paged16_ctas"] = c0
                prow["paged16_sweep_us"] = {
                    key: queued_time(lambda q, k, v, t, kw=kw: kp(q, k, v, cache_lens=lens, block_table=t, check_pages=False, **kw),
                                     psets, args.iters, repeats=3)[0]
                    for key, kw in (("s1", dict(splits=1)), ("s4", dict(splits=4)), ("s4_combine", dict(splits=4, fused=False)),
                                    (f"c{sm}", dict(ctas=sm)), (f"c{2 * sm}", dict(ctas=2 * sm)))
                    if kw.get("ctas", 0) <= kp.plan.split.units(B, 1, Lk) and kw.get("splits", 0) <= -(-Lk // kp.plan.split.chunk)}
            del psets
            torch.cuda.empty_cache()
        paged_rows.append(prow)
    env = dict(device=torch.cuda.get_device_name(0), torch=torch.__version__, sms=sm)
    Path(out_path).parent.mkdir(parents=True, exist_ok=True)
    with open(out_path, "w") as f:
        json.dump(dict(env=env, rows=results, paged=paged_rows, tiles=tile_rows), f, indent=1)

    def gbs(r, key):
        return f"{r[key]:8.1f} us ({r['kv_bytes'] / r[key] / 1e3:6.0f} GB/s)" if key in r else f"{'n/a':>24}"

    print(f"{'B, Lk, Lq':>16} | {'ctas':>5} | {'attngen decode':>24} | {'cache_lens mask':>24} | {'SDPA flash':>24} | {'cuDNN':>24} | {'forward family':>24} | err")
    for r in results:
        print(f"{r['B']:>5}, {r['Lk']:>6}, {r['Lq']:>2} | {r['ctas']:>5} | {gbs(r, 'ours_us')} | {gbs(r, 'ours_cache_lens_us')} | "
              f"{gbs(r, 'sdpa_flash_us')} | {gbs(r, 'cudnn_us')} | {gbs(r, 'forward_family_us')} | {r['max_abs_err_vs_fp32_sdpa']:.2e}")
    print("\npartials merged in the split kernel (default) vs by the combine kernel (fused=False), us:")
    for r in results:
        if "ours_combine_us" in r:
            print(f"  ({r['B']}, {r['Lk']}, Lq {r['Lq']}): {r['ours_us']:.1f} vs {r['ours_combine_us']:.1f} "
                  f"(max |diff| {r['ours_combine_err_vs_ours']:.1e})")
    print("\nschedule sweep (us; s<N>: N splits a row block, c<N>: N equal shares; default = the table's ctas):")
    for r in results:
        print(f"  ({r['B']}, {r['Lk']}, Lq {r['Lq']}): " + "  ".join(f"{s}: {t:.1f}" for s, t in r["schedule_sweep_us"].items()))
    print("\nsplit-kernel schedule sweep (keys a warp x stages: us, GB/s, CTAs an SM, splits, max err vs fp32 SDPA):")
    for r in tile_rows:
        print(f"  ({r['B']}, {r['Lk']}): " + "; ".join(
            f"{n}: {x['us']:.1f} us {r['kv_bytes'] / x['us'] / 1e3:.0f} GB/s {x['ctas_per_sm']}/SM c{x['ctas']} err {x['err']:.1e}"
            for n, x in r["tiles"].items()))
    print("\npaged decode (causal && kv < cache_lens, shuffled pages) vs contiguous:")
    for r in paged_rows:
        print(f"  ({r['B']}, {r['Lk']}): contiguous {gbs(r, 'contiguous_us')}; token-major {gbs(r, 'contiguous_token_major_us')}; " + "; ".join(
            f"page {pg}: {gbs(r, f'paged{pg}_us')} ({r[f'paged{pg}_us'] / r['contiguous_us']:.3f}x, err {r[f'paged{pg}_err_vs_contiguous']:.1e})"
            for pg in (16, 64, 256) if f"paged{pg}_us" in r))
        if "paged16_sweep_us" in r:
            print(f"    page 16 by schedule (default c{r['paged16_ctas']}): " + "  ".join(f"{k}: {t:.1f} us" for k, t in r["paged16_sweep_us"].items()))
    for r in results:
        for k_ in ("sdpa_flash_error", "cudnn_error"):
            if k_ in r:
                print(f"  ({r['B']}, {r['Lk']}): {k_}: {r[k_]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
