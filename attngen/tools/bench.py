"""`attngen bench`: time a generated kernel on the GPU, side by side with torch's kernels.

    attngen bench FILE [--variant NAME] [--shape B,H,L,D ...] [--json out.json] [--plot out.png]
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

`--shape` takes B,H,L,D (self attention, or Lq = Lk = L) or B,H,Lq,Lk,D; H must be the spec's heads
and D its head_dim (an error otherwise: one compiled kernel serves every B and L, not other heads).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from attngen.ir import abi
from attngen.check import tolerance
from attngen.ir.nodes import AttnKind, Builtin, BuiltinName, Const, DType, IndexVar, Layout, SizeSym, Variant

L2_BYTES = 60 << 20  # H200 L2 cache
MIN_REPEATS = 20
EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2


# --------------------------------------------------------------------------------------------
# Timing


@dataclass
class Timing:
    """Per-launch GPU times in milliseconds."""

    median_ms: float
    min_ms: float
    p90_ms: float
    repeats: int
    sets: int


def time_gpu(launch: Callable[[int], Any], n_sets: int, *, warmup: int = 5, repeats: int = 30) -> Timing:
    """Time `launch(i)` (i = the input set, rotating) with CUDA events around every launch.

    Events are recorded on CuPy's current stream, which is the legacy default stream torch also
    uses unless a caller changed streams, so one clock serves our kernels and torch's peers."""
    import cupy

    repeats = max(MIN_REPEATS, repeats)
    for i in range(max(1, warmup)):
        launch(i % n_sets)
    cupy.cuda.Device().synchronize()
    starts = [cupy.cuda.Event() for _ in range(repeats)]
    ends = [cupy.cuda.Event() for _ in range(repeats)]
    for i in range(repeats):
        starts[i].record()
        launch(i % n_sets)
        ends[i].record()
    ends[-1].synchronize()
    times = sorted(cupy.cuda.get_elapsed_time(s, e) for s, e in zip(starts, ends))
    return Timing(statistics.median(times), times[0], times[min(len(times) - 1, int(0.9 * len(times)))],
                  repeats, n_sets)


# Below this median time per launch, event timing around each Python call may measure the host
# (a call's argument checks take ~0.1-0.3 ms; the H200 seed case read 0.30 ms by events and 16 us
# in a graph): such cases are re-timed with the launches captured in a CUDA graph, which is what
# a C++ engine or a graph-captured model sees.
GRAPH_BELOW_MS = 1.0


def time_graph(launch: Callable[[int], Any], n_sets: int, *, repeats: int = 100) -> Timing | None:
    """GPU time per launch: `repeats` launches captured in one torch CUDA graph, replayed between
    events; None when torch is missing or the launch cannot be captured."""
    try:
        import torch
    except ImportError:
        return None
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for i in range(3):
                launch(i % n_sets)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for i in range(repeats):
                launch(i % n_sets)
        g.replay()
        torch.cuda.synchronize()
        times = []
        for _ in range(11):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            g.replay()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) / repeats)
    except Exception:  # not capturable (host sync inside, a non-torch allocation): keep event timing
        return None
    times.sort()
    return Timing(statistics.median(times), times[0], times[min(len(times) - 1, int(0.9 * len(times)))], repeats, n_sets)


def time_launches(launch: Callable[[int], Any], n_sets: int, *, repeats: int = 30) -> tuple[Timing, str]:
    """Event timing, or CUDA-graph timing when the launches are short enough to be host-bound;
    returns the timing and which method produced it ("events" or "cuda-graph")."""
    t = time_gpu(launch, n_sets, repeats=repeats)
    if t.median_ms < GRAPH_BELOW_MS:
        g = time_graph(launch, n_sets)
        if g is not None:
            return g, "cuda-graph"
    return t, "events"


def rotation_sets(bytes_per_set: int, *, max_sets: int = 32, max_bytes: int = 16 << 30) -> int:
    """How many input sets make the rotation's footprint at least 2× L2 (at least 2 sets)."""
    want = math.ceil(2 * L2_BYTES / max(1, bytes_per_set))
    cap = max(2, max_bytes // max(1, bytes_per_set))
    return int(max(2, min(want, max_sets, cap)))


def gemm_rate() -> dict:
    """The device's matrix-product rate, measured now: bf16 8192³ with torch, fp16 with CuPy."""
    n = 8192
    try:
        import torch

        if torch.cuda.is_available():
            a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
            b = torch.randn_like(a)
            c = torch.empty_like(a)
            t = time_gpu(lambda i: torch.matmul(a, b, out=c), 1, warmup=5, repeats=20)
            del a, b, c
            return {"dtype": "bf16", "n": n, "ms": t.median_ms, "tflops": 2 * n**3 / t.median_ms / 1e9, "via": "torch"}
    except Exception:
        pass
    import cupy

    a = cupy.random.standard_normal((n, n), dtype=cupy.float32).astype(cupy.float16)
    b = cupy.random.standard_normal((n, n), dtype=cupy.float32).astype(cupy.float16)
    t = time_gpu(lambda i: cupy.matmul(a, b), 1, warmup=3, repeats=20)
    return {"dtype": "fp16 (no torch: bf16 unavailable in CuPy)", "n": n, "ms": t.median_ms,
            "tflops": 2 * n**3 / t.median_ms / 1e9, "via": "cupy"}


# --------------------------------------------------------------------------------------------
# Work: flops and the visible fraction


def dense_flops(v: Variant, B: int, Lq: int, Lk: int) -> float:
    """Flops of Q·Kᵀ and P·V as if every score were visible: 2·B·H·Lq·Lk·(D + Dv)."""
    return 2.0 * B * v.heads * Lq * Lk * (v.head_dim + v.value_head_dim)


def _mask_is_true(v: Variant) -> bool:
    return isinstance(v.mask, Const) and v.mask.value is True


def visible_fraction(v: Variant, B: int, Lq: int, Lk: int, inputs: Mapping[str, Any]) -> float:
    """The fraction of (b, h, q, kv) the mask keeps, evaluated exactly on these inputs: on the GPU
    through the Flex mask_mod when torch has CUDA, else with the NumPy reference in row chunks.
    Axes the mask does not read (b, h) are evaluated once."""
    if _mask_is_true(v):
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


# --------------------------------------------------------------------------------------------
# Inputs on the device


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


# --------------------------------------------------------------------------------------------
# Peers


def sdpa_expressible(v: Variant, Lq: int, Lk: int) -> str | None:
    """None when torch SDPA computes exactly this variant (norms aside), else why not."""
    if v.dtype == DType.FP32:
        return "fp32 (flash and cuDNN are fp16/bf16 only)"
    if v.scores:
        return "score modification"
    if v.head_dim != v.value_head_dim:
        return "Dv != D"
    if _mask_is_true(v):
        return None
    if isinstance(v.mask, Builtin) and v.mask.name == BuiltinName.CAUSAL and Lq == Lk:
        return None
    return "mask beyond none/causal"


def _bhsd(t: Any, v: Variant, heads: int) -> Any:
    """A torch tensor in [B, H, L, D] (a view) from the variant's layout (or a flat hidden state)."""
    if t.dim() == 3:
        t = t.reshape(t.shape[0], t.shape[1], heads, -1)
        return t.transpose(1, 2)
    return t.transpose(1, 2) if v.layout == Layout.BSHD else t


@dataclass
class Peer:
    """A torch implementation of the same computation: `make(set_inputs) -> run()` builds a
    closure per input set (so set-up such as block masks is outside the timing)."""

    name: str
    make: Callable[[Mapping[str, Any]], Callable[[], Any]]
    note: str = ""
    fix: Callable[[Any], Any] | None = None  # applied to the output for the agreement check only


def sdpa_peer(v: Variant, backend: str, Lq: int, Lk: int) -> Peer | None:
    """torch SDPA pinned to one backend ('flash' or 'cudnn'); None when not expressible."""
    if sdpa_expressible(v, Lq, Lk) is not None or v.norms or v.residual:
        return None
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    be = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}[backend]
    causal = not _mask_is_true(v)

    def make(ins: Mapping[str, Any]) -> Callable[[], Any]:
        q, k, vv = _bhsd(ins["q"], v, v.heads), _bhsd(ins["k"], v, v.kv_heads), _bhsd(ins["v"], v, v.kv_heads)

        def run():
            with sdpa_kernel(be):
                o = F.scaled_dot_product_attention(q, k, vv, is_causal=causal, scale=v.effective_scale,
                                                   enable_gqa=v.heads != v.kv_heads)
            return o.transpose(1, 2) if v.layout == Layout.BSHD else o

        return run

    return Peer(f"sdpa-{backend}", make)


def torch_composite_peer(v: Variant, Lq: int, Lk: int, compiled: bool) -> Peer | None:
    """torch eager (or torch.compile'd) norms + SDPA + residual, for fused-norm variants whose mask
    and scores SDPA can express: the unfused pipeline the fused kernel replaces."""
    if not (v.norms or v.residual) or v.scores or v.head_dim != v.value_head_dim:
        return None
    causal = False
    if not _mask_is_true(v):
        if isinstance(v.mask, Builtin) and v.mask.name == BuiltinName.CAUSAL and Lq == Lk:
            causal = True
        else:
            return None
    import torch
    import torch.nn.functional as F

    from attngen.check.flex import _norm
    from attngen.ir.nodes import NormScope, NormTarget, norm_bias_name, norm_weight_name

    dt = {DType.FP32: torch.float32, DType.FP16: torch.float16, DType.BF16: torch.bfloat16}[v.dtype]
    H, Hkv, D = v.heads, v.kv_heads, v.head_dim
    qn, kn, on = v.norm(NormTarget.Q), v.norm(NormTarget.K), v.norm(NormTarget.O)

    def pipeline(q, k, vv, ins):
        B = q.shape[0]
        x = q
        if qn is not None:
            w, b = ins.get(norm_weight_name(NormTarget.Q)), ins.get(norm_bias_name(NormTarget.Q))
            if qn.scope == NormScope.TOKEN and v.layout == Layout.BSHD:
                Lq_ = q.shape[1]
                q = _norm(q.reshape(B, Lq_, H * D), qn.kind, qn.eps, w, b).to(dt).reshape(B, Lq_, H, D)
            else:
                q = _norm(q, qn.kind, qn.eps, w, b).to(dt)
        if kn is not None:
            w, b = ins.get(norm_weight_name(NormTarget.K)), ins.get(norm_bias_name(NormTarget.K))
            k = _norm(k, kn.kind, kn.eps, w, b).to(dt)
        o = F.scaled_dot_product_attention(_bhsd(q, v, H), _bhsd(k, v, Hkv), _bhsd(vv, v, Hkv), is_causal=causal,
                                           scale=v.effective_scale, enable_gqa=H != Hkv)
        if v.layout == Layout.BSHD:
            o = o.transpose(1, 2)
        if on is not None:
            w, b = ins.get(norm_weight_name(NormTarget.O)), ins.get(norm_bias_name(NormTarget.O))
            o = _norm(o, on.kind, on.eps, w, b).to(dt)
        if v.residual:
            o = o + x.reshape(o.shape)
        return o

    fn = torch.compile(pipeline) if compiled else pipeline

    def make(ins: Mapping[str, Any]) -> Callable[[], Any]:
        q, k, vv = ins["q"], ins["k"], ins["v"]
        rest = {n: a for n, a in ins.items() if n not in ("q", "k", "v")}
        return lambda: fn(q, k, vv, rest)

    return Peer("torch-compile" if compiled else "torch-eager", make, "norms + SDPA + residual")


def flex_peer(v: Variant) -> Peer:
    """FlexAttention compiled with torch.compile, from the IR (`attngen.check.flex`)."""
    from attngen.check import flex

    extra = flex.not_in_flex(v)

    prepared: list[Callable[..., Any]] = []

    def make(ins: Mapping[str, Any]) -> Callable[[], Any]:
        # One prepare (mods, block mask, compiled graph) per shape; input sets only swap q/k/v.
        if not prepared:
            rest = {n: a for n, a in ins.items() if n not in ("q", "k", "v")}
            prepared.append(flex.prepare_flex(v, ins["q"], ins["k"], ins["v"], rest, compiled=True))
        run = prepared[0]
        q, k, vv = ins["q"], ins["k"], ins["v"]
        return lambda: run(q, k, vv)[0]

    return Peer("flex" if not extra else "flex+torch", make, ("torch: " + ", ".join(extra)) if extra else "")


def peers_for(v: Variant, Lq: int, Lk: int) -> list[Peer]:
    """Every torch peer that can compute this variant at these lengths (empty without torch/CUDA)."""
    try:
        import torch

        if not torch.cuda.is_available():
            return []
    except Exception:
        return []
    out: list[Peer] = []
    for be in ("flash", "cudnn"):
        p = sdpa_peer(v, be, Lq, Lk)
        if p is not None:
            out.append(p)
    for compiled in (False, True):
        p = torch_composite_peer(v, Lq, Lk, compiled)
        if p is not None:
            out.append(p)
    out.append(flex_peer(v))
    return out


# --------------------------------------------------------------------------------------------
# One benchmark row set: ours and the peers at one shape


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
) -> list[Row]:
    """Time our kernel and its peers at one shape; returns our row first, then one per peer."""
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
    plist = list(extra_peers) + peers_for(v, Lq, Lk)
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


# --------------------------------------------------------------------------------------------
# Output


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


# --------------------------------------------------------------------------------------------
# The command


def parse_shape(text: str, v: Variant) -> tuple[int, int, int]:
    """B,H,L,D or B,H,Lq,Lk,D → (B, Lq, Lk), checking H and D against the spec (ValueError)."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    try:
        nums = [int(p) for p in parts]
    except ValueError:
        raise ValueError(f"--shape {text!r}: expected integers B,H,L,D or B,H,Lq,Lk,D") from None
    if len(nums) == 4:
        B, H, Lq, D = nums
        Lk = Lq
    elif len(nums) == 5:
        B, H, Lq, Lk, D = nums
    else:
        raise ValueError(f"--shape {text!r}: expected B,H,L,D or B,H,Lq,Lk,D, got {len(nums)} numbers")
    if min(nums) < 1:
        raise ValueError(f"--shape {text!r}: every size must be >= 1")
    if H != v.heads:
        raise ValueError(f"--shape {text!r}: H={H} but {v.name} has heads {v.heads} (H is fixed by the spec)")
    if D != v.head_dim:
        raise ValueError(f"--shape {text!r}: D={D} but {v.name} has head_dim {v.head_dim}")
    if v.kind == AttnKind.SELF and Lq != Lk:
        raise ValueError(f"--shape {text!r}: {v.name} is self attention, so Lq must equal Lk (got {Lq}, {Lk})")
    return B, Lq, Lk


def default_shapes(v: Variant) -> list[tuple[int, int, int]]:
    """B·L = 32k tokens at L = 1k, 4k, 16k (as the peer anchors), fewer for very many heads."""
    out = []
    for L, B in ((1024, 32), (4096, 8), (16384, 2)):
        B = max(1, B * 16 // max(16, v.heads))
        out.append((B, L, L))
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="attngen bench", description="Time a kernel, side by side with torch peers.")
    p.add_argument("file", metavar="FILE")
    p.add_argument("--variant")
    p.add_argument("--shape", action="append", default=None, help="B,H,L,D or B,H,Lq,Lk,D (repeatable)")
    p.add_argument("--json", default=None, help="write results as JSON here")
    p.add_argument("--plot", default=None, help="write a TFLOP/s plot here (needs matplotlib)")
    p.add_argument("--peers", action=argparse.BooleanOptionalAction, default=True, help="time torch peers too")
    p.add_argument("--repeats", type=int, default=30, help=f"timed launches per implementation (>= {MIN_REPEATS})")
    return p


def main(args: argparse.Namespace | Sequence[str] | None = None) -> int:
    """Run `attngen bench`; 0 ok, 1 a spec error or a disagreeing output, 2 a usage error."""
    if args is None or not isinstance(args, argparse.Namespace):
        args = build_parser().parse_args(list(args) if args is not None else None)
    from attngen.plan import validate
    from attngen.check import fuzz
    from attngen.lang.diagnostics import SpecError

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
        try:
            shapes_by_variant[v.name] = [parse_shape(s, v) for s in args.shape] if args.shape else default_shapes(v)
        except ValueError as e:
            return err(str(e))
    ok, why = fuzz.gpu_status()
    if not ok:
        return err(f"no GPU: {why}; `attngen bench` times kernels on a CUDA device")
    if getattr(args, "repeats", 30) < MIN_REPEATS:
        return err(f"--repeats must be at least {MIN_REPEATS}")
    from attngen.runtime import kernel as runtime

    gemm = gemm_rate()
    print(f"{gemm['dtype']} GEMM {gemm['n']}^3: {gemm['tflops']:.0f} TFLOP/s ({gemm['ms']:.3f} ms)", file=sys.stderr)
    rows: list[Row] = []
    for v in variants:
        kernel = runtime.compile(v)
        for B, Lq, Lk in shapes_by_variant[v.name]:
            rows += bench_shape(v, kernel, B, Lq, Lk, gemm_tflops=gemm["tflops"], peers=getattr(args, "peers", True),
                                repeats=getattr(args, "repeats", 30))
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
