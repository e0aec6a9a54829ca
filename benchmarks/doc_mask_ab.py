"""Document and window masks on the wgmma forward at two tiles, FlexAttention beside.

    python benchmarks/doc_mask_ab.py [--out PATH]

bf16 D128 H16 B2 L16384: `document(doc) && causal` over the suite's 16 random documents a row, 16
documents of 1024 tokens, 64 of 256 and one of 16k, and `causal && window(1023, 0)`; each at 128 x
128 x 3 stages (`auto` in the rows: the main tile of these masks) and at 128 x 128 x 2 (`x2`: two Q buffers on
split K/V rings, the tile `tile auto` gives them, `schedule._short_runs`). Outputs of the two tiles are compared on the same inputs
(`maxdiff_vs_auto`); the first tile of a case is timed beside FlexAttention where the suite has it.
Results: JSON lines (`results/h200_doc_mask.jsonl` holds the committed runs)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for p in (ROOT, ROOT / "benchmarks"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import numpy as np  # noqa: E402

from suite import _documents  # noqa: E402

HDR = "dtype bf16; head_dim 128; heads 16"
DOC = HDR + "\n input doc: i32[B, Lk] sorted\n mask document(doc) && causal"
WIN = HDR + "\n mask causal && window(1023, 0)"
TILES = {"auto": "\n tile block_m 128 block_n 128 warps 8 stages 3", "x2": "\n tile block_m 128 block_n 128 warps 8 stages 2"}


def uniform(B: int, L: int, n: int) -> dict[str, np.ndarray]:
    """Documents of n tokens each."""
    return {"doc": np.repeat(np.arange(L // n, dtype=np.int32), n)[None, :].repeat(B, 0).copy()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "/tmp"), "doc_mask_ab.jsonl"))
    args = ap.parse_args(argv)
    from attngen.check import fuzz
    from attngen.ir import abi
    from attngen.lang import frontend
    from attngen.runtime import kernel as runtime
    from attngen.tools import bench

    ok, why = fuzz.gpu_status()
    if not ok:
        print(f"doc_mask_ab: no GPU ({why})", file=sys.stderr)
        return 2
    B, L = 2, 16384
    cases = [("doc_random", DOC, _documents(None, B, L, L), True), ("doc_uniform1024", DOC, uniform(B, L, 1024), True),
             ("doc_uniform256", DOC, uniform(B, L, 256), False), ("doc_one", DOC, uniform(B, L, L), False),
             ("window1024", WIN, {}, True)]
    out = open(args.out, "w", encoding="utf-8")
    bad = 0
    for label, body, rt, flex in cases:
        base = None
        for i, (tname, tile) in enumerate(TILES.items()):
            v = frontend.loads(f"attention p {{ {body}{tile} }}\n", "<doc_mask_ab>").get()
            k = runtime.compile(v, family="forward")
            rows = bench.bench_shape(v, k, B, L, L, workload=label, peers=flex and i == 0, repeats=30, check_reference=False,
                                     only_peers={"flex"}, runtime_inputs=rt or None)
            ins = bench.device_qkv(v, B, L, L, 5)
            o = fuzz.empty_device(abi.o_shape(v, B, L), v.dtype)
            k(ins["q"], ins["k"], ins["v"], out=o, **{n: fuzz.to_device(a) for n, a in rt.items()})
            fuzz.synchronize()
            o = fuzz.to_host(o, v.dtype).astype(np.float32)
            base = o if base is None else base
            diff = float(np.abs(o - base).max())
            bad += diff != 0.0 or any(r.agrees is False or r.error for r in rows)
            for r in rows:
                out.write(json.dumps({"case": label, "tile": tname, "maxdiff_vs_auto": diff, **asdict(r)}, default=str) + "\n")
                print(f"{label:16s} {tname:5s} {r.impl:8s} {r.ms or float('nan'):8.4f} ms {r.tflops_visible or 0:7.1f} TFLOP/s "
                      f"maxdiff_vs_auto={diff:.3g} agrees={r.agrees} err={r.error}", flush=True)
    out.close()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
