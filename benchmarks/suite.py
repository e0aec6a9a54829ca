"""The canonical benchmark suite: the workloads behind the performance bars of issues 3 and 4.

    python benchmarks/suite.py [--out PATH] [--only NAME ...] [--no-peers] [--repeats N]

Each workload is a spec (as `.attn` text below) at one shape; each row times our kernel and the
torch peers that compute the same thing (SDPA flash / cuDNN where expressible, torch eager and
torch.compile pipelines for fused norms, FlexAttention compiled from the IR), after checking that
their outputs agree with ours. Results go to PATH as JSON lines (an `env` line, a `gemm` line, one
line per row, one line per bar), default `$OUT/bench.jsonl` when $OUT is set, else
`benchmarks/results/h200.jsonl`; a short table and the bars (met / missed, by how much) print last.
Runs in well under 4 minutes on one H200.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # runnable from a checkout without installing
    sys.path.insert(0, str(ROOT))

from attngen.tools import bench  # noqa: E402
from attngen.lang import frontend  # noqa: E402
from attngen.ir.nodes import Variant  # noqa: E402

# --------------------------------------------------------------------------------------------
# Specs

SPECS = {
    "dense_d128": """
attention dense_d128 { dtype bf16; head_dim 128; heads 16 }
""",
    "causal_d128": """
attention causal_d128 { dtype bf16; head_dim 128; heads 16; mask causal }
""",
    "dense_d64": """
attention dense_d64 { dtype bf16; head_dim 64; heads 16 }
""",
    "causal_d64": """
attention causal_d64 { dtype bf16; head_dim 64; heads 16; mask causal }
""",
    # Seed 000: a padded fp32 batch, B4 H8 L128 D64.
    "seed_fp32_padding": """
attention seed_fp32_padding { dtype fp32; head_dim 64; heads 8; mask padding }
""",
    # Each token sees itself and the 1023 before it: 1024 keys, as FlexAttention's sliding window.
    "sliding_window_1024": """
attention sliding_window_1024 { dtype bf16; head_dim 128; heads 16; mask causal && window(1023, 0) }
""",
    "document_causal_16": """
attention document_causal_16 {
  dtype bf16; head_dim 128; heads 16
  input doc: i32[B, Lk] sorted
  mask document(doc) && causal
}
""",
    "causal_softcap_30": """
attention causal_softcap_30 { dtype bf16; head_dim 128; heads 16; mask causal; score softcap(30.0) }
""",
    # Seed 003: pre-LayerNorm (over the whole H*D row) cross attention with the residual, one kernel.
    "preln_cross_residual": """
attention preln_cross_residual {
  dtype bf16; head_dim 64; heads 16; kind cross; layout bshd
  norm q layernorm(1e-5) scope token
  residual
}
""",
    # QK-norm (head-scope RMSNorm on q and k); compared with causal_d128, the same kernel without it.
    "qk_norm_causal_d128": """
attention qk_norm_causal_d128 {
  dtype bf16; head_dim 128; heads 16; mask causal
  norm q rmsnorm(1e-6) scope head
  norm k rmsnorm(1e-6) scope head
}
""",
}


# --------------------------------------------------------------------------------------------
# Workloads


@dataclass
class Workload:
    name: str
    spec: str
    B: int
    Lq: int
    Lk: int
    inputs: Callable[[Variant, int, int, int], dict[str, np.ndarray]] | None = None
    peers: Callable[[Variant, int, int, int, Mapping[str, np.ndarray]], list[bench.Peer]] | None = None
    repeats: int = 30


def _documents(v: Variant, B: int, Lq: int, Lk: int) -> dict[str, np.ndarray]:
    """16 documents per row, boundaries drawn at random (as the FlexAttention anchor)."""
    rng = np.random.default_rng(16)
    ids = np.zeros((B, Lk), dtype=np.int32)
    for b in range(B):
        for bd in np.sort(rng.choice(np.arange(1, Lk), size=15, replace=False)):
            ids[b, bd:] += 1
    return {"doc": ids}


SEED_LENS = np.array([128, 100, 64, 17], dtype=np.int32)


def _seed_lengths(v: Variant, B: int, Lq: int, Lk: int) -> dict[str, np.ndarray]:
    return {"q_lens": SEED_LENS[:B].copy(), "kv_lens": SEED_LENS[:B].copy()}


def _seed_peers(v: Variant, B: int, Lq: int, Lk: int, host: Mapping[str, np.ndarray]) -> list[bench.Peer]:
    """SDPA (memory-efficient and math backends) with a boolean padding mask, as torch users
    write it; rows past q_lens are zeroed so the comparison sees what our kernel defines."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    qlens = torch.as_tensor(host["q_lens"], device="cuda").long()
    kvlens = torch.as_tensor(host["kv_lens"], device="cuda").long()
    key_ok = (torch.arange(Lk, device="cuda")[None, :] < kvlens[:, None])[:, None, None, :]
    row_ok = (torch.arange(Lq, device="cuda")[None, :] < qlens[:, None])[:, None, :, None]
    def zero_rows(o):
        # Our kernel defines rows past q_lens as 0; SDPA with a key mask computes them.
        return torch.where(row_ok, o, torch.zeros((), dtype=o.dtype, device=o.device))

    out = []
    for name, be in (("sdpa-efficient", SDPBackend.EFFICIENT_ATTENTION), ("sdpa-math", SDPBackend.MATH)):
        def make(ins, be=be):
            q, k, vv = ins["q"], ins["k"], ins["v"]

            def run():
                with sdpa_kernel(be):
                    return F.scaled_dot_product_attention(q, k, vv, attn_mask=key_ok)

            return run

        out.append(bench.Peer(name, make, "bool key-padding mask", fix=zero_rows))
    return out


WORKLOADS = [
    Workload("dense_d128", "dense_d128", 2, 16384, 16384),
    Workload("causal_d128", "causal_d128", 2, 16384, 16384),
    Workload("dense_d64", "dense_d64", 8, 4096, 4096),
    Workload("causal_d64", "causal_d64", 8, 4096, 4096),
    Workload("seed_fp32_padding", "seed_fp32_padding", 4, 128, 128, _seed_lengths, _seed_peers, repeats=200),
    Workload("sliding_window_1024", "sliding_window_1024", 2, 16384, 16384),
    Workload("document_causal_16", "document_causal_16", 2, 16384, 16384, _documents),
    Workload("causal_softcap_30", "causal_softcap_30", 2, 16384, 16384),
    Workload("preln_cross_residual", "preln_cross_residual", 32, 2048, 512, repeats=50),
    Workload("qk_norm_causal_d128", "qk_norm_causal_d128", 2, 16384, 16384),
]


# --------------------------------------------------------------------------------------------
# Bars (issues 3 and 4)


@dataclass
class Bar:
    name: str
    target: str
    value: float | None
    met: bool | None
    detail: str = ""
    extra: dict = field(default_factory=dict)


def _ours(rows: list[bench.Row], workload: str) -> bench.Row | None:
    return next((r for r in rows if r.workload == workload and r.impl == "attngen" and r.ms), None)


def _peer(rows: list[bench.Row], workload: str, impl: str) -> bench.Row | None:
    return next((r for r in rows if r.workload == workload and r.impl == impl and r.ms), None)


def bars(rows: list[bench.Row]) -> list[Bar]:
    """Each performance bar, met or missed and by how much (None where the row is missing)."""
    out: list[Bar] = []

    def at_least(name: str, wl: str, target: float) -> None:
        r = _ours(rows, wl)
        val = r.tflops_visible if r else None
        out.append(Bar(name, f">= {target:g} TFLOP/s", val, None if val is None else val >= target,
                       "" if val is None else f"{val:.0f} TFLOP/s ({100 * val / target:.0f}% of the bar)"))

    at_least("bf16 D128 B2 H16 L16384 dense", "dense_d128", 340)
    at_least("bf16 D128 B2 H16 L16384 causal", "causal_d128", 340)
    at_least("bf16 D64 B8 H16 L4096 dense", "dense_d64", 300)
    at_least("bf16 D64 B8 H16 L4096 causal", "causal_d64", 300)
    r = _ours(rows, "seed_fp32_padding")
    us = r.ms * 1000 if r else None
    out.append(Bar("seed fp32 B4 H8 L128 D64 padding", "<= 15 us", us, None if us is None else us <= 15.0,
                   "" if us is None else f"{us:.1f} us"))
    for wl, label in (("sliding_window_1024", "sliding window 1024"), ("document_causal_16", "document-causal 16 docs"),
                      ("causal_softcap_30", "causal + softcap 30")):
        r, f = _ours(rows, wl), _peer(rows, wl, "flex")
        if r and f:
            ratio = f.ms / r.ms
            out.append(Bar(f"{label} vs FlexAttention", ">= 1.0x flex (aim 1.5x)", ratio, ratio >= 1.0,
                           f"ours {r.tflops_visible:.0f} vs flex {f.tflops_visible:.0f} TFLOP/s: {ratio:.2f}x"))
        else:
            out.append(Bar(f"{label} vs FlexAttention", ">= 1.0x flex", None, None, "row missing"))
    r = _ours(rows, "preln_cross_residual")
    out.append(Bar("pre-LN cross attention + residual B32 H16 Lq2048 Lk512 D64", "<= 0.40 ms", r.ms if r else None,
                   None if r is None else r.ms <= 0.40,
                   "" if r is None else f"{r.ms:.3f} ms" + "".join(
                       f"; {p.impl} {p.ms:.3f} ms" for p in rows if p.workload == "preln_cross_residual" and p.impl != "attngen" and p.ms)))
    a, b = _ours(rows, "qk_norm_causal_d128"), _ours(rows, "causal_d128")
    if a and b:
        over = a.ms / b.ms - 1
        out.append(Bar("QK-norm overhead (vs the same causal kernel)", "<= 10%", 100 * over, over <= 0.10,
                       f"{a.ms:.3f} ms vs {b.ms:.3f} ms: {100 * over:+.1f}%"))
    else:
        out.append(Bar("QK-norm overhead", "<= 10%", None, None, "row missing"))
    return out


# --------------------------------------------------------------------------------------------
# Main


def default_out() -> Path:
    if os.environ.get("OUT"):
        return Path(os.environ["OUT"]) / "bench.jsonl"
    return ROOT / "benchmarks" / "results" / "h200.jsonl"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=None, help="JSON lines output (default $OUT/bench.jsonl or benchmarks/results/h200.jsonl)")
    p.add_argument("--only", nargs="*", default=None, help="run only these workloads: " + ", ".join(w.name for w in WORKLOADS))
    p.add_argument("--no-peers", action="store_true", help="time only our kernels")
    p.add_argument("--repeats", type=int, default=None, help="timed launches per implementation (default per workload)")
    args = p.parse_args(argv)

    from attngen.check import fuzz

    ok, why = fuzz.gpu_status()
    if not ok:
        print(f"suite: no GPU ({why}); nothing to time", file=sys.stderr)
        return 2
    from attngen.runtime import kernel as runtime

    wls = [w for w in WORKLOADS if not args.only or w.name in args.only]
    unknown = set(args.only or []) - {w.name for w in WORKLOADS}
    if unknown:
        print(f"suite: unknown workloads: {', '.join(sorted(unknown))}", file=sys.stderr)
        return 2
    out_path = Path(args.out) if args.out else default_out()
    out_path.parent.mkdir(parents=True, exist_ok=True)
    t_start = time.monotonic()
    log = open(out_path, "w", encoding="utf-8")

    def emit(obj: dict) -> None:
        log.write(json.dumps(obj, default=str) + "\n")
        log.flush()

    emit({"kind": "env", **bench.env_info()})
    gemm = bench.gemm_rate()
    emit({"kind": "gemm", **gemm})
    print(f"{gemm['dtype']} GEMM: {gemm['tflops']:.0f} TFLOP/s", file=sys.stderr, flush=True)
    rows: list[bench.Row] = []
    for w in wls:
        t0 = time.monotonic()
        try:
            v = frontend.loads(SPECS[w.spec], f"<suite:{w.spec}>").get()
            kernel = runtime.compile(v)
            t_compile = time.monotonic() - t0
            host = w.inputs(v, w.B, w.Lq, w.Lk) if w.inputs else None
            extra = w.peers(v, w.B, w.Lq, w.Lk, host or {}) if (w.peers and not args.no_peers) else []
            got = bench.bench_shape(v, kernel, w.B, w.Lq, w.Lk, workload=w.name, gemm_tflops=gemm["tflops"],
                                    peers=not args.no_peers, repeats=args.repeats or w.repeats, runtime_inputs=host,
                                    extra_peers=extra)
            got[0].extra["compile_s"] = t_compile
        except Exception as e:  # one broken workload must not hide the others
            import traceback

            traceback.print_exc()
            got = [bench.Row(workload=w.name, variant=w.spec, impl="attngen", dtype="?", B=w.B, H=0, Lq=w.Lq, Lk=w.Lk,
                             D=0, error=f"{type(e).__name__}: {str(e)[:300]}")]
        for r in got:
            emit({"kind": "row", **asdict(r)})
        rows += got
        print(f"  {w.name}: {time.monotonic() - t0:.1f}s", file=sys.stderr, flush=True)
    bs = bars(rows)
    for b in bs:
        emit({"kind": "bar", **asdict(b)})
    log.close()
    print(bench.format_table(rows))
    print()
    print(f"{'bar':<58} {'target':<24} {'result':<10} detail")
    for b in bs:
        res = {True: "met", False: "MISSED", None: "n/a"}[b.met]
        print(f"{b.name[:58]:<58} {b.target:<24} {res:<10} {b.detail}")
    disagree = [r for r in rows if r.agrees is False]
    print(f"\nsuite: {len(rows)} rows, {len(disagree)} disagreeing outputs, "
          f"{time.monotonic() - t_start:.0f}s; results in {out_path}")
    return 1 if disagree else 0


if __name__ == "__main__":
    sys.exit(main())
