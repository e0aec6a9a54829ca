#!/usr/bin/env bash
# The device run the twenty-third session prepared and could not make (no machine was lent): what
# issues 14 and 16 still need on the final kernels, in calls of at most 600 s.
#   source .whl/env.sh && ITEMS="..." bash tools/device_s23.sh
# Items run in order; groups separated by `|` run at once, group i on GPU i mod the GPU count
# (CUDA_VISIBLE_DEVICES): one GPU each on the two-GPU kind, all sharing it on one (correctness
# items only then: nothing timed should share the GPU). A plan for the 1800 s budget on nvidia-h200-x2 (one cold start, then each
# call issued at once so that the machine stays warm; the session-18 GPU suite ran ~310 tests in
# ~380 s + ~150 s on one H200, so the two halves fit a call side by side):
#   call 1  ITEMS="gpu1 | gpu2"              the whole GPU suite (<= 520 s | <= 420 s)
#   call 2  ITEMS="campaign | race"          the fuzz campaign (N=1000 SPECS=200, <= 480 s); racecheck
#                                            and memcheck, forward and backward (4 x <= 120 s)
#   call 3  ITEMS="mmaab | bwdfuzz sweep"    the split A/B (<= 300 s); a backward fuzz of every example
#                                            (<= 200 s) and the length sweep on the TMA producer, with
#                                            SWEEP_ONLY and SWEEP_S=300 narrowing it to fit
# Items:
#   mmaab     benchmarks/mma_split_ab.py: the mma.sync forward and backward (and the wgmma backward, split
#             at D64 inside the products since this session) with the mask split by
#             axis against the per-element form (D64, where it is the default, and D128, where
#             render.MMA_SPLIT_MAX_HEAD_DIM keeps it off: ptxas spills there), outputs compared
#   gpu1      the forward GPU tests (examples, constructs, regressions, kernels, oracles, chain,
#             validation, tiles, arches)
#   gpu2      the rest: backward, autograd, binder/torch op, decode, varlen, head dims
#   race      compute-sanitizer racecheck and memcheck of the forward and backward odd shapes ($RACE_FWD:
#             the forward specs racecheck runs, all when empty)
#   campaign  tools/fuzz_all.sh (every example, N shape cases each, SPECS generated specs)
#   bwdfuzz   attngen fuzz --pass backward over every example that trains ($BWD_N cases each, 6 at
#             once; issue 14's "every example trains" asks for a backward fuzz pass of each)
#   sweep     benchmarks/sweep.py --only $SWEEP_ONLY --append (peers in the same run)
# On one H200 (the only kind lent in the twenty-fourth session), one item a call or a few in a row,
# never side by side: sharing the GPU made every group of that session's first call reach its limit.
#   call 1  ITEMS=gpu1                       call 2  ITEMS=gpu2
#   call 3  ITEMS="bwdfuzz race" BWD_N=20 RACE_FWD="doc_mma_d64 doc_d128"
#   call 4  ITEMS="mmaab campaign" MMAAB_DIMS=128 N=300 SPECS=100 CAMPAIGN_S=360
# The D64 A/B is committed (results/h200_mma_split_ab.jsonl); MMAAB_DIMS=128 runs the D128 half
# alone, to be appended to that file.
# Results under $OUT, a summary last.
source "$(dirname "$0")/_device_lib.sh"
G=tests/gpu
run_items() {  # items...
for it in "$@"; do
  t0=$(date +%s)
  case $it in
    mmaab)
      timeout ${MMAAB_S:-300} python3 benchmarks/mma_split_ab.py --head-dims ${MMAAB_DIMS:-64,128} --out "$OUT/mma_split_ab.jsonl" > "$OUT/mma_split_ab.txt" 2>&1
      echo "mmaab rc=$?" >> "$S"; grep -E "^D" "$OUT/mma_split_ab.txt" >> "$S" ;;
    gpu1)
      pyt fwd ${GPU1_S:-520} $G/test_gpu_examples.py $G/test_gpu_constructs.py $G/test_gpu_regressions.py $G/test_gpu_kernels.py \
        $G/test_gpu_oracles.py $G/test_gpu_chain.py $G/test_gpu_validation.py $G/test_gpu_tiles_by_length.py $G/test_gpu_arches.py ;;
    gpu2)
      pyt rest ${GPU2_S:-420} $G/test_gpu_backward.py $G/test_gpu_backward_features.py $G/test_gpu_backward_tc.py \
        $G/test_gpu_backward_tma.py $G/test_gpu_backward_wgmma.py $G/test_gpu_autograd.py $G/test_gpu_binder_torch.py \
        $G/test_gpu_decode.py $G/test_gpu_varlen.py $G/test_gpu_headdim.py ;;
    race)
      for tool in racecheck memcheck; do
        names=""; [ $tool = racecheck ] && names=${RACE_FWD:-}  # racecheck is slow: RACE_FWD names the specs
        timeout ${RACE_S:-120} compute-sanitizer --tool $tool python3 tools/sanitize_cases.py $names > "$OUT/${tool}_fwd.txt" 2>&1
        echo "$tool forward rc=$? ($(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$OUT/${tool}_fwd.txt" | tail -n 1); $(tail -n 1 "$OUT/${tool}_fwd.txt"))" >> "$S"
        timeout ${RACE_S:-120} compute-sanitizer --tool $tool python3 tools/sanitize_bwd_cases.py --quick > "$OUT/${tool}_bwd.txt" 2>&1
        echo "$tool backward rc=$? ($(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$OUT/${tool}_bwd.txt" | tail -n 1); $(tail -n 1 "$OUT/${tool}_bwd.txt"))" >> "$S"
      done ;;
    campaign)
      N=${N:-1000} SPECS=${SPECS:-200} LIMIT=${CAMPAIGN_S:-480} bash tools/fuzz_all.sh > "$OUT/campaign.txt" 2>&1
      echo "campaign rc=$?" >> "$S"; grep -E "^rc=" "$OUT/campaign.txt" | sort | uniq -c | head -n 40 >> "$S"
      tail -n 2 "$OUT/campaign.txt" >> "$S" ;;
    bwdfuzz)
      ls examples/*.attn | grep -v paged_decode | OUT="$OUT" BWD_N=${BWD_N:-40} xargs -P 6 -I{} bash -c \
        'f={}; n=$(basename $f .attn); timeout ${BWDFUZZ_S:-200} python3 -m attngen fuzz $f --pass backward --max-examples $BWD_N \
           > "$OUT/bwdfuzz_$n.txt" 2>&1; echo "bwdfuzz $n rc=$? $(tr "\r" "\n" < "$OUT/bwdfuzz_$n.txt" | grep "^attngen fuzz: [0-9]" | tail -n 1)"' \
        | sort >> "$S" ;;
    sweep)
      timeout ${SWEEP_S:-540} python3 benchmarks/sweep.py --out "$OUT/sweep.jsonl" --append ${SWEEP_ONLY:+--only $SWEEP_ONLY} > "$OUT/sweep.txt" 2>&1
      echo "sweep rc=$?" >> "$S"; tail -n 30 "$OUT/sweep.txt" >> "$S" ;;
  esac
  echo "  ($it: $(( $(date +%s) - t0 )) s)" >> "$S"
done
}
IFS='|' read -ra GROUPS_ <<< "${ITEMS:-gpu1}"
NGPU=$(nvidia-smi -L | grep -c '^GPU')
if [ ${#GROUPS_[@]} -gt 1 ]; then
  for i in "${!GROUPS_[@]}"; do
    ( export CUDA_VISIBLE_DEVICES=$(( i % (NGPU > 0 ? NGPU : 1) )); S="$OUT/summary_gpu$i.txt"; echo "== GPU $i: ${GROUPS_[$i]}" > "$S"
      run_items ${GROUPS_[$i]} ) &
  done
  wait
  cat "$OUT"/summary_gpu*.txt >> "$S"
else
  run_items ${GROUPS_[0]}
fi
cat "$S"
