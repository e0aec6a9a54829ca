#!/usr/bin/env bash
# GPU-side proofs of issue 13's install, arch and C++ parts, in one run on a GPU machine.
#
#   bash tools/device_install_check.sh          (from the repository root; logs under $OUT or ./device-check)
#
# Carry: .whl (lark) and .whl-cuda (NVIDIA's nvidia-cuda-nvrtc and nvidia-cuda-runtime wheels,
# cuda-pathfinder, setuptools; see the README's install section). Steps, each logged to $OUT/NAME.log:
#
#   wheel     builds attngen's wheel offline (setuptools from .whl-cuda, build isolation)
#   repack    packs the machine's installed CuPy and the base dependencies into wheels
#             (tools/wheel_from_installed.py): the cupy-cuda13x wheel (66 MiB) and the NVRTC wheel
#             (55 MiB) do not both fit the 64 MiB a device call carries, so CuPy's files come from
#             the machine's own install, NVRTC and the CUDA headers from NVIDIA's carried wheels
#   venv      a fresh venv without system site-packages, into which pip installs `attngen[cuda]`
#             with --no-index from those wheels only (so pip resolves the cuda extra itself)
#   extra     in that venv, with the CUDA toolkit hidden (CUDA_PATH/CUDA_HOME unset, no CUDA dirs
#             on PATH or LD_LIBRARY_PATH, /usr/local/cuda* covered by empty mounts where the
#             machine allows it, an empty kernel cache), from a directory outside the checkout:
#             `attngen fuzz` of the seed fp32 example and of an fp16 example against the NumPy
#             reference; then asserts that libnvrtc was loaded from the venv and that the
#             headers came from the venv's nvidia/cu13/include
#   nvrtc-new NVRTC from the venv compiles fp16 and bf16 examples for sm_100 and sm_120 (cubins)
#   cpp       examples/cpp: CMake runs the venv's `attngen compile`, nvcc builds, the program
#             runs (it sizes its workspace, launches twice, checks against a CPU loop)
#   gpu-tests tests/gpu/test_gpu_arches.py: sm_90 (mma.sync on Hopper) and Turing's source built
#             for sm_90, against the reference
#
# It prints a PASS/FAIL table at the end and exits 0 only when every step passed.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
OUT="${OUT:-$ROOT/device-check}"
mkdir -p "$OUT"
WORK="$(mktemp -d /tmp/attngen-devcheck.XXXXXX)"
WHEELS="$WORK/wheels"
VENV="$WORK/venv"
mkdir -p "$WHEELS"
PY="${PYTHON:-python3}"

declare -a NAMES RESULTS
record() { NAMES+=("$1"); RESULTS+=("$2"); echo "== $1: $2"; }
step() {  # step NAME COMMAND...: runs it with output to $OUT/NAME.log
  local name="$1"; shift
  echo "== $name ..."
  if "$@" >"$OUT/$name.log" 2>&1; then record "$name" PASS; else record "$name" "FAIL (rc $?, see $name.log)"; tail -n 25 "$OUT/$name.log"; fi
}

{
  echo "date: $(date -u +%FT%TZ)"
  nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader 2>&1
  "$PY" --version
  "$PY" -c "import cupy; print('system cupy', cupy.__version__)" 2>&1
  ls -la .whl-cuda .whl 2>&1
  git rev-parse HEAD 2>/dev/null
} | tee "$OUT/info.log"

# ---------------------------------------------------------------------------------------------
build_wheel() {
  "$PY" -m pip wheel --no-deps --no-index --find-links "$ROOT/.whl-cuda" -w "$WHEELS" "$ROOT" && ls "$WHEELS"/attngen-*.whl
}
step wheel build_wheel

repack() {
  "$PY" tools/wheel_from_installed.py "$WHEELS" cupy-cuda13x numpy jinja2 ml-dtypes hypothesis --deps \
    --exclude cuda-pathfinder,lark,nvidia-cuda-nvrtc,nvidia-cuda-runtime,setuptools
}
step repack repack

make_venv() {
  "$PY" -m venv "$VENV" || { rm -rf "$VENV"; "$PY" -m venv --without-pip "$VENV"; } || return 1
  grep -q "include-system-site-packages = false" "$VENV/pyvenv.cfg" || { echo "venv sees system site-packages"; return 1; }
  if "$VENV/bin/python" -c "import cupy" 2>/dev/null; then echo "cupy importable before the install"; return 1; fi
  local pip=("$VENV/bin/python" -m pip)
  [ -x "$VENV/bin/pip" ] || pip=("$PY" -m pip --python "$VENV/bin/python")
  # Without PYTHONPATH: packages a caller put there (the device's lark, a checkout) would count as
  # already installed, and the venv would lack them once that path is gone.
  env -u PYTHONPATH "${pip[@]}" install --no-index --no-cache-dir --find-links "$WHEELS" --find-links "$ROOT/.whl-cuda" \
    --find-links "$ROOT/.whl" "attngen[cuda]" || return 1
  env -u PYTHONPATH "${pip[@]}" list
}
step venv make_venv

# The toolkit hidden: only the venv's wheels can serve NVRTC and the headers.
clean_path() { tr ':' '\n' <<<"$1" | grep -vi cuda | paste -sd: -; }
run_hidden() {  # run_hidden FUNCTION: runs the (exported) function without a CUDA toolkit in sight
  local path ldp
  path="$VENV/bin:$(clean_path "$PATH")"
  ldp="$(clean_path "${LD_LIBRARY_PATH:-}")"
  local envs=(env -u CUDA_PATH -u CUDA_HOME -u CUDA_ROOT -u CUDA_TOOLKIT_ROOT_DIR -u PYTHONPATH -u PYTHONHOME
              PATH="$path" LD_LIBRARY_PATH="$ldp" ATTNGEN_CACHE_DIR="$WORK/cache" HYPOTHESIS_STORAGE_DIRECTORY="$WORK/hyp")
  local mounts="mkdir -p $WORK/empty; for d in /usr/local/cuda*; do [ -d \"\$d\" ] && mount --bind $WORK/empty \"\$d\"; done; true"
  if command -v unshare >/dev/null && unshare -m true 2>/dev/null; then
    echo "(toolkit directories covered by empty mounts)"
    "${envs[@]}" unshare -m bash -c "$mounts; echo \"/usr/local/cuda holds: \$(ls /usr/local/cuda/ 2>/dev/null | head -3)\"; $1"
  else
    echo "(no mount namespace here: /usr/local/cuda stays on disk; the lib and header checks below say what was used)"
    "${envs[@]}" bash -c "$1"
  fi
}

cuda_extra() {
  local dir="$WORK/outside"
  mkdir -p "$dir" && cp examples/seed_padded_fp32.attn examples/gpt2_causal_fp16.attn "$dir/" && cd "$dir" || return 1
  # (a working nvcc would not matter: NVRTC comes first, and the checks below name what was used)
  if nvcc --version >/dev/null 2>&1; then echo "note: a working nvcc is on the PATH: $(command -v nvcc)"; else echo "no working nvcc"; fi
  attngen check seed_padded_fp32.attn gpt2_causal_fp16.attn || return 1
  local s
  for s in seed_padded_fp32 gpt2_causal_fp16; do
    attngen fuzz "$s.attn" --max-examples 8 --seconds 120 2>&1 | tee fuzz.out
    [ "${PIPESTATUS[0]}" -eq 0 ] || return 1
    if grep -q "no kernels ran" fuzz.out; then echo "attngen fuzz ran no kernel"; return 1; fi
  done
  python - "$VENV" <<'PY'
import sys
venv = sys.argv[1]
import attngen, cupy
from attngen.cuda import compile as compile_cuda
from attngen.lang import frontend
from attngen.check import fuzz
from attngen.runtime import kernel as runtime
assert attngen.__file__.startswith(venv), attngen.__file__
assert cupy.__file__.startswith(venv), cupy.__file__
v = frontend.load("seed_padded_fp32.attn").get()
k = runtime.compile(v)
print("compiled with", k.compiler, "cached" if k.cached else f"in {k.compile_seconds:.2f} s", "for", k.plan.arch.value)
assert k.compiler.startswith("nvrtc"), k.compiler
case = fuzz.Case(B=2, Lq=100, Lk=100)
arrays = fuzz.case_inputs(v, case)
out, lse = fuzz.run_kernel(k, v, arrays)
reports = fuzz.compare(v, arrays, out, lse)
for r in reports:
    print(r.summary())
assert all(r.ok for r in reports)
libs = sorted({ln.split()[-1] for ln in open("/proc/self/maps") if "libnvrtc" in ln or "libcudart" in ln})
print("loaded:", *libs, sep="\n  ")
nvrtc = [p for p in libs if "libnvrtc.so" in p]
assert nvrtc and all(p.startswith(venv) for p in nvrtc), nvrtc
incs = compile_cuda._cuda_include_dirs()
print("NVRTC include dirs:", incs)
assert incs and incs[0].startswith(venv) and incs[0].endswith("nvidia/cu13/include"), incs
print("ok: the cuda extra's wheels served NVRTC and the headers")
PY
}
export ROOT WORK VENV
export -f cuda_extra
step extra run_hidden cuda_extra

nvrtc_new_arches() {
  cd "$ROOT" && python - "$VENV" <<'PY'
import sys
from attngen.cuda import compile as compile_cuda, render as render_cuda
from attngen.plan import validate
from attngen.plan.schedule import Arch
for name in ("gpt2_causal_fp16", "llama3_gqa_causal", "seed_padded_fp32"):
    for arch in (Arch.SM100, Arch.SM120):
        v = validate.load(f"examples/{name}.attn", arch=arch).get()
        b = compile_cuda.compile_source(render_cuda.render(v, arch), arch, prefer="nvrtc", use_cache=False)
        assert b.cubin[:4] == b"\x7fELF", name
        print(f"{name} {arch.value}: {b.compiler}, {len(b.cubin)} bytes of cubin in {b.seconds:.2f} s")
PY
}
export -f nvrtc_new_arches
step nvrtc-new run_hidden nvrtc_new_arches

cpp_example() {
  command -v cmake && command -v nvcc || { echo "cmake or nvcc missing"; return 1; }
  cmake -S examples/cpp -B "$WORK/cpp" -DATTNGEN_COMMAND="$VENV/bin/attngen" && cmake --build "$WORK/cpp" -j 8 \
    && "$WORK/cpp/attn_demo" && "$WORK/cpp/paged_decode_demo"
}
step cpp cpp_example

gpu_tests() {
  local site="$WORK/site"
  "$PY" -m pip install -q --no-index --no-deps --target "$site" .whl/*.whl || return 1
  PYTHONPATH="$ROOT:$site" "$PY" -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_gpu_arches.py | tee "$WORK/pytest.out"
  local rc=${PIPESTATUS[0]}
  # a skipped test proves nothing here
  [ "$rc" -eq 0 ] && grep -Eq '[0-9]+ passed' "$WORK/pytest.out" && ! grep -Eq '[0-9]+ skipped' "$WORK/pytest.out"
}
step gpu-tests gpu_tests

echo
echo "== device_install_check: $(date -u +%FT%TZ)"
{
  printf '%-10s %s\n' STEP RESULT
  for i in "${!NAMES[@]}"; do printf '%-10s %s\n' "${NAMES[$i]}" "${RESULTS[$i]}"; done
} | tee "$OUT/summary.txt"
fails=$(grep -vc -e '^STEP' -e ' PASS$' "$OUT/summary.txt")
if [ "$fails" -eq 0 ]; then echo "ALL PASS"; else echo "$fails step(s) failed"; fi
rm -rf "$WORK"
exit $((fails > 0))
