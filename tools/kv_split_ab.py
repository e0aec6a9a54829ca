"""A/B of the wgmma forward's K/V ring (split or shared) and key-tile widths, with cuDNN in the same run.

    ATTNGEN_CACHE_DIR=/tmp/attngen-cache python3 tools/kv_split_ab.py [d256 d128 d192] > ab.txt

Each configuration is a variant of its own (its name carries the configuration) with a tile hint;
`schedule.wgmma_kv_split` is overridden per configuration (None: the schedule's own rule) and the
block_n register bound lifted, so that shared and split rings can be compared at equal tiles.
Kernels are prebuilt into the disk cache in parallel processes. Each output is compared with
cuDNN's at the timed shape before timing (bench.bench_shape: rotating input sets, random normal
inputs). Results: $OUT/ab_split.json (benchmarks/results/h200_kv_split_experiments.json holds a run)."""
import json, os, sys, time
from pathlib import Path
ROOT = Path(__file__).resolve().parents[1]  # tools/ -> the repository
sys.path.insert(0, str(ROOT))
import torch
from attngen.plan import schedule as S
from attngen.lang import frontend
from attngen.runtime import kernel as runtime
from attngen.tools import bench, bench_rows
from attngen.check import fuzz, tolerance
from attngen.ir import abi

orig_split = S.wgmma_kv_split
S.wgmma_max_block_n = lambda dv, tile: 256

def spec(name, d, causal, bn, st):
    dd = f"{d} value 128" if d == 192 else str(d)
    return (f"attention {name} {{\n  dtype bf16\n  head_dim {dd}\n  heads 16\n  layout bshd\n" + ("  mask causal\n" if causal else "")
            + (f"  tile block_m 128 block_n {bn} warps 8 stages {st}\n" if bn else "") + "}\n")

CASES = []  # (d, causal, B, L, configs[(tag, split, bn, st)])
CASES.append((256, False, 4, 8192, [("auto", None, None, None), ("base48x3", False, 48, 3), ("s48x3", True, 48, 3), ("s64x2", True, 64, 2), ("s80x2", True, 80, 2)]))
CASES.append((256, True, 4, 8192, [("auto", None, None, None), ("base48x3", False, 48, 3), ("s48x3", True, 48, 3), ("s64x2", True, 64, 2), ("s80x2", True, 80, 2)]))
CASES.append((128, False, 2, 16384, [("base128x3", False, 128, 3), ("s128x2", True, 128, 2), ("s176x2", True, 176, 2), ("s160x2", True, 160, 2), ("s144x2", True, 144, 2), ("s128x3", True, 128, 3)]))
CASES.append((128, True, 2, 16384, [("base128x3", False, 128, 3), ("s128x2", True, 128, 2), ("s176x2", True, 176, 2), ("s144x2", True, 144, 2)]))
CASES.append((128, True, 16, 2048, [("base128x3", False, 128, 3), ("s128x2", True, 128, 2), ("s176x2", True, 176, 2)]))
CASES.append((128, False, 32, 1024, [("base128x3", False, 128, 3), ("s128x2", True, 128, 2), ("s176x2", True, 176, 2)]))
CASES.append((192, True, 4, 8192, [("auto", None, None, None), ("base80x3", False, 80, 3), ("s112x2", True, 112, 2), ("s96x2", True, 96, 2)]))
only = sys.argv[1:]


def _variant(d, causal, tag, split, bn, st):
    name = f"ab_d{d}_{'c' if causal else 'n'}_{tag}"
    S.wgmma_kv_split = orig_split if split is None else (lambda tile, s=split: s)
    return frontend.loads(spec(name, d, causal, bn, st), "<ab>").get(None)


def _build(job):
    """Prebuild into the disk cache (NVRTC is single-threaded): one process a kernel."""
    d, causal, cfg = job
    t0 = time.time()
    try:
        runtime.compile(_variant(d, causal, *cfg), arch="sm_90a", family="forward")
        return f"built {d} {causal} {cfg[0]} in {time.time() - t0:.1f}s"
    except Exception as e:
        return f"build {d} {causal} {cfg[0]} FAILED {type(e).__name__}: {str(e)[:200]}"


if __name__ == "__main__":
    from concurrent.futures import ProcessPoolExecutor
    jobs = [(d, c, cfg) for d, c, B, L, cfgs in CASES if not only or f"d{d}" in only for cfg in cfgs]
    with ProcessPoolExecutor(int(os.environ.get("AB_JOBS", "12"))) as ex:
        for msg in ex.map(_build, jobs):
            print(msg, flush=True)
out_rows = []
for d, causal, B, L, cfgs in CASES:
    if only and f"d{d}" not in only:
        continue
    peer_o = None
    for tag, split, bn, st in cfgs:
        name = f"ab_d{d}_{'c' if causal else 'n'}_{tag}"
        try:
            v = _variant(d, causal, tag, split, bn, st)
            t0 = time.time()
            kernel = runtime.compile(v, arch="sm_90a", family="forward")
            ct = time.time() - t0
            if peer_o is None:
                p = bench.sdpa_peer(v, "cudnn", L, L)
                first = bench.device_qkv(v, B, L, L, 0)
                peer_o = p.make(first)()
                rows = []
                n_sets = bench.rotation_sets(sum(bench.nbytes(x) for x in first.values()))
                sets = [first] + [bench.device_qkv(v, B, L, L, 1 + i) for i in range(n_sets - 1)]
                runs = [p.make(sets[i]) for i in range(n_sets)]
                t, how = bench.time_launches(lambda i: runs[i](), n_sets, repeats=20)
                dense = bench.dense_flops(v, B, L, L)
                vis = 0.5 * (L + 1) / L if causal else 1.0
                cudnn_tf = dense * vis / t.median_ms / 1e9
                out_rows.append(dict(d=d, causal=causal, B=B, L=L, cfg="cudnn", tflops=cudnn_tf, ms=t.median_ms))
                print(f"d{d} {'causal' if causal else 'dense'} B{B} L{L} cudnn {cudnn_tf:.1f}", flush=True)
            first = bench.device_qkv(v, B, L, L, 0)
            o = fuzz.empty_device(abi.o_shape(v, B, L), v.dtype)
            kernel(first["q"], first["k"], first["v"], out=o)
            fuzz.synchronize()
            rep = tolerance.check(bench_rows._to_np(o, v.dtype), bench_rows._to_np(peer_o, v.dtype), v.dtype, f"{name} vs cudnn")
            got = bench.bench_shape(v, kernel, B, L, L, workload=name, peers=False, repeats=20, check_reference=False)
            r = got[0]
            out_rows.append(dict(d=d, causal=causal, B=B, L=L, cfg=tag, tile=str(kernel.plan.tile) if hasattr(kernel, "plan") else "", tflops=r.tflops_visible, ms=r.ms, agrees=rep.ok, check=rep.summary()[:160], compile_s=ct))
            print(f"d{d} {'causal' if causal else 'dense'} B{B} L{L} {tag:10s} {r.tflops_visible:7.1f} TF/s  x cudnn {r.tflops_visible / cudnn_tf:.3f}  agrees={rep.ok} compile {ct:.1f}s", flush=True)
        except Exception as e:
            out_rows.append(dict(d=d, causal=causal, cfg=tag, error=f"{type(e).__name__}: {str(e)[:300]}"))
            print(f"d{d} {tag} ERROR {type(e).__name__}: {str(e)[:300]}", flush=True)
    peer_o = None
    torch.cuda.empty_cache()
S.wgmma_kv_split = orig_split
Path(os.environ.get("OUT", "/tmp"), "ab_split.json").write_text(json.dumps(out_rows, indent=1))
