#!/usr/bin/env bash
# The decode family's GPU check, on a GPU machine with the cuda extra and torch:
#   bash tools/decode_gpu_check.sh
# Fixed-shape smoke over every decode spec (never stops early), compute-sanitizer memcheck on three
# of them (contiguous, paged, sinks), the decode GPU tests, the examples that use the decode
# constructs, the GPU tests whose small-Lq cases the auto family now routes to decode, and the
# decode benchmark (table, schedule and tile sweeps, the split kernel's own merge against the
# combine kernel, paged vs contiguous), and the C++ paged example (bound schedule, three splits
# merged by the combine kernel, then by the split kernel twice). About 5-6 minutes on an H200.
set -uo pipefail
export PYTHONUNBUFFERED=1 ATTNGEN_CACHE_DIR=/tmp/attngen-cache
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
timeout 90 python3 tests/gpu/decode_smoke.py 2>&1 | grep -v "^  ok" | tail -40 | tee "$OUT/decode_smoke.txt"
timeout 90 compute-sanitizer --tool memcheck --error-exitcode 9 python3 tests/gpu/decode_smoke.py --quick \
  --only d_cache_bf16_d128_g8 d_paged8_fp16_d64_g8 d_sink_bf16_d64_g8 > "$OUT/decode_memcheck.txt" 2>&1
echo "compute-sanitizer memcheck: exit $? ($(tail -1 "$OUT/decode_memcheck.txt"))" | tee -a "$OUT/decode_summary.txt"
timeout 150 python3 -m pytest -q -m gpu tests/gpu/test_gpu_decode.py -p no:cacheprovider 2>&1 | tail -3 | tee -a "$OUT/decode_summary.txt"
timeout 200 python3 -m pytest -q -m gpu tests/gpu/test_gpu_examples.py tests/gpu/test_gpu_kernels.py -p no:cacheprovider \
  -k "paged or gpt_oss or mqa or extreme or one_kernel or grid" 2>&1 | tail -3 | tee -a "$OUT/decode_summary.txt"
timeout 150 python3 benchmarks/decode_bench.py --out "$OUT/decode_bench.json" 2>&1 | tail -40 | tee "$OUT/decode_bench.txt"
timeout 150 bash -c 'cmake -S examples/cpp -B /tmp/cpp -DATTNGEN_COMMAND="python3;-m;attngen" > /tmp/cmake.txt 2>&1 \
  && cmake --build /tmp/cpp -j 16 >> /tmp/cmake.txt 2>&1 && /tmp/cpp/paged_decode_demo' 2>&1 | tail -6 | tee -a "$OUT/decode_summary.txt"
echo "=== summary"; cat "$OUT/decode_summary.txt"
