"""CPU ring-attention check, run as a script by test_ring_cpu.py: TOTAL processes on gloo; for each
group of ranks given, its members run `attngen.distributed.ring_attention` over that subgroup with
the NumPy reference as the local attention, and compare their rows with the reference on the whole
sequence. Subgroups (e.g. ranks 6,7 or 1,2,3) also check that peers are named by global rank.

usage: python _ring_worker.py TOTAL PORT OUTDIR GROUPS      (GROUPS like "6,7;1,2,3;0,1,2,3")
Each rank writes OUTDIR/rank<r>.json: a list of {world, case, ok, err, detail}.
"""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

SPEC = """
attention {name} {{
  dtype {dtype}; head_dim 32; heads 4 kv 2; layout {layout}
  {extra}
  mask {mask}
  {score}
  output lse
}}
"""

# name, dtype, layout, mask, score, extra declarations, L, scheme, seq_len given
CASES = [
    ("causal", "fp32", "bshd", "causal", "", "", 37, "zigzag", True),
    ("causal_contig", "fp32", "bhsd", "causal", "", "", 29, "contiguous", False),
    ("window", "fp32", "bshd", "causal && window(5, 0)", "", "", 41, "zigzag", True),
    ("window_2sided", "fp32", "bhsd", "window(3, 4)", "", "", 23, "zigzag", True),
    ("document", "fp32", "bshd", "document(doc_ids) && causal", "", "input doc_ids: i32[B, Lk] sorted", 37, "zigzag", True),
    ("softcap", "bf16", "bshd", "causal", "score softcap(5.0)", "", 31, "zigzag", True),
    ("alibi_prefix", "fp32", "bshd", "causal || prefix(6)", "score alibi", "", 26, "zigzag", True),
    ("padding", "fp32", "bshd", "padding && causal", "", "", 19, "zigzag", True),
    ("full", "fp32", "bshd", "true", "", "", 13, "zigzag", True),
]


def _tol(dtype: str) -> float:
    return 2e-5 if dtype == "fp32" else 2e-2


def run_case(case, rank: int, world: int, group=None):
    import torch

    import attngen
    from attngen.runtime import distributed as D
    from attngen.check import reference
    from attngen.check.workload import make_inputs

    name, dtype, layout, mask, score, extra, L, scheme, given = case
    var = attngen.loads(SPEC.format(name=name, dtype=dtype, layout=layout, mask=mask, score=score, extra=extra)).get()
    x = make_inputs(var, 2, L, L, np.random.default_rng(1234 + L))
    ins = {d.name: x[d.name] for d in var.runtime_inputs()}
    o_ref, lse_ref = reference.attention(var, x["q"], x["k"], x["v"], ins)
    seq_dim = 2 if layout == "bhsd" else 1

    def t(a):
        a = np.asarray(a)
        if a.dtype.name == "bfloat16":
            return torch.from_numpy(a.astype(np.float32)).to(torch.bfloat16)
        return torch.from_numpy(np.ascontiguousarray(a))

    q, k, v = (D.shard(t(x[n]), world, rank, seq_dim, scheme) for n in ("q", "k", "v"))
    o, lse = D.ring_attention(D.ReferenceKernel(var), q, k, v, group, seq_len=L if given else None, scheme=scheme,
                              **{n: t(a) for n, a in ins.items()})
    want_o = D.shard(torch.from_numpy(np.asarray(o_ref, dtype=np.float32)), world, rank, seq_dim, scheme)
    want_lse = D.shard(torch.from_numpy(lse_ref), world, rank, 2, scheme)
    if o.shape != want_o.shape or lse.shape != want_lse.shape:
        return False, float("inf"), f"shapes {tuple(o.shape)} {tuple(lse.shape)} vs {tuple(want_o.shape)} {tuple(want_lse.shape)}"
    if o.dtype != (torch.float32 if dtype == "fp32" else torch.bfloat16):
        return False, float("inf"), f"dtype {o.dtype}"
    err = float((o.float() - want_o).abs().max()) if o.numel() else 0.0
    same_inf = bool(torch.equal(torch.isneginf(lse), torch.isneginf(want_lse)))
    fin = ~torch.isneginf(want_lse)
    lerr = float((lse[fin] - want_lse[fin]).abs().max()) if fin.any() else 0.0
    ok = err <= _tol(dtype) and lerr <= 1e-4 and same_inf and not torch.isnan(o.float()).any()
    return ok, max(err, lerr), f"o err {err:.3g}, lse err {lerr:.3g}, -inf rows agree {same_inf}"


def worker(rank: int, total: int, port: int, outdir: str, groups: list[list[int]]) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=total)
    out = []
    try:
        for members in groups:
            g = dist.new_group(members) if len(members) < total else None  # every rank creates every group
            if rank in members:
                for case in CASES:
                    try:
                        ok, err, detail = run_case(case, members.index(rank), len(members), g)
                    except Exception:
                        ok, err, detail = False, float("inf"), traceback.format_exc()[-2000:]
                    out.append({"world": len(members), "case": case[0], "ok": bool(ok), "err": err, "detail": detail})
            dist.barrier()  # one group at a time
    finally:
        Path(outdir, f"rank{rank}.json").write_text(json.dumps(out))
        dist.destroy_process_group()


def main() -> None:
    import torch.multiprocessing as mp

    total, port, outdir = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    groups = [[int(x) for x in part.split(",")] for part in sys.argv[4].split(";")]
    mp.spawn(worker, args=(total, port, outdir, groups), nprocs=total, join=True)


if __name__ == "__main__":
    main()
