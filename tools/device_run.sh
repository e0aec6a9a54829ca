#!/usr/bin/env bash
# One device call: environment, GPU test suite, spot checks + timings. Usage (device tool):
#   source .whl/env.sh && bash tools/device_run.sh [quick|full]
set -uo pipefail
mode=${1:-full}
export PYTHONUNBUFFERED=1 ATTNGEN_CACHE_DIR=/tmp/attngen-cache
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
python3 -c "import cupy, torch; print('cupy', cupy.__version__, 'torch', torch.__version__)"
case "$mode" in
  quick) python3 tools/gpu_check.py --perf --tiles 2>&1 | tee "$OUT/gpu_check.log" ;;
  full)
    HYPOTHESIS_PROFILE=gpu timeout 400 python3 -m pytest -q -m gpu tests/gpu -x -p no:cacheprovider 2>&1 | tail -30 | tee "$OUT/pytest_gpu.log"
    python3 tools/gpu_check.py --perf 2>&1 | tee "$OUT/gpu_check.log" ;;
esac
