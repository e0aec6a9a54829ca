#!/usr/bin/env bash
# The thirteenth session's device calls (one H200):
#   source .whl/env.sh && ITEMS="..." bash tools/device_s13.sh
# Items, in the order given:
#   dqab      the wgmma backward's dQ reduction modes A/B: benchmarks/bwd_bench.py --wg-dq over
#             $DQ_MODES (default red2 wg; peers re-timed in each run), then the Flex backward rows
#             over $FLEX_MODES (default wg red2)
#   gpubwd    the GPU backward tests with the dQ mode forced to $AG_WG_DQ (tools/pytest_wg_dq.py)
#   gpu       the whole GPU test suite (default modes)
#   san       compute-sanitizer memcheck of the forward and backward odd shapes, backward racecheck
#   sanwg     memcheck, racecheck and synccheck of the backward odd shapes with the dQ mode forced
#             to $AG_WG_DQ (default wg: its named barriers and the hand-off between warpgroups)
#   fuzzbwd   fuzz --pass backward over the training examples
#   ablate    benchmarks/bwd_ablate.py (where the backward's time goes: the dQ reductions, the
#             per-CTA fixed cost, the pre/finish kernels) on four rows, dQ mode $ABLATE_DQ (default
#             the plan's)
# Results under $OUT, logs in $OUT/logs.tgz, a summary last.
set -uo pipefail
export PYTHONUNBUFFERED=1 ATTNGEN_CACHE_DIR=/tmp/attngen-cache
OUT=${OUT:-/tmp/out}
LOGS=/tmp/device-s13-logs
mkdir -p "$OUT" "$LOGS"
S="$OUT/summary.txt"
# xdist's work stealing (3.2+) keeps idle workers busy while the slowest tests (100-120 s each) run;
# the default scheduling left tests queued behind them when the fourteenth session's suite was cut
DIST=$(python3 -c "import sys, xdist; sys.exit(0 if tuple(map(int, xdist.__version__.split('.')[:2])) >= (3, 2) else 1)" 2>/dev/null && echo "--dist worksteal")
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader | tee -a "$S"
for it in ${ITEMS:-dqab}; do
  t0=$(date +%s)
  case $it in
    dqab)
      for m in ${DQ_MODES:-red2 wg}; do
        timeout ${BWD_S:-100} python3 benchmarks/bwd_bench.py --iters 3 --wg-dq "$m" --out "$OUT/bwd_$m.json" > "$LOGS/bwd_$m.txt" 2>&1
        echo "bwd_bench --wg-dq $m rc=$?" >> "$S"
      done
      for m in ${FLEX_MODES:-wg red2}; do
        timeout ${FLEX_S:-120} python3 benchmarks/bwd_flex_bench.py --iters 3 --wg-dq "$m" --out "$OUT/bwd_flex_$m.json" > "$LOGS/bwd_flex_$m.txt" 2>&1
        echo "bwd_flex_bench --wg-dq $m rc=$?" >> "$S"
      done ;;
    gpubwd)
      AG_WG_DQ=${AG_WG_DQ:-wg} PYTHONPATH=tools${PYTHONPATH:+:$PYTHONPATH} HYPOTHESIS_PROFILE=ci timeout ${GPUBWD_S:-200} \
        python3 -m pytest -q -m gpu -p pytest_wg_dq -p no:cacheprovider -n 15 $DIST -rfE --tb=short \
        tests/gpu/test_gpu_backward_wgmma.py tests/gpu/test_gpu_backward.py tests/gpu/test_gpu_backward_features.py tests/gpu/test_gpu_autograd.py \
        > "$LOGS/pytest_gpubwd.txt" 2>&1
      echo "gpu backward tests (dQ ${AG_WG_DQ:-wg}) rc=$?: $(tail -n 1 "$LOGS/pytest_gpubwd.txt")" >> "$S"
      grep -E "^(FAILED|ERROR)" "$LOGS/pytest_gpubwd.txt" | head -n 20 >> "$S" ;;
    gpu)
      HYPOTHESIS_PROFILE=ci timeout ${PYTEST_S:-470} python3 -m pytest -q -m gpu tests/gpu -p no:cacheprovider -n 15 $DIST -rfE --tb=short --durations=15 \
        > "$LOGS/pytest_gpu.txt" 2>&1
      echo "gpu pytest rc=$?: $(tail -n 1 "$LOGS/pytest_gpu.txt")" >> "$S"
      grep -E "^(FAILED|ERROR)" "$LOGS/pytest_gpu.txt" | head -n 30 >> "$S" ;;
    san)
      timeout 70 compute-sanitizer --tool memcheck --error-exitcode 9 python3 tools/sanitize_cases.py > "$LOGS/san_fwd.txt" 2>&1
      echo "memcheck forward rc=$? ($(tail -n 1 "$LOGS/san_fwd.txt"))" >> "$S"
      timeout 60 compute-sanitizer --tool memcheck --error-exitcode 9 python3 tools/sanitize_bwd_cases.py > "$LOGS/san_bwd.txt" 2>&1
      echo "memcheck backward rc=$? ($(tail -n 1 "$LOGS/san_bwd.txt"))" >> "$S"
      timeout 70 compute-sanitizer --tool racecheck --error-exitcode 9 python3 tools/sanitize_bwd_cases.py --quick > "$LOGS/san_race.txt" 2>&1
      echo "racecheck backward rc=$? ($(grep -E 'RACECHECK SUMMARY' "$LOGS/san_race.txt" | tail -n 1); $(tail -n 1 "$LOGS/san_race.txt"))" >> "$S" ;;
    sanwg)
      for tool in memcheck racecheck synccheck; do
        AG_WG_DQ=${AG_WG_DQ:-wg} timeout ${SANWG_S:-90} compute-sanitizer --tool $tool --error-exitcode 9 python3 tools/sanitize_bwd_cases.py --quick \
          > "$LOGS/sanwg_$tool.txt" 2>&1
        echo "$tool backward (dQ ${AG_WG_DQ:-wg}) rc=$? ($(grep -E 'SUMMARY' "$LOGS/sanwg_$tool.txt" | tail -n 1); $(tail -n 1 "$LOGS/sanwg_$tool.txt"))" >> "$S"
      done ;;
    fuzzbwd)
      OUT="$LOGS" timeout 60 bash tests/gpu/bwd_features_gpu.sh 4 > "$LOGS/fuzz_bwd.txt" 2>&1
      echo "fuzz --pass backward rc=$?: $(grep -E 'on GPU in' "$LOGS/fuzz_bwd.txt" | sed 's/.*attngen fuzz: //' | tr '\n' ';')" >> "$S" ;;
    ablate)
      timeout ${ABLATE_S:-300} python3 benchmarks/bwd_ablate.py --iters 3 ${ABLATE_DQ:+--wg-dq $ABLATE_DQ} --out "$OUT/bwd_ablate.json" \
        > "$LOGS/bwd_ablate.txt" 2>&1
      echo "bwd_ablate rc=$?" >> "$S"; grep -E "TFLOP/s|skipped" "$LOGS/bwd_ablate.txt" | tail -n 32 >> "$S" ;;
  esac
  echo "  ($it: $(( $(date +%s) - t0 )) s)" >> "$S"
done
tar czf "$OUT/logs.tgz" -C "$LOGS" . 2>/dev/null
for f in "$LOGS"/bwd_*.txt; do
  [ -f "$f" ] || continue
  echo "== $(basename "$f")" >> "$S"; grep -vE "^\s*$|built in|wrote " "$f" | tail -n 8 >> "$S"
done
cat "$S"
