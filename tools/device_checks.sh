#!/usr/bin/env bash
# The GPU checks and benchmarks, by item, for a GPU machine with the `cuda` extra (and torch for the
# peers) installed:
#   ITEMS="gpu1 gpu2" bash tools/device_checks.sh
#   ITEMS="gpu1 | gpu2" bash tools/device_checks.sh     # groups split by `|` run at once, group i on
#                                                       # GPU i mod the GPU count
# Items run in the order given. Nothing timed should share a GPU: put benchmark items in a group of
# their own on a machine with several GPUs, or run them alone.
#
# Correctness:
#   gpu        the whole GPU test suite (tests/gpu)
#   gpu1       its forward half (examples, constructs, regressions, kernels, oracles, chain,
#              validation, tiles, arches)
#   gpu2       its other half (backward, autograd, the torch op, decode, varlen, head dims)
#   race       compute-sanitizer racecheck and memcheck of the forward and backward on odd shapes
#              ($RACE_FWD: the forward specs racecheck runs, all when empty; racecheck is slow)
#   racequant  compute-sanitizer memcheck and racecheck of the quantized kernels (their GPU tests, narrowed)
#   decodemem  compute-sanitizer memcheck of the decode family (contiguous, paged, sinks)
#   nbarprobe  racecheck of tools/racecheck_nbar_probe.cu (what the tool reports of a correct
#              named-barrier hand-off, a lockstep control and a real race; needs nvcc)
#   fuzz       attngen fuzz of every example, the quantized gallery's too ($FUZZ_JOBS at once, $FUZZ_SECONDS
#              each), then fuzz --specs; the first failures' reproducers in $OUT/fuzz_failures.txt
#   campaign   the fuzz campaign, tools/fuzz_all.sh ($N shape cases an example, $SPECS generated specs)
#   bwdfuzz    attngen fuzz --pass backward over every example that trains ($BWD_N cases each)
#   quant      the quantized kernels' GPU tests (FP8/INT8 forward, the FP8 KV cache's decode)
#   cpu        the GPU tests outside tests/gpu: CPU kernels against CUDA ones, the transformers
#              integration on CUDA
# Benchmarks (each writes the file benchmarks/README.md cites, under $OUT):
#   suite      benchmarks/suite.py                     -> h200.jsonl
#   sweep      benchmarks/sweep.py ($SWEEP_ONLY narrows it) -> h200_sweep.jsonl
#   bwd        benchmarks/bwd_bench.py --also-loads cp.async -> h200_bwd_tma_ab.json
#   bwdflex    benchmarks/bwd_flex_bench.py           -> bwd_flex.json
#   train      benchmarks/train_block_bench.py        -> h200_train_block.json
#   decode     benchmarks/decode_bench.py --quick     -> h200_decode_shares.json
#   headdim    benchmarks/headdim_bench.py            -> h200_headdim.json
#   varlen     benchmarks/varlen_bench.py             -> h200_varlen.json
#   compile    benchmarks/compile_bench.py            -> h200_compile.json
#   mmaab      benchmarks/mma_split_ab.py ($MMAAB_DIMS, default 64) -> h200_mma_split_ab.jsonl
#   host       tools/host_overhead.py (host time per call)  -> host_overhead.json
#   hostbench  benchmarks/host_bench.py (eager, graph and host µs a call) -> h100_host.jsonl
#   quantfwd   benchmarks/quant_bench.py (FP8/INT8 forward vs bf16, accuracy) -> quant_fwd.json
#   quantdec   benchmarks/quant_decode_bench.py (FP8 paged decode vs bf16)  -> quant_decode.json
# Each item has a time limit ($<ITEM>_S, e.g. GPU1_S=520); results and logs go under $OUT
# (default /tmp/out), and a summary (GPU, clocks, one line an item) is printed as each item ends;
# TAR_TO=PATH archives every log under $OUT into one file at the end.
set -uo pipefail
export PYTHONUNBUFFERED=1 ATTNGEN_CACHE_DIR=${ATTNGEN_CACHE_DIR:-/tmp/attngen-cache}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
S="$OUT/summary.txt"
G=tests/gpu
# xdist's work stealing (3.2+) keeps idle workers busy while the slowest GPU tests run.
DIST=$(python3 -c "import sys, xdist; sys.exit(0 if tuple(map(int, xdist.__version__.split('.')[:2])) >= (3, 2) else 1)" 2>/dev/null && echo "--dist worksteal")
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader; git rev-parse --short HEAD 2>/dev/null; } | tee -a "$S"

pyt() {  # label, limit, pytest arguments...: GPU tests under xdist, a line of counts (and failures)
  local label=$1 lim=$2; shift 2
  HYPOTHESIS_PROFILE=ci timeout "$lim" python3 -m pytest -v -m gpu "$@" -p no:cacheprovider -n ${WORKERS:-14} $DIST -rfE --tb=short \
    --durations=15 > "$OUT/pytest_$label.txt" 2>&1
  echo "gpu pytest $label rc=$?: $(grep -E '^(=+ )?[0-9]+ (passed|failed)' "$OUT/pytest_$label.txt" | tail -n 1)" >> "$S"
  grep -E "^(FAILED|ERROR)" "$OUT/pytest_$label.txt" | head -n 20 >> "$S"
}

bench() {  # label, limit, output file, command...: one benchmark, its rc and the tail of its log
  local label=$1 lim=$2 out=$3; shift 3
  timeout "$lim" "$@" --out "$OUT/$out" > "$OUT/$label.txt" 2>&1
  echo "$label rc=$? -> $out" >> "$S"; tail -n 20 "$OUT/$label.txt" >> "$S"
}

run_items() {  # items...
for it in "$@"; do
  t0=$(date +%s); n0=$(wc -l < "$S")
  case $it in
    gpu)
      pyt all ${GPU_S:-900} $G ;;
    gpu1)
      pyt fwd ${GPU1_S:-520} $G/test_gpu_examples.py $G/test_gpu_constructs.py $G/test_gpu_regressions.py $G/test_gpu_kernels.py \
        $G/test_gpu_oracles.py $G/test_gpu_validation.py $G/test_gpu_tiles_by_length.py $G/test_gpu_arches.py ;;
    gpu2)
      pyt rest ${GPU2_S:-420} $G/test_gpu_backward.py $G/test_gpu_backward_features.py $G/test_gpu_backward_tc.py \
        $G/test_gpu_backward_tma.py $G/test_gpu_backward_wgmma.py $G/test_gpu_autograd.py $G/test_gpu_binder_torch.py \
        $G/test_gpu_decode.py $G/test_gpu_varlen.py $G/test_gpu_headdim.py ;;
    race)
      for tool in racecheck memcheck; do
        names=""; [ $tool = racecheck ] && names=${RACE_FWD:-}
        timeout ${RACE_S:-120} compute-sanitizer --tool $tool python3 tools/sanitize_cases.py $names > "$OUT/${tool}_fwd.txt" 2>&1
        echo "$tool forward rc=$? ($(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$OUT/${tool}_fwd.txt" | tail -n 1); $(tail -n 1 "$OUT/${tool}_fwd.txt"))" >> "$S"
        timeout ${RACE_S:-120} compute-sanitizer --tool $tool python3 tools/sanitize_bwd_cases.py --quick > "$OUT/${tool}_bwd.txt" 2>&1
        echo "$tool backward rc=$? ($(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$OUT/${tool}_bwd.txt" | tail -n 1); $(tail -n 1 "$OUT/${tool}_bwd.txt"))" >> "$S"
      done ;;
    racequant)
      # The quantized kernels (FP8/INT8 forward, the FP8 KV cache's decode) under the sanitizers, through
      # their GPU tests narrowed by $RACEQUANT_K; each test checks its output against the reference.
      for tool in memcheck racecheck; do
        timeout ${RACEQUANT_S:-150} compute-sanitizer --tool $tool --error-exitcode 9 python3 -m pytest -q -m gpu -p no:cacheprovider \
          $G/test_gpu_quant_fwd.py $G/test_gpu_decode_fp8.py \
          -k "${RACEQUANT_K:-(kernel_matches and plain and 77x333) or matches_the_reference}" > "$OUT/${tool}_quant.txt" 2>&1
        echo "$tool quant rc=$? ($(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$OUT/${tool}_quant.txt" | tail -n 1); $(grep -E '[0-9]+ (passed|failed)' "$OUT/${tool}_quant.txt" | tail -n 1))" >> "$S"
      done ;;
    decodemem)
      timeout ${DECODEMEM_S:-60} compute-sanitizer --tool memcheck --error-exitcode 9 python3 tests/gpu/decode_smoke.py --quick \
        --only d_cache_bf16_d128_g8 d_paged8_fp16_d64_g8 d_sink_bf16_d64_g8 > "$OUT/decode_memcheck.txt" 2>&1
      echo "decode memcheck rc=$? ($(tail -n 1 "$OUT/decode_memcheck.txt"))" >> "$S" ;;
    nbarprobe)
      nvcc -arch=sm_90a -o /tmp/nbar_probe tools/racecheck_nbar_probe.cu > "$OUT/nbarprobe_build.txt" 2>&1 \
        || { echo "nbarprobe: nvcc failed (see nbarprobe_build.txt)" >> "$S"; continue; }
      for m in 0 1 2; do
        timeout 60 compute-sanitizer --tool racecheck --error-exitcode 9 /tmp/nbar_probe $m > "$OUT/nbarprobe_$m.txt" 2>&1
        echo "racecheck nbar probe mode $m rc=$? ($(grep -E '^mode' "$OUT/nbarprobe_$m.txt"); $(grep -E 'SUMMARY' "$OUT/nbarprobe_$m.txt"))" >> "$S"
      done ;;
    fuzz)
      FS=${FUZZ_SECONDS:-20}; rm -rf /tmp/fuzz
      ls examples/*.attn examples/quant/*.attn | OUT="$OUT" FS=$FS xargs -P ${FUZZ_JOBS:-6} -I{} bash -c \
        'f={}; n=$(basename $f .attn); timeout 180 python3 -m attngen fuzz $f --seconds $FS --out /tmp/fuzz/$n \
           > "$OUT/fuzz_$n.txt" 2>&1; echo "fuzz $n rc=$? $(tr "\r" "\n" < "$OUT/fuzz_$n.txt" | grep -v "ex/s" | tail -n 1)"' \
        | sort >> "$S"
      timeout ${FUZZSPECS_S:-300} python3 -m attngen fuzz --specs --seconds "$((FS * 6))" --out /tmp/fuzz/specs > "$OUT/fuzz_run.txt" 2>&1
      echo "fuzz --specs rc=$? $(tr '\r' '\n' < "$OUT/fuzz_run.txt" | grep -v 'ex/s' | tail -n 1)" >> "$S"
      # Reproducers sit folders deep under /tmp/fuzz: bring back the first failures' text.
      cat /tmp/fuzz/*/FIRST_FAILURE.txt /tmp/fuzz/*/*/FAILURE.txt 2>/dev/null | head -c 200000 > "$OUT/fuzz_failures.txt" ;;
    campaign)
      N=${N:-1000} SPECS=${SPECS:-200} LIMIT=${CAMPAIGN_S:-480} bash tools/fuzz_all.sh > "$OUT/campaign.txt" 2>&1
      echo "campaign rc=$?" >> "$S"; grep -E "^rc=" "$OUT/campaign.txt" | sort | uniq -c | head -n 40 >> "$S"
      tail -n 2 "$OUT/campaign.txt" >> "$S" ;;
    bwdfuzz)
      ls examples/*.attn | grep -v paged_decode | OUT="$OUT" BWD_N=${BWD_N:-40} xargs -P 6 -I{} bash -c \
        'f={}; n=$(basename $f .attn); timeout ${BWDFUZZ_S:-200} python3 -m attngen fuzz $f --pass backward --max-examples $BWD_N \
           > "$OUT/bwdfuzz_$n.txt" 2>&1; echo "bwdfuzz $n rc=$? $(tr "\r" "\n" < "$OUT/bwdfuzz_$n.txt" | grep "^attngen fuzz: [0-9]" | tail -n 1)"' \
        | sort >> "$S" ;;
    quant)
      pyt quant ${QUANT_S:-300} $G/test_gpu_quant_fwd.py $G/test_gpu_decode_fp8.py ;;
    cpu)
      pyt cpu ${CPU_S:-300} tests/cpu tests/integrations ;;
    suite)   bench suite ${SUITE_S:-300} h200.jsonl python3 benchmarks/suite.py ;;
    sweep)   bench sweep ${SWEEP_S:-540} h200_sweep.jsonl python3 benchmarks/sweep.py ${SWEEP_ONLY:+--only $SWEEP_ONLY} ;;
    bwd)     bench bwd ${BWD_S:-300} h200_bwd_tma_ab.json python3 benchmarks/bwd_bench.py --also-loads cp.async ;;
    bwdflex) bench bwdflex ${BWDFLEX_S:-300} bwd_flex.json python3 benchmarks/bwd_flex_bench.py ;;
    train)   bench train ${TRAIN_S:-150} h200_train_block.json python3 benchmarks/train_block_bench.py ;;
    decode)  bench decode ${DECODE_S:-120} h200_decode_shares.json python3 benchmarks/decode_bench.py --quick ;;
    headdim) bench headdim ${HEADDIM_S:-200} h200_headdim.json python3 benchmarks/headdim_bench.py ;;
    varlen)  bench varlen ${VARLEN_S:-200} h200_varlen.json python3 benchmarks/varlen_bench.py ;;
    compile) bench compile ${COMPILE_S:-120} h200_compile.json python3 benchmarks/compile_bench.py ;;
    host)    timeout ${HOST_S:-120} env OUT="$OUT" python3 tools/host_overhead.py > "$OUT/host.txt" 2>&1
             echo "host rc=$? -> host_overhead.json" >> "$S"; tail -n 14 "$OUT/host.txt" >> "$S" ;;
    hostbench) bench hostbench ${HOSTBENCH_S:-240} h100_host.jsonl python3 benchmarks/host_bench.py ;;
    quantfwd)  bench quantfwd ${QUANTFWD_S:-240} quant_fwd.json python3 benchmarks/quant_bench.py ;;
    quantdec)  bench quantdec ${QUANTDEC_S:-180} quant_decode.json python3 benchmarks/quant_decode_bench.py ;;
    mmaab)   bench mmaab ${MMAAB_S:-300} h200_mma_split_ab.jsonl python3 benchmarks/mma_split_ab.py --head-dims ${MMAAB_DIMS:-64} ;;
    *) echo "unknown item: $it" >> "$S" ;;
  esac
  echo "  ($it: $(( $(date +%s) - t0 )) s)" >> "$S"
  # Each item's lines as it ends, so a run cut short by its time limit still reports what finished.
  [ -z "${QUIET_ITEMS:-}" ] && tail -n +$((n0 + 1)) "$S"
done
}

IFS='|' read -ra GROUPS_ <<< "${ITEMS:-gpu}"
if [ ${#GROUPS_[@]} -gt 1 ]; then
  NGPU=$(nvidia-smi -L | grep -c '^GPU')
  for i in "${!GROUPS_[@]}"; do
    ( export CUDA_VISIBLE_DEVICES=$(( i % (NGPU > 0 ? NGPU : 1) )); S="$OUT/summary_gpu$i.txt"; echo "== GPU $i: ${GROUPS_[$i]}" > "$S"
      QUIET_ITEMS=1 run_items ${GROUPS_[$i]} ) &
  done
  wait
  cat "$OUT"/summary_gpu*.txt >> "$S"
  cat "$S"
else
  run_items ${GROUPS_[0]}
fi
# One archive of every log: a device's return of $OUT may be capped at a few files.
[ -n "${TAR_TO:-}" ] && tar czf "$TAR_TO" -C "$OUT" . 2>/dev/null
