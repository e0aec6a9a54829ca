#!/usr/bin/env bash
# The device calls of the thirteenth to fifteenth sessions (one H200):
#   source .whl/env.sh && ITEMS="..." bash tools/device_s13.sh
# Items, in the order given:
#   smokewg   the backward odd shapes with the dQ mode forced to $AG_WG_DQ (default wg), no
#             sanitizer, under $SMOKE_S (150 s: cold compiles took 60 s in the fifteenth session): a
#             hang or a wrong gradient shows here first, and then the items after it leave that
#             mode out of dqab and skip gpubwd (sanwg still runs: it is the diagnosis)
#   dqab      the wgmma backward's dQ reduction modes A/B: benchmarks/bwd_bench.py --wg-dq over
#             $DQ_MODES (default red2 wg; peers re-timed in each run; $BWD_ARGS added, e.g. --only
#             rows), then the Flex backward rows
#             over $FLEX_MODES (default wg red2)
#   bwd       the backward suite rows on the plan's defaults: benchmarks/bwd_bench.py --also-engine mma
#             (results h200_bwd_wgmma.json) and bwd_flex_bench.py (h200_bwd_flex.json)
#   nbarprobe compute-sanitizer racecheck of tools/racecheck_nbar_probe.cu (built beforehand on the
#             CPU machine: nvcc -arch=sm_90a -o .whl/nbar_probe tools/racecheck_nbar_probe.cu; it
#             travels with the .whl carry): the named-barrier hand-off of
#             WgDq.WG, a lockstep control and a real race, so that a racecheck report on the kernel
#             can be read against what the tool says of a known-correct protocol
#   gpubwd    the GPU backward tests with the dQ mode forced to $AG_WG_DQ (tools/pytest_wg_dq.py)
#   gpu       the whole GPU test suite (default modes); $GPU_ARGS is added to pytest's arguments
#             (e.g. --ignore of files an earlier call ran on the same kernels), $WORKERS its workers
#   san       compute-sanitizer memcheck of the forward and backward odd shapes, backward racecheck
#   sanwg     memcheck, racecheck and synccheck of the backward odd shapes with the dQ mode forced
#             to $AG_WG_DQ (default wg: its named barriers and the hand-off between warpgroups)
#   fuzzbwd   fuzz --pass backward over the training examples
#   train     the pre-LN cross block trained end to end against torch.compile (tests/gpu/bwd_features_gpu.sh 3:
#             h200_train_block.json)
#   ncu       ncu of one backward each (tools/ncu_bwd.py --only $NCU_CASES, default the wgbulk kernel and
#             its dQ cuts) and of cuDNN's: the sections and metrics of tools/device_s14.sh, into
#             $OUT/ncu_bwd.txt (results/h200_bwd_wgmma_ncu.txt holds the red2/tile run)
#   ablate    benchmarks/bwd_ablate.py (where the backward's time goes: the dQ reductions, the
#             per-CTA fixed cost, the pre/finish kernels) on four rows, dQ mode $ABLATE_DQ (default
#             the plan's; $ABLATE_ARGS added, e.g. --only rows --ablations cuts)
# Results under $OUT, logs in $OUT/logs.tgz, a summary last.
set -uo pipefail
export PYTHONUNBUFFERED=1 ATTNGEN_CACHE_DIR=/tmp/attngen-cache
OUT=${OUT:-/tmp/out}
# The logs are tarred into $OUT after every item (the device brings back only so many files), so
# that a call cut by its time limit still returns those of the items it finished.
LOGS=/tmp/device-s13-logs
mkdir -p "$OUT" "$LOGS"
S="$OUT/summary.txt"
# xdist's work stealing (3.2+) keeps idle workers busy while the slowest tests (100-120 s each) run;
# the default scheduling left tests queued behind them when the fourteenth session's suite was cut
DIST=$(python3 -c "import sys, xdist; sys.exit(0 if tuple(map(int, xdist.__version__.split('.')[:2])) >= (3, 2) else 1)" 2>/dev/null && echo "--dist worksteal")
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader | tee -a "$S"
WG_BAD=0
drop_bad() { local m out=""; for m in $1; do [ "$WG_BAD" = 1 ] && [ "$m" = "${AG_WG_DQ:-wg}" ] || out="$out $m"; done; echo $out; }
for it in ${ITEMS:-dqab}; do
  t0=$(date +%s)
  case $it in
    smokewg)
      AG_WG_DQ=${AG_WG_DQ:-wg} timeout ${SMOKE_S:-150} python3 tools/sanitize_bwd_cases.py --quick > "$LOGS/smokewg.txt" 2>&1
      rc=$?; [ $rc = 0 ] || WG_BAD=1
      echo "smoke backward (dQ ${AG_WG_DQ:-wg}) rc=$rc ($(tail -n 1 "$LOGS/smokewg.txt"))" >> "$S"
      grep -E "^BAD" "$LOGS/smokewg.txt" | head -n 8 >> "$S" ;;
    dqab)
      for m in $(drop_bad "${DQ_MODES:-red2 wg}"); do
        timeout ${BWD_S:-100} python3 benchmarks/bwd_bench.py --iters 3 --wg-dq "$m" ${BWD_ARGS:-} --out "$OUT/bwd_$m.json" > "$LOGS/bwd_$m.txt" 2>&1
        echo "bwd_bench --wg-dq $m rc=$?" >> "$S"
      done
      for m in $(drop_bad "${FLEX_MODES:-wg red2}"); do
        timeout ${FLEX_S:-120} python3 benchmarks/bwd_flex_bench.py --iters 3 --wg-dq "$m" --out "$OUT/bwd_flex_$m.json" > "$LOGS/bwd_flex_$m.txt" 2>&1
        echo "bwd_flex_bench --wg-dq $m rc=$?" >> "$S"
      done ;;
    bwd)
      timeout ${BWD_S:-150} python3 benchmarks/bwd_bench.py --iters 3 --also-engine mma --out "$OUT/h200_bwd_wgmma.json" > "$LOGS/bwd_main.txt" 2>&1
      echo "bwd_bench --also-engine mma rc=$?" >> "$S"
      timeout ${FLEX_S:-120} python3 benchmarks/bwd_flex_bench.py --iters 3 --out "$OUT/h200_bwd_flex.json" > "$LOGS/bwd_flex.txt" 2>&1
      echo "bwd_flex_bench rc=$?" >> "$S" ;;
    nbarprobe)
      for m in 0 1 2; do
        timeout 60 compute-sanitizer --tool racecheck --error-exitcode 9 .whl/nbar_probe $m > "$LOGS/nbarprobe_$m.txt" 2>&1
        echo "racecheck nbar probe mode $m rc=$? ($(grep -E '^mode' "$LOGS/nbarprobe_$m.txt"); $(grep -E 'SUMMARY' "$LOGS/nbarprobe_$m.txt"))" >> "$S"
      done ;;
    gpubwd)
      if [ "$WG_BAD" = 1 ]; then echo "gpubwd skipped: the smoke run of dQ ${AG_WG_DQ:-wg} failed" >> "$S"; continue; fi
      AG_WG_DQ=${AG_WG_DQ:-wg} PYTHONPATH=tools${PYTHONPATH:+:$PYTHONPATH} HYPOTHESIS_PROFILE=ci timeout ${GPUBWD_S:-200} \
        python3 -m pytest -q -m gpu -p pytest_wg_dq -p no:cacheprovider -n 15 $DIST -rfE --tb=short \
        tests/gpu/test_gpu_backward_wgmma.py tests/gpu/test_gpu_backward.py tests/gpu/test_gpu_backward_features.py tests/gpu/test_gpu_autograd.py \
        > "$LOGS/pytest_gpubwd.txt" 2>&1
      echo "gpu backward tests (dQ ${AG_WG_DQ:-wg}) rc=$?: $(tail -n 1 "$LOGS/pytest_gpubwd.txt")" >> "$S"
      grep -E "^(FAILED|ERROR)" "$LOGS/pytest_gpubwd.txt" | head -n 20 >> "$S" ;;
    gpu)
      HYPOTHESIS_PROFILE=ci timeout ${PYTEST_S:-470} python3 -m pytest -q -m gpu tests/gpu -p no:cacheprovider -n ${WORKERS:-15} $DIST -rfE --tb=short --durations=15 ${GPU_ARGS:-} \
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
    train)
      OUT="$LOGS" timeout ${TRAIN_S:-120} bash tests/gpu/bwd_features_gpu.sh 3 > "$LOGS/train.txt" 2>&1
      rc=$?; cp "$LOGS/train_block.json" "$OUT/h200_train_block.json" 2>/dev/null
      echo "train block rc=$rc: $(tail -n 4 "$LOGS/train.txt" | tr '\n' ';')" >> "$S" ;;
    ncu)
      SECS="--section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats"
      MET="--metrics lts__t_sectors_op_red.sum,lts__t_sectors_op_atom.sum,lts__t_sectors_op_read.sum,lts__t_sectors_op_write.sum,regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio"
      timeout ${NCU_S:-300} ncu --profile-from-start off --kernel-name regex:'dkdv|cudnn' $SECS $MET \
        python3 tools/ncu_bwd.py --only ${NCU_CASES:-wgbulk wgbulk_no_dq_store wgbulk_no_dq_handoff wgbulk_no_dq} > "$OUT/ncu_bwd.txt" 2>&1
      echo "ncu backward rc=$? ($(grep -cE '^  [a-z_].*\(' "$OUT/ncu_bwd.txt") kernels)" >> "$S"
      grep -E "max error|cudnn: one" "$OUT/ncu_bwd.txt" >> "$S" ;;
    ablate)
      timeout ${ABLATE_S:-300} python3 benchmarks/bwd_ablate.py --iters 3 ${ABLATE_DQ:+--wg-dq $ABLATE_DQ} ${ABLATE_ARGS:-} --out "$OUT/bwd_ablate.json" \
        > "$LOGS/bwd_ablate.txt" 2>&1
      echo "bwd_ablate rc=$?" >> "$S"; grep -E "TFLOP/s|skipped" "$LOGS/bwd_ablate.txt" | tail -n 32 >> "$S" ;;
  esac
  echo "  ($it: $(( $(date +%s) - t0 )) s)" >> "$S"
  tar czf "$OUT/logs.tgz" -C "$LOGS" . 2>/dev/null
done
for f in "$LOGS"/bwd_*.txt; do
  [ -f "$f" ] || continue
  echo "== $(basename "$f")" >> "$S"; grep -vE "^\s*$|built in|wrote " "$f" | tail -n 8 >> "$S"
done
cat "$S"
