#!/usr/bin/env bash
# Ring attention on one host's GPUs (kind nvidia-h200-x2): the exactness check against the
# single-GPU kernel and backward, then the benchmark (1 vs N GPUs at 128k and 256k, forward and
# forward+backward, compute-only and comm-only times, torch's context_parallel in the same run). Logs and JSON go to $OUT (default ./ring_out).
# usage: tools/ring_device_check.sh [NPROC]      (bounded to about 9.5 minutes; cold kernel compiles, forward and
# backward, are most of the check)
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
N="${1:-2}"
OUT="${OUT:-$PWD/ring_out}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
TR="python3 -m torch.distributed.run --standalone --nproc_per_node $N"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpus.txt"
timeout 270 $TR tests/gpu/ring_gpu_check.py --out "$OUT/ring_check.json" > "$OUT/ring_check.log" 2>&1
check=$?
timeout 300 $TR benchmarks/ring_bench.py --out "$OUT/ring_bench.json" > "$OUT/ring_bench.log" 2>&1
bench=$?
echo "== ring check (exit $check)"
grep -E "^ring check|^rank|Error|error" "$OUT/ring_check.log" | head -40
echo "== ring bench (exit $bench)"
sed -n '/^ring attention/,$p' "$OUT/ring_bench.log" | head -30
[ "$bench" -ne 0 ] && tail -20 "$OUT/ring_bench.log"
exit $(( check != 0 || bench != 0 ))
