"""Head dims 256 and 192/128 (issue 15): attngen against torch SDPA's cuDNN and flash backends, same run.

    python benchmarks/headdim_bench.py [--out PATH] [--repeats N] [--sweep]

bf16, B4 H16 L8192, self attention: D256 dense and causal (bar: >= 0.85x cuDNN, which measured 664
dense / 692 causal TFLOP/s at this shape), and D192 with value 128 causal against every SDPA backend
that accepts Dv != D (cuDNN, memory-efficient; FlashAttention-2 refuses it). Timing and the checks
are attngen.tools.bench.bench_shape's: launches rotate through input sets over twice the L2, inputs
random normal (never zeros), each peer's output compared with ours before it is timed (the shapes are
too large for the NumPy reference, which tests/gpu/test_gpu_headdim.py covers). TFLOP/s count the
visible (unmasked) work: 2 B H Lq Lk (D + Dv) times the visible fraction. --sweep also times the
causal specs at the other tiles of tests/gpu/headdim_specs.SWEEP_TILES (ours only). Results: JSON to PATH (default
$OUT/headdim_bench.json, else benchmarks/results/h200_headdim.json) and a table on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for p in (ROOT, ROOT / "tests" / "gpu"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from headdim_specs import SWEEP_TILES, compiled  # noqa: E402  (the GPU tests' spec texts: one build per device run)

B, L = 4, 8192
CASES = ["hd256_dense", "hd256_causal", "hd192_causal"]
BARS = {"hd256_dense": ("sdpa-cudnn", 0.85), "hd256_causal": ("sdpa-cudnn", 0.85)}


def _sdpa_dv_peer(v, backend: str):
    """An SDPA backend for D != Dv (bench.sdpa_peer declines every Dv != D case); causal or dense."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from attngen.ir.nodes import TRUE
    from attngen.tools import bench, bench_peers

    be = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
          "efficient": SDPBackend.EFFICIENT_ATTENTION}[backend]
    causal = v.mask != TRUE

    def make(ins):
        q, k, vv = (bench_peers._bhsd(ins[n], v, h) for n, h in (("q", v.heads), ("k", v.kv_heads), ("v", v.kv_heads)))

        def run():
            with sdpa_kernel(be):
                o = torch.nn.functional.scaled_dot_product_attention(q, k, vv, is_causal=causal, scale=v.effective_scale)
            return o.transpose(1, 2) if v.layout.value == "bshd" else o
        return run
    return bench.Peer(f"sdpa-{backend}", make)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--sweep", action="store_true", help="also time the causal specs at SWEEP_TILES' tiles")
    args = ap.parse_args(argv)
    from attngen.tools import bench

    out = Path(args.out) if args.out else (Path(os.environ["OUT"]) / "headdim_bench.json" if os.environ.get("OUT")
                                           else ROOT / "benchmarks" / "results" / "h200_headdim.json")
    rows: list[bench.Row] = []
    for name in CASES:
        v, kernel = compiled(name, "sm_90a")
        if v.head_dim == v.value_head_dim:
            peers = [p for p in (bench.sdpa_peer(v, be, L, L) for be in ("cudnn", "flash")) if p is not None]
        else:
            peers = [_sdpa_dv_peer(v, be) for be in ("cudnn", "flash", "efficient")]
        # bench_shape(peers=True) would add torch.compile and flex peers (minutes of compiling): time
        # ours with peers=False, then each SDPA peer through the same routine.
        got = bench.bench_shape(v, kernel, B, L, L, workload=name, peers=False, repeats=args.repeats, check_reference=False)
        ours = got[0]
        for p in peers:
            prow = _time_peer(bench, v, kernel, p, ours, args.repeats)
            got.append(prow)
        rows += got
        print(bench.format_table(got), flush=True)
    if args.sweep:
        for name, tiles in SWEEP_TILES.items():
            for tile in tiles:
                v, kernel = compiled(name, "sm_90a", tile)
                got = bench.bench_shape(v, kernel, B, L, L, workload=f"{name} tile {tile}", peers=False,
                                        repeats=args.repeats, check_reference=False)
                rows += got
                print(bench.format_table(got), flush=True)
    verdicts = []
    for name, (peer, bar) in BARS.items():
        ours = next((r for r in rows if r.workload == name and r.impl == "attngen"), None)
        pr = next((r for r in rows if r.workload == name and r.impl == peer and r.ms), None)
        if ours and pr and ours.ms:
            ratio = pr.ms / ours.ms
            verdicts.append(dict(workload=name, peer=peer, ratio=ratio, bar=bar, met=ratio >= bar))
            print(f"{name}: {ratio:.3f}x {peer} (bar {bar}x): {'met' if ratio >= bar else 'MISSED'}")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"env": bench.env_info(), "B": B, "L": L, "rows": [asdict(r) for r in rows],
                               "bars": verdicts}, indent=1))
    print(f"wrote {out}")
    return 0


def _time_peer(bench, v, kernel, p, ours, repeats):
    """One peer at the benchmark shape: its output checked against ours, then timed alike."""
    from attngen.check import fuzz, tolerance
    from attngen.ir import abi
    from attngen.tools import bench_rows

    base = dict(workload=ours.workload, variant=v.name, dtype=v.dtype.value, B=B, H=v.heads, Lq=L, Lk=L, D=v.head_dim)
    prow = bench.Row(impl=p.name, **base)
    try:
        first = bench.device_qkv(v, B, L, L, 0)
        n_sets = bench.rotation_sets(sum(bench.nbytes(x) for x in first.values()))
        sets = [first] + [bench.device_qkv(v, B, L, L, 1 + i) for i in range(n_sets - 1)]
        runs = [p.make(sets[i]) for i in range(n_sets)]
        po = runs[0]()
        o = fuzz.empty_device(abi.o_shape(v, B, L), v.dtype)
        kernel(first["q"], first["k"], first["v"], out=o)
        fuzz.synchronize()
        rep = tolerance.check(bench_rows._to_np(o, v.dtype), bench_rows._to_np(po, v.dtype), v.dtype, f"attngen vs {p.name}")
        prow.agrees, prow.check = rep.ok, rep.summary()
        t, how = bench.time_launches(lambda i: runs[i](), n_sets, repeats=repeats)
        vis, dense = ours.visible, bench.dense_flops(v, B, L, L)
        prow.ms, prow.tflops_dense, prow.visible = t.median_ms, dense / t.median_ms / 1e9, vis
        prow.tflops_visible = dense * vis / t.median_ms / 1e9
        prow.speedup_vs_peer = t.median_ms / ours.ms if ours.ms else None
        prow.extra = {"min_ms": t.min_ms, "timing": how}
    except Exception as e:  # a backend that refuses the shape is a row with its error
        prow.error = f"{type(e).__name__}: {str(e)[:300]}"
    return prow


if __name__ == "__main__":
    raise SystemExit(main())
