"""Times suite workloads (benchmarks/suite.py) under other tiles: the evidence behind `tile auto`.

    python tools/tile_sweep.py WORKLOAD=BMxBNxWxS[,BMxBNxWxS...] [WORKLOAD=...] [--repeats N]

Each tile is appended to the workload's spec as a `tile` statement; outputs are checked against
the reference like any suite row, and only our kernel is timed. Prints one line per (workload,
tile) and writes JSON lines to $OUT/tile_sweep.jsonl when OUT is set.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import suite  # noqa: E402

from attngen.tools import bench  # noqa: E402
from attngen.plan import validate  # noqa: E402
from attngen.runtime import kernel as runtime  # noqa: E402


def main(argv: list[str]) -> int:
    repeats = None
    if "--repeats" in argv:
        i = argv.index("--repeats")
        repeats = int(argv[i + 1])
        argv = argv[:i] + argv[i + 2:]
    by_name = {w.name: w for w in suite.WORKLOADS}
    log = open(os.path.join(os.environ["OUT"], "tile_sweep.jsonl"), "w") if os.environ.get("OUT") else None
    gemm = bench.gemm_rate()["tflops"]
    for arg in argv:
        name, _, tiles = arg.partition("=")
        w = by_name[name]
        for t in [None, *(x for x in tiles.split(",") if x)]:  # NAME= times the auto tile only
            text = suite.SPECS[w.spec].rstrip().rstrip("}")
            if t is not None:
                bm, bn, wp, st = t.split("x")
                text += f"; tile block_m {bm} block_n {bn} warps {wp} stages {st} }}"
            else:
                text += "}"
            v = validate.loads(text, f"<sweep:{name}>").get()  # a tile the arch cannot run: a located error
            k = runtime.compile(v)
            host = w.inputs(v, w.B, w.Lq, w.Lk) if w.inputs else None
            row = bench.bench_shape(v, k, w.B, w.Lq, w.Lk, workload=name, gemm_tflops=gemm, peers=False,
                                    repeats=repeats or w.repeats, runtime_inputs=host)[0]
            label = "auto" if t is None else t
            print(f"{name:24s} {label:12s} {k.tile.block_m}x{k.tile.block_n}x{k.tile.warps}x{k.tile.stages} "
                  f"{row.ms:8.4f} ms {row.tflops_visible or 0:7.1f} TFLOP/s {'ok' if row.agrees is not False else 'DISAGREES'}", flush=True)
            if log:
                log.write(json.dumps({"workload": name, "tile": label, "ms": row.ms, "tflops": row.tflops_visible, "agrees": row.agrees}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
