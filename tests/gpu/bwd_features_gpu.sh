#!/bin/bash
# GPU checks of issue 14's backward features (varlen, token-scope q norm, o post-norm, every
# example training) and the training-block benchmark, in parts that each fit one device call
# (10 minutes). Run from the repository root on the GPU machine, with the project importable:
#   bash tests/gpu/bwd_features_gpu.sh 1   # varlen, norms, autograd through the op (both dQ modes)
#   bash tests/gpu/bwd_features_gpu.sh 2   # every training example's backward once; the paged refusal
#   bash tests/gpu/bwd_features_gpu.sh 3   # benchmarks/train_block_bench.py -> $OUT/train_block.json
#   bash tests/gpu/bwd_features_gpu.sh 4   # attngen fuzz --pass backward on the examples that train now
set -o pipefail
export PYTHONUNBUFFERED=1
part=${1:-1}
out=${OUT:-/tmp}
case "$part" in
  1) python3 -m pytest -q -m gpu -x tests/gpu/test_gpu_backward_features.py -k "not every_training_example" 2>&1 | tee "$out/bwd_features_1.txt" | tail -40 ;;
  2) python3 -m pytest -q -m gpu tests/gpu/test_gpu_backward_features.py -k every_training_example \
       "tests/gpu/test_gpu_backward.py::test_backward_refuses_bad_arguments_before_launch" 2>&1 | tee "$out/bwd_features_2.txt" | tail -40 ;;
  3) python3 benchmarks/train_block_bench.py --out "$out/train_block.json" 2>&1 | tee "$out/train_block.txt" | tail -20 ;;
  4) for ex in varlen_causal_training whisper_preln_cross diff_transformer_subln; do
       python3 -m attngen fuzz "examples/$ex.attn" --pass backward --max-examples 40 --seed 14 --out "$out/fuzz_bwd"
     done 2>&1 | tee "$out/bwd_features_4.txt" | grep -E "examples|fail|refuse" ;;
  *) echo "usage: $0 1|2|3|4" >&2; exit 2 ;;
esac
