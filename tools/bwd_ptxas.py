"""ptxas's report on every example's backward dK/dV kernel at sm_90a (issue 14): registers, stack,
spills, and whether ptxas serialised or fenced the asynchronous products (C7507 setmaxnreg ignored,
C7512 serialised wgmma, C7517 / C7519 injected waits / arrives).

    python tools/bwd_ptxas.py [EXAMPLE.attn ...] > bwd_wgmma_ptxas.txt

Each spec (default: examples/*.attn) is rendered as `attngen compile --pass backward --arch sm_90a`
does (every variant of a spec with variants) and compiled with nvcc -cubin -Xptxas -v (no GPU)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from attngen.cuda import compile as compile_cuda  # noqa: E402
from attngen.cuda import render_bwd  # noqa: E402
from attngen.lang import frontend  # noqa: E402
from attngen.plan import bwd as plan_bwd  # noqa: E402
from attngen.plan.schedule import Arch  # noqa: E402

_CODES = ("C7507", "C7512", "C7517", "C7519")
_RES = re.compile(r"Compiling entry function '(?P<name>\w+_bwd_dkdv)'.*?Function properties for \w+\n\s*"
                  r"(?P<frame>\d+) bytes stack frame, (?P<st>\d+) bytes spill stores, (?P<ld>\d+) bytes spill loads.*?Used (?P<regs>\d+) registers",
                  re.S)


def line(label: str, v) -> str:
    """One kernel's report line."""
    try:
        src, bp = render_bwd.render_with_plan(v, Arch.SM90A)
    except Exception as e:  # a variant the backward refuses: its first line, as the CLI prints it
        return f"{label}: compile refused: {str(e).splitlines()[-1] if str(e) else type(e).__name__}"
    _, log = compile_cuda.nvcc(src, Arch.SM90A, "cubin", extra=("-Xptxas", "-v"))
    m = _RES.search(log)
    if not m:
        return f"{label}: no dK/dV kernel in ptxas's report"
    codes = [c for c in _CODES if c in log]
    split = int(plan_bwd.wg_dq_split(bp.backward.wg_dq)) if bp.engine == plan_bwd.BwdEngine.WGMMA else 0
    return (f"{label}: wg_split={split} Used {m['regs']} registers; {m['frame']} bytes stack frame, {m['st']} bytes spill stores, "
            f"{m['ld']} bytes spill loads; {' '.join(codes) if codes else 'no C75xx'}")


def main(argv: list[str]) -> int:
    paths = [Path(a) for a in argv] or sorted((ROOT / "examples").glob("*.attn"))
    multi: list[str] = []  # specs with variants: after the others, a line a variant
    for path in paths:
        try:
            variants = frontend.load(str(path)).variants
        except Exception as e:  # a spec that does not check: its last line
            print(f"{path.stem}: spec refused: {str(e).splitlines()[-1] if str(e) else type(e).__name__}")
            continue
        if len(variants) == 1:
            print(line(path.stem, variants[0]), flush=True)
        else:
            multi += [line(f"{v.name} (--variant)", v) for v in variants]
    for m in multi:
        print(m, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
