#!/usr/bin/env bash
# The tenth session's final device check, one call on the two-GPU kind (nvidia-h200-x2):
#   source .whl/env.sh; bash tools/device_s10_final.sh
# GPU 0: the GPU test suite, compute-sanitizer memcheck (forward odd shapes incl. the split K/V
# rings, backward, decode), the backward fuzz pass, a backward racecheck. GPU 1 (timing only): the
# length sweep against cuDNN and FA2, the suite rows whose kernels changed, head dims, backward,
# training blocks with their kernels profiled, decode. Results under $OUT; summary last.
set -uo pipefail
export PYTHONUNBUFFERED=1 ATTNGEN_CACHE_DIR=/tmp/attngen-cache
OUT=${OUT:-/tmp/out}
LOGS=/tmp/device-s10f-logs
mkdir -p "$OUT" "$LOGS"
S="$OUT/summary.txt"
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -n 1; } | tee -a "$S"
(
  export CUDA_VISIBLE_DEVICES=0
  HYPOTHESIS_PROFILE=ci timeout 300 python3 -m pytest -q -m gpu tests/gpu -p no:cacheprovider -n 14 -rfE --tb=short \
    > "$LOGS/pytest_gpu.txt" 2>&1
  echo "gpu pytest rc=$?: $(tail -n 1 "$LOGS/pytest_gpu.txt")" >> "$S"
  grep -E "^(FAILED|ERROR)" "$LOGS/pytest_gpu.txt" | head -n 30 >> "$S"
  timeout 70 compute-sanitizer --tool memcheck --error-exitcode 9 python3 tools/sanitize_cases.py > "$LOGS/san_memcheck.txt" 2>&1
  echo "compute-sanitizer forward memcheck rc=$? ($(tail -n 1 "$LOGS/san_memcheck.txt"))" >> "$S"
  timeout 50 compute-sanitizer --tool memcheck --error-exitcode 9 python3 tools/sanitize_bwd_cases.py > "$LOGS/san_bwd.txt" 2>&1
  echo "compute-sanitizer backward memcheck rc=$? ($(tail -n 1 "$LOGS/san_bwd.txt"))" >> "$S"
  timeout 40 compute-sanitizer --tool memcheck --error-exitcode 9 python3 tests/gpu/decode_smoke.py --quick \
    --only d_cache_bf16_d128_g8 d_paged8_fp16_d64_g8 d_sink_bf16_d64_g8 > "$LOGS/decode_memcheck.txt" 2>&1
  echo "decode memcheck rc=$? ($(tail -n 1 "$LOGS/decode_memcheck.txt"))" >> "$S"
  OUT="$LOGS" timeout 60 bash tests/gpu/bwd_features_gpu.sh 4 > "$LOGS/fuzz_bwd.txt" 2>&1
  echo "fuzz --pass backward rc=$?: $(grep -E 'on GPU in' "$LOGS/fuzz_bwd.txt" | sed 's/.*attngen fuzz: //' | tr '\n' ';')" >> "$S"
  timeout 60 compute-sanitizer --tool racecheck --error-exitcode 9 python3 tools/sanitize_bwd_cases.py --quick > "$LOGS/san_bwd_race.txt" 2>&1
  echo "compute-sanitizer backward racecheck rc=$? ($(grep -E 'RACECHECK SUMMARY' "$LOGS/san_bwd_race.txt" | tail -n 1); $(tail -n 1 "$LOGS/san_bwd_race.txt"))" >> "$S"
) &
(
  export CUDA_VISIBLE_DEVICES=1
  timeout 170 python3 benchmarks/sweep.py --peers cudnn,flash --out "$OUT/h200_sweep.jsonl" > "$LOGS/sweep.txt" 2>&1
  echo "sweep rc=$?" >> "$S"
  timeout 90 python3 benchmarks/suite.py --only ${SUITE_ROWS:-dense_d128 dense_d64 causal_d64} --out "$OUT/h200_suite_rows.jsonl" > "$LOGS/suite.txt" 2>&1
  echo "suite rows rc=$?" >> "$S"
  timeout 70 python3 benchmarks/headdim_bench.py --out "$OUT/h200_headdim.json" > "$LOGS/headdim.txt" 2>&1
  echo "headdim bench rc=$?" >> "$S"
  timeout 90 python3 benchmarks/bwd_bench.py --iters 3 --also-engine mma --out "$OUT/h200_bwd_wgmma.json" > "$LOGS/bwd_bench.txt" 2>&1
  echo "bwd bench rc=$?" >> "$S"
  timeout 90 python3 benchmarks/train_block_bench.py --profile --out "$OUT/h200_train_block.json" > "$LOGS/train_block.txt" 2>&1
  echo "train block bench rc=$?" >> "$S"
  timeout 60 python3 benchmarks/decode_bench.py --quick --out "$OUT/h200_decode_shares.json" > "$LOGS/decode_bench.txt" 2>&1
  echo "decode bench rc=$?" >> "$S"
) &
wait
tar czf "$OUT/logs.tgz" -C "$LOGS" . 2>/dev/null
{ echo "== sweep"; grep -vE "^\s*$" "$LOGS/sweep.txt" | tail -n 40; echo "== suite rows"; tail -n 12 "$LOGS/suite.txt";
  echo "== headdim"; grep -E "MISSED|met|attngen|cudnn" "$LOGS/headdim.txt" | tail -n 12; echo "== bwd"; tail -n 7 "$LOGS/bwd_bench.txt";
  echo "== train block"; tail -n 40 "$LOGS/train_block.txt"; echo "== decode"; tail -n 12 "$LOGS/decode_bench.txt"; } >> "$S"
cat "$S"
