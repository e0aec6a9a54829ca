"""`attngen bench`'s peers: torch SDPA (flash, cuDNN) where a variant is expressible, torch eager
norm + SDPA + residual for fused-norm variants, and FlexAttention compiled by torch.compile."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from attngen.ir.nodes import Builtin, BuiltinName, Const, DType, Layout, Variant


def mask_is_true(v: Variant) -> bool:
    """Whether the variant has no mask (every score visible)."""
    return isinstance(v.mask, Const) and v.mask.value is True


def sdpa_expressible(v: Variant, Lq: int, Lk: int) -> str | None:
    """None when torch SDPA computes exactly this variant (norms aside), else why not."""
    if v.dtype == DType.FP32:
        return "fp32 (flash and cuDNN are fp16/bf16 only)"
    if v.scores:
        return "score modification"
    if v.head_dim != v.value_head_dim:
        return "Dv != D"
    if mask_is_true(v):
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
    causal = not mask_is_true(v)

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
    if not mask_is_true(v):
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

    if compiled:
        from attngen.check.flex import raise_recompile_limits

        raise_recompile_limits()
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
