#!/usr/bin/env bash
# The nineteenth session's first device call (one H200), TMA loads (issue 16):
#   source .whl/env.sh && bash tools/device_s19.sh
# 1. the TMA tests (tests/gpu/test_gpu_chain.py -k tma: bit-identical to the plain kernel and the
#    reference), 2. softmax_ab with the tma schedules beside the default and cuDNN / Flex.
set -uo pipefail
export PYTHONUNBUFFERED=1 ATTNGEN_CACHE_DIR=/tmp/attngen-cache
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
S="$OUT/summary.txt"
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader | tee -a "$S"
t0=$(date +%s)
timeout ${TEST_S:-200} python3 -m pytest -v -m gpu tests/gpu/test_gpu_chain.py -k test_tma_loads -p no:cacheprovider -n 6 -rfE --tb=short \
  > "$OUT/pytest_tma.txt" 2>&1
echo "tma pytest rc=$?: $(tail -n 1 "$OUT/pytest_tma.txt") ($(( $(date +%s) - t0 )) s)" >> "$S"
grep -E "^(FAILED|ERROR)|Error|error" "$OUT/pytest_tma.txt" | head -n 20 >> "$S"
t0=$(date +%s)
timeout ${AB_S:-$(( 560 - ($(date +%s) - T0) ))} python3 benchmarks/softmax_ab.py --schedules ${AB_SCHED:-tma} \
  --only ${AB_ONLY:-d128_dense d128_causal d64_dense d64_causal d128_gqa32_8_dense d128_gqa32_8_causal} --lengths ${AB_L:-512,1024,2048,4096,16384} \
  --out "$OUT/tma_ab.jsonl" > "$OUT/tma_ab.txt" 2>&1
echo "softmax_ab rc=$? ($(( $(date +%s) - t0 )) s)" >> "$S"
cat "$S"
tail -n 45 "$OUT/tma_ab.txt"
