#!/usr/bin/env python3
"""ptxas's registers and spill stores for the mma.sync forward (sm_80) with a mask's lookups split by
axis (`emit.split_by_axis`) and in the per-element form, over head dims, masks and tiles, then the
same for the mma.sync backward's dK/dV kernel: the evidence behind `render.MMA_SPLIT_MAX_HEAD_DIM`.
CPU only (needs nvcc). With `cuobjdump` on the PATH (or at $CUOBJDUMP; Triton's wheel carries
one) it also counts the SASS global loads, branches and shuffles of the head-dim-64 kernels.

    python tools/mma_split_ptxas.py [--out benchmarks/results/mma_split_ptxas.txt]
"""

from __future__ import annotations

import argparse
import itertools
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from attngen.cuda import render, render_bwd  # noqa: E402
from attngen.cuda.compile import nvcc, nvcc_version, resources  # noqa: E402
from attngen.lang import frontend  # noqa: E402
from attngen.plan.schedule import Arch  # noqa: E402

MASKS = {
    "documents": "input doc: i32[B, Lk] sorted; mask document(doc) && causal",
    "prefix_lm": "input plen: i32[B]; mask causal || prefix(plen[b])",
    "padding": "mask padding",
}
TILES = {
    "auto": "",
    "128x64x4w": "; tile block_m 128 block_n 64 warps 4 stages 2",
    "64x64x4w": "; tile block_m 64 block_n 64 warps 4 stages 2",
    "64x32x4w": "; tile block_m 64 block_n 32 warps 4 stages 2",
}


def _sass_counts(src: str, kernel: str) -> str | None:
    """Global loads, branches and shuffles in `kernel`'s sm_80 SASS, or None without cuobjdump."""
    exe = os.environ.get("CUOBJDUMP") or shutil.which("cuobjdump")
    if not exe:
        return None
    cubin, _ = nvcc(src, Arch.SM80, "cubin")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([exe, "-sass", f.name], capture_output=True, text=True, check=True).stdout
    body = next((part for part in re.split(r"\n\s*Function : ", text) if part.split("\n", 1)[0].strip() == kernel), text)
    counts = []
    for op in ("LDG", "BRA", "SHFL"):
        pattern = r"\b" + op + r"(\.\S+)?\s"
        counts.append(f"{op} {len(re.findall(pattern, body))}")
    return " ".join(counts)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="also write the table here")
    args = ap.parse_args()
    lines = [f"# tools/mma_split_ptxas.py: bf16, heads 8, sm_80, {nvcc_version()}; registers / spill-store bytes",
             "# head_dim  mask  tile (resolved)  per-element  split"]
    plain = lambda *a: None  # noqa: E731
    split = render._fwd_split
    for D, (mname, mask), (tname, tile) in itertools.product((64, 96, 128), MASKS.items(), TILES.items()):
        v = frontend.loads(f"attention a {{ dtype bf16; head_dim {D}; heads 8; {mask}{tile} }}").get()
        row = []
        for fn, cap in ((plain, render.MMA_SPLIT_MAX_HEAD_DIM), (split, 1 << 30)):
            old_fn, old_cap = render._fwd_split, render.MMA_SPLIT_MAX_HEAD_DIM
            render._fwd_split, render.MMA_SPLIT_MAX_HEAD_DIM = fn, cap
            try:
                src, kp = render.render_with_plan(v, Arch.SM80)
            finally:
                render._fwd_split, render.MMA_SPLIT_MAX_HEAD_DIM = old_fn, old_cap
            r = [x for x in resources(src, Arch.SM80) if x.kernel == kp.kernel_name][0]
            sass = _sass_counts(src, kp.kernel_name) if D == 64 and tname == "auto" else None
            row.append(f"{r.registers} / {r.spill_stores}" + (f" ({sass})" if sass else ""))
        t = kp.tile
        lines.append(f"{D}  {mname}  {tname} ({t.block_m}x{t.block_n}x{t.warps}w)  {row[0]}  {row[1]}")
        print(lines[-1], flush=True)
    lines.append("# backward dK/dV kernel (its tile: 64 queries a step)")
    for D, (mname, mask) in itertools.product((64, 96, 128), MASKS.items()):
        v = frontend.loads(f"attention a {{ dtype bf16; head_dim {D}; heads 8; {mask} }}").get()
        row = []
        for fn in (lambda *a: None, render_bwd._bwd_split_ctx):
            old_fn, old_cap = render_bwd._bwd_split_ctx, render_bwd.MMA_SPLIT_MAX_HEAD_DIM
            render_bwd._bwd_split_ctx, render_bwd.MMA_SPLIT_MAX_HEAD_DIM = fn, 1 << 30
            try:
                src, bp = render_bwd.render_with_plan(v, Arch.SM80)
            finally:
                render_bwd._bwd_split_ctx, render_bwd.MMA_SPLIT_MAX_HEAD_DIM = old_fn, old_cap
            r = [x for x in resources(src, Arch.SM80) if x.kernel.endswith("_dkdv")][0]
            sass = _sass_counts(src, r.kernel) if D == 64 else None
            row.append(f"{r.registers} / {r.spill_stores}" + (f" ({sass})" if sass else ""))
        lines.append(f"{D}  {mname}  {bp.engine.value} {bp.backward.tc_block_m} queries  {row[0]}  {row[1]}")
        print(lines[-1], flush=True)
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
