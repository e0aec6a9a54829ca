#!/usr/bin/env bash
# The fourteenth session's device call (one H200):
#   source .whl/env.sh && bash tools/device_s14.sh
# 1. ncu of one backward each (tools/ncu_bwd.py): our dK/dV kernel with dQ modes red2 and tile, red2
#    with its dQ reductions cut, and cuDNN's backward; sections plus the L2 reduction sectors and
#    every warp-stall reason (a second, sections-only run if ncu refuses the metric list).
# 2. the whole GPU test suite, verbose (which tests finished, if the limit cuts it), with the
#    backward memcheck and racecheck of odd shapes running beside it.
# Results under $OUT, a summary last.
set -uo pipefail
export PYTHONUNBUFFERED=1 ATTNGEN_CACHE_DIR=/tmp/attngen-cache
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
S="$OUT/summary.txt"
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader | tee -a "$S"
t0=$(date +%s)
SECS="--section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats"
MET="--metrics lts__t_sectors_op_red.sum,lts__t_sectors_op_atom.sum,lts__t_sectors_op_read.sum,lts__t_sectors_op_write.sum,regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio"
timeout ${NCU_S:-150} ncu --profile-from-start off --kernel-name regex:'dkdv|cudnn' $SECS $MET python3 tools/ncu_bwd.py --only red2 tile red2_no_dq_red > "$OUT/ncu_bwd.txt" 2>&1
rc=$?
if [ $rc -ne 0 ] && ! grep -q "Section: GPU Speed Of Light" "$OUT/ncu_bwd.txt"; then
  mv "$OUT/ncu_bwd.txt" "$OUT/ncu_bwd_failed.txt"
  timeout ${NCU_S:-150} ncu --profile-from-start off --kernel-name regex:'dkdv|cudnn' $SECS python3 tools/ncu_bwd.py --only red2 tile red2_no_dq_red > "$OUT/ncu_bwd.txt" 2>&1
  rc=$?
fi
echo "ncu backward rc=$rc ($(grep -cE '^  [a-z_].*\(' "$OUT/ncu_bwd.txt") kernels; $(( $(date +%s) - t0 )) s)" >> "$S"
grep -E "max error|cudnn: one" "$OUT/ncu_bwd.txt" >> "$S"
t0=$(date +%s)
( sleep 20
  nice timeout 100 compute-sanitizer --tool memcheck --error-exitcode 9 python3 tools/sanitize_bwd_cases.py > "$OUT/san_bwd.txt" 2>&1
  echo "memcheck backward rc=$? ($(tail -n 1 "$OUT/san_bwd.txt"))" >> "$OUT/san_summary.txt"
  nice timeout 120 compute-sanitizer --tool racecheck --error-exitcode 9 python3 tools/sanitize_bwd_cases.py --quick > "$OUT/san_race.txt" 2>&1
  echo "racecheck backward rc=$? ($(grep -E 'RACECHECK SUMMARY' "$OUT/san_race.txt" | tail -n 1); $(tail -n 1 "$OUT/san_race.txt"))" >> "$OUT/san_summary.txt" ) &
SAN=$!
HYPOTHESIS_PROFILE=ci timeout ${PYTEST_S:-$(( 570 - ($(date +%s) - T0) ))} python3 -m pytest -v -m gpu tests/gpu -p no:cacheprovider -n 15 -rfE --tb=short --durations=30 \
  > "$OUT/pytest_gpu.txt" 2>&1
echo "gpu pytest rc=$?: $(tail -n 1 "$OUT/pytest_gpu.txt") ($(grep -c ' PASSED' "$OUT/pytest_gpu.txt") PASSED lines, $(grep -c ' FAILED' "$OUT/pytest_gpu.txt") FAILED, $(grep -c ' SKIPPED' "$OUT/pytest_gpu.txt") SKIPPED; $(( $(date +%s) - t0 )) s)" >> "$S"
grep -E "^(FAILED|ERROR)" "$OUT/pytest_gpu.txt" | head -n 30 >> "$S"
wait $SAN
cat "$OUT/san_summary.txt" >> "$S" 2>/dev/null
cat "$S"
