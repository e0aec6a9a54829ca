"""`attngen bench`'s rows: the work a variant does at a shape (dense flops, the visible fraction
of the mask on these inputs), inputs on the device (never zeros), and one row set per shape: ours
timed beside the peers, each peer's output checked against ours first."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from attngen.ir import abi
from attngen.check import tolerance
from attngen.ir.nodes import DType, IndexVar, SizeSym, Variant
from attngen.tools.bench_peers import Peer, mask_is_true, peers_for
from attngen.tools.bench_timing import rotation_sets, time_launches


def dense_flops(v: Variant, B: int, Lq: int, Lk: int) -> float:
    """Flops of Q·Kᵀ and P·V as if every score were visible: 2·B·H·Lq·Lk·(D + Dv)."""
    return 2.0 * B * v.heads * Lq * Lk * (v.head_dim + v.value_head_dim)


def visible_fraction(v: Variant, B: int, Lq: int, Lk: int, inputs: Mapping[str, Any]) -> float:
    """The fraction of (b, h, q, kv) the mask keeps, evaluated exactly on these inputs: on the GPU
    through the Flex mask_mod when torch has CUDA, else with the NumPy reference in row chunks.
    Axes the mask does not read (b, h) are evaluated once."""
    if mask_is_true(v):
        return 1.0
    from attngen.check import flex
    from attngen.ir.nodes import Index, walk

    uses = {n.var for n in walk(v.mask) if isinstance(n, Index)}
    bs = list(range(B)) if IndexVar.B in uses else [0]
    nh = v.heads if IndexVar.H in uses else 1
    try:
        import torch

        if not torch.cuda.is_available():
            raise ImportError
        tens = {n: flex._as_torch(a, "cuda") for n, a in inputs.items() if n not in ("q", "k", "v")}
        mask_mod, _ = flex.to_flex(v, inputs=tens, B=B, Lq=Lq, Lk=Lk, device="cuda")
        rows = max(1, (16 << 20) // max(1, nh * Lk))
        kv = torch.arange(Lk, device="cuda")[None, None, :]
        hh = torch.arange(nh, device="cuda")[:, None, None]
        count = 0
        for b in bs:
            bt = torch.tensor(b, device="cuda")
            for q0 in range(0, Lq, rows):
                qq = torch.arange(q0, min(Lq, q0 + rows), device="cuda")[None, :, None]
                m = mask_mod(bt, hh, qq, kv)
                count += int(torch.broadcast_to(m, (nh, qq.shape[1], Lk)).sum().item())
        return count / (len(bs) * nh * Lq * Lk)
    except ImportError:
        pass
    from attngen.check import reference
    from attngen.ir.abi import Sizes

    sizes = Sizes(B, Lq, Lk)
    tensors = reference.prepare_tensors(v, {n: np.asarray(a) if not hasattr(a, "get") else a.get()
                                            for n, a in inputs.items() if n not in ("q", "k", "v")})
    env_sizes = {s: abi.size_value(v, s, sizes) for s in SizeSym}
    rows = max(1, (16 << 20) // max(1, nh * Lk))
    count = 0
    for b in bs:
        for q0 in range(0, Lq, rows):
            q1 = min(Lq, q0 + rows)
            env = reference.Env({IndexVar.B: b, IndexVar.H: np.arange(nh)[:, None, None],
                                 IndexVar.Q: np.arange(q0, q1)[None, :, None], IndexVar.KV: np.arange(Lk)[None, None, :]},
                                env_sizes, tensors)
            count += int(np.count_nonzero(np.broadcast_to(reference.evaluate(v.mask, env), (nh, q1 - q0, Lk))))
    return count / (len(bs) * nh * Lq * Lk)


def device_qkv(v: Variant, B: int, Lq: int, Lk: int, seed: int) -> dict[str, Any]:
    """Random normal q, k, v on the device in the variant's dtype and layout (never zeros)."""
    try:
        import torch

        if torch.cuda.is_available():
            g = torch.Generator(device="cuda").manual_seed(seed)
            from attngen.check.flex import torch_dtype

            dt = torch_dtype(v.dtype)
            mk = lambda shape: torch.randn(shape, generator=g, device="cuda", dtype=torch.float32).to(dt)  # noqa: E731
            return {"q": mk(abi.q_shape(v, B, Lq)), "k": mk(abi.kv_shape(v, B, Lk, False)),
                    "v": mk(abi.kv_shape(v, B, Lk, True))}
    except ImportError:
        pass
    from attngen.check import fuzz

    rng = np.random.default_rng(seed)
    from attngen.check.reference import dtype_of

    mk = lambda shape: fuzz.to_device(rng.standard_normal(shape, dtype=np.float32).astype(dtype_of(v.dtype)))  # noqa: E731
    return {"q": mk(abi.q_shape(v, B, Lq)), "k": mk(abi.kv_shape(v, B, Lk, False)), "v": mk(abi.kv_shape(v, B, Lk, True))}


def host_runtime_inputs(v: Variant, B: int, Lq: int, Lk: int, seed: int) -> dict[str, np.ndarray]:
    """Valid runtime inputs (lengths, ids, weights...) from `workload.make_inputs` (host arrays)."""
    if not v.runtime_inputs():
        return {}
    from attngen.check import workload

    arrays = workload.make_inputs(v, B, Lq, Lk, np.random.default_rng(seed), dist="uniform")
    return {n: a for n, a in arrays.items() if n not in ("q", "k", "v")}


def nbytes(x: Any) -> int:
    if hasattr(x, "nbytes"):
        return int(x.nbytes)
    return int(x.numel() * x.element_size())


@dataclass
class Row:
    """One timed implementation at one shape (JSON-serialisable)."""

    workload: str
    variant: str
    impl: str
    dtype: str
    B: int
    H: int
    Lq: int
    Lk: int
    D: int
    ms: float | None = None
    tflops_visible: float | None = None
    tflops_dense: float | None = None
    frac_gemm: float | None = None
    visible: float | None = None
    speedup_vs_peer: float | None = None  # peer rows: peer ms / ours ms (> 1: ours is faster)
    agrees: bool | None = None
    check: str | None = None
    note: str = ""
    error: str | None = None
    extra: dict = field(default_factory=dict)


def _to_np(x: Any, dtype: DType) -> np.ndarray:
    from attngen.check import fuzz

    return fuzz.to_host(x, dtype)


def bench_shape(
    v: Variant,
    kernel: Any,
    B: int,
    Lq: int,
    Lk: int,
    *,
    workload: str = "",
    gemm_tflops: float | None = None,
    peers: bool = True,
    repeats: int = 30,
    seed: int = 0,
    runtime_inputs: Mapping[str, np.ndarray] | None = None,
    extra_peers: Sequence[Peer] = (),
    check_reference: bool | None = None,
    log: Callable[[str], None] = lambda s: print(s, file=sys.stderr, flush=True),
    only_peers: Collection[str] | None = None,
) -> list[Row]:
    """Time our kernel and its peers at one shape; returns our row first, then one per peer
    (`only_peers`: the names of the peers to run, e.g. {"sdpa-cudnn"}; None runs every one)."""
    from attngen.check import fuzz

    host_rt = dict(runtime_inputs) if runtime_inputs is not None else host_runtime_inputs(v, B, Lq, Lk, seed)
    dev_rt = {n: fuzz.to_device(a) for n, a in host_rt.items()}
    first = device_qkv(v, B, Lq, Lk, seed)
    per_set = sum(nbytes(x) for x in first.values())
    n_sets = rotation_sets(per_set)
    sets = [first] + [device_qkv(v, B, Lq, Lk, seed + 1 + i) for i in range(n_sets - 1)]
    base = dict(workload=workload or v.name, variant=v.name, dtype=v.dtype.value, B=B, H=v.heads, Lq=Lq, Lk=Lk,
                D=v.head_dim)
    vis = visible_fraction(v, B, Lq, Lk, host_rt)
    dense = dense_flops(v, B, Lq, Lk)

    def rates(ms: float) -> dict:
        return dict(ms=ms, tflops_visible=dense * vis / ms / 1e9, tflops_dense=dense / ms / 1e9,
                    frac_gemm=(dense * vis / ms / 1e9) / gemm_tflops if gemm_tflops else None, visible=vis)

    o_shape = abi.o_shape(v, B, Lq)
    outs = [fuzz.empty_device(o_shape, v.dtype) for _ in range(n_sets)]
    lses = [fuzz.empty_device(abi.lse_shape(v, B, Lq), DType.FP32) for _ in range(n_sets)] if v.lse else None

    def ours(i: int):
        s = sets[i]
        kw = {"out": outs[i]}
        if lses is not None:
            kw["lse"] = lses[i]
        return kernel(s["q"], s["k"], s["v"], **kw, **dev_rt)

    ours(0)
    fuzz.synchronize()
    o0 = _to_np(outs[0], v.dtype)
    rows: list[Row] = []
    row = Row(impl="attngen", **base)
    # Correctness first: against the reference where it is affordable, else the peers below.
    if check_reference is None:
        check_reference = B * v.heads * Lq * Lk <= (1 << 24)
    if check_reference:
        from attngen.check import reference

        host = {"q": _to_np(first["q"], v.dtype), "k": _to_np(first["k"], v.dtype), "v": _to_np(first["v"], v.dtype)}
        ref_o, _ = reference.attention(v, host["q"], host["k"], host["v"], host_rt)
        rep = tolerance.check(o0, ref_o, v.dtype, "O vs reference",
                              score_err=reference.score_error(v, host["q"], host["k"], host_rt))
        row.agrees, row.check = rep.ok, rep.summary()
        if not rep.ok:
            log(f"WARNING {v.name} {B}x{Lq}x{Lk}: {rep.summary()}")
    elif np.isnan(np.asarray(o0, dtype=np.float32)).any():
        row.agrees, row.check = False, "NaN in the output (poisoned buffer not fully written?)"
    t, how = time_launches(ours, n_sets, repeats=repeats)
    for k_, val in rates(t.median_ms).items():
        setattr(row, k_, val)
    row.extra = {"min_ms": t.min_ms, "p90_ms": t.p90_ms, "repeats": t.repeats, "sets": t.sets, "timing": how}
    rows.append(row)
    if not peers:
        return rows
    plist = [p for p in list(extra_peers) + peers_for(v, Lq, Lk) if only_peers is None or p.name in only_peers]
    for p in plist:
        prow = Row(impl=p.name, note=p.note, **base)
        runs: list[Callable[[], Any]] = []
        try:
            runs = [p.make({**sets[i], **dev_rt}) for i in range(n_sets)]
            t0 = time.monotonic()
            po = runs[0]()
            if p.fix is not None:
                po = p.fix(po)
            fuzz.synchronize()
            prow.extra["first_call_s"] = time.monotonic() - t0
            po_np = _to_np(po, v.dtype)
            rep = tolerance.check(o0, po_np, v.dtype, f"attngen vs {p.name}")
            prow.agrees, prow.check = rep.ok, rep.summary()
            if not rep.ok:
                log(f"WARNING {v.name}: outputs disagree with {p.name}: {rep.summary()}")
            pt, phow = time_launches(lambda i: runs[i](), n_sets, repeats=repeats)
            for k_, val in rates(pt.median_ms).items():
                setattr(prow, k_, val)
            prow.speedup_vs_peer = pt.median_ms / row.ms if row.ms else None
            prow.extra.update({"min_ms": pt.min_ms, "p90_ms": pt.p90_ms, "timing": phow})
            if not rep.ok and row.agrees is None:
                row.agrees = False
            elif rep.ok and row.agrees is None:
                row.agrees, row.check = True, f"agrees with {p.name}: {rep.summary()}"
        except Exception as e:  # a peer that cannot run this case is a row with an error, not a crash
            prow.error = f"{type(e).__name__}: {str(e)[:300]}"
        rows.append(prow)
        runs = []  # free this peer's buffers before the next one
    return rows
