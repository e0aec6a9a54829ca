#!/usr/bin/env bash
# Head dims 256 and 192/128 on a GPU machine with the cuda extra and torch:
#   bash tools/headdim_gpu_check.sh [--sweep]
# Builds every kernel of tests/gpu/headdim_specs.py and the two gallery examples in parallel into
# the disk cache first (NVRTC is single-threaded; each wgmma build takes a while), then runs
# tests/gpu/test_gpu_headdim.py and benchmarks/headdim_bench.py (--sweep: also the causal specs at
# the other tiles of SWEEP_TILES, about 40 s more). Results land under $OUT.
set -uo pipefail
export PYTHONUNBUFFERED=1 ATTNGEN_CACHE_DIR=${ATTNGEN_CACHE_DIR:-/tmp/attngen-cache}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
SWEEP=${1:-}
export HEADDIM_SWEEP=$([ "$SWEEP" = "--sweep" ] && echo 1 || echo 0)
timeout 70 python3 - <<'PY' 2>&1 | tail -20 | tee "$OUT/headdim_prebuild.txt"
import os, sys, time
from concurrent.futures import ProcessPoolExecutor
sys.path.insert(0, "tests/gpu")
from headdim_specs import GPU_CASES, SWEEP_TILES

def build(job):
    t0 = time.time()
    try:
        if job[0] == "example":
            from attngen.runtime import kernel as runtime
            runtime.compile(f"examples/{job[1]}.attn", family="forward")
        elif job[0] == "sweep":
            from headdim_specs import compiled
            compiled(job[1], "sm_90a", job[2])
        else:
            from headdim_specs import compiled
            compiled(*job)
    except Exception as e:  # reported here; the tests then fail with the whole story
        return job, f"FAILED {type(e).__name__}: {str(e)[:500]}"
    return job, f"{time.time() - t0:.1f} s"

jobs = sorted({(n, a) for n, a, _ in GPU_CASES}) + [("example", "gemma3_d256_local"), ("example", "deepseek_mla_prefill")]
if os.environ["HEADDIM_SWEEP"] == "1":
    jobs += [("sweep", n, t) for n, ts in SWEEP_TILES.items() for t in ts]
with ProcessPoolExecutor(max_workers=len(jobs)) as ex:
    for job, s in ex.map(build, jobs):
        print(f"built {job}: {s}")
PY
timeout 75 python3 -m pytest -q -m gpu tests/gpu/test_gpu_headdim.py -p no:cacheprovider 2>&1 | tee "$OUT/headdim_tests.txt" | tail -15
timeout $([ "$HEADDIM_SWEEP" = 1 ] && echo 120 || echo 70) python3 benchmarks/headdim_bench.py $SWEEP --out "$OUT/headdim_bench.json" 2>&1 | tee "$OUT/headdim_bench.txt" | tail -30
