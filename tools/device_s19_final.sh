#!/usr/bin/env bash
# The nineteenth session's last device call (one H200), on the final kernels (TMA loads the
# default): the GPU tests of the forward and of what runs it (autograd, backward wgmma, binder),
# with memcheck of the odd shapes beside them. Results under $OUT, a summary last.
#   source .whl/env.sh && bash tools/device_s19_final.sh
set -uo pipefail
export PYTHONUNBUFFERED=1 ATTNGEN_CACHE_DIR=/tmp/attngen-cache
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
S="$OUT/summary.txt"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader | tee -a "$S"
t0=$(date +%s)
( sleep 25
  nice timeout 110 compute-sanitizer --tool memcheck --error-exitcode 9 python3 tools/sanitize_cases.py > "$OUT/san_memcheck.txt" 2>&1
  echo "memcheck forward rc=$? ($(grep -E 'ERROR SUMMARY' "$OUT/san_memcheck.txt" | tail -n 1); $(tail -n 1 "$OUT/san_memcheck.txt"))" >> "$OUT/san_summary.txt" ) &
SAN=$!
FILES="tests/gpu/test_gpu_chain.py tests/gpu/test_gpu_kernels.py tests/gpu/test_gpu_examples.py tests/gpu/test_gpu_constructs.py
 tests/gpu/test_gpu_oracles.py tests/gpu/test_gpu_regressions.py tests/gpu/test_gpu_tiles_by_length.py tests/gpu/test_gpu_validation.py
 tests/gpu/test_gpu_binder_torch.py tests/gpu/test_gpu_arches.py tests/gpu/test_gpu_autograd.py tests/gpu/test_gpu_backward_wgmma.py"
HYPOTHESIS_PROFILE=ci timeout ${PYTEST_S:-430} python3 -m pytest -v -m gpu $FILES -p no:cacheprovider -n 14 -rfE --tb=short --durations=15 \
  > "$OUT/pytest_gpu.txt" 2>&1
echo "gpu pytest rc=$?: $(tail -n 1 "$OUT/pytest_gpu.txt") ($(grep -c ' PASSED' "$OUT/pytest_gpu.txt") PASSED lines, $(grep -c ' FAILED' "$OUT/pytest_gpu.txt") FAILED, $(grep -c ' SKIPPED' "$OUT/pytest_gpu.txt") SKIPPED; $(( $(date +%s) - t0 )) s)" >> "$S"
grep -E "^(FAILED|ERROR)" "$OUT/pytest_gpu.txt" | head -n 30 >> "$S"
wait $SAN
cat "$OUT/san_summary.txt" >> "$S" 2>/dev/null
cat "$S"
