"""`attngen bench`'s output: the table, the TFLOP/s plot, the environment recorded with results."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from attngen.tools.bench_rows import Row


def format_table(rows: Sequence[Row]) -> str:
    """A plain-text table: one line per implementation and shape."""
    head = f"{'workload':<26} {'impl':<14} {'B,H,Lq,Lk,D':<22} {'ms':>9} {'TF/s vis':>9} {'TF/s dns':>9} {'%gemm':>6} {'vs ours':>8} ok"
    lines = [head, "-" * len(head)]
    for r in rows:
        shape = f"{r.B},{r.H},{r.Lq},{r.Lk},{r.D}"
        if r.error:
            lines.append(f"{r.workload[:26]:<26} {r.impl[:14]:<14} {shape:<22} error: {r.error[:60]}")
            continue
        ms = f"{r.ms:9.4f}" if r.ms is not None else " " * 9
        tv = f"{r.tflops_visible:9.1f}" if r.tflops_visible is not None else " " * 9
        td = f"{r.tflops_dense:9.1f}" if r.tflops_dense is not None else " " * 9
        fg = f"{100 * r.frac_gemm:5.1f}%" if r.frac_gemm is not None else " " * 6
        sp = f"{r.speedup_vs_peer:7.2f}x" if r.speedup_vs_peer is not None else " " * 8
        ok = {True: "yes", False: "NO", None: "-"}[r.agrees]
        lines.append(f"{r.workload[:26]:<26} {r.impl[:14]:<14} {shape:<22} {ms} {tv} {td} {fg} {sp} {ok}")
    return "\n".join(lines)


def plot(rows: Sequence[Row], path: str) -> str | None:
    """TFLOP/s (visible work) against Lk for attngen and each peer; None when matplotlib is absent."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception:
        return "matplotlib is not installed (pip install matplotlib): no plot written"
    fig, ax = plt.subplots(figsize=(7, 4.5))
    impls = sorted({r.impl for r in rows}, key=lambda s: (s != "attngen", s))
    for impl in impls:
        pts = sorted((r.Lk, r.tflops_visible) for r in rows if r.impl == impl and r.tflops_visible)
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=impl, linewidth=2.5 if impl == "attngen" else 1.2)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("sequence length (Lk)")
    ax.set_ylabel("TFLOP/s (visible work)")
    ax.set_title(", ".join(sorted({r.variant for r in rows})))
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return None


def env_info() -> dict:
    """GPU, driver, library versions and the git commit, for results files."""
    info: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
    try:
        import cupy

        props = cupy.cuda.runtime.getDeviceProperties(0)
        info["gpu"] = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
        info["driver"] = cupy.cuda.runtime.driverGetVersion()
        info["cuda_runtime"] = cupy.cuda.runtime.runtimeGetVersion()
        info["cupy"] = cupy.__version__
    except Exception as e:
        info["gpu_error"] = repr(e)[:200]
    try:
        import torch

        info["torch"] = torch.__version__
    except Exception:
        pass
    try:
        import subprocess

        info["commit"] = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                                        cwd=Path(__file__).resolve().parent.parent.parent, timeout=10).stdout.strip() or None
    except Exception:
        info["commit"] = None
    return info
