#!/usr/bin/env bash
# A mid-session device check of the decode family and the C++ examples (one H200):
#   source .whl/env.sh && bash tools/device_mid.sh
set -uo pipefail
export PYTHONUNBUFFERED=1 ATTNGEN_CACHE_DIR=/tmp/attngen-cache
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; S="$OUT/summary.txt"
nvidia-smi --query-gpu=name --format=csv,noheader | tee -a "$S"
( timeout 150 python3 -m pytest -q -m gpu tests/gpu/test_gpu_decode.py -p no:cacheprovider -x -n 4 > "$OUT/pytest_decode.txt" 2>&1
  echo "decode gpu tests rc=$?: $(tail -n 1 "$OUT/pytest_decode.txt")" >> "$S" ) &
( timeout 150 bash -c 'cmake -S examples/cpp -B /tmp/cpp -DATTNGEN_COMMAND="python3;-m;attngen" > /tmp/cmake.txt 2>&1 && cmake --build /tmp/cpp -j 8 >> /tmp/cmake.txt 2>&1 && /tmp/cpp/attn_demo && /tmp/cpp/paged_decode_demo' > "$OUT/cpp.txt" 2>&1
  echo "cpp examples rc=$?: $(grep -E 'PASS|FAIL|paged decode|max' "$OUT/cpp.txt" | tr '\n' ' ')" >> "$S"; tail -n 20 /tmp/cmake.txt >> "$OUT/cpp.txt" ) &
wait
timeout 60 compute-sanitizer --tool memcheck --error-exitcode 9 python3 tests/gpu/decode_smoke.py --quick \
  --only d_cache_bf16_d128_g8 d_paged8_fp16_d64_g8 d_sink_bf16_d64_g8 > "$OUT/decode_memcheck.txt" 2>&1
echo "decode memcheck rc=$? ($(tail -n 1 "$OUT/decode_memcheck.txt"))" >> "$S"
timeout 150 python3 benchmarks/decode_bench.py --out "$OUT/h200_decode.json" > "$OUT/decode_bench.txt" 2>&1
echo "decode bench rc=$?" >> "$S"
timeout 60 python3 benchmarks/compile_bench.py --out "$OUT/h200_compile.json" --repeats 2 > "$OUT/compile.txt" 2>&1
echo "compile bench rc=$?: $(tail -n 2 "$OUT/compile.txt")" >> "$S"
echo "=== decode bench"; tail -n 30 "$OUT/decode_bench.txt"; echo "=== summary"; cat "$S"
