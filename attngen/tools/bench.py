"""`attngen bench`: time a generated kernel on the GPU, side by side with torch's kernels.

    attngen bench FILE [--variant NAME] [--shape B=8,L=4096 ...] [--json out.json] [--plot out.png]
                  [--peers/--no-peers] [--repeats N]

Timing: CUDA events around every launch, after warm-up, at least 20 repeats, the median reported;
launches rotate among several input sets whose total size exceeds twice the 60 MB L2 of an H200, so
a kernel never reads inputs the previous launch left in cache.

Rates: TFLOP/s counting only visible work (2·(D+Dv) flops per visible score, the visible fraction
evaluated from the mask itself on these inputs) and dense-equivalent (as if nothing were masked),
plus the fraction of the device's bf16 matrix-product rate, measured in the same run (an 8192³
torch matmul; CuPy's fp16 matmul when torch is absent).

Peers, when torch is importable: SDPA's flash and cuDNN backends where the variant is expressible
(fp16/bf16, no score modification, no norm, mask none or causal with Lq == Lk), torch eager
norm + SDPA + residual for fused-norm variants, and FlexAttention compiled with torch.compile via
`attngen.check.flex` (norms and residual applied in torch around it). Every peer's output is checked
against ours under the tolerance policy before it is timed; rows say whether they agreed.

`--shape` names sizes (attngen.tools.shape): B=8,L=4096 (Lq = Lk) or B=2,Lq=1,Lk=4096 (cross
attention); H and D, when given, must be the spec's heads and head_dim (one compiled kernel serves
every B and L, not other heads).

The work lives in focused modules: bench_timing (clocks), bench_peers (torch peers), bench_rows
(work, device inputs, one row set a shape), bench_report (table, plot, environment). This module
is the command and re-exports their public names, which benchmarks/*.py use as `bench.X`.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from attngen.ir.nodes import AttnKind, Layout, Variant
from attngen.tools.bench_peers import Peer, peers_for, sdpa_expressible, sdpa_peer, torch_composite_peer, flex_peer
from attngen.tools.bench_report import env_info, format_table, plot
from attngen.tools.bench_rows import Row, bench_shape, dense_flops, device_qkv, host_runtime_inputs, nbytes, visible_fraction
from attngen.tools.bench_timing import (
    GRAPH_BELOW_MS, L2_BYTES, MIN_REPEATS, Timing, gemm_rate, rotation_sets, time_gpu, time_graph, time_launches,
)
from attngen.tools import shape as shape_arg
from attngen.tools.exit_codes import EXIT_FAIL, EXIT_OK, EXIT_USAGE

__all__ = [
    "GRAPH_BELOW_MS", "L2_BYTES", "MIN_REPEATS", "Peer", "Row", "Timing", "bench_shape", "build_parser",
    "default_shapes", "dense_flops", "device_qkv", "env_info", "flex_peer", "format_table", "gemm_rate",
    "host_runtime_inputs", "main", "nbytes", "parse_shape", "peers_for", "plot", "rotation_sets", "sdpa_expressible",
    "sdpa_peer", "time_gpu", "time_graph", "time_launches", "torch_composite_peer", "visible_fraction",
]


def parse_shape(text: str, v: Variant) -> tuple[int, int, int]:
    """A `--shape` value (attngen.tools.shape: B=..,Lq=..,Lk=.. or B=..,L=..; H, D checked against the
    spec) as (B, Lq, Lk); ValueError (a ShapeError) for a bad form or sizes `v` cannot take."""
    s = shape_arg.parse_shape(text)
    s.check(v.name, v.kind == AttnKind.SELF, v.heads, v.head_dim)
    if v.kind == AttnKind.SELF and s.Lq != s.Lk:
        raise shape_arg.ShapeError(f"--shape {text!r}: {v.name} is self attention, and `attngen bench` times whole "
                                   f"sequences, so Lq must equal Lk (give L=..)")
    return s.B, s.Lq, s.Lk


def default_shapes(v: Variant) -> list[tuple[int, int, int]]:
    """B·L = 32k tokens at L = 1k, 4k, 16k (as the peer anchors), fewer for very many heads."""
    out = []
    for L, B in ((1024, 32), (4096, 8), (16384, 2)):
        B = max(1, B * 16 // max(16, v.heads))
        out.append((B, L, L))
    return out


def build_parser() -> argparse.ArgumentParser:
    """The `attngen bench` arguments on their own (when this module runs by itself); defined once,
    in the command line (attngen.tools.cli.bench_arguments)."""
    from attngen.tools.cli import bench_arguments

    p = argparse.ArgumentParser(prog="attngen bench", description="Time a kernel, side by side with torch peers.")
    bench_arguments(p)
    return p


def main(args: argparse.Namespace | Sequence[str] | None = None) -> int:
    """Run `attngen bench`; 0 ok, 1 a spec error or a disagreeing output, 2 a usage error."""
    if args is None or not isinstance(args, argparse.Namespace):
        args = build_parser().parse_args(list(args) if args is not None else None)
    from attngen.plan import validate
    from attngen.lang.diagnostics import SpecError
    from attngen.runtime.extras import gpu_check

    def err(msg: str, code: int = EXIT_USAGE) -> int:
        print(f"attngen bench: error: {msg}", file=sys.stderr)
        return code

    try:
        text = Path(args.file).read_text(encoding="utf-8")
    except OSError as e:
        return err(f"{args.file}: {e.strerror or e}")
    try:
        prog = validate.loads(text, args.file)
    except SpecError as e:
        print(e.render(), file=sys.stderr)
        return EXIT_FAIL
    try:
        variants = list(prog.select(args.variant))
    except KeyError as e:
        return err(str(e.args[0]) if e.args else str(e))
    shapes_by_variant: dict[str, list[tuple[int, int, int]]] = {}
    for v in variants:
        if v.layout == Layout.VARLEN:
            return err(f"{v.name}: `attngen bench` times padded batches of one shape; for `layout varlen` (lengths that "
                       "vary by sequence) run benchmarks/varlen_bench.py")
        try:
            shapes_by_variant[v.name] = [parse_shape(s, v) for s in args.shape] if args.shape else default_shapes(v)
        except ValueError as e:
            return err(str(e))
    gpu = gpu_check()
    if not gpu.ok:
        return err(gpu.message("`attngen bench`"))
    if args.repeats < MIN_REPEATS:
        return err(f"--repeats must be at least {MIN_REPEATS}")
    from attngen.runtime import kernel as runtime

    gemm = gemm_rate()
    print(f"{gemm['dtype']} GEMM {gemm['n']}^3: {gemm['tflops']:.0f} TFLOP/s ({gemm['ms']:.3f} ms)", file=sys.stderr)
    rows: list[Row] = []
    for v in variants:
        kernel = runtime.compile(v)
        for B, Lq, Lk in shapes_by_variant[v.name]:
            rows += bench_shape(v, kernel, B, Lq, Lk, gemm_tflops=gemm["tflops"], peers=args.peers,
                                repeats=args.repeats)
    print(format_table(rows))
    if args.json:
        payload = {"env": env_info(), "gemm": gemm, "rows": [asdict(r) for r in rows]}
        Path(args.json).write_text(json.dumps(payload, indent=1, default=str), encoding="utf-8")
        print(f"wrote {args.json}", file=sys.stderr)
    if args.plot:
        problem = plot(rows, args.plot)
        print(problem or f"wrote {args.plot}", file=sys.stderr)
    bad = [r for r in rows if r.agrees is False]
    return EXIT_FAIL if bad else EXIT_OK


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
