"""Cold compile and warm load of a new variant (issue 16's bar: <= 2 s cold, <= 20 ms warm).

Each measurement runs in a fresh Python process, as a user's first call does, with CuPy and
attngen imported before the clock starts (their import is reported apart):
  cold          empty cache directory: parse, render, NVRTC, load.
  warm-process  a new process over the cache the cold run filled: parse (parser tables from the
                cache), render (compiled templates from the cache), cubin from the cache, load.
  warm-inproc   in the warm process, a second variant whose cubin is on disk but which this
                process has not seen: what a server pays when a request names a new variant.
Writes one JSON file (default benchmarks/results/h200_compile.json).

    python benchmarks/compile_bench.py [--out FILE] [--repeats N]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap

SPEC = """
attention gqa_window_softcap {
  dtype bf16
  head_dim 128
  heads 32 kv 8
  mask causal && window(1024, 0)
  score softcap(30)
}
attention gqa_window_softcap_b {
  dtype bf16
  head_dim 128
  heads 32 kv 8
  mask causal && window(2048, 0)
  score softcap(50)
}
"""

CHILD = textwrap.dedent("""
    import json, sys, time
    t0 = time.perf_counter()
    import cupy
    cupy.cuda.Device().synchronize()
    import attngen
    t1 = time.perf_counter()
    from attngen.lang.frontend import loads
    prog_text = sys.argv[1]
    t2 = time.perf_counter()
    k = attngen.compile(prog_text, "gqa_window_softcap")
    t3 = time.perf_counter()
    k2 = attngen.compile(prog_text, "gqa_window_softcap_b")
    t4 = time.perf_counter()
    print(json.dumps(dict(imports_s=t1 - t0, first_s=t3 - t2, second_s=t4 - t3, cached=k.cached,
                          compile_seconds=k.compile_seconds, compiler=k.compiler)))
""")


def _child(cache: str) -> dict:
    env = dict(os.environ, ATTNGEN_CACHE_DIR=cache)
    r = subprocess.run([sys.executable, "-c", CHILD, SPEC], capture_output=True, text=True, env=env, check=False)
    if r.returncode != 0:
        raise SystemExit(f"child failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="benchmarks/results/h200_compile.json")
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    cold, warm, inproc, imports = [], [], [], []
    compiler = ""
    for _ in range(a.repeats):
        with tempfile.TemporaryDirectory(prefix="attngen-compile-bench-") as cache:
            c = _child(cache)  # fills the cache: both variants compiled
            w = _child(cache)  # a new process, everything on disk
            if not w["cached"] or c["cached"]:
                raise SystemExit(f"cache state not as expected: cold cached={c['cached']}, warm cached={w['cached']}")
            cold.append(c["first_s"])
            warm.append(w["first_s"])
            inproc.append(w["second_s"])
            imports.append(w["imports_s"])
            compiler = c["compiler"]
    res = dict(
        spec="GQA 32/8 causal + window + softcap, bf16 D128, sm_90a",
        compiler=compiler,
        repeats=a.repeats,
        cold_s=statistics.median(cold),
        warm_process_s=statistics.median(warm),
        warm_inproc_s=statistics.median(inproc),
        imports_s=statistics.median(imports),
        all=dict(cold=cold, warm_process=warm, warm_inproc=inproc, imports=imports),
        bars=dict(cold_s=2.0, warm_s=0.020),
    )
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)
    print(f"compile bench ({compiler}): cold {res['cold_s']:.2f} s (bar 2 s); warm new process "
          f"{1e3 * res['warm_process_s']:.1f} ms, warm new variant in process {1e3 * res['warm_inproc_s']:.1f} ms "
          f"(bar 20 ms); imports {res['imports_s']:.2f} s")


if __name__ == "__main__":
    main()
