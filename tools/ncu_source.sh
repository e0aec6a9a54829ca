#!/usr/bin/env bash
# Instruction-level ncu profiles (issue 16): the first two forward cells of
# tools/ncu_fwd.py (ours and cuDNN's each), with the SourceCounters section (warp-stall samples per
# SASS instruction) and the pipe and shared-memory counters. On a GPU machine with ncu, from the tree root:
#   bash tools/ncu_source.sh
# Returns under $OUT: the details pages (text), the per-instruction source pages (CSV, gzipped; read
# them with tools/ncu_sass_top.py), and the logs.
set -uo pipefail
export PYTHONUNBUFFERED=1 ATTNGEN_CACHE_DIR=/tmp/attngen-cache
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
SECS="--section SourceCounters --section WarpStateStats --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section InstructionStats --section SchedulerStats"
MET="--metrics sm__cycles_active.avg,sm__cycles_elapsed.avg,sm__inst_executed_pipe_tensor_op_gmma.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_elapsed,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum,smsp__inst_executed.sum,lts__t_sectors_op_red.sum"
run() {  # name, kernel regex, launch count, command...
  local name=$1 re=$2 n=$3; shift 3
  local t0=$(date +%s)
  timeout ${NCU_S:-240} ncu --clock-control none --profile-from-start off --kernel-name "regex:$re" --launch-count "$n" $SECS $MET \
    -o "/tmp/$name" -f "$@" > "$OUT/${name}_log.txt" 2>&1
  echo "$name: ncu rc=$? ($(( $(date +%s) - t0 )) s)" | tee -a "$OUT/summary.txt"
  ncu -i "/tmp/$name.ncu-rep" --page details > "$OUT/${name}_details.txt" 2>&1
  ncu -i "/tmp/$name.ncu-rep" --page source --csv --print-source sass 2> "$OUT/${name}_src_err.txt" | gzip > "$OUT/${name}_sass.csv.gz"
  echo "$name: source page $(zcat "$OUT/${name}_sass.csv.gz" | wc -l) lines" | tee -a "$OUT/summary.txt"
}
# $ITEMS: the items to run (fwd, the default)
for it in ${ITEMS:-fwd}; do
  case $it in
    fwd) run fwd 'attngen|cudnn|sm90|fmha' 4 python3 tools/ncu_fwd.py ;;
  esac
  grep -E "Duration|Compute \(SM\) Throughput|Issue Slots Busy|hmma_cycles|wavefronts_mem_shared|bank_conflicts" "$OUT/${it}_details.txt" | tee -a "$OUT/summary.txt"
done
