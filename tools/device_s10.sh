#!/usr/bin/env bash
# The tenth session's device check, one call on the two-GPU kind (nvidia-h200-x2):
#   source .whl/env.sh; bash tools/device_s10.sh
# GPU 0: the GPU test suite, then sanitizers (forward memcheck on odd shapes, backward memcheck, decode
# memcheck) and a backward fuzz pass. GPU 1: timing only (training blocks with their kernels
# profiled, head dims with the tile sweep, backward bench), then a backward racecheck once the
# clocks are done, so that tests never share a GPU with a clock. Results under $OUT; summary last.
set -uo pipefail
export PYTHONUNBUFFERED=1 ATTNGEN_CACHE_DIR=/tmp/attngen-cache
OUT=${OUT:-/tmp/out}
LOGS=/tmp/device-s10-logs
mkdir -p "$OUT" "$LOGS"
S="$OUT/summary.txt"
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; git rev-parse --short HEAD 2>/dev/null; } | tee -a "$S"
# Warm the NVRTC cache for the suite's kernels is not needed: each side compiles what it runs.
(
  export CUDA_VISIBLE_DEVICES=0
  HYPOTHESIS_PROFILE=ci timeout 320 python3 -m pytest -q -m gpu tests/gpu -p no:cacheprovider -n 14 -rfE --tb=short \
    > "$LOGS/pytest_gpu.txt" 2>&1
  echo "gpu pytest rc=$?: $(tail -n 1 "$LOGS/pytest_gpu.txt")" >> "$S"
  grep -E "^(FAILED|ERROR)" "$LOGS/pytest_gpu.txt" | head -n 30 >> "$S"
  timeout 60 compute-sanitizer --tool memcheck --error-exitcode 9 python3 tools/sanitize_cases.py > "$LOGS/san_memcheck.txt" 2>&1
  echo "compute-sanitizer forward memcheck rc=$? ($(tail -n 1 "$LOGS/san_memcheck.txt"))" >> "$S"
  timeout 50 compute-sanitizer --tool memcheck --error-exitcode 9 python3 tools/sanitize_bwd_cases.py > "$LOGS/san_bwd.txt" 2>&1
  echo "compute-sanitizer backward memcheck rc=$? ($(tail -n 1 "$LOGS/san_bwd.txt"))" >> "$S"
  timeout 40 compute-sanitizer --tool memcheck --error-exitcode 9 python3 tests/gpu/decode_smoke.py --quick \
    --only d_cache_bf16_d128_g8 d_paged8_fp16_d64_g8 d_sink_bf16_d64_g8 > "$LOGS/decode_memcheck.txt" 2>&1
  echo "decode memcheck rc=$? ($(tail -n 1 "$LOGS/decode_memcheck.txt"))" >> "$S"
  OUT="$LOGS" timeout 60 bash tests/gpu/bwd_features_gpu.sh 4 > "$LOGS/fuzz_bwd.txt" 2>&1
  echo "fuzz --pass backward rc=$?: $(grep -cE 'fail' "$LOGS/fuzz_bwd.txt") lines with 'fail'" >> "$S"; tail -n 6 "$LOGS/fuzz_bwd.txt" >> "$S"
) &
(
  export CUDA_VISIBLE_DEVICES=1
  timeout 150 python3 benchmarks/train_block_bench.py --profile --out "$OUT/h200_train_block.json" > "$LOGS/train_block.txt" 2>&1
  echo "train block bench rc=$?" >> "$S"
  timeout 170 python3 benchmarks/headdim_bench.py --sweep --out "$OUT/h200_headdim.json" > "$LOGS/headdim.txt" 2>&1
  echo "headdim bench rc=$?" >> "$S"
  timeout 100 python3 benchmarks/bwd_bench.py --iters 3 --also-engine mma --out "$OUT/h200_bwd_wgmma.json" > "$LOGS/bwd_bench.txt" 2>&1
  echo "bwd bench rc=$?" >> "$S"
  timeout 120 compute-sanitizer --tool racecheck --error-exitcode 9 python3 tools/sanitize_bwd_cases.py --quick > "$LOGS/san_bwd_race.txt" 2>&1
  echo "compute-sanitizer backward racecheck rc=$? ($(grep -E 'RACECHECK SUMMARY|hazard' "$LOGS/san_bwd_race.txt" | tail -n 1); $(tail -n 1 "$LOGS/san_bwd_race.txt"))" >> "$S"
) &
wait
tar czf "$OUT/logs.tgz" -C "$LOGS" . 2>/dev/null
{ echo "== headdim"; tail -n 16 "$LOGS/headdim.txt"; echo "== bwd"; tail -n 12 "$LOGS/bwd_bench.txt";
  echo "== train block"; tail -n 48 "$LOGS/train_block.txt"; } >> "$S"
cat "$S"
