"""The backward pass at run time (stage: load/launch): `backward(kernel, q, k, v, dO, ...)` returns
(dq, dk, dv), the gradients of sum(dO * O) for O = kernel(q, k, v, ...).

    kern = attngen.compile("examples/llama3_gqa_causal.attn")
    dq, dk, dv = attngen.runtime.bwd.backward(kern, q, k, v, dO)            # runs the forward for O, LSE
    dq, dk, dv = attngen.runtime.bwd.backward(kern, q, k, v, dO, o=o, lse=lse)  # with the forward's saved ones

The forward's O and LSE are what the backward reads (P is recomputed from the LSE); without them the
forward of the same variant with `output lse` runs first (`training_variant`). With `norm o`, `o`
is O', the attention output before the post-norm and the residual (the output of
`training_variant(v)`'s forward; `apply_o_norm` gives y from it), and dO the gradient at y: the
backward's pre kernel maps it through the norm. `layout varlen`: q, k, v, dO packed [total, H, D]
with the cu_seqlens inputs, the LSE [H, total_q]. Arrays are checked before any launch, as
the forward checks them: wrong shapes, dtypes, devices or layouts are a ValueError saying what was
expected. Arrays are CuPy arrays (bf16 as uint16 bit patterns) or torch CUDA tensors; the
gradients come back in the library of q, contiguous, in the shapes of q, k, v, allocated on the
launch stream. A call signature is validated and packed once (`bind_backward`, on the binder's
pieces); the workspaces come from the binder's pool, or under CUDA-graph capture from the caller's
allocator (so a CUDA graph can capture the backward). `q_offset`, `kv_offset`, `Lq_total`, `Lk_total` place the call in a longer sequence as in
the forward call; `dlse` adds a gradient at the LSE output. `attngen.torch` builds its autograd on
this function (attngen/runtime/torch_op.py).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from attngen.ir import abi
from attngen.cuda.compile import compile_source
from attngen.cuda.render import TmaMap
from attngen.plan import bwd as plan_bwd
from attngen.plan.op_plan import OpPlan
from attngen.runtime import binder
from attngen.runtime.binder import (MAX_BINDINGS, POOL, SIG_FNS, ArgBuffer, ArrayView, Launch, TmaSlot, allocator, bind_sizes, capturing,
                                    check_dtype, check_lse, contiguous_view, cu_function, external_stream, input_fields, launch_stream,
                                    load_functions, pack_fields, seq_strides, stride_fields, torch_sig, view)
from attngen.ir.nodes import DType, NormKind, NormTarget, Variant
from attngen.plan.bwd import o_norm_inputs, training_variant  # noqa: F401 (the torch op's, from here)
from attngen.plan.bwd import BwdEngine, choose_engine, learnable, norm_params, unsupported, wg_tma_maps
from attngen.cuda.render_bwd import render_with_plan
from attngen.plan.schedule import Arch


@dataclass
class BackwardKernels:
    """The backward kernels of one variant, compiled for one architecture."""

    variant: Variant
    source: str
    plan: OpPlan  # the backward family's
    functions: dict[str, Any]  # device function name in the template -> CuPy kernel
    bindings: OrderedDict = field(default_factory=OrderedDict)  # call signature -> BwdBinding
    input_names: tuple[str, ...] = ()  # the runtime inputs in ABI order
    device: int = 0  # where the kernels were loaded


class _Cache(dict):
    """The compiled backward kernels; `clear()` (benchmarks swap templates with it) also retires
    what kernels remembered of it (`generation`)."""

    generation = 0

    def clear(self) -> None:
        self.generation += 1
        super().clear()


_CACHE: _Cache = _Cache()
_LOCK = threading.Lock()


def compile_backward(v: Variant, arch: Arch, *, deterministic: bool = False, engine: BwdEngine | None = None) -> BackwardKernels:
    """Render, compile (through the on-disk cache) and load the backward kernels of `v`.
    ValueError, naming the construct, when the backward kernels do not support it yet (or the
    requested dK/dV `engine` cannot run it; None: the plan's default)."""
    import cupy

    bad = unsupported(v)
    if bad:
        raise ValueError(f"variant {v.name}: " + "; ".join(d.message for d in bad))
    dev = cupy.cuda.Device().id
    engine = choose_engine(v, arch, engine)[0]  # the resolved engine keys the cache (the default may change)
    key = (v, arch, deterministic, dev, engine, plan_bwd.WG_LOADS)
    with _LOCK:
        if key in _CACHE:
            return _CACHE[key]
    src, bp = render_with_plan(v, arch, deterministic=deterministic, engine=engine)
    binary = compile_source(src, arch)
    module, by_name = load_functions(binary.cubin, {k.name: k.smem.bytes for k in bp.kernels})
    fns = {k.func: by_name[k.name] for k in bp.kernels}
    bk = BackwardKernels(v, src, bp, fns, input_names=tuple(d.name for d in v.runtime_inputs()), device=dev)
    bk._module = module  # type: ignore[attr-defined]  # keeps the module (and its functions) alive
    with _LOCK:
        return _CACHE.setdefault(key, bk)


def apply_o_norm(v: Variant, o_pre: Any, x: Any, weight: Any = None, bias: Any = None) -> Any:
    """y = norm(O') w + bias (+ x with a residual) in fp32, rounded to the element type, as the
    fused epilogue computes it (torch tensors or CuPy arrays; x in O's shape or flat [B, L, H*D])."""
    n = v.norm(NormTarget.O)
    assert n is not None
    is_torch = type(o_pre).__module__.startswith("torch")
    if is_torch:
        import torch as xp

        f = o_pre.float()
        mean = f.mean(-1, keepdim=True) if n.kind == NormKind.LAYERNORM else 0.0
        c = f - mean
        y = c * xp.rsqrt((c * c).mean(-1, keepdim=True) + n.eps)
    else:
        import cupy as xp

        f = o_pre.astype(xp.float32)
        mean = f.mean(-1, keepdims=True) if n.kind == NormKind.LAYERNORM else 0.0
        c = f - mean
        y = c / xp.sqrt((c * c).mean(-1, keepdims=True) + n.eps)
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    if v.residual:
        y = y + (x.float() if is_torch else x.astype(xp.float32)).reshape(y.shape)
    return y.to(o_pre.dtype) if is_torch else y.astype(o_pre.dtype)


def _forward_with_lse(kernel: Any) -> Any:
    """The forward kernel of `training_variant` (the kernel itself when it is that variant),
    compiled through the kernel (`Kernel.for_variant`) and remembered on it."""
    fwd = kernel.__dict__.get("_training_forward")
    if fwd is None:
        tv = training_variant(kernel.variant)
        fwd = kernel if tv == kernel.variant else kernel.for_variant(tv)
        kernel.__dict__["_training_forward"] = fwd
    return fwd


def _torch_stream(ptr: int, device: Any) -> Any:
    """torch's allocations and ops on the launch stream: nothing to switch when it is torch's
    current stream (the autograd case, also under CUDA-graph capture), else that stream."""
    import contextlib

    import torch

    if torch.cuda.current_stream(device).cuda_stream == ptr:
        return contextlib.nullcontext()
    return torch.cuda.stream(torch.cuda.ExternalStream(ptr, device=device))



# ---------------------------------------------------------------------------------------------
# The call: validated and packed once a signature (`attngen.runtime.binder`)


@dataclass
class BwdBinding:
    """What one backward call signature needs, built once: the launches over one argument buffer
    (every backward kernel takes the same ABI fields; the wgmma dK/dV kernel its TMA descriptors
    after them), where each call's pointers go, and what a call allocates."""

    args: ArgBuffer
    launches: list[Launch]
    pre: int  # the index of ag_bwd_pre among the launches (a `dlse` is subtracted after it)
    delta: int  # the index of ws_delta among the workspaces
    array_slots: list[int]  # per call array (q, k, v, o, dO, lse, runtime inputs): its pointer's slot
    grad_slots: list[int]  # dq, dk, dv
    ws_slots: list[int]
    ws_specs: list[tuple[int, DType]]  # (elements, dtype) a workspace, from the pool
    param_slots: list[tuple[int, str, tuple[int, ...]]]  # (slot, input, shape) of each gradient in `wrt`
    tmaps: list[tuple[TmaSlot, str]]
    aligned: tuple[int, ...]  # call arrays whose pointers the tensor-core kernels copy with 16-byte cp.async
    dtype: DType
    is_torch: bool
    alloc: Any
    pool_keys: tuple[tuple[Any, ...], ...]
    grad_new: tuple[Any, ...] = ()  # dq, dk, dv's allocation calls (`binder.maker`), built once a binding
    lock: threading.Lock = field(default_factory=threading.Lock)


def _strides(var: Variant, a: ArrayView, name: str) -> tuple[int, int, int]:
    return seq_strides(var, a, name)


def bind_backward(bk: BackwardKernels, var: Variant, arrays: tuple[Any, ...], inputs: dict[str, Any], dlse: Any, sp: int,
                  wrt: tuple[str, ...], positions: tuple | None) -> BwdBinding:
    """The full validation of one backward signature and its argument buffer by field name."""
    op = bk.plan
    bp = op.backward
    assert bp is not None
    allowed = learnable(var) + norm_params(var)
    for name in wrt:
        if name not in allowed:
            raise ValueError(f"wrt: expected names of score inputs with a gradient ({', '.join(allowed) or 'none in this variant'}), got {name!r}")
    aq, ak, av, ao, ado, al = (view(x, n) for x, n in zip(arrays[:6], ("q", "k", "v", "o", "dO", "lse")))
    for a, n in ((aq, "q"), (ak, "k"), (av, "v"), (ado, "dO")):
        check_dtype(a, var.dtype, n)
    given = {name: view(x, name) for name, x in inputs.items()}
    placed = abi.Positions(*positions) if positions is not None else abi.Positions()
    sizes = bind_sizes(var, aq, ak, av, given, placed)
    B, Lq, Lk = sizes.B, sizes.Lq, sizes.Lk
    pos = placed.resolve(Lq, Lk)
    o_shape = tuple(abi.o_shape(var, B, Lq))
    if ado.shape != o_shape:
        raise ValueError(f"dO: expected the output's shape {o_shape}, got {ado.shape}")
    dev = bk.device
    for name, a in (("q", aq), ("k", ak), ("v", av), ("dO", ado), *given.items()):
        if a.device != dev:
            raise ValueError(f"{name}: expected an array on cuda:{dev}, where the backward kernels were loaded, got cuda:{a.device}")
    check_dtype(ao, var.dtype, "o")
    if ao.shape != o_shape:
        raise ValueError(f"o: expected shape {o_shape}, got {ao.shape}")
    lse_shape = tuple(abi.lse_shape(var, B, Lq))  # [B, H, Lq]; varlen [H, total_q]
    check_lse(al, aq, lse_shape)
    if dlse is not None:
        check_lse(view(dlse, "dlse"), aq, lse_shape, "dlse")
    grads = [contiguous_view(a.shape, var.dtype, dev, aq.is_torch) for a in (aq, ak, av)]
    strides = {n: _strides(var, a, n) for a, n in zip((aq, ak, av, ao, ado, *grads), ("q", "k", "v", "o", "dO", "dq", "dk", "dv"))}
    aligned: tuple[int, ...] = ()
    if op.engine != BwdEngine.FFMA:
        # The tensor-core kernels copy rows of these with 16-byte cp.async.
        read = ((0, aq, "q", not bp.q_norm), (1, ak, "k", not bp.k_norm), (2, av, "v", True), (4, ado, "dO", not bp.o_norm))
        for i, a, n, r in read:
            if r and any(s % 8 for s in strides[n]):
                raise ValueError(f"{n}: expected every stride to be a multiple of 8 elements (16 bytes) for the tensor-core backward, got strides {a.strides}")
        aligned = tuple(i for i, _, _, r in read if r)
    fixed, in_ptrs = input_fields(var, given)
    fixed.update({"B": B, "Lq": Lq, "Lk": Lk, "q_offset": pos.q_offset, "kv_offset": pos.kv_offset,
                  "Lq_total": pos.Lq_total, "Lk_total": pos.Lk_total, "total_q": Lq, "total_k": Lk})
    for t, st in strides.items():
        fixed.update(stride_fields(t, st))
    params: list[tuple[str, tuple[int, ...]]] = []
    for name in allowed:
        if name in wrt:
            if name not in given:
                raise ValueError(f"wrt: {name!r} is not an input of this call (affine-free norms have no weights)")
            params.append((name, given[name].shape))
        else:
            fixed[f"grad_{name}"] = 0
    ws = _workspaces(var, op, B, Lq, Lk)
    specs = wg_tma_maps(op, var) if bp.wg_loads is not None else ()
    call = ("q", "k", "v", "o", "dO", "lse", *in_ptrs)
    args, _, slots = pack_fields(op.fields, fixed, (*call, "dq", "dk", "dv", *ws, *(f"grad_{n}" for n, _ in params)),
                                     op.base_name, blobs=len(specs))
    tmaps = []
    for j, m in enumerate(specs):
        L = Lq if m.length == "Lq" else Lk
        dims = m.dims(B, L)
        ss, sh, sb = m.dense_strides(L) if m.tensor in ws else tuple(reversed(strides[m.tensor]))
        dt, size = ("fp32", 4) if m.fp32 else (var.dtype.value, var.dtype.itemsize)
        tmaps.append((TmaSlot(args, j, slots[m.tensor], dt, dims, TmaMap.byte_strides(dims, (ss, sh, sb), size),
                              (m.box_cols, m.rows, 1, 1), hint=""), m.tensor))
    alloc = allocator(aq.is_torch, aq.obj.device if aq.is_torch else None, sp)
    launches = []
    for kern in op.kernels:
        fn = bk.functions[kern.func]
        launches.append(Launch(cu_function(fn), op.launch_grid(kern, B, Lq, Lk), kern.threads, kern.smem.bytes, args))
        launches[-1].bind_stream(sp)
    return BwdBinding(
        args=args, launches=launches, pre=next(i for i, kern in enumerate(op.kernels) if kern.func == "ag_bwd_pre"),
        delta=list(ws).index("ws_delta"), array_slots=[slots[n] for n in call], grad_slots=[slots[n] for n in ("dq", "dk", "dv")],
        ws_slots=[slots[n] for n in ws], ws_specs=list(ws.values()),
        pool_keys=POOL.keys((aq.is_torch, dev, sp), list(ws.values())),
        param_slots=[(slots[f"grad_{n}"], n, shape) for n, shape in params], tmaps=tmaps, aligned=aligned,
        dtype=var.dtype, is_torch=aq.is_torch, alloc=alloc,
        grad_new=tuple(binder.maker(alloc, a.shape, var.dtype) for a in (aq, ak, av)))


def _workspaces(var: Variant, op: OpPlan, B: int, Lq: int, Lk: int) -> dict[str, tuple[int, DType]]:
    """The backward's workspaces by ABI field: (elements, dtype). Rows of the per-row ones: B * H *
    Lq; varlen H * total_q (the packed rows, [H, total_q] like the LSE). They grow with B*L, never
    Lq*Lk."""
    bp = op.backward
    assert bp is not None
    nb = 1 if bp.varlen else B
    rows_q, rows_k = nb * var.heads * Lq, nb * var.kv_heads * Lk
    ws = {"ws_delta": (rows_q, DType.FP32), "ws_dq": (rows_q * var.head_dim, DType.FP32)}
    if bp.q_norm:
        ws["ws_q"] = (rows_q * var.head_dim, var.dtype)
    if bp.k_norm:
        ws["ws_k"] = (rows_k * var.head_dim, var.dtype)
        ws["ws_dk"] = (rows_k * var.head_dim, DType.FP32)
    if bp.o_norm:
        ws["ws_do"] = (rows_q * var.value_head_dim, var.dtype)
    return {f.name: ws[f.name] for f in op.fields if f.name in ws}


def _run(b: BwdBinding, ptrs: list[int], dlse: Any, sp: int) -> tuple[Any, ...]:
    """One call on its binding: allocate the gradients, take the workspaces, patch the pointers
    (re-encoding a TMA descriptor only when its pointer changed), launch through the driver."""
    for i in b.aligned:
        if ptrs[i] & 15:
            raise ValueError(f"{('q', 'k', 'v', 'o', 'dO')[i]}: expected a 16-byte aligned data pointer for the tensor-core backward")
    alloc, is_torch = b.alloc, b.is_torch
    fresh = capturing(sp)  # under graph capture: the graph's own buffers, not the pool's
    with POOL.stream_lock(sp):
        # Each gradient its own allocation: the dispatched op (torch.compile) may not return
        # outputs that alias one another, as slices of one tensor would.
        grads = [new() for new in b.grad_new]
        ws = [alloc((n,), dt) for n, dt in b.ws_specs] if fresh else POOL.take(b.pool_keys, b.ws_specs, alloc)
        params = {name: alloc(shape, DType.FP32, True) for _, name, shape in b.param_slots} if b.param_slots else {}
        with b.lock:
            vals = b.args.vals
            for slot, p in zip(b.array_slots, ptrs):
                vals[slot] = p
            for slot, x in zip(b.grad_slots, grads):
                vals[slot] = x.data_ptr() if is_torch else x.data.ptr
            for slot, x in zip(b.ws_slots, ws):
                vals[slot] = x.data_ptr() if is_torch else x.data.ptr
            for slot, name, _ in b.param_slots:
                vals[slot] = params[name].data_ptr() if is_torch else params[name].data.ptr
            for tm, name in b.tmaps:
                if vals[tm.array] != tm.last:
                    tm.update(vals[tm.array], name)
            for i, ln in enumerate(b.launches):
                binder.launch_driver(ln, sp)
                if i == b.pre and dlse is not None:
                    _subtract(ws[b.delta], b.ws_specs[b.delta][0], dlse, sp, is_torch)
    return (*grads, params)


def _subtract(delta: Any, n: int, dlse: Any, sp: int, is_torch: bool) -> None:
    """delta[:n] -= dlse on the launch stream (a pool buffer may be longer than this call's rows): a
    loss that reads the LSE, dS = P * (dP - (delta - dlse))."""
    if is_torch:
        with _torch_stream(sp, delta.device):
            delta[:n].sub_(dlse.reshape(-1))
        return
    import cupy

    with external_stream(sp):
        cupy.subtract(delta[:n], dlse.reshape(-1), out=delta[:n])


def backward(
    kernel: Any,
    q: Any,
    k: Any,
    v: Any,
    dO: Any,
    *,
    o: Any = None,
    lse: Any = None,
    deterministic: bool = False,
    wrt: tuple[str, ...] = (),
    stream: Any = None,
    dlse: Any = None,
    q_offset: int = 0,
    kv_offset: int = 0,
    Lq_total: int | None = None,
    Lk_total: int | None = None,
    engine: BwdEngine | None = None,
    variant: Variant | None = None,
    **inputs: Any,
) -> tuple[Any, ...]:
    """(dq, dk, dv) for a compiled forward `kernel` (attngen.compile); see the module doc. With
    `wrt` naming score inputs (`plan_bwd.learnable`: bias, alibi slopes, rel_bias tables, float
    lookups), (dq, dk, dv, {name: gradient}) with each gradient fp32 in its input's shape.

    `dlse` (fp32 [B, H, Lq], varlen [H, total_q], contiguous): a gradient at the LSE output as well, for a loss that
    reads the LSE (d LSE/d s = P, so it enters as delta - dlse). `q_offset`, `kv_offset`,
    `Lq_total`, `Lk_total` place the call in a longer sequence exactly as in the forward call
    (`abi.Positions`); pass the same values the forward got. `engine` asks for a dK/dV engine
    (`plan_bwd.BwdEngine`; None: the plan's default for the arch). `variant`: the variant to
    differentiate when `kernel` is its `training_variant`'s forward (default: kernel.variant).

    Each call signature (shapes, strides, dtypes, devices, stream, `wrt`, placement, whether
    `dlse` is given) is validated and packed once; later calls patch pointers and launch."""
    if getattr(kernel, "target", None) == "cpu":  # the CPU backend's backward (attngen.cpu.backward)
        from attngen.cpu.backward import backward as cpu_backward

        return cpu_backward(kernel, q, k, v, dO, o=o, lse=lse, wrt=wrt, dlse=dlse, q_offset=q_offset, kv_offset=kv_offset,
                            Lq_total=Lq_total, Lk_total=Lk_total, variant=variant, **inputs)
    var = kernel.variant if variant is None else variant
    bk = _backward_kernels(kernel, var, deterministic, engine)  # refuses unsupported constructs first
    wrt = tuple(wrt)
    if (o is None) != (lse is None):
        raise ValueError("o, lse: expected both (the forward's saved output and LSE) or neither, got one")
    placed = (q_offset, kv_offset, Lq_total, Lk_total)
    positions = None if placed == (0, 0, None, None) else placed
    if o is None:
        # q, k, v and dO refused before the forward launches (a call with o and lse is checked once a signature)
        _check_before_forward(var, q, k, v, dO, inputs, positions)
        where = {} if positions is None else dict(q_offset=q_offset, kv_offset=kv_offset, Lq_total=Lq_total, Lk_total=Lk_total)
        fwd_inputs = {n: a for n, a in inputs.items() if n not in o_norm_inputs(var)}
        o, lse = _forward_with_lse(kernel)(q, k, v, stream=stream, **where, **fwd_inputs)
    order = bk.input_names
    arrays = (q, k, v, o, dO, lse, *[inputs[n] for n in order if n in inputs]) if order else (q, k, v, o, dO, lse)
    sig = binder.call_signature(arrays if dlse is None else (*arrays, dlse))
    if sig is None or len(arrays) != 6 + len(order) or len(inputs) != len(order):
        bind_backward(bk, var, arrays, inputs, dlse, 0, wrt, positions)  # raises the precise error
        raise ValueError("backward: expected CuPy arrays or torch CUDA tensors")
    sigs, ptrs = sig
    is_torch = SIG_FNS.get(type(q)) is torch_sig
    sp = launch_stream(stream, is_torch, sigs[0][3])
    key = (sigs, sp, wrt, positions)
    b = bk.bindings.get(key)
    if b is None:
        b = bk.bindings[key] = bind_backward(bk, var, arrays, inputs, dlse, sp, wrt, positions)
        while len(bk.bindings) > MAX_BINDINGS:
            bk.bindings.popitem(last=False)
    dq, dk, dv, params = _run(b, ptrs, dlse, sp)
    if wrt:
        return dq, dk, dv, {n: params[n] for n in wrt}
    return dq, dk, dv


def _check_before_forward(var: Variant, q: Any, k: Any, v: Any, dO: Any, inputs: dict[str, Any], positions: tuple | None) -> None:
    """The checks of q, k, v and dO a call without the forward's o and LSE makes before running that forward."""
    aq, ak, av, ado = (view(x, n) for x, n in ((q, "q"), (k, "k"), (v, "v"), (dO, "dO")))
    for a, n in ((aq, "q"), (ak, "k"), (av, "v"), (ado, "dO")):
        check_dtype(a, var.dtype, n)
    given = {name: view(x, name) for name, x in inputs.items()}
    sizes = bind_sizes(var, aq, ak, av, given, abi.Positions(*positions) if positions is not None else abi.Positions())
    o_shape = tuple(abi.o_shape(var, sizes.B, sizes.Lq))
    if ado.shape != o_shape:
        raise ValueError(f"dO: expected the output's shape {o_shape}, got {ado.shape}")


_PAIRS: dict[tuple[int, int], tuple[Variant, Variant, bool]] = {}


def _same_training(a: Variant, b: Variant) -> bool:
    """Whether two variants share a training forward (remembered per pair of objects)."""
    got = _PAIRS.get((id(a), id(b)))
    if got is None or got[0] is not a or got[1] is not b:
        got = _PAIRS[(id(a), id(b))] = (a, b, training_variant(a) == training_variant(b))
    return got[2]


def _backward_kernels(kernel: Any, var: Variant, deterministic: bool, engine: BwdEngine | None) -> BackwardKernels:
    """`compile_backward` for this kernel's arch, remembered on the kernel per (variant,
    deterministic, engine and the copies `plan_bwd.WG_LOADS`) so that a call does not re-plan;
    `var` must be the kernel's own variant or share its training forward (checked before an
    entry is made, so a remembered one needs no check)."""
    memo = getattr(kernel, "__dict__", None)
    memo = memo.setdefault("_bwd_kernels", {}) if memo is not None else {}
    key = (id(var), deterministic, engine, id(plan_bwd.WG_LOADS))  # (ids: an enum member's hash is Python code)
    got = memo.get(key)
    if got is None or got[0] is not var or got[2] != _CACHE.generation:
        if var is not kernel.variant and not _same_training(kernel.variant, var):
            raise ValueError(f"variant: expected {var.name}'s own forward or its training forward, got a kernel of {kernel.variant.name}")
        got = memo[key] = (var, compile_backward(var, kernel.plan.arch, deterministic=deterministic, engine=engine), _CACHE.generation)
    return got[1]


__all__ = ["BackwardKernels", "apply_o_norm", "backward", "compile_backward", "o_norm_inputs", "training_variant"]
