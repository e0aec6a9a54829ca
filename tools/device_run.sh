#!/usr/bin/env bash
# The whole device check in one call (device tool, with .whl carried):
#   source .whl/env.sh && bash tools/device_run.sh
# GPU test suite, sanitizers on odd shapes, the benchmark suite, a fuzz pass; short summary last.
set -uo pipefail
export PYTHONUNBUFFERED=1 ATTNGEN_CACHE_DIR=/tmp/attngen-cache HYPOTHESIS_PROFILE=gpu
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
FUZZ_SECONDS=${FUZZ_SECONDS:-20}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/env.txt"
git rev-parse --short HEAD 2>/dev/null | tee -a "$OUT/env.txt"
mode=${1:-all}
if [ "$mode" != fuzz ]; then
timeout 330 python3 -m pytest -q -m gpu tests/gpu -p no:cacheprovider 2>&1 | tail -3 | tee "$OUT/pytest_gpu.txt"
for tool in memcheck racecheck; do
  timeout 240 compute-sanitizer --tool $tool --error-exitcode 9 python3 tools/sanitize_cases.py >"$OUT/san_$tool.txt" 2>&1
  echo "compute-sanitizer $tool: exit $? ($(grep -c ERROR "$OUT/san_$tool.txt") error lines; $(tail -1 "$OUT/san_$tool.txt"))" | tee -a "$OUT/summary.txt"
done
timeout 300 python3 benchmarks/suite.py --out "$OUT/bench.jsonl" 2>&1 | tail -40 | tee "$OUT/bench.txt"
fi
if [ "$mode" != main ]; then
for f in examples/*.attn; do
  timeout 120 python3 -m attngen fuzz "$f" --seconds "$FUZZ_SECONDS" --out /tmp/fuzz 2>&1 | tr '\r' '\n' | grep -v "ex/s" | tail -1
done | tee "$OUT/fuzz.txt"
timeout 300 python3 -m attngen fuzz --specs --seconds "$((FUZZ_SECONDS * 6))" --out /tmp/fuzz 2>&1 | tr '\r' '\n' | grep -v "ex/s" | tail -2 | tee -a "$OUT/fuzz.txt"
# Reproducers sit three folders down, deeper than $OUT returns: bring back the first failures' text.
cat /tmp/fuzz/FIRST_FAILURE.txt /tmp/fuzz/*/FAILURE.txt 2>/dev/null | head -c 200000 > "$OUT/fuzz_failures.txt"
head -c 4000 "$OUT/fuzz_failures.txt"
fi
echo "=== summary"; cat "$OUT"/pytest_gpu.txt "$OUT"/summary.txt 2>/dev/null | grep -E "passed|failed|exit"
