#!/usr/bin/env bash
# The whole device check of a tree in two calls on the two-GPU kind (nvidia-h200-x2), each part on
# its own GPU so they run side by side. From the repository root, with .whl (and, for part A,
# .whl-cuda) carried:
#
#   source .whl/env.sh && bash tools/device_final.sh A     (GPU suite | install, arch and C++ proofs)
#   source .whl/env.sh && bash tools/device_final.sh B     (host overhead, suite, sweep | sanitizers,
#                                                           decode check and bench, fuzz)
#   source .whl/env.sh && bash tools/device_final.sh T     (GPU suite, backward/varlen/head-dim
#                                                           benches | backward sanitizers, C++,
#                                                           decode, fuzz: one call)
#
# Results under $OUT: a summary.txt, the JSON results, and logs.tgz with every log (the device tool
# brings back at most 8 files). The summary prints last.
set -uo pipefail
export PYTHONUNBUFFERED=1 ATTNGEN_CACHE_DIR=/tmp/attngen-cache
OUT=${OUT:-/tmp/out}
LOGS=/tmp/device-final-logs
mkdir -p "$OUT" "$LOGS"
S="$OUT/summary.txt"
part=${1:?usage: device_final.sh A|B|T}
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; git rev-parse --short HEAD 2>/dev/null; } | tee -a "$S"

if [ "$part" = A ]; then
  # GPU 0: the GPU test suite (NVRTC builds spread over 8 workers; the kernel cache is shared).
  (
    CUDA_VISIBLE_DEVICES=0 HYPOTHESIS_PROFILE=ci timeout 480 python3 -m pytest -q -m gpu tests/gpu -p no:cacheprovider \
      -n 8 -rfE --tb=short > "$LOGS/pytest_gpu.txt" 2>&1
    echo "gpu pytest rc=$?: $(tail -n 1 "$LOGS/pytest_gpu.txt")" >> "$S"
  ) &
  # GPU 1: the cuda extra in a clean venv, other arches, the C++ example.
  (
    CUDA_VISIBLE_DEVICES=1 OUT="$LOGS/install" timeout 480 bash tools/device_install_check.sh > "$LOGS/install.txt" 2>&1
    echo "install check rc=$?" >> "$S"
    sed -n '/PASS\|FAIL/p' "$LOGS/install.txt" | tail -n 12 >> "$S"
  ) &
  wait
  grep -E "^(FAILED|ERROR)" "$LOGS/pytest_gpu.txt" | head -n 30 >> "$S"
  # Both GPUs: ring attention's exactness against the single-GPU kernel, and its benchmark.
  OUT="$LOGS/ring" timeout 300 bash tools/ring_device_check.sh 2 > "$LOGS/ring.txt" 2>&1
  echo "ring check rc=$?" >> "$S"
  grep -E "^ring check|^ +[0-9]+ \||^ring attention|^ +L \|" "$LOGS/ring.txt" >> "$S"
  cp "$LOGS/ring/ring_bench.json" "$LOGS/ring/ring_check.json" "$OUT/" 2>/dev/null
fi

if [ "$part" = B ]; then
  (
    # GPU 0, timing: host cost per call first (a quiet process), then the suite and the sweep.
    CUDA_VISIBLE_DEVICES=0 OUT="$OUT" timeout 90 python3 tools/host_overhead.py > "$LOGS/host_overhead.txt" 2>&1
    echo "host_overhead rc=$?" >> "$S"
    CUDA_VISIBLE_DEVICES=0 timeout 270 python3 benchmarks/suite.py --out "$OUT/bench.jsonl" > "$LOGS/suite.txt" 2>&1
    echo "suite rc=$?" >> "$S"
    CUDA_VISIBLE_DEVICES=0 timeout 150 python3 benchmarks/sweep.py --out "$OUT/sweep.jsonl" --peers cudnn,flash \
      > "$LOGS/sweep.txt" 2>&1
    echo "sweep rc=$?" >> "$S"
  ) &
  (
    # GPU 1: (when .whl-cuda travelled) the install proofs again, sanitizers on odd shapes, the
    # decode family's check and bench, a fuzz pass.
    export CUDA_VISIBLE_DEVICES=1
    if [ -d .whl-cuda ]; then
      OUT="$LOGS/install" timeout 240 bash tools/device_install_check.sh > "$LOGS/install.txt" 2>&1
      echo "install check rc=$?" >> "$S"
      sed -n '/PASS\|FAIL/p' "$LOGS/install.txt" | tail -n 7 >> "$S"
    fi
    for tool in memcheck racecheck; do
      timeout 150 compute-sanitizer --tool $tool --error-exitcode 9 python3 tools/sanitize_cases.py > "$LOGS/san_$tool.txt" 2>&1
      echo "compute-sanitizer $tool rc=$? ($(tail -n 1 "$LOGS/san_$tool.txt"))" >> "$S"
    done
    timeout 90 compute-sanitizer --tool memcheck --error-exitcode 9 python3 tests/gpu/decode_smoke.py --quick \
      --only d_cache_bf16_d128_g8 d_paged8_fp16_d64_g8 d_sink_bf16_d64_g8 > "$LOGS/decode_memcheck.txt" 2>&1
    echo "decode memcheck rc=$? ($(tail -n 1 "$LOGS/decode_memcheck.txt"))" >> "$S"
    timeout 120 python3 benchmarks/decode_bench.py --out "$OUT/decode_bench.json" > "$LOGS/decode_bench.txt" 2>&1
    echo "decode bench rc=$?" >> "$S"
    for f in examples/seed_padded_fp32.attn examples/llama3_gqa_causal.attn examples/gpt_oss_sinks.attn \
             examples/packed_documents.attn examples/whisper_preln_cross.attn examples/paged_decode_llama3.attn; do
      timeout 60 python3 -m attngen fuzz "$f" --seconds 20 --out /tmp/fuzz 2>&1 | tr '\r' '\n' | grep -v "ex/s" | tail -n 1
    done > "$LOGS/fuzz.txt" 2>&1
    timeout 90 python3 -m attngen fuzz --specs --seconds 60 --out /tmp/fuzz 2>&1 | tr '\r' '\n' | grep -v "ex/s" \
      | tail -n 2 >> "$LOGS/fuzz.txt"
    cat "$LOGS/fuzz.txt" >> "$S"
  ) &
  wait
  { echo "== host overhead"; tail -n 25 "$LOGS/host_overhead.txt"; echo "== suite"; tail -n 45 "$LOGS/suite.txt";
    echo "== sweep"; tail -n 40 "$LOGS/sweep.txt"; echo "== decode"; tail -n 30 "$LOGS/decode_bench.txt"; } >> "$S"
fi

if [ "$part" = T ]; then
  # One call for a tree whose forward kernels are unchanged (renders byte-identical) but whose
  # backward, varlen, head-dim and decode kernels are new: GPU suite and the new benchmarks on
  # GPU 0; sanitizers on the new kernels, the C++ examples, decode and a fuzz pass on GPU 1.
  (
    export CUDA_VISIBLE_DEVICES=0
    HYPOTHESIS_PROFILE=ci timeout 300 python3 -m pytest -q -m gpu tests/gpu -p no:cacheprovider -n 8 -rfE --tb=short \
      > "$LOGS/pytest_gpu.txt" 2>&1
    echo "gpu pytest rc=$?: $(tail -n 1 "$LOGS/pytest_gpu.txt")" >> "$S"
    timeout 110 python3 benchmarks/bwd_bench.py --out "$OUT/h200_bwd.json" > "$LOGS/bwd_bench.txt" 2>&1
    echo "bwd bench rc=$?" >> "$S"
    timeout 60 python3 benchmarks/varlen_bench.py --out "$OUT/h200_varlen.json" > "$LOGS/varlen_bench.txt" 2>&1
    echo "varlen bench rc=$?" >> "$S"
    timeout 70 python3 benchmarks/headdim_bench.py --out "$OUT/h200_headdim.json" > "$LOGS/headdim_bench.txt" 2>&1
    echo "headdim bench rc=$?" >> "$S"
  ) &
  (
    export CUDA_VISIBLE_DEVICES=1
    for tool in memcheck racecheck; do
      timeout 100 compute-sanitizer --tool $tool --error-exitcode 9 python3 tools/sanitize_bwd_cases.py > "$LOGS/san_bwd_$tool.txt" 2>&1
      echo "compute-sanitizer $tool backward rc=$? ($(tail -n 1 "$LOGS/san_bwd_$tool.txt"))" >> "$S"
    done
    timeout 60 compute-sanitizer --tool memcheck --error-exitcode 9 python3 tests/gpu/decode_smoke.py --quick \
      --only d_cache_bf16_d128_g8 d_paged8_fp16_d64_g8 d_sink_bf16_d64_g8 > "$LOGS/decode_memcheck.txt" 2>&1
    echo "decode memcheck rc=$? ($(tail -n 1 "$LOGS/decode_memcheck.txt"))" >> "$S"
    timeout 100 bash -c 'cmake -S examples/cpp -B /tmp/cpp -DATTNGEN_COMMAND="python3;-m;attngen" > /tmp/cmake.txt 2>&1 \
      && cmake --build /tmp/cpp -j 16 >> /tmp/cmake.txt 2>&1 && /tmp/cpp/attn_demo && /tmp/cpp/paged_decode_demo' > "$LOGS/cpp.txt" 2>&1
    echo "cpp examples rc=$?: $(grep -E 'PASS|FAIL' "$LOGS/cpp.txt" | tr '\n' ' ')" >> "$S"
    timeout 130 python3 benchmarks/decode_bench.py --out "$OUT/h200_decode.json" > "$LOGS/decode_bench.txt" 2>&1
    echo "decode bench rc=$?" >> "$S"
    { for a in "examples/llama3_gqa_causal.attn --seconds 12" "examples/varlen_causal_training.attn --seconds 12" \
               "examples/gemma3_d256_local.attn --seconds 12" "examples/gpt_oss_sinks.attn --pass backward --seconds 15" \
               "examples/qwen3_qk_norm.attn --pass backward --seconds 15"; do
        timeout 45 python3 -m attngen fuzz $a --out /tmp/fuzz 2>&1 | tr '\r' '\n' | grep -v "ex/s" | tail -n 1
      done
      timeout 60 python3 -m attngen fuzz --specs --seconds 40 --out /tmp/fuzz 2>&1 | tr '\r' '\n' | grep -v "ex/s" | tail -n 2
    } > "$LOGS/fuzz.txt" 2>&1
    cat "$LOGS/fuzz.txt" >> "$S"
  ) &
  wait
  grep -E "^(FAILED|ERROR)" "$LOGS/pytest_gpu.txt" | head -n 30 >> "$S"
  { echo "== bwd"; tail -n 14 "$LOGS/bwd_bench.txt"; echo "== varlen"; tail -n 14 "$LOGS/varlen_bench.txt";
    echo "== headdim"; tail -n 10 "$LOGS/headdim_bench.txt"; echo "== decode"; tail -n 24 "$LOGS/decode_bench.txt"; } >> "$S"
fi

tar czf "$OUT/logs.tgz" -C "$LOGS" . 2>/dev/null
echo "=== summary"
cat "$S"
