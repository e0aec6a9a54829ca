#!/usr/bin/env bash
# The fuzz campaign on a GPU machine: every example with N shape cases, plus generated specs.
#   N=1000 SPECS=200 bash tools/fuzz_all.sh   (EXAMPLES="a.attn b.attn" narrows it)
# Examples run in parallel (one process each; the GPU is shared); BLAS is pinned to one thread so
# the NumPy references do not fight over the cores. Writes $OUT/fuzz_*.txt and prints one line per run.
set -uo pipefail
export PYTHONUNBUFFERED=1 ATTNGEN_CACHE_DIR=${ATTNGEN_CACHE_DIR:-/tmp/attngen-cache}
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
N=${N:-1000}; SPECS=${SPECS:-200}; JOBS=${JOBS:-12}; LIMIT=${LIMIT:-500}
FZ=/tmp/fuzz; rm -rf "$FZ"; mkdir -p "$FZ"
# Compile every example once up front so the parallel runs do not all cold-compile at once.
python3 - <<'PY'
import glob, attngen
from attngen.lang import frontend
for f in sorted(glob.glob("examples/*.attn")):
    for v in frontend.load(f).variants:
        attngen.compile(v)
PY
one() {
  name=$(basename "$1" .attn)
  timeout "$LIMIT" python3 -m attngen fuzz "$1" --max-examples "$N" --out "$FZ/$name" >"$FZ/$name.log" 2>&1
  echo "rc=$? $(tr '\r' '\n' <"$FZ/$name.log" | grep '^attngen fuzz: [0-9]' | tail -1)"
}
export -f one; export N FZ LIMIT
{
  timeout "$LIMIT" python3 -m attngen fuzz --specs --max-examples "$SPECS" --out "$FZ/specs" >"$FZ/specs.log" 2>&1
  echo "rc=$? $(tr '\r' '\n' <"$FZ/specs.log" | grep '^attngen fuzz: [0-9]' | tail -1)" >"$FZ/specs.line"
} &
ls ${EXAMPLES:-examples/*.attn} | xargs -P "$JOBS" -I{} bash -c 'one {}' | sort | tee "$OUT/fuzz_examples.txt"
wait
cat "$FZ/specs.line" | tee "$OUT/fuzz_specs.txt"
# Failure texts come back in $OUT (reproducer folders are deeper than $OUT returns).
for f in "$FZ"/*/FIRST_FAILURE.txt "$FZ"/*/*/FAILURE.txt; do
  [ -f "$f" ] && { echo "=== $f"; head -c 20000 "$f"; }
done > "$OUT/fuzz_failures.txt" 2>/dev/null
for f in "$FZ"/*.log; do grep -l "FAIL\|Traceback" "$f"; done 2>/dev/null | while read -r f; do
  echo "=== $f"; tr '\r' '\n' <"$f" | grep -v "ex/s" | tail -40; done >> "$OUT/fuzz_failures.txt"
echo "fuzz failure text: $(wc -c <"$OUT/fuzz_failures.txt") bytes"
