"""A quick, non-stopping GPU pass over the decode specs (fixed shapes): prints one line a case.

    python tests/gpu/decode_smoke.py [--only NAME ...] [--quick]

(`--quick`: three shapes a spec, one merged in the split kernel, for compute-sanitizer runs.)

For a device run where a failing hypothesis test would spend the budget shrinking: every spec of
test_gpu_decode.py at a few fixed shapes and split counts, errors summarised, never stopping early.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from attngen.check import fuzz  # noqa: E402
from attngen.runtime import kernel as runtime  # noqa: E402
from gpu_helpers import variant_of  # noqa: E402
from test_gpu_decode import SPECS  # noqa: E402

# (B, Lq, Lk, splits or (override, N)): forced equal splits, N equal shares cutting row blocks
# ("ctas"), or either merged in the split kernel ("splits_fused", "ctas_fused").
SHAPES = [(1, 1, 1, None), (2, 1, 777, None), (1, 3, 4097, None), (3, 16, 129, 2), (2, 1, 3000, 1), (1, 5, 2049, 64), (2, 7, 65, None),
          (3, 2, 3000, ("ctas", 7)), (2, 1, 5000, ("ctas", 131)), (1, 16, 999, ("ctas", 3)), (3, 2, 3000, ("splits_fused", 5)),
          (2, 1, 5000, ("ctas_fused", 131))]


def main() -> int:
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("--only", nargs="*", default=None)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    shapes = [*SHAPES[1:3], SHAPES[-2]] if args.quick else SHAPES  # quick: two shapes and one split-kernel merge
    bad = 0
    for text in SPECS:
        v = variant_of(text)
        if args.only and v.name not in args.only:
            continue
        t0 = time.perf_counter()
        try:
            k = runtime.compile(v, family="decode")
        except Exception as e:
            print(f"{v.name}: COMPILE FAILED {type(e).__name__}: {str(e)[:2000]}")
            bad += 1
            continue
        print(f"{v.name}: compiled in {time.perf_counter() - t0:.1f} s, chunk {k.plan.split.chunk}")
        for B, Lq, Lk, splits in shapes:
            if v.kind.value == "self":
                Lk = Lq
            n_chunks = -(-Lk // k.plan.split.chunk)
            kw_s = {}
            if isinstance(splits, tuple):
                if splits[0].startswith("ctas"):
                    kw_s["ctas"] = min(splits[1], k.plan.split.units(B, Lq, Lk))
                else:
                    kw_s["splits"] = min(splits[1], n_chunks)
                if splits[0].endswith("_fused"):
                    kw_s["fused"] = True
            elif splits is not None:
                kw_s["splits"] = min(splits, n_chunks)
            case = fuzz.Case(B, Lq, Lk, "normal", seed=B * 1000 + Lq * 7 + Lk)
            arrays = fuzz.case_inputs(v, case)
            try:
                out, lse = fuzz.run_kernel(lambda q, kk, vv, **kw: k(q, kk, vv, **kw_s, **kw), v, arrays)
                reps = fuzz.compare(v, arrays, out, lse)
                fails = [r.summary() for r in reps if not r.ok]
            except Exception as e:
                fails = [f"{type(e).__name__}: {str(e)[:300]}"]
            print(f"  {'ok  ' if not fails else 'FAIL'} {case.describe()} {kw_s or 'default schedule'}" + ("" if not fails else "\n    " + "\n    ".join(fails)))
            bad += bool(fails)
    print(f"smoke: {bad} failing")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
