"""The backward pass at run time (stage: load/launch): `backward(kernel, q, k, v, dO, ...)` returns
(dq, dk, dv), the gradients of sum(dO * O) for O = kernel(q, k, v, ...).

    kern = attngen.compile("examples/llama3_gqa_causal.attn")
    dq, dk, dv = attngen.runtime_bwd.backward(kern, q, k, v, dO)            # runs the forward for O, LSE
    dq, dk, dv = attngen.runtime_bwd.backward(kern, q, k, v, dO, o=o, lse=lse)  # with the forward's saved ones

The forward's O and LSE are what the backward reads (P is recomputed from the LSE); without them the
forward of the same variant with `output lse` runs first (`training_variant`). With `norm o`, `o`
is O', the attention output before the post-norm and the residual (the output of
`training_variant(v)`'s forward; `apply_o_norm` gives y from it), and dO the gradient at y: the
backward's pre kernel maps it through the norm. `layout varlen`: q, k, v, dO packed [total, H, D]
with the cu_seqlens inputs, the LSE [H, total_q]. Arrays are checked before any launch, as
the forward checks them: wrong shapes, dtypes, devices or layouts are a ValueError saying what was
expected. Arrays are CuPy arrays (bf16 as uint16 bit patterns) or torch CUDA tensors; the
gradients come back in the library of q, contiguous, in the shapes of q, k, v. With torch tensors
the workspaces come from torch's allocator on the launch stream (so a CUDA graph can capture the
backward). `q_offset`, `kv_offset`, `Lq_total`, `Lk_total` place the call in a longer sequence as in
the forward call; `dlse` adds a gradient at the LSE output. `attngen.torch` builds its autograd on
this function (attngen/runtime/torch_op.py).
"""

from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass
from typing import Any

from attngen.ir import abi
from attngen.cuda.compile import compile_source
from attngen.runtime.kernel import load_functions
from attngen.ir.nodes import DType, Layout, NormKind, NormTarget, Variant, norm_bias_name, norm_weight_name
from attngen.plan.bwd import BwdEngine, BwdPlan, choose_engine, learnable, norm_params, unsupported, wg_tma_maps
from attngen.cuda.render_bwd import render_with_plan
from attngen.plan.schedule import Arch


@dataclass
class BackwardKernels:
    """The backward kernels of one variant, compiled for one architecture."""

    variant: Variant
    source: str
    plan: BwdPlan
    functions: dict[str, Any]  # device function name in the template -> CuPy kernel


_CACHE: dict[tuple[Any, ...], BackwardKernels] = {}
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
    from attngen.plan import bwd as plan_bwd

    key = (v, arch, deterministic, dev, engine, plan_bwd.WG_LOADS)
    with _LOCK:
        if key in _CACHE:
            return _CACHE[key]
    src, bp = render_with_plan(v, arch, deterministic=deterministic, engine=engine)
    binary = compile_source(src, arch)
    module, by_name = load_functions(binary.cubin, {k.name: k.smem for k in bp.kernels})
    fns = {k.func: by_name[k.name] for k in bp.kernels}
    bk = BackwardKernels(v, src, bp, fns)
    bk._module = module  # type: ignore[attr-defined]  # keeps the module (and its functions) alive
    with _LOCK:
        return _CACHE.setdefault(key, bk)


def training_variant(v: Variant) -> Variant:
    """The forward whose outputs the backward reads: `v` writing the LSE; with `norm o`, also
    without the post-norm and the residual, so that its output is O', the attention output the
    norm normalises (the backward's pre kernel maps dY to dO' through the norm with it; the
    caller applies y = norm(O') (+ x), `apply_o_norm`)."""
    v = dataclasses.replace(v, lse=True, nan_check=False)
    if v.norm(NormTarget.O) is None:
        return v
    return dataclasses.replace(v, norms=tuple(n for n in v.norms if n.target != NormTarget.O), residual=False)


def o_norm_inputs(v: Variant) -> tuple[str, ...]:
    """The runtime inputs of the o post-norm (read by `apply_o_norm`, not by `training_variant`'s forward)."""
    n = v.norm(NormTarget.O)
    if n is None or not n.affine:
        return ()
    return (norm_weight_name(NormTarget.O),) + ((norm_bias_name(NormTarget.O),) if n.kind == NormKind.LAYERNORM else ())


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


def _forward_with_lse(kernel: Any):
    """The forward kernel of `training_variant` (the kernel itself when it is that variant)."""
    from attngen.runtime import kernel as runtime

    v = kernel.variant
    tv = training_variant(v)
    if tv == v:
        return kernel
    return runtime.compile(tv, arch=kernel.plan.arch)


def _torch_stream(ptr: int, device: Any) -> Any:
    """torch's allocations and ops on the launch stream: nothing to switch when it is torch's
    current stream (the autograd case, also under CUDA-graph capture), else that stream."""
    import contextlib

    import torch

    if torch.cuda.current_stream(device).cuda_stream == ptr:
        return contextlib.nullcontext()
    return torch.cuda.stream(torch.cuda.ExternalStream(ptr, device=device))


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
    differentiate when `kernel` is its `training_variant`'s forward (default: kernel.variant)."""
    import cupy
    import numpy as np

    from attngen.runtime import kernel as runtime

    var = kernel.variant if variant is None else variant
    if variant is not None and training_variant(variant) != training_variant(kernel.variant):
        raise ValueError(f"variant: expected {variant.name}'s own forward or its training forward, got a kernel of {kernel.variant.name}")
    arch = kernel.plan.arch
    bk = compile_backward(var, arch, deterministic=deterministic, engine=engine)  # refuses unsupported constructs first
    wrt = tuple(wrt)
    allowed = learnable(var) + norm_params(var)
    for name in wrt:
        if name not in allowed:
            raise ValueError(f"wrt: expected names of score inputs with a gradient ({', '.join(allowed) or 'none in this variant'}), got {name!r}")
    aq, ak, av, ado = (runtime._view(x, n) for x, n in ((q, "q"), (k, "k"), (v, "v"), (dO, "dO")))
    for a, n in ((aq, "q"), (ak, "k"), (av, "v"), (ado, "dO")):
        runtime._check_dtype(a, var.dtype, n)
    given = {name: runtime._view(x, name) for name, x in inputs.items()}
    placed = abi.Positions(q_offset, kv_offset, Lq_total, Lk_total)
    sizes = abi.bind_sizes(
        var, aq.shape, ak.shape, av.shape,
        {n: (a.shape, runtime._dtype_name_for_abi(a, next((d.dtype for d in var.runtime_inputs() if d.name == n), DType.I32)))
         for n, a in given.items()},
        positions=placed,
    )
    B, Lq, Lk = sizes.B, sizes.Lq, sizes.Lk
    pos = placed.resolve(Lq, Lk)
    o_shape = tuple(abi.o_shape(var, B, Lq))
    if ado.shape != o_shape:
        raise ValueError(f"dO: expected the output's shape {o_shape}, got {ado.shape}")
    dev = cupy.cuda.Device().id
    for name, a in (("q", aq), ("k", ak), ("v", av), ("dO", ado), *given.items()):
        if a.device != dev:
            raise ValueError(f"{name}: expected an array on the current device cuda:{dev}, got cuda:{a.device}")
    if (o is None) != (lse is None):
        raise ValueError("o, lse: expected both (the forward's saved output and LSE) or neither, got one")
    if o is None:
        where = {} if placed.is_plain else dict(q_offset=q_offset, kv_offset=kv_offset, Lq_total=Lq_total, Lk_total=Lk_total)
        fwd_inputs = {n: a for n, a in inputs.items() if n not in o_norm_inputs(var)}
        o, lse = _forward_with_lse(kernel)(q, k, v, stream=stream, **where, **fwd_inputs)
    ao, al = runtime._view(o, "o"), runtime._view(lse, "lse")
    runtime._check_dtype(ao, var.dtype, "o")
    if ao.shape != o_shape:
        raise ValueError(f"o: expected shape {o_shape}, got {ao.shape}")
    lse_shape = tuple(abi.lse_shape(var, B, Lq))  # [B, H, Lq]; varlen [H, total_q]
    lse_strides = tuple(int(x) for x in reversed(np.cumprod((1, *reversed(lse_shape[1:])))))
    if al.dtype != "float32" or al.shape != lse_shape or al.strides != lse_strides:
        raise ValueError(f"lse: expected a contiguous float32 array of shape {lse_shape}, got {al.dtype} {al.shape} strides {al.strides}")
    adl = None
    if dlse is not None:
        adl = runtime._view(dlse, "dlse")
        if adl.dtype != "float32" or adl.shape != lse_shape or adl.strides != lse_strides:
            raise ValueError(f"dlse: expected a contiguous float32 array of shape {lse_shape}, got {adl.dtype} {adl.shape} strides {adl.strides}")
        if adl.is_torch != aq.is_torch or adl.device != dev:
            raise ValueError(f"dlse: expected a {'torch tensor' if aq.is_torch else 'CuPy array'} on cuda:{dev} like q")

    def strides3(a, name: str) -> tuple[int, int, int]:
        if a.strides[-1] != 1:
            raise ValueError(f"{name}: expected the last dimension to be contiguous (stride 1), got strides {a.strides}")
        if var.layout == Layout.VARLEN:  # packed [total, heads, D]: no batch stride (the kernels move to each sequence's rows)
            return 0, a.strides[1], a.strides[0]
        if len(a.shape) == 3 and abi.q_token_flat(var):  # q (and dq) as a flat [B, L, H*D] hidden state
            return a.strides[0], var.head_dim, a.strides[1]
        if len(a.shape) != 4:
            raise ValueError(f"{name}: expected a 4-dimensional array, got shape {a.shape}")
        if var.layout == Layout.BHSD:
            return a.strides[0], a.strides[1], a.strides[2]
        return a.strides[0], a.strides[2], a.strides[1]

    if bk.plan.engine != BwdEngine.FFMA:
        # The tensor-core kernels copy rows of these with 16-byte cp.async.
        for a, n, read in ((aq, "q", not bk.plan.q_norm), (ak, "k", not bk.plan.k_norm), (av, "v", True), (ado, "dO", not bk.plan.o_norm)):
            if not read:
                continue
            bad = [s for s in strides3(a, n) if s % 8]
            if bad:
                raise ValueError(f"{n}: expected every stride to be a multiple of 8 elements (16 bytes) for the tensor-core backward, got strides {a.strides}")
            if a.ptr % 16:
                raise ValueError(f"{n}: expected a 16-byte aligned data pointer for the tensor-core backward")

    if stream is None:
        if aq.is_torch:
            import torch

            stream = runtime._external_stream(torch.cuda.current_stream().cuda_stream)
        else:
            stream = cupy.cuda.get_current_stream()
    elif not isinstance(stream, (cupy.cuda.Stream, cupy.cuda.ExternalStream)):
        stream = runtime._external_stream(int(getattr(stream, "cuda_stream", stream)))
    grads = [runtime._empty(a.shape, var.dtype, aq.is_torch, aq.obj, stream) for a in (aq, ak, av)]
    agq, agk, agv = (runtime._view(g, n) for g, n in zip(grads, ("dq", "dk", "dv")))
    bp = bk.plan
    elem = {DType.FP32: cupy.float32, DType.FP16: cupy.float16, DType.BF16: cupy.uint16}[var.dtype]
    # Rows of the per-row workspaces: B * H * Lq; varlen H * total_q (the packed rows, [H, total_q] like the LSE).
    nb = 1 if bp.varlen else B
    # Workspaces in the launch stream's order (they grow with B*L, never Lq*Lk), from the caller's
    # library: torch's caching allocator is CUDA-graph aware, so a captured backward allocates
    # from the graph's pool instead of calling cudaMalloc inside the capture.
    if aq.is_torch:
        import torch

        tdev = aq.obj.device
        with _torch_stream(stream.ptr, tdev):
            def alloc(n: int, fp32: bool) -> Any:
                dt = torch.float32 if fp32 else {DType.FP32: torch.float32, DType.FP16: torch.float16, DType.BF16: torch.bfloat16}[var.dtype]
                return torch.empty(n, dtype=dt, device=tdev)

            delta = alloc(nb * var.heads * Lq, True)
            ws_dq = alloc(nb * var.heads * Lq * var.head_dim, True)
            ws = {"ws_q": alloc(nb * var.heads * Lq * var.head_dim, False) if bp.q_norm else None,
                  "ws_k": alloc(nb * var.kv_heads * Lk * var.head_dim, False) if bp.k_norm else None,
                  "ws_dk": alloc(nb * var.kv_heads * Lk * var.head_dim, True) if bp.k_norm else None,
                  "ws_do": alloc(nb * var.heads * Lq * var.value_head_dim, False) if bp.o_norm else None}
    else:
        with stream:
            delta = cupy.empty(nb * var.heads * Lq, dtype=cupy.float32)
            ws_dq = cupy.empty(nb * var.heads * Lq * var.head_dim, dtype=cupy.float32)
            ws = {"ws_q": cupy.empty(nb * var.heads * Lq * var.head_dim, dtype=elem) if bp.q_norm else None,
                  "ws_k": cupy.empty(nb * var.kv_heads * Lk * var.head_dim, dtype=elem) if bp.k_norm else None,
                  "ws_dk": cupy.empty(nb * var.kv_heads * Lk * var.head_dim, dtype=cupy.float32) if bp.k_norm else None,
                  "ws_do": cupy.empty(nb * var.heads * Lq * var.value_head_dim, dtype=elem) if bp.o_norm else None}

    def ptr(a: Any) -> np.uint64:
        return np.uint64(a.data_ptr() if aq.is_torch else a.data.ptr)

    args: list[Any] = [np.uint64(a.ptr) for a in (aq, ak, av, ao, ado, al, agq, agk, agv)]
    args += [ptr(delta), ptr(ws_dq)]
    args += [ptr(ws[f.name]) for f in bp.fields if f.name in ws]
    args += [np.int32(B), np.int32(Lq), np.int32(Lk), np.int32(pos.q_offset), np.int32(pos.kv_offset),
             np.int32(pos.Lq_total), np.int32(pos.Lk_total)]
    if bp.varlen:
        args += [np.int32(Lq), np.int32(Lk)]  # total_q, total_k
    for a, n in ((aq, "q"), (ak, "k"), (av, "v"), (ao, "o"), (ado, "dO"), (agq, "dq"), (agk, "dk"), (agv, "dv")):
        args += [np.int64(s) for s in strides3(a, n)]
    for d in var.runtime_inputs():
        a = given[d.name]
        runtime._check_dtype(a, d.dtype, d.name)
        args.append(np.uint64(a.ptr))
        args.extend(np.int32(n) for n in a.shape)
        args.extend(np.int64(s) for s in a.strides)
    param_grads: dict[str, Any] = {}
    for name in allowed:
        if name in wrt:
            if name not in given:
                raise ValueError(f"wrt: {name!r} is not an input of this call (affine-free norms have no weights)")
            shape = given[name].shape
            if aq.is_torch:
                import torch

                with _torch_stream(stream.ptr, aq.obj.device):
                    param_grads[name] = torch.zeros(shape, dtype=torch.float32, device=aq.obj.device)
            else:
                with stream:
                    param_grads[name] = cupy.zeros(shape, dtype=cupy.float32)
            args.append(np.uint64(runtime._view(param_grads[name], name).ptr))
        else:
            args.append(np.uint64(0))
    # The wgmma dK/dV kernel's TMA descriptors (plan_bwd.wg_tma_maps), after the ABI fields: the
    # tensors' own strides, or a workspace's [B, heads, L, cols] rows.
    maps = ()
    specs = wg_tma_maps(bp, var) if bp.wg_loads is not None else ()
    if specs:
        from attngen.cuda.render import TmaMap
        from attngen.runtime.binder import tmap_scalar

        views = {"q": aq, "k": ak, "v": av, "dO": ado}
        mlist = []
        for m in specs:
            L = Lq if m.length == "Lq" else Lk
            dims = m.dims(B, L)
            if m.tensor in views:
                sb, sh, ss = strides3(views[m.tensor], m.tensor)
                p = views[m.tensor].ptr
            else:
                ss, sh, sb = m.dense_strides(L)
                p = int(ptr(ws_dq if m.tensor == "ws_dq" else ws[m.tensor]))
            dt, size = ("fp32", 4) if m.fp32 else (var.dtype.value, var.dtype.itemsize)
            mlist.append(tmap_scalar(dt, p, dims, TmaMap.byte_strides(dims, (ss, sh, sb), size), (m.box_cols, m.rows, 1, 1), m.tensor))
        maps = tuple(mlist)
    for kern in bp.kernels:
        grid = bp.grid(kern.func, B, Lq, Lk, var.heads, var.kv_heads, var.head_dim)
        kargs = tuple(args) + (maps if kern.func == "ag_bwd_dkdv" else ())
        bk.functions[kern.func](grid, (kern.threads,), kargs, shared_mem=kern.smem, stream=stream)
        if kern.func == "ag_bwd_pre" and adl is not None:
            # A loss that reads the LSE: dS = P * (dP - delta) + P * dlse = P * (dP - (delta - dlse)).
            if aq.is_torch:
                with _torch_stream(stream.ptr, tdev):
                    delta.sub_(adl.obj.reshape(-1))
            else:
                with stream:
                    delta -= adl.obj.reshape(-1)
    # The workspaces were allocated in the launch stream's order: dropping them here is safe.
    if wrt:
        return grads[0], grads[1], grads[2], {n: param_grads[n] for n in wrt}
    return grads[0], grads[1], grads[2]


__all__ = ["BackwardKernels", "apply_o_norm", "backward", "compile_backward", "o_norm_inputs", "training_variant"]
