#!/usr/bin/env bash
# The training blocks' device check (branch trainblk), one call on one H200, from the tree's root:
#   bash tools/device_trainblk.sh        (lark from .whl: python3 -m pip install --target /tmp/site .whl/*.whl first)
# First the per-kernel profile of each training block (a row each, so a slow row leaves the other's
# figures), then the GPU tests of the norm backward (token-scope q norm, o post-norm, head-scope q/k
# norms on the wgmma engine and their weight gradients). Results and logs under $OUT.
set -uo pipefail
export PYTHONUNBUFFERED=1 ATTNGEN_CACHE_DIR=/tmp/attngen-cache
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
BENCH_S=${BENCH_S:-50}  # seconds a bench row (each took ~20 s with --profile)
TEST_S=${TEST_S:-150}  # (52 s ran 34 tests of these, none failed, before the timeout)
for row in preln_cross qk_norm; do
  timeout "$BENCH_S" python3 benchmarks/train_block_bench.py --profile --only "$row" --out "$OUT/tb_$row.json" > "$OUT/tb_$row.txt" 2>&1
  echo "bench $row rc=$?"; tail -n 16 "$OUT/tb_$row.txt"
done
timeout "$TEST_S" python3 -m pytest -q -m gpu -n 8 -p no:cacheprovider -rfE --tb=short tests/gpu/test_gpu_backward_features.py \
  tests/gpu/test_gpu_backward_wgmma.py tests/gpu/test_gpu_backward.py::test_norm_weight_gradients > "$OUT/pytest.txt" 2>&1
echo "pytest rc=$?: $(tail -n 1 "$OUT/pytest.txt")"; grep -E "^(FAILED|ERROR)" "$OUT/pytest.txt" | head -n 20
