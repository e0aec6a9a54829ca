#!/bin/bash
# The runtime branch's GPU proof in one device call (about 5 minutes): the host-overhead table
# (tools/host_overhead.py), then the new binder/torch-op tests and the whole GPU suite, in four
# parallel pytest groups (one GPU; NVRTC builds use the 16 CPUs). Results under $OUT.
#   bash tools/device_runtime_check.sh [seconds]      (default 285: the whole run's budget)
set -u
BUDGET=${1:-285}
OUT=${OUT:-/tmp/attngen-out}
mkdir -p "$OUT"
{ python3 -c "import torch, cupy; print('torch', torch.__version__, 'cupy', cupy.__version__, torch.cuda.get_device_name())"; } > "$OUT/summary.txt" 2>&1
timeout 100 python3 tools/host_overhead.py > "$OUT/host_overhead.txt" 2>&1
echo "host_overhead rc=$? at ${SECONDS}s" >> "$OUT/summary.txt"
LEFT=$((BUDGET - SECONDS))
group() {
  local name=$1; shift
  timeout "$LEFT" python3 -m pytest -v -m gpu -p no:cacheprovider -rfE --tb=short "$@" > "$OUT/$name.txt" 2>&1
  echo "$name rc=$? $(tail -n 1 "$OUT/$name.txt")" >> "$OUT/summary.txt"
}
group new tests/gpu/test_gpu_binder_torch.py tests/gpu/test_gpu_validation.py &
group kernels tests/gpu/test_gpu_kernels.py tests/gpu/test_gpu_regressions.py &
group examples tests/gpu/test_gpu_examples.py &
group rest tests/gpu/test_gpu_constructs.py tests/gpu/test_gpu_oracles.py &
wait
echo "done at ${SECONDS}s" >> "$OUT/summary.txt"
cat "$OUT/summary.txt"
cat "$OUT/host_overhead.txt"
