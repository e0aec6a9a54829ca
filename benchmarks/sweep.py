"""The length sweep: forward TFLOP/s against L, ours beside cuDNN, FA2 and FlexAttention.

    python benchmarks/sweep.py [--out PATH] [--plot PNG] [--lengths 512,1024,...] [--peers cudnn,flash,flex]
                               [--only CONFIG ...] [--append]
    python benchmarks/sweep.py --plot-only RESULTS.jsonl --plot PNG

The grid: bf16, H16, B*L = 32768 tokens, head dims 64 and 128, dense and causal, L from 512 to
16384, plus GQA 32/8 at D128 (dense and causal). Every implementation runs in the same process on
the same inputs (rotating sets larger than L2), after its output is checked against ours; causal
counts half the work (the visible fraction is computed from the mask). Results are JSON lines
(`env`, `gemm`, one `row` per implementation and cell); the plot has one panel per (D, mask) and
one line per implementation. With cuDNN and FA2 it needs about six minutes on one H200 (33 of the
36 cells fit in 320 s), more with FlexAttention (a torch.compile a shape):
to stay within a device call, split the grid with --only / --lengths and --append each part to
one results file.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # runnable from a checkout without installing
    sys.path.insert(0, str(ROOT))

from attngen.tools import bench  # noqa: E402
from attngen.lang import frontend  # noqa: E402

TOKENS = 32768
LENGTHS = (512, 1024, 2048, 4096, 8192, 16384)
# (label, heads, kv heads, head dim, causal)
CONFIGS = (
    ("d64_dense", 16, 16, 64, False),
    ("d64_causal", 16, 16, 64, True),
    ("d128_dense", 16, 16, 128, False),
    ("d128_causal", 16, 16, 128, True),
    ("d128_gqa32_8_dense", 32, 8, 128, False),
    ("d128_gqa32_8_causal", 32, 8, 128, True),
)
PEER_NAMES = {"cudnn": "sdpa-cudnn", "flash": "sdpa-flash", "flex": "flex"}


def spec(label: str, heads: int, kv: int, d: int, causal: bool) -> str:
    """The `.attn` text of one sweep configuration."""
    kv_part = f" kv {kv}" if kv != heads else ""
    mask = "; mask causal" if causal else ""
    return f"attention {label} {{ dtype bf16; head_dim {d}; heads {heads}{kv_part}{mask} }}\n"


def run(args: argparse.Namespace) -> int:
    from attngen.check import fuzz
    from attngen.runtime import kernel as runtime

    ok, why = fuzz.gpu_status()
    if not ok:
        print(f"sweep: no GPU ({why}); nothing to time", file=sys.stderr)
        return 2
    want = {PEER_NAMES[p] for p in args.peers.split(",") if p}
    lengths = [int(x) for x in args.lengths.split(",")]
    out_path = Path(args.out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    # --append adds this run (its own env and gemm lines) to an existing results file, so one grid
    # can be split over several calls (`--only` / `--lengths`) and still plot and tabulate as one.
    earlier = load_rows(str(out_path)) if args.append and out_path.exists() else []
    f = open(out_path, "a" if args.append else "w", encoding="utf-8")

    def emit(obj: dict) -> None:
        f.write(json.dumps(obj, default=str) + "\n")
        f.flush()

    emit({"kind": "env", **bench.env_info()})
    gemm = bench.gemm_rate()
    emit({"kind": "gemm", **gemm})
    rows: list[bench.Row] = []
    t_start = time.monotonic()
    for label, heads, kv, d, causal in CONFIGS:
        if args.only and label not in args.only:
            continue
        v = frontend.loads(spec(label, heads, kv, d, causal), f"<sweep:{label}>").get()
        kernel = runtime.compile(v)
        for L in lengths:
            B = max(1, TOKENS // L)
            t0 = time.monotonic()
            try:
                got = bench.bench_shape(v, kernel, B, L, L, workload=f"{label}_L{L}", gemm_tflops=gemm["tflops"],
                                        peers=bool(want), repeats=args.repeats, check_reference=False, only_peers=want)
            except Exception as e:  # one broken cell must not hide the others
                got = [bench.Row(workload=f"{label}_L{L}", variant=label, impl="attngen", dtype="bf16", B=B, H=heads,
                                 Lq=L, Lk=L, D=d, error=f"{type(e).__name__}: {str(e)[:300]}")]
            for r in got:
                r.extra["config"] = label
                emit({"kind": "row", **asdict(r)})
            rows += got
            print(f"  {label} L{L}: {time.monotonic() - t0:.1f}s", file=sys.stderr, flush=True)
    f.close()
    print(table(earlier + rows))
    disagree = [r for r in rows if r.agrees is False]
    print(f"\nsweep: {len(rows)} rows, {len(disagree)} disagreeing, {time.monotonic() - t_start:.0f}s; {out_path}")
    if args.plot:
        print(plot(earlier + rows, args.plot) or "sweep: matplotlib missing, no plot")
    return 1 if disagree else 0


def table(rows: list[bench.Row]) -> str:
    """TFLOP/s (visible work) per configuration and length: ours / cuDNN / FA2 / Flex, and ratios."""
    cells: dict[tuple[str, int], dict[str, float]] = {}
    for r in rows:
        if r.ms and r.tflops_visible is not None:
            cells.setdefault((r.extra.get("config", r.variant), r.Lq), {})[r.impl] = r.tflops_visible
    lines = [f"{'config':<22} {'L':>6} {'ours':>7} {'cuDNN':>7} {'FA2':>7} {'Flex':>7} {'/cuDNN':>7} {'/FA2':>6}"]
    for (cfg, L), c in sorted(cells.items()):
        def g(k: str) -> str:
            return f"{c[k]:7.0f}" if k in c else "      -"
        ours = c.get("attngen")
        rc = f"{ours / c['sdpa-cudnn']:7.2f}" if ours and "sdpa-cudnn" in c else "      -"
        rf = f"{ours / c['sdpa-flash']:6.2f}" if ours and "sdpa-flash" in c else "     -"
        lines.append(f"{cfg:<22} {L:>6} {g('attngen')} {g('sdpa-cudnn')} {g('sdpa-flash')} {g('flex')} {rc} {rf}")
    return "\n".join(lines)


def load_rows(path: str) -> list[bench.Row]:
    rows = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        obj = json.loads(line)
        if obj.pop("kind", None) == "row":
            rows.append(bench.Row(**obj))
    return rows


def plot(rows: list[bench.Row], path: str) -> str | None:
    """One panel per configuration, TFLOP/s against L (log2 axis), one line per implementation."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    configs = [c[0] for c in CONFIGS if any(r.extra.get("config") == c[0] for r in rows)]
    fig, axes = plt.subplots(2, (len(configs) + 1) // 2, figsize=(5 * ((len(configs) + 1) // 2), 8), squeeze=False)
    for ax, cfg in zip(axes.T.flat, configs):
        for impl in ("attngen", "sdpa-cudnn", "sdpa-flash", "flex"):
            pts = sorted((r.Lq, r.tflops_visible) for r in rows
                         if r.extra.get("config") == cfg and r.impl == impl and r.ms and r.tflops_visible)
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=impl)
        ax.set_xscale("log", base=2)
        ax.set_title(cfg)
        ax.set_xlabel("L (B*L = 32768 tokens)")
        ax.set_ylabel("TFLOP/s (visible work)")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    for ax in list(axes.T.flat)[len(configs):]:
        ax.set_visible(False)  # an odd number of configurations leaves a panel empty
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return f"sweep: plot in {path}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    default_out = Path(os.environ["OUT"]) / "sweep.jsonl" if os.environ.get("OUT") else ROOT / "benchmarks" / "results" / "h200_sweep.jsonl"
    p.add_argument("--out", default=str(default_out))
    p.add_argument("--plot", default=None, help="write a PNG plot here")
    p.add_argument("--plot-only", default=None, metavar="RESULTS", help="plot an existing results file and exit")
    p.add_argument("--lengths", default=",".join(map(str, LENGTHS)))
    p.add_argument("--peers", default="cudnn,flash,flex", help="comma list of cudnn, flash, flex")
    p.add_argument("--only", nargs="*", default=None, help="configurations: " + ", ".join(c[0] for c in CONFIGS))
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--append", action="store_true", help="add this run to --out instead of replacing it")
    args = p.parse_args(argv)
    if args.plot_only:
        rows = load_rows(args.plot_only)
        print(table(rows))
        if args.plot:
            print(plot(rows, args.plot) or "sweep: matplotlib missing, no plot")
        return 0
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
