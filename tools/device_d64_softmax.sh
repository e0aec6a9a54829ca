#!/usr/bin/env bash
# Issue 16's device check (D64 wgmma softmax schedule), one call on one H200, from the tree root:
#   source .whl/env.sh; bash tools/device_d64_softmax.sh
# First the forward GPU tests of D64 wgmma variants against the NumPy reference (dense, now on the
# 192 x 128 tile, causal, GQA, LSE, padding with fully masked rows, cross lengths down to 1, sinks,
# the pre-LN block), then
# the A/B of the softmax schedules beside cuDNN (benchmarks/softmax_ab.py) on the same GPU,
# after the tests, so that no test shares the GPU with a clock. Results under $OUT; summary last.
set -uo pipefail
export PYTHONUNBUFFERED=1 ATTNGEN_CACHE_DIR=/tmp/attngen-cache
OUT=${OUT:-/tmp/out}
TESTS_S=${TESTS_S:-70}
AB_S=${AB_S:-100}
mkdir -p "$OUT"
S="$OUT/summary.txt"
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader | tee -a "$S"
XDIST=""
python3 -c "import xdist" 2>/dev/null && XDIST="-n 8"
HYPOTHESIS_PROFILE=ci timeout "$TESTS_S" python3 -m pytest -q -m gpu -p no:cacheprovider $XDIST -rfE --tb=short \
  tests/gpu/test_gpu_kernels.py tests/gpu/test_gpu_examples.py \
  -k "grid_fp16_d64 or grid_bf16_d64 or f_none_fp16 or f_padding_causal_cross_bf16 or extreme_cross or fully_masked or serves_every or gpt2_causal_fp16 or gpt_oss or whisper_preln or dilated_causal" \
  > "$OUT/pytest_gpu.txt" 2>&1
echo "gpu pytest rc=$?: $(tail -n 1 "$OUT/pytest_gpu.txt")" >> "$S"
grep -E "^(FAILED|ERROR)" "$OUT/pytest_gpu.txt" | head -n 20 >> "$S"
timeout "$AB_S" python3 benchmarks/softmax_ab.py --out "$OUT/softmax_ab.jsonl" > "$OUT/ab.txt" 2>&1
echo "d64 softmax A/B rc=$?" >> "$S"
grep -vE "^  " "$OUT/ab.txt" | tail -n 30 >> "$S"
cat "$S"
