#!/usr/bin/env bash
# The twenty-first session's device calls (one H200):
#   source .whl/env.sh && ITEMS="..." bash tools/device_s21.sh
# Items, in the order given:
#   smoke     the backward odd shapes (tools/sanitize_bwd_cases.py --quick, no sanitizer) on the
#             TMA dK/dV kernel, under $SMOKE_S: a hang or a wrong gradient shows here first (then
#             bwdab and gpubwd are skipped)
#   bwdab     benchmarks/bwd_bench.py --also-loads cp.async: the backward with the TMA copies (the
#             default) and with cp.async in the same run, cuDNN and FA2 beside them ($BWD_ARGS added)
#   bwddq     benchmarks/bwd_bench.py --also-dq $ALSO_DQ (default wgtma): the default dQ mode (WgDq.WG_BULK: row
#             reductions of padded rows) against that one (WG_TMA: tensor reductions of swizzled boxes) in the
#             same run, peers beside (this session's runs had WG_TMA as the default and --also-dq wgbulk)
#   gpubwd    the GPU tests of the backward (TMA vs cp.async, wgmma, autograd)
#   tiles     (the twentieth session) softmax_ab --tiles at the sweep cells that missed 0.95x cuDNN (D64 L1k/2k, D128 2k-8k)
#   tiles2    the D128 short-loop threshold (4096) checked: default against 128 x 128 x 2 at L4k and
#             L16k, dense, causal and GQA 32/8
#   gpu       GPU test files ($GPU_FILES, default the ones the nineteenth session did not run)
#   flex      benchmarks/bwd_flex_bench.py: window, documents, softcap against Flex's backward
#   train     benchmarks/train_block_bench.py: the two training blocks against torch.compile
#   fuzz      attngen fuzz --pass backward over the training examples ($FUZZ_N cases each)
#   sanbwd    compute-sanitizer memcheck of the backward odd shapes, default and with AG_WG_DQ=wgtma, then
#             racecheck of the default (its named-barrier hand-off reports are known: see benchmarks/README.md)
#   gpuwgt    the GPU backward tests with the dQ mode forced to WgDq.WG_TMA (-p tools.pytest_wg_dq)
#   san       compute-sanitizer memcheck of the forward and backward odd shapes (TMA kernels)
# Results under $OUT, a summary last.
set -uo pipefail
export PYTHONUNBUFFERED=1 ATTNGEN_CACHE_DIR=/tmp/attngen-cache
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
S="$OUT/summary.txt"
DIST=$(python3 -c "import sys, xdist; sys.exit(0 if tuple(map(int, xdist.__version__.split('.')[:2])) >= (3, 2) else 1)" 2>/dev/null && echo "--dist worksteal")
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader | tee -a "$S"
BAD=0
pyt() {  # label, limit, files...
  local label=$1 lim=$2; shift 2
  HYPOTHESIS_PROFILE=ci timeout "$lim" python3 -m pytest -v -m gpu "$@" -p no:cacheprovider -n ${WORKERS:-12} $DIST -rfE --tb=short \
    > "$OUT/pytest_$label.txt" 2>&1
  echo "gpu pytest $label rc=$?: $(tail -n 1 "$OUT/pytest_$label.txt") ($(grep -c ' PASSED' "$OUT/pytest_$label.txt") PASSED, $(grep -c ' FAILED' "$OUT/pytest_$label.txt") FAILED, $(grep -c ' SKIPPED' "$OUT/pytest_$label.txt") SKIPPED)" >> "$S"
  grep -E "^(FAILED|ERROR)" "$OUT/pytest_$label.txt" | head -n 20 >> "$S"
}
for it in ${ITEMS:-smoke bwdab gpubwd}; do
  t0=$(date +%s)
  case $it in
    smoke)
      timeout ${SMOKE_S:-120} python3 tools/sanitize_bwd_cases.py --quick > "$OUT/smoke.txt" 2>&1
      rc=$?; [ $rc = 0 ] || BAD=1
      echo "smoke backward rc=$rc ($(tail -n 1 "$OUT/smoke.txt"))" >> "$S"
      grep -E "^BAD" "$OUT/smoke.txt" | head -n 8 >> "$S" ;;
    bwdab)
      [ $BAD = 0 ] || { echo "bwdab skipped (smoke failed)" >> "$S"; continue; }
      timeout ${BWD_S:-200} python3 benchmarks/bwd_bench.py --iters ${BWD_ITERS:-5} --also-loads cp.async ${BWD_ARGS:-} --out "$OUT/bwd_tma_ab.json" > "$OUT/bwd_tma_ab.txt" 2>&1
      echo "bwdab rc=$?" >> "$S"; grep -E "TFLOP/s" "$OUT/bwd_tma_ab.txt" >> "$S" ;;
    bwddq)
      [ $BAD = 0 ] || { echo "bwddq skipped (smoke failed)" >> "$S"; continue; }
      timeout ${BWD_S:-200} python3 benchmarks/bwd_bench.py --iters ${BWD_ITERS:-5} --also-dq ${ALSO_DQ:-wgtma} ${BWD_ARGS:-} --out "$OUT/bwd_dq_ab.json" > "$OUT/bwd_dq_ab.txt" 2>&1
      echo "bwddq rc=$?" >> "$S"; grep -E "TFLOP/s" "$OUT/bwd_dq_ab.txt" >> "$S" ;;
    gpubwd)
      [ $BAD = 0 ] || { echo "gpubwd skipped (smoke failed)" >> "$S"; continue; }
      pyt bwd ${GPUBWD_S:-200} tests/gpu/test_gpu_backward_tma.py tests/gpu/test_gpu_backward_wgmma.py tests/gpu/test_gpu_autograd.py ;;
    tiles)
      TILES="128x128x8x3 128x128x8x2 128x176x8x2 192x128x12x3"
      timeout ${AB_S:-200} python3 benchmarks/softmax_ab.py --out "$OUT/tiles_d64.jsonl" --only d64_dense d64_causal --lengths 1024,2048 \
        --schedules default --tiles $TILES > "$OUT/tiles_d64.txt" 2> "$OUT/tiles_d64.err"
      echo "tiles d64 rc=$?" >> "$S"; tail -n 6 "$OUT/tiles_d64.txt" >> "$S"
      timeout ${AB_S2:-230} python3 benchmarks/softmax_ab.py --out "$OUT/tiles_d128.jsonl" --only d128_dense d128_causal --lengths 2048,4096,8192 \
        --schedules default --tiles $TILES > "$OUT/tiles_d128.txt" 2> "$OUT/tiles_d128.err"
      echo "tiles d128 rc=$?" >> "$S"; tail -n 9 "$OUT/tiles_d128.txt" >> "$S" ;;
    tiles2)
      timeout ${AB_S3:-150} python3 benchmarks/softmax_ab.py --out "$OUT/tiles2.jsonl" --only d128_dense d128_causal d128_gqa32_8_dense d128_gqa32_8_causal \
        --lengths 4096,16384 --schedules default --tiles 128x128x8x2 > "$OUT/tiles2.txt" 2> "$OUT/tiles2.err"
      echo "tiles2 rc=$?" >> "$S"; tail -n 12 "$OUT/tiles2.txt" >> "$S" ;;
    gpu)
      pyt rest ${GPU_S:-200} ${GPU_FILES:-tests/gpu/test_gpu_varlen.py tests/gpu/test_gpu_decode.py tests/gpu/test_gpu_headdim.py tests/gpu/test_gpu_backward.py tests/gpu/test_gpu_backward_features.py tests/gpu/test_gpu_backward_tc.py} ;;
    flex)
      timeout ${FLEX_S:-240} python3 benchmarks/bwd_flex_bench.py --iters ${FLEX_ITERS:-5} ${FLEX_ARGS:-} --out "$OUT/bwd_flex.json" > "$OUT/bwd_flex.txt" 2>&1
      echo "flex rc=$?" >> "$S"; tail -n 5 "$OUT/bwd_flex.txt" >> "$S" ;;
    train)
      timeout ${TRAIN_S:-200} python3 benchmarks/train_block_bench.py --out "$OUT/train_block.json" > "$OUT/train_block.txt" 2>&1
      echo "train rc=$?" >> "$S"; tail -n 4 "$OUT/train_block.txt" >> "$S" ;;
    fuzz)
      for ex in ${FUZZ_SPECS:-examples/whisper_preln_cross.attn examples/qwen3_qk_norm.attn examples/llama3_gqa_causal.attn}; do
        timeout ${FUZZ_S:-100} python3 -m attngen fuzz "$ex" --pass backward --max-examples ${FUZZ_N:-40} > "$OUT/fuzz_$(basename $ex .attn).txt" 2>&1
        echo "fuzz backward $ex rc=$? ($(tail -n 1 "$OUT/fuzz_$(basename $ex .attn).txt"))" >> "$S"
      done ;;
    sanbwd)
      timeout ${SANB_S:-120} compute-sanitizer --tool memcheck --error-exitcode 9 python3 tools/sanitize_bwd_cases.py --quick > "$OUT/san_bwd.txt" 2>&1
      echo "memcheck backward rc=$? ($(grep -E 'ERROR SUMMARY' "$OUT/san_bwd.txt" | tail -n 1); $(tail -n 1 "$OUT/san_bwd.txt"))" >> "$S"
      AG_WG_DQ=wgtma timeout ${SANB_S:-120} compute-sanitizer --tool memcheck --error-exitcode 9 python3 tools/sanitize_bwd_cases.py --quick > "$OUT/san_bwd_wgtma.txt" 2>&1
      echo "memcheck backward (wgtma) rc=$? ($(grep -E 'ERROR SUMMARY' "$OUT/san_bwd_wgtma.txt" | tail -n 1); $(tail -n 1 "$OUT/san_bwd_wgtma.txt"))" >> "$S"
      timeout ${RACE_S:-150} compute-sanitizer --tool racecheck python3 tools/sanitize_bwd_cases.py --quick > "$OUT/race_bwd.txt" 2>&1
      echo "racecheck backward rc=$? ($(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$OUT/race_bwd.txt" | tail -n 1); $(tail -n 1 "$OUT/race_bwd.txt"))" >> "$S" ;;
    gpuwgt)
      AG_WG_DQ=wgtma pyt wgt ${GPUWGT_S:-200} -p tools.pytest_wg_dq tests/gpu/test_gpu_backward_tma.py tests/gpu/test_gpu_backward_wgmma.py tests/gpu/test_gpu_autograd.py tests/gpu/test_gpu_backward_features.py ;;
    san)
      timeout ${SAN_S:-150} compute-sanitizer --tool memcheck --error-exitcode 9 python3 tools/sanitize_cases.py > "$OUT/san_fwd.txt" 2>&1
      echo "memcheck forward rc=$? ($(grep -E 'ERROR SUMMARY' "$OUT/san_fwd.txt" | tail -n 1); $(tail -n 1 "$OUT/san_fwd.txt"))" >> "$S"
      timeout ${SANB_S:-150} compute-sanitizer --tool memcheck --error-exitcode 9 python3 tools/sanitize_bwd_cases.py --quick > "$OUT/san_bwd.txt" 2>&1
      echo "memcheck backward rc=$? ($(grep -E 'ERROR SUMMARY' "$OUT/san_bwd.txt" | tail -n 1); $(tail -n 1 "$OUT/san_bwd.txt"))" >> "$S" ;;
  esac
  echo "  ($it: $(( $(date +%s) - t0 )) s)" >> "$S"
done
cat "$S"
