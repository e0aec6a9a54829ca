"""CPU ring-attention check, run as a script by test_ring_cpu.py: TOTAL processes on gloo; for each
group of ranks given, its members run `attngen.distributed.ring_attention` over that subgroup with
the NumPy reference as the local attention, and compare their rows with the reference on the whole
sequence (CASES), then differentiate it with autograd and compare their shards of dq, dk and dv
with the float64 reference backward on the whole sequence (BWD_CASES); the world-2 ring also runs with the CPU backend's kernel as its local attention when
a host compiler exists. Subgroups (e.g. ranks 6,7
or 1,2,3) also check that peers are named by global rank.

usage: python _ring_worker.py TOTAL PORT OUTDIR GROUPS      (GROUPS like "6,7;1,2,3;0,1,2,3")
Each rank writes OUTDIR/rank<r>.json: a list of {world, case, pass ("fwd" or "bwd"), ok, err, detail}.
"""

from __future__ import annotations

import json
import os
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


# The backward's cases, all fp32 and GQA (heads 4 kv 2): dense, causal with both shardings, a
# causal window with softcap (a score whose derivative is not 1), documents with ALiBi.
BWD_CASES = [
    ("dense", "fp32", "bshd", "true", "", "", 23, "zigzag", True),
    ("causal_zigzag", "fp32", "bshd", "causal", "", "", 37, "zigzag", True),
    ("causal_contig", "fp32", "bhsd", "causal", "", "", 29, "contiguous", False),
    ("window_softcap", "fp32", "bshd", "causal && window(6, 0)", "score softcap(4.0)", "", 31, "zigzag", True),
    ("document_alibi", "fp32", "bshd", "document(doc_ids) && causal", "score alibi", "input doc_ids: i32[B, Lk] sorted", 33,
     "zigzag", True),
]

# Gradients are fp32 on the ring and float64 in the reference. The ring's backward runs each block
# in float64 from fp32 inputs: the saved O and LSE are fp32 (rounded once, relative 6e-8, and the
# LSE error enters P as an absolute error of |LSE| * 6e-8), and the blocks' shares are rounded to
# fp32 and summed in fp32 over at most 2W blocks. All of that is a few fp32 ulps of the gradients'
# magnitude (the largest error seen is about 6e-7 relative, 10 ulps): the bound below is 4e-6
# relative to max(1, the largest reference gradient).
BWD_REL_TOL = 4e-6


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


def run_bwd_case(case, rank: int, world: int, group=None):
    """The ring's gradients (autograd through `ring_attention`; a gradient at the output, and for
    dense and plain causal masks one at the LSE too) against a float64 backward on the whole sequence."""
    import torch

    import attngen
    from attngen.check import reference_bwd
    from attngen.check.workload import make_inputs
    from attngen.runtime import distributed as D

    name, dtype, layout, mask, score, extra, L, scheme, given = case
    var = attngen.loads(SPEC.format(name=name, dtype=dtype, layout=layout, mask=mask, score=score, extra=extra)).get()
    x = make_inputs(var, 2, L, L, np.random.default_rng(4321 + L))
    ins = {d.name: x[d.name] for d in var.runtime_inputs()}
    seq_dim = 2 if layout == "bhsd" else 1
    rng = np.random.default_rng(99 + L)
    dO = rng.standard_normal(np.shape(x["q"])[:-1] + (32,)).astype(np.float32)
    # Dense and plain causal masks also put a gradient on the LSE, checked against torch autograd
    # of the same attention in float64 (the NumPy reference backward takes none at the LSE).
    dl = rng.standard_normal((2, 4, L)).astype(np.float32) if mask in ("true", "causal") and not score else None
    if dl is None:
        want = reference_bwd.attention_backward(var, x["q"], x["k"], x["v"], ins, dO)
    else:
        want = _torch_backward(x["q"], x["k"], x["v"], dO, dl, layout, mask == "causal", var.effective_scale)

    def t(a):
        return torch.from_numpy(np.ascontiguousarray(a))

    q, k, v = (D.shard(t(x[n]), world, rank, seq_dim, scheme).requires_grad_() for n in ("q", "k", "v"))
    o, lse = D.ring_attention(D.ReferenceKernel(var), q, k, v, group, seq_len=L if given else None, scheme=scheme,
                              **{n: t(a) for n, a in ins.items()})
    loss = (o * D.shard(t(dO), world, rank, seq_dim, scheme)).sum()
    if dl is not None:
        loss = loss + (lse * D.shard(t(dl), world, rank, 2, scheme)).sum()
    loss.backward()
    errs, detail = [], []
    for n, got in (("dq", q.grad), ("dk", k.grad), ("dv", v.grad)):
        ref = D.shard(torch.from_numpy(want[n]), world, rank, seq_dim, scheme)
        if got is None or got.shape != ref.shape or got.dtype != torch.float32:
            return False, float("inf"), f"{n}: {None if got is None else (tuple(got.shape), got.dtype)} vs {tuple(ref.shape)}"
        bound = BWD_REL_TOL * max(1.0, float(torch.from_numpy(want[n]).abs().max()))
        e = float((got.double() - ref).abs().max()) if got.numel() else 0.0
        errs.append(e / bound)
        detail.append(f"{n} err {e:.3g} (bound {bound:.3g})")
    return max(errs) <= 1.0, max(errs), ", ".join(detail)


def _torch_backward(q, k, v, dO, dl, layout: str, causal: bool, scale: float) -> dict:
    """Gradients of sum(O * dO) + sum(LSE * dl) by torch autograd in float64, whole sequence, GQA."""
    import torch

    def bhsd(a):
        a = torch.from_numpy(np.asarray(a, dtype=np.float64))
        return a if layout == "bhsd" else a.transpose(1, 2)

    q4, k4, v4 = (bhsd(a).requires_grad_() for a in (q, k, v))
    g = q4.shape[1] // k4.shape[1]
    s = torch.einsum("bhqd,bhkd->bhqk", q4, k4.repeat_interleave(g, 1)) * scale
    if causal:
        L = s.shape[-1]
        s = s.masked_fill(torch.ones(L, L, dtype=torch.bool).triu(1), float("-inf"))
    lse = torch.logsumexp(s, -1)
    o = torch.einsum("bhqk,bhkd->bhqd", torch.softmax(s, -1), v4.repeat_interleave(g, 1))
    ((o * bhsd(dO)).sum() + (lse * torch.from_numpy(dl.astype(np.float64))).sum()).backward()
    out = {}
    for n, t in (("dq", q4), ("dk", k4), ("dv", v4)):
        gr = t.grad if layout == "bhsd" else t.grad.transpose(1, 2)
        out[n] = gr.contiguous().numpy()
    return out


# The CPU backend as the ring's forward kernel (compiled without `output lse`: the ring recompiles
# it with the LSE), run by the world-2 ring when a host compiler exists; the parent builds both
# kernels first so that the ranks read them from the cache.
CPU_SPEC = "attention ring_cpu_backend { dtype fp32; head_dim 32; heads 4 kv 2; layout bshd; mask causal && window(9, 0) }"


def build_cpu_kernels() -> bool:
    """Build the CPU backend's kernels of CPU_SPEC (with and without the LSE); False without a compiler."""
    import dataclasses

    import attngen
    from attngen import backend
    from attngen.cpu.compile import CompilerNotFound, find_compiler

    try:
        find_compiler()
    except CompilerNotFound:
        return False
    kern = attngen.compile(CPU_SPEC, device="cpu")
    backend.compile(dataclasses.replace(kern.variant, lse=True), device="cpu")
    return True


def run_cpu_backend_case(rank: int, world: int, group=None):
    """Forward and gradients of a ring whose local kernel is the CPU backend's, against the reference."""
    import torch

    import attngen
    from attngen.check import reference, reference_bwd
    from attngen.runtime import distributed as D

    kern = attngen.compile(CPU_SPEC, device="cpu")
    L = 35
    g = torch.Generator().manual_seed(L)
    q, k, v, dO = (torch.randn(2, L, h, 32, generator=g) for h in (4, 2, 2, 4))
    want_o, _ = reference.attention(kern.variant, q.numpy(), k.numpy(), v.numpy())
    want = reference_bwd.attention_backward(kern.variant, q.numpy(), k.numpy(), v.numpy(), {}, dO.numpy())
    shards = [D.shard(t, world, rank, 1).requires_grad_() for t in (q, k, v)]
    o, _ = D.ring_attention(kern, *shards, group, seq_len=L)
    o.backward(D.shard(dO, world, rank, 1))
    errs = {"o": float((o.detach() - D.shard(torch.from_numpy(np.asarray(want_o, dtype=np.float32)), world, rank, 1)).abs().max())}
    for n, t in zip(("dq", "dk", "dv"), shards):
        errs[n] = float((t.grad.double() - D.shard(torch.from_numpy(want[n]), world, rank, 1)).abs().max())
    # The CPU kernel's forward is fp32 (its own summation order): 2e-5 as for the forward cases.
    return max(errs.values()) <= 2e-5, max(errs.values()), ", ".join(f"{n} err {e:.3g}" for n, e in errs.items())


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
                    out.append({"world": len(members), "case": case[0], "pass": "fwd", "ok": bool(ok), "err": err, "detail": detail})
                for case in BWD_CASES:
                    try:
                        ok, err, detail = run_bwd_case(case, members.index(rank), len(members), g)
                    except Exception:
                        ok, err, detail = False, float("inf"), traceback.format_exc()[-2000:]
                    out.append({"world": len(members), "case": case[0], "pass": "bwd", "ok": bool(ok), "err": err, "detail": detail})
                if len(members) == 2 and os.environ.get("RING_CPU_BACKEND") == "1":
                    try:
                        ok, err, detail = run_cpu_backend_case(members.index(rank), len(members), g)
                    except Exception:
                        ok, err, detail = False, float("inf"), traceback.format_exc()[-2000:]
                    out.append({"world": 2, "case": "cpu_backend", "pass": "cpu_backend", "ok": bool(ok), "err": err, "detail": detail})
            dist.barrier()  # one group at a time
    finally:
        Path(outdir, f"rank{rank}.json").write_text(json.dumps(out))
        dist.destroy_process_group()


def main() -> None:
    import torch.multiprocessing as mp

    total, port, outdir = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    groups = [[int(x) for x in part.split(",")] for part in sys.argv[4].split(";")]
    os.environ["RING_CPU_BACKEND"] = "1" if build_cpu_kernels() else "0"  # the spawned ranks inherit it
    mp.spawn(worker, args=(total, port, outdir, groups), nprocs=total, join=True)


if __name__ == "__main__":
    main()
