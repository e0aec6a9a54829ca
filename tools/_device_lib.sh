# Shared by the device scripts (source it): the environment, $OUT and the summary file $S, the
# GPU's name and clocks first in the summary, and pyt, which runs GPU test files under xdist with a
# time limit and adds a line of counts (and the failures) to the summary.
set -uo pipefail
export PYTHONUNBUFFERED=1 ATTNGEN_CACHE_DIR=${ATTNGEN_CACHE_DIR:-/tmp/attngen-cache}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
S="$OUT/summary.txt"
DIST=$(python3 -c "import sys, xdist; sys.exit(0 if tuple(map(int, xdist.__version__.split('.')[:2])) >= (3, 2) else 1)" 2>/dev/null && echo "--dist worksteal")
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader | tee -a "$S"
pyt() {  # label, limit, pytest arguments (files, -p plugins)...
  local label=$1 lim=$2; shift 2
  HYPOTHESIS_PROFILE=ci timeout "$lim" python3 -m pytest -v -m gpu "$@" -p no:cacheprovider -n ${WORKERS:-14} $DIST -rfE --tb=short \
    --durations=15 > "$OUT/pytest_$label.txt" 2>&1
  echo "gpu pytest $label rc=$?: $(grep -E '^(=+ )?[0-9]+ (passed|failed)' "$OUT/pytest_$label.txt" | tail -n 1) ($(grep -c ' PASSED' "$OUT/pytest_$label.txt") PASSED, $(grep -c ' FAILED' "$OUT/pytest_$label.txt") FAILED, $(grep -c ' SKIPPED' "$OUT/pytest_$label.txt") SKIPPED)" >> "$S"
  grep -E "^(FAILED|ERROR)" "$OUT/pytest_$label.txt" | head -n 20 >> "$S"
}
