"""A/B of the wgmma softmax schedule (schedule.WgmmaSoftmax), beside cuDNN.

    python benchmarks/softmax_ab.py [--out PATH] [--lengths 1024,4096,16384] [--repeats 20] [--only CONFIG ...]
                                    [--schedules NAME ...] [--tiles BMxBNxWxS ...]

The sweep's cells (bf16, H16, B*L = 32768 tokens, dense and causal) with one kernel for each
schedule. At D64: the plan's default (plain), turns only, the FMA polynomial for 2 or 4 of a
thread's 16 column groups, with and without turns; dense also at 128 x 128 with two consumer
warpgroups (the auto tile is 192 x 128 with three, like causal). At D128
(FlashAttention-3's ping-pong case, two consumer warpgroups): plain and turns, on the main and the
short-loop kernel alike; `kslot` / `vslot` (the K or the V ring a slot deeper, where shared
memory allows: the short-loop kernel, L <= 2k), alone and chained. `chain` (work tiles chained: a tile's first S and softmax under the last
P.V of the one before) runs on every configuration; `cp.async` (the producer's copies by all its
threads instead of TMA from one) on D64, D128, GQA 32/8 and the documents; `--schedules` keeps only the named ones.
`--tiles` adds, beside the default, the configuration compiled at each named tile (a `tile`
statement: that one kernel at every length, where the default may launch the short-loop tile at
short lengths, `schedule.short_tile`), as schedule `tile:BMxBNxWxS`.
`d128_documents` is the suite's document row (16 random documents a row) at each length, with
FlexAttention beside it instead of cuDNN; `d64_preln_cross` the suite's pre-LN row at its own
shape (B32 Lq2048 Lk512), with torch.compile of the unfused block beside it. Every kernel of a cell times the same inputs in the same process,
interleaved by length; the plan's default is checked against cuDNN's output and every other
schedule against the default's output on the same inputs (`extra.vs_default`). Results are JSON
lines (`row`s as benchmarks/sweep.py writes them, with `extra.schedule`), then a table of TFLOP/s
and the ratio to cuDNN.
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

from attngen.lang import frontend  # noqa: E402
from attngen.plan.schedule import WgmmaLoads, WgmmaSoftmax  # noqa: E402
from attngen.tools import bench  # noqa: E402

TOKENS = 32768
# (label, .attn body)
CONFIGS = (
    ("d64_dense", "dtype bf16; head_dim 64; heads 16"),
    ("d64_causal", "dtype bf16; head_dim 64; heads 16; mask causal"),
    ("d64_dense_128", "dtype bf16; head_dim 64; heads 16; tile block_m 128 block_n 128 warps 8 stages 3"),
    ("d128_dense", "dtype bf16; head_dim 128; heads 16"),
    ("d128_causal", "dtype bf16; head_dim 128; heads 16; mask causal"),
    ("d128_gqa32_8_dense", "dtype bf16; head_dim 128; heads 32 kv 8"),
    ("d128_gqa32_8_causal", "dtype bf16; head_dim 128; heads 32 kv 8; mask causal"),
    # The suite's document row at every length: 16 random documents a row (suite._documents).
    ("d128_documents", "dtype bf16; head_dim 128; heads 16\n input doc: i32[B, Lk] sorted\n mask document(doc) && causal"),
    # The suite's pre-LN row, at its own shape only (SHAPES).
    ("d64_preln_cross", "dtype bf16; head_dim 64; heads 16; kind cross; layout bshd\n norm q layernorm(1e-5) scope token\n residual"),
)
# Configurations timed at one fixed (B, Lq, Lk) instead of the lengths: the suite's pre-LN shape.
SHAPES = {"d64_preln_cross": (32, 2048, 512)}
# (name, override; None: the plan's default)
SCHEDULES = (
    ("default", None),
    ("turns", WgmmaSoftmax(0, True)),
    ("poly2", WgmmaSoftmax(2, False)),
    ("poly2+turns", WgmmaSoftmax(2, True)),
    ("poly4+turns", WgmmaSoftmax(4, True)),
    # chained consumers copy with cp.async (the plan keeps TMA off them: `schedule.wgmma_tma_ok`)
    ("chain", WgmmaSoftmax(chain=True, loads=WgmmaLoads.CP_ASYNC)),
    # split rings of their own depths (the short-loop D128 kernel's 128 x 128 x 2 stages has room
    # for one more K or V tile; elsewhere the plan turns them off and they time the default)
    ("kslot", WgmmaSoftmax(k_slot=True)),
    ("vslot", WgmmaSoftmax(v_slot=True)),
    ("kslot+chain", WgmmaSoftmax(chain=True, k_slot=True, loads=WgmmaLoads.CP_ASYNC)),
    ("vslot+chain", WgmmaSoftmax(chain=True, v_slot=True, loads=WgmmaLoads.CP_ASYNC)),
    # the tiles copied with cp.async by all 128 producer threads instead of TMA from one (where the plan allows TMA, `schedule.wgmma_tma_ok`; elsewhere
    # both are the default); in results/h200_tma_ab.jsonl, `default` labels this cp.async
    # producer and `tma` the TMA one (now the default)
    ("cp.async", WgmmaSoftmax(loads=WgmmaLoads.CP_ASYNC)),
)
# The ring schedules apply to the short-loop D128 kernel (schedule.short_tile) only.
RING_SCHEDULES = ("kslot", "vslot", "kslot+chain", "vslot+chain")
_NOT_RINGS = tuple(n for n, _ in SCHEDULES if n not in RING_SCHEDULES)
# The schedules each configuration times (the rest: every one).
ONLY_SCHEDULES = {"d64_dense": _NOT_RINGS, "d64_causal": _NOT_RINGS, "d64_dense_128": ("default",), "d128_dense": ("default", "turns", "chain", "kslot", "vslot", "kslot+chain", "vslot+chain", "cp.async"),
                  "d128_causal": ("default", "turns", "chain", "kslot", "vslot", "kslot+chain", "vslot+chain", "cp.async"),
                  "d128_documents": ("default", "chain", "cp.async"),
                  "d128_gqa32_8_dense": ("default", "cp.async"), "d128_gqa32_8_causal": ("default", "cp.async"),
                  "d64_preln_cross": ("default", "chain")}


def _runtime_inputs(v, B: int, Lq: int, Lk: int) -> dict:
    """The configuration's runtime inputs (host arrays): the suite's documents, the workload's
    inputs otherwise (norm weights), or none."""
    if not v.runtime_inputs():
        return {}
    if "doc" in {d.name for d in v.runtime_inputs()}:
        from suite import _documents  # beside this script

        return _documents(v, B, Lq, Lk)
    return bench.host_runtime_inputs(v, B, Lq, Lk, 0)


def _peers(v, rt: dict) -> set[str]:
    """The peer beside a configuration: cuDNN, FlexAttention for the documents (SDPA cannot take
    them), torch.compile of norms + SDPA + residual for the pre-LN row (the suite's peer)."""
    if "doc" in rt:
        return {"flex"}
    if v.residual or v.norms:
        return {"torch-compile"}
    return {"sdpa-cudnn"}


def run(args: argparse.Namespace) -> int:
    from attngen.check import fuzz
    from attngen.runtime import kernel as runtime

    ok, why = fuzz.gpu_status()
    if not ok:
        print(f"softmax_ab: no GPU ({why}); nothing to time", file=sys.stderr)
        return 2
    lengths = [int(x) for x in args.lengths.split(",")]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    f = open(out, "w", encoding="utf-8")

    def emit(obj: dict) -> None:
        f.write(json.dumps(obj, default=str) + "\n")
        f.flush()

    emit({"kind": "env", **bench.env_info()})
    rows: list[bench.Row] = []
    t_start = time.monotonic()
    for label, body in CONFIGS:
        if args.only and label not in args.only:
            continue
        v = frontend.loads(f"attention {label} {{ {body} }}\n", f"<ab:{label}>").get()
        kernels = []
        for name, sm in SCHEDULES:
            if name not in ONLY_SCHEDULES.get(label, (name,)) or (args.schedules and name not in args.schedules + ["default"]):
                continue
            t0 = time.monotonic()
            k = runtime.compile(v, family="forward", softmax=sm)
            kernels.append((name, k))
            print(f"  {label} {name}: {k.plan.attention.softmax} built in {time.monotonic() - t0:.1f}s", file=sys.stderr, flush=True)
        for t in args.tiles or []:
            if label in SHAPES:
                continue
            bm, bn, wp, st = t.split("x")
            try:  # a tile this configuration cannot take must not stop the others
                vt = frontend.loads(f"attention {label} {{ {body}; tile block_m {bm} block_n {bn} warps {wp} stages {st} }}\n",
                                    f"<ab:{label}:{t}>").get()
                kernels.append((f"tile:{t}", runtime.compile(vt, family="forward")))
            except Exception as e:
                print(f"  {label} tile {t}: skipped ({type(e).__name__}: {str(e)[:200]})", file=sys.stderr, flush=True)
        shapes = [SHAPES[label]] if label in SHAPES else [(max(1, TOKENS // L), L, L) for L in lengths]
        for B, L, Lk in shapes:
            rt = _runtime_inputs(v, B, L, Lk)
            vs_default = _agreement(v, kernels, B, L, Lk, rt)
            for name, k in kernels:
                peer = name == "default" and not label.endswith("_128")
                try:
                    got = bench.bench_shape(v, k, B, L, Lk, workload=f"{label}_L{L}", peers=peer, repeats=args.repeats,
                                            check_reference=False, only_peers=_peers(v, rt), runtime_inputs=rt or None)
                except Exception as e:  # one broken cell must not hide the others
                    got = [bench.Row(workload=f"{label}_L{L}", variant=label, impl="attngen", dtype="bf16", B=B, H=16,
                                     Lq=L, Lk=Lk, D=v.head_dim, error=f"{type(e).__name__}: {str(e)[:300]}")]
                for r in got:
                    r.extra["config"] = label
                    r.extra["schedule"] = name if r.impl == "attngen" else r.impl
                    if r.impl == "attngen" and name in vs_default:
                        r.extra["vs_default"] = vs_default[name]
                        if not vs_default[name]["ok"]:
                            r.agrees = False
                    emit({"kind": "row", **asdict(r)})
                rows += got
            print(f"  {label} L{L}: {time.monotonic() - t_start:.1f}s", file=sys.stderr, flush=True)
    f.close()
    print(table(rows))
    bad = [r for r in rows if r.agrees is False or r.error]
    for r in bad:
        print(f"PROBLEM {r.extra.get('config')} L{r.Lq} {r.extra.get('schedule')}: {r.error or r.check}")
    print(f"\nsoftmax_ab: {len(rows)} rows, {len(bad)} problems, {time.monotonic() - t_start:.0f}s; {out}")
    return 1 if bad else 0


def _agreement(v, kernels: list, B: int, L: int, Lk: int, rt: dict) -> dict[str, dict]:
    """Each non-default schedule's output against the default's on the same inputs: the
    tolerance policy's verdict and whether they are bit-identical (turns change no arithmetic)."""
    from attngen.check import fuzz, tolerance
    from attngen.ir import abi
    from attngen.tools import bench_rows

    ins = bench.device_qkv(v, B, L, Lk, 99)
    dev_rt = {n: fuzz.to_device(a) for n, a in rt.items()}
    outs = {}
    for name, k in kernels:
        o = fuzz.empty_device(abi.o_shape(v, B, L), v.dtype)
        k(ins["q"], ins["k"], ins["v"], out=o, **dev_rt)
        fuzz.synchronize()
        outs[name] = bench_rows._to_np(o, v.dtype)
    ref = outs.get("default")
    if ref is None:
        return {}
    res = {}
    for name, o in outs.items():
        if name == "default":
            continue
        rep = tolerance.check(o, ref, v.dtype, f"{v.name} {name} vs default")
        res[name] = {"ok": bool(rep.ok), "bit_identical": o.tobytes() == ref.tobytes(), "summary": rep.summary()[:200]}
    return res


def table(rows: list[bench.Row]) -> str:
    """TFLOP/s (visible work) per configuration, length and schedule, and the ratio to cuDNN."""
    cells: dict[tuple[str, int], dict[str, float]] = {}
    for r in rows:
        if r.ms and r.tflops_visible is not None:
            cells.setdefault((r.extra["config"], r.Lq), {})[r.extra["schedule"]] = r.tflops_visible
    tiles = sorted({n for c in cells.values() for n in c if n.startswith("tile:")})
    names = [n for n, _ in SCHEDULES if any(n in c for c in cells.values())] + tiles + ["sdpa-cudnn", "flex", "torch-compile"]
    lines = [f"{'config':<16} {'L':>6} " + " ".join(f"{n:>12}" for n in names)]
    for (cfg, L), c in sorted(cells.items()):
        cud = c.get("sdpa-cudnn")
        cols = []
        for n in names:
            if n not in c:
                cols.append(f"{'-':>12}")
            elif cud and n not in ("sdpa-cudnn", "flex", "torch-compile"):
                cols.append(f"{c[n]:6.0f} {c[n] / cud:4.2f}x")
            else:
                cols.append(f"{c[n]:12.0f}")
        lines.append(f"{cfg:<16} {L:>6} " + " ".join(cols))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    default_out = Path(os.environ["OUT"]) / "softmax_ab.jsonl" if os.environ.get("OUT") else ROOT / "benchmarks" / "results" / "h200_softmax_ab.jsonl"
    p.add_argument("--out", default=str(default_out))
    p.add_argument("--lengths", default="1024,4096,16384")
    p.add_argument("--only", nargs="*", default=None, help="configurations: " + ", ".join(c[0] for c in CONFIGS))
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--schedules", nargs="*", default=None,
                   help="time only these schedules (and the default): " + ", ".join(n for n, _ in SCHEDULES[1:]))
    p.add_argument("--tiles", nargs="*", default=None, help="also time each configuration at these tiles (BMxBNxWxS)")
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
