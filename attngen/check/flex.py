"""IR → PyTorch FlexAttention: an independent GPU oracle and the peer `attngen bench` races.

`to_flex` walks a variant's mask and score expressions into torch ops and returns FlexAttention's
`mask_mod(b, h, q_idx, kv_idx)` and `score_mod(score, b, h, q_idx, kv_idx)`. The same functions
broadcast, so calling them on `arange` grids gives the dense mask (that is how they are tested on
the CPU against `attngen.reference`).

Semantics carried over exactly from the IR (see `attngen.ir.nodes`):
* integer `/` and `%` are floor division / floor modulo, and dividing by zero gives 0;
* a lookup `t[i, j]` outside t's bounds reads 0: indices are clamped into range for the gather and
  the result is replaced by 0 where any index was out of range (never a read outside the tensor);
* runtime tensors are captured by the closures (moved to the device given);
* `alibi` without a tensor reads standard (BLOOM) slopes, computed here.

Not expressible in FlexAttention alone: pre-norms on q/k, the post-norm on o and the residual.
`run_flex` applies them in torch around the flex call (in fp32, rounding normalised q/k to the spec
dtype as the numerics contract says), so it is a complete oracle but, for those variants, not a
single fused kernel; `not_in_flex(variant)` lists what it had to do outside.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from attngen.ir.dtypes import by_numpy_name
from attngen.ir.nodes import (
    ALIBI_SLOPES,
    BLOCK_TABLE,
    Binary,
    BinOp,
    Builtin,
    Call,
    Const,
    DType,
    Expr,
    Func,
    Index,
    IndexVar,
    Layout,
    Load,
    NormKind,
    NormScope,
    NormTarget,
    ScalarType,
    Score,
    Size,
    SizeSym,
    TensorRef,
    Unary,
    UnOp,
    Variant,
    norm_bias_name,
    norm_weight_name,
    walk,
)

MaskMod = Callable[..., Any]
ScoreMod = Callable[..., Any]


def _torch():
    import torch

    return torch


def torch_dtype(d: DType):
    """The torch dtype of an IR element type."""
    return getattr(_torch(), d.info.torch)


def standard_alibi_slopes(n_heads: int) -> list[float]:
    """BLOOM's ALiBi slopes: a geometric sequence 2^(-8/n · i), interleaved for non-powers of 2."""

    def pow2(n: int) -> list[float]:
        start = 2.0 ** (-(2.0 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if n_heads <= 0:
        return []
    if math.log2(n_heads).is_integer():
        return pow2(n_heads)
    closest = 2 ** math.floor(math.log2(n_heads))
    return pow2(closest) + standard_alibi_slopes(2 * closest)[0::2][: n_heads - closest]


def _alibi_slopes(v: Variant) -> list[float]:
    # Prefer the reference's own slopes so that the oracle and the reference agree by construction
    # if it defines them; fall back to BLOOM's formula.
    try:
        from attngen.check import reference

        for name in ("standard_alibi_slopes", "alibi_slopes", "standard_slopes"):
            fn = getattr(reference, name, None)
            if callable(fn):
                return [float(x) for x in fn(v.heads)]
    except Exception:
        pass
    return standard_alibi_slopes(v.heads)


def _size_values(v: Variant, B: int | None, Lq: int | None, Lk: int | None) -> dict[SizeSym, int | None]:
    return {
        SizeSym.B: B,
        SizeSym.H: v.heads,
        SizeSym.HKV: v.kv_heads,
        SizeSym.LQ: Lq,
        SizeSym.LK: Lk,
        SizeSym.D: v.head_dim,
        SizeSym.DV: v.value_head_dim,
    }


class _Compiler:
    """Turns IR expressions into closures over an environment of index/score tensors."""

    def __init__(self, v: Variant, sizes: dict[SizeSym, int | None], tensors: Mapping[str, Any], device: Any):
        self.torch = _torch()
        self.v = v
        self.sizes = sizes
        self.device = device
        self.tensors = dict(tensors)
        t = self.torch
        # Constants are created once, on the device, so the closures allocate nothing per call.
        self.i0 = t.tensor(0, dtype=t.int64, device=device)
        self.i1 = t.tensor(1, dtype=t.int64, device=device)
        self.f0 = t.tensor(0.0, dtype=t.float32, device=device)

    def const(self, c: Const):
        t = self.torch
        if c.type == ScalarType.BOOL:
            val = t.tensor(bool(c.value), dtype=t.bool, device=self.device)
        elif c.type == ScalarType.INT:
            val = t.tensor(int(c.value), dtype=t.int64, device=self.device)
        else:
            val = t.tensor(float(c.value), dtype=t.float32, device=self.device)
        return lambda env: val

    def compile(self, e: Expr) -> Callable[[dict], Any]:
        t = self.torch
        if isinstance(e, Builtin):
            return self.compile(e.body)
        if isinstance(e, Const):
            return self.const(e)
        if isinstance(e, Index):
            key = e.var
            return lambda env: env[key]
        if isinstance(e, Score):
            return lambda env: env["s"]
        if isinstance(e, Size):
            val = self.sizes.get(e.sym)
            if val is None:
                raise ValueError(f"the expression reads size {e.sym.value}, which needs a value: pass sizes to to_flex")
            c = t.tensor(int(val), dtype=t.int64, device=self.device)
            return lambda env: c
        if isinstance(e, TensorRef):
            raise ValueError(f"tensor {e.name!r} used as a value outside a lookup")
        if isinstance(e, Load):
            return self.load(e)
        if isinstance(e, Unary):
            f = self.compile(e.operand)
            if e.op == UnOp.NOT:
                return lambda env: t.logical_not(f(env))
            return lambda env: -f(env)
        if isinstance(e, Binary):
            return self.binary(e)
        if isinstance(e, Call):
            return self.call(e)
        raise TypeError(f"unknown IR node {type(e).__name__}")

    def load(self, e: Load) -> Callable[[dict], Any]:
        t = self.torch
        if e.tensor in self.tensors:
            tensor = self.tensors[e.tensor]
        elif e.tensor == ALIBI_SLOPES:
            tensor = t.tensor(_alibi_slopes(self.v), dtype=t.float32, device=self.device)
        else:
            raise ValueError(f"runtime input {e.tensor!r} was not given to to_flex")
        if tensor.dim() != len(e.indices):
            raise ValueError(f"{e.tensor}: indexed with {len(e.indices)} indices but has rank {tensor.dim()}")
        tensor = tensor.to(self.device)
        # Integers compute in int64 (indices and values), floats in fp32: the reference's float64
        # is out of reach of the fused kernels anyway, and fp32 is what Flex passes as the score.
        tensor = tensor.to(t.int64) if not tensor.dtype.is_floating_point else tensor.to(t.float32)
        zero = self.i0 if e.type == ScalarType.INT else self.f0
        if e.type == ScalarType.BOOL:
            zero = t.tensor(False, device=self.device)
        dims = list(tensor.shape)
        idx = [self.compile(i) for i in e.indices]

        def fn(env):
            raw = [f(env) for f in idx]
            inb = None
            clamped = []
            for r, n in zip(raw, dims):
                ok = (r >= 0) & (r < n)
                inb = ok if inb is None else (inb & ok)
                clamped.append(r.clamp(0, n - 1))
            val = tensor[tuple(clamped)]
            return t.where(inb, val, zero) if inb is not None else val

        return fn

    def binary(self, e: Binary) -> Callable[[dict], Any]:
        t = self.torch
        lf, rf = self.compile(e.lhs), self.compile(e.rhs)
        op = e.op
        integer = e.lhs.type == ScalarType.INT and e.rhs.type == ScalarType.INT
        if op == BinOp.ADD:
            return lambda env: lf(env) + rf(env)
        if op == BinOp.SUB:
            return lambda env: lf(env) - rf(env)
        if op == BinOp.MUL:
            return lambda env: lf(env) * rf(env)
        if op in (BinOp.DIV, BinOp.MOD):
            i0, i1 = self.i0, self.i1
            if integer:
                # Floor semantics, and x / 0 == x % 0 == 0, as in the IR.
                def idiv(env):
                    a, b = lf(env), rf(env)
                    zero = b == 0
                    safe = t.where(zero, i1, b)
                    r = t.div(a, safe, rounding_mode="floor") if op == BinOp.DIV else t.remainder(a, safe)
                    return t.where(zero, i0, r)

                return idiv
            if op == BinOp.DIV:
                return lambda env: t.true_divide(lf(env), rf(env))
            return lambda env: t.remainder(lf(env), rf(env))
        if op == BinOp.LT:
            return lambda env: lf(env) < rf(env)
        if op == BinOp.LE:
            return lambda env: lf(env) <= rf(env)
        if op == BinOp.GT:
            return lambda env: lf(env) > rf(env)
        if op == BinOp.GE:
            return lambda env: lf(env) >= rf(env)
        if op == BinOp.EQ:
            return lambda env: lf(env) == rf(env)
        if op == BinOp.NE:
            return lambda env: lf(env) != rf(env)
        if op == BinOp.AND:
            return lambda env: t.logical_and(lf(env), rf(env))
        if op == BinOp.OR:
            return lambda env: t.logical_or(lf(env), rf(env))
        raise TypeError(f"unknown binary operator {op}")

    def call(self, e: Call) -> Callable[[dict], Any]:
        t = self.torch
        args = [self.compile(a) for a in e.args]
        f = e.func
        to_float = e.type == ScalarType.FLOAT

        def fl(x):
            # tanh/exp/log/sqrt of an integer argument compute in fp32 (the IR types them FLOAT).
            return x if x.dtype.is_floating_point else x.to(t.float32)

        if f == Func.TANH:
            return lambda env: t.tanh(fl(args[0](env)))
        if f == Func.EXP:
            return lambda env: t.exp(fl(args[0](env)))
        if f == Func.LOG:
            return lambda env: t.log(fl(args[0](env)))
        if f == Func.SQRT:
            return lambda env: t.sqrt(fl(args[0](env)))
        if f == Func.ABS:
            return lambda env: t.abs(args[0](env))
        if f in (Func.MIN, Func.MAX):
            g = t.minimum if f == Func.MIN else t.maximum

            def mm(env):
                a, b = args[0](env), args[1](env)
                if to_float:
                    a, b = fl(a), fl(b)
                return g(a, b)

            return mm
        if f == Func.WHERE:

            def wh(env):
                a, b = args[1](env), args[2](env)
                if to_float:
                    a, b = fl(a), fl(b)
                return t.where(args[0](env), a, b)

            return wh
        raise TypeError(f"unknown function {f}")


def _uses(e: Expr, var: IndexVar) -> bool:
    return any(isinstance(n, Index) and n.var == var for n in walk(e))


def to_flex(
    variant: Variant,
    *,
    inputs: Mapping[str, Any] | None = None,
    B: int | None = None,
    Lq: int | None = None,
    Lk: int | None = None,
    device: Any = None,
) -> tuple[MaskMod | None, ScoreMod | None]:
    """FlexAttention `mask_mod` and `score_mod` for a variant (None where it has no mask/score).

    `inputs` are the runtime tensors the expressions read (torch tensors or arrays; captured);
    B, Lq, Lk are needed when the expressions mention those sizes (causal with cross attention
    aligns with Lk − Lq). Both functions also work on broadcast index grids outside Flex."""
    torch = _torch()
    tensors: dict[str, Any] = {}
    for name, val in (inputs or {}).items():
        if name in ("q", "k", "v"):
            continue
        tensors[name] = _as_torch(val, device)
    if device is None:
        device = next((x.device for x in tensors.values()), torch.device("cpu"))
    comp = _Compiler(variant, _size_values(variant, B, Lq, Lk), tensors, device)

    mask_mod = None
    mask = variant.visibility()  # a paged cache's lengths bound it too
    if not (isinstance(mask, Const) and mask.value is True):
        mf = comp.compile(mask)

        def mask_mod(b, h, q_idx, kv_idx):
            env = {IndexVar.B: b.to(torch.int64) if hasattr(b, "to") else b,
                   IndexVar.H: h.to(torch.int64) if hasattr(h, "to") else h,
                   IndexVar.Q: q_idx.to(torch.int64), IndexVar.KV: kv_idx.to(torch.int64)}
            return mf(env)

        mask_mod.__name__ = f"mask_{variant.name}"

    score_mod = None
    if variant.scores:
        sfs = [comp.compile(s) for s in variant.scores]

        def score_mod(score, b, h, q_idx, kv_idx):
            env = {IndexVar.B: b.to(torch.int64), IndexVar.H: h.to(torch.int64),
                   IndexVar.Q: q_idx.to(torch.int64), IndexVar.KV: kv_idx.to(torch.int64)}
            s = score
            for f in sfs:
                env["s"] = s
                s = f(env)
                if s.dtype != score.dtype:
                    s = s.to(score.dtype)
            return s

        score_mod.__name__ = f"score_{variant.name}"
    return mask_mod, score_mod


def _as_torch(x: Any, device: Any = None):
    """A torch tensor for a torch tensor, CuPy array or NumPy array (bf16 via a uint16 view)."""
    torch = _torch()
    if isinstance(x, torch.Tensor):
        return x if device is None else x.to(device)
    if hasattr(x, "__cuda_array_interface__") or hasattr(x, "__dlpack__") and not hasattr(x, "__array_interface__"):
        t = torch.from_dlpack(x) if hasattr(x, "__dlpack__") else torch.as_tensor(x, device="cuda")
        return t if device is None else t.to(device)
    import numpy as np

    arr = np.asarray(x)
    row = by_numpy_name(arr.dtype.name)
    if row is not None and row.foreign:
        t = torch.from_numpy(np.ascontiguousarray(arr).view(row.bits)).view(getattr(torch, row.torch))
    else:
        t = torch.from_numpy(np.ascontiguousarray(arr))
    return t if device is None else t.to(device)


def mask_uses(variant: Variant) -> tuple[bool, bool]:
    """Whether the mask reads b and h (so the block mask must be built per batch / head)."""
    mask = variant.visibility()
    return _uses(mask, IndexVar.B), _uses(mask, IndexVar.H)


def not_in_flex(variant: Variant) -> list[str]:
    """What `run_flex` computes in torch around FlexAttention (empty: pure Flex)."""
    out = [f"{n.target.value}-norm ({n.kind.value}, scope {n.scope.value})" for n in variant.norms]
    if variant.residual:
        out.append("residual")
    if variant.sink is not None:
        out.append(f"sink {variant.sink}")
    return out


def _norm(x, kind: NormKind, eps: float, weight, bias):
    """Layer/RMS norm over the last dim in fp32."""
    torch = _torch()
    xf = x.to(torch.float32)
    if kind == NormKind.LAYERNORM:
        mu = xf.mean(dim=-1, keepdim=True)
        xc = xf - mu
        var = (xc * xc).mean(dim=-1, keepdim=True)
        y = xc * torch.rsqrt(var + eps)
    else:
        ms = (xf * xf).mean(dim=-1, keepdim=True)
        y = xf * torch.rsqrt(ms + eps)
    if weight is not None:
        y = y * weight.to(torch.float32)
    if bias is not None:
        y = y + bias.to(torch.float32)
    return y


_COMPILED: dict[str, Any] = {}


def _call_flex(fn, q, k, v, score_mod, block_mask, scale: float, gqa: bool):
    """flex_attention returning (O, LSE): `return_aux` where this torch has it, else `return_lse`."""
    try:
        from torch.nn.attention.flex_attention import AuxRequest
    except ImportError:  # torch < 2.9
        return fn(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale, enable_gqa=gqa, return_lse=True)
    o, aux = fn(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale, enable_gqa=gqa,
                return_aux=AuxRequest(lse=True))
    return o, aux.lse


def raise_recompile_limits() -> None:
    """Let torch.compile recompile one function for many shapes and variants, and fail loudly past that.

    Every shape and every variant's mods is a recompile of the same frame (flex_attention's, or a
    peer pipeline's); past dynamo's default limit (8) it silently runs that frame eagerly, ~100x
    slower for Flex, which a benchmark would report as the peer's speed."""
    import torch._dynamo.config as dynamo_config

    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(dynamo_config, name):
            setattr(dynamo_config, name, max(getattr(dynamo_config, name), 1024))
    for name in ("accumulated_recompile_limit", "accumulated_cache_size_limit"):
        if hasattr(dynamo_config, name):
            setattr(dynamo_config, name, max(getattr(dynamo_config, name), 4096))
    for name in ("fail_on_recompile_limit_hit", "fail_on_cache_limit_hit"):
        if hasattr(dynamo_config, name):
            setattr(dynamo_config, name, True)


def compiled_flex():
    """`torch.compile(flex_attention)`, made once per process (Flex is only fast compiled)."""
    if "flex" not in _COMPILED:
        torch = _torch()
        from torch.nn.attention.flex_attention import flex_attention

        raise_recompile_limits()
        _COMPILED["flex"] = torch.compile(flex_attention, dynamic=False)
    return _COMPILED["flex"]


def make_block_mask(variant: Variant, mask_mod: MaskMod | None, B: int, Lq: int, Lk: int, device: Any):
    """A Flex BlockMask for the variant's mask (None when it has none)."""
    if mask_mod is None:
        return None
    from torch.nn.attention.flex_attention import create_block_mask

    uses_b, uses_h = mask_uses(variant)
    return create_block_mask(mask_mod, B if uses_b else None, variant.heads if uses_h else None, Lq, Lk,
                             device=device)


def prepare_flex(
    variant: Variant,
    q: Any,
    k: Any,
    v: Any,
    inputs: Mapping[str, Any] | None = None,
    *,
    compiled: bool = True,
    upcast: bool = False,
) -> Callable[[], tuple[Any, Any]]:
    """Everything `run_flex` does, split so the block mask and mods are built once: returns a
    function that runs the whole computation (norms, flex, epilogue) and returns (O, LSE).

    The returned `run(q, k, v)` may be given other tensors of the same shapes (the benchmark's
    rotating input sets). q/k/v are torch tensors (or CuPy/NumPy arrays) in the variant's layout; q may be the flat
    [B, Lq, H*D] hidden state of a token-scope pre-norm variant. O comes back in the variant's
    layout ([B, Lq, H, Dv] for bshd) and spec dtype; LSE fp32 [B, H, Lq], −inf on empty rows.

    `upcast=True` runs Flex in fp32 on the (spec-dtype-rounded) inputs: on the CPU, eager Flex
    computes in the input dtype, which would make a bf16 cross-check meaningless."""
    torch = _torch()
    from torch.nn.attention.flex_attention import flex_attention

    q = _as_torch(q)
    device = q.device
    ins = {n: _as_torch(x, device) for n, x in (inputs or {}).items()}
    dt = torch_dtype(variant.dtype)
    H, Hkv, D = variant.heads, variant.kv_heads, variant.head_dim
    bshd = variant.layout == Layout.BSHD

    def unpage(x: Any) -> Any:
        # A paged cache [num_pages, N, Hkv, D] gathered through the block table [B, P] into the
        # variant's layout with Lk = P * N (Flex attends over contiguous keys).
        x = _as_torch(x)
        if variant.page_size is None:
            return x
        table = ins[BLOCK_TABLE].long()
        g = x[table]  # [B, P, N, Hkv, D]
        g = g.reshape(g.shape[0], g.shape[1] * g.shape[2], g.shape[3], g.shape[4])
        return g if bshd else g.transpose(1, 2)

    k, v = unpage(k), unpage(v)
    B = q.shape[0]
    Lq = q.shape[1] if bshd else q.shape[2]
    Lk = k.shape[1] if bshd else k.shape[2]
    if q.dim() == 3:  # flat hidden state [B, Lq, H*D]
        q = q.reshape(B, Lq, H, D)
    mask_mod, score_mod = to_flex(variant, inputs=ins, B=B, Lq=Lq, Lk=Lk, device=device)
    block_mask = make_block_mask(variant, mask_mod, B, Lq, Lk, device)
    fn = compiled_flex() if compiled else flex_attention
    scale = variant.effective_scale
    qn, kn, on = variant.norm(NormTarget.Q), variant.norm(NormTarget.K), variant.norm(NormTarget.O)

    def w(target: NormTarget, bias: bool):
        name = norm_bias_name(target) if bias else norm_weight_name(target)
        return ins.get(name)

    def run(q_: Any = None, k_: Any = None, v_: Any = None) -> tuple[Any, Any]:
        # Other q/k/v of the same shapes reuse the mods and block mask (and torch.compile's graph:
        # new closures per input set would recompile Flex each time).
        qq = q if q_ is None else _as_torch(q_).reshape(q.shape)
        kk = k if k_ is None else unpage(k_)
        vv = v if v_ is None else unpage(v_)
        xq = qq
        if qn is not None:
            if qn.scope == NormScope.TOKEN:
                flat = qq.reshape(B, Lq, H * D) if bshd else qq.transpose(1, 2).reshape(B, Lq, H * D)
                y = _norm(flat, qn.kind, qn.eps, w(NormTarget.Q, False), w(NormTarget.Q, True)).to(dt)
                qq = y.reshape(B, Lq, H, D) if bshd else y.reshape(B, Lq, H, D).transpose(1, 2)
            else:
                qq = _norm(qq, qn.kind, qn.eps, w(NormTarget.Q, False), w(NormTarget.Q, True)).to(dt)
        if kn is not None:
            if kn.scope == NormScope.TOKEN:
                flat = kk.reshape(B, Lk, Hkv * D) if bshd else kk.transpose(1, 2).reshape(B, Lk, Hkv * D)
                y = _norm(flat, kn.kind, kn.eps, w(NormTarget.K, False), w(NormTarget.K, True)).to(dt)
                kk = y.reshape(B, Lk, Hkv, D) if bshd else y.reshape(B, Lk, Hkv, D).transpose(1, 2)
            else:
                kk = _norm(kk, kn.kind, kn.eps, w(NormTarget.K, False), w(NormTarget.K, True)).to(dt)
        if bshd:
            qq, kk, vv = qq.transpose(1, 2), kk.transpose(1, 2), vv.transpose(1, 2)
        if upcast:
            qq, kk, vv = qq.to(dt).float(), kk.to(dt).float(), vv.to(dt).float()
        o, lse = _call_flex(fn, qq, kk, vv, score_mod, block_mask, scale, H != Hkv)
        # Rows with nothing visible: O = 0 and LSE = -inf, whatever Flex left there.
        empty = torch.isneginf(lse) | torch.isnan(lse)
        lse = torch.where(empty, torch.full_like(lse, -math.inf), lse.to(torch.float32))
        o = torch.where(empty[..., None], torch.zeros_like(o), o)
        if variant.sink is not None:
            # The sink joins the denominator: LSE' = logaddexp(LSE, sink[h]), O scaled by
            # exp(LSE - LSE') (0 on empty rows, whose LSE' is the sink).
            sk = ins[variant.sink].to(device=lse.device, dtype=torch.float32).reshape(1, H, 1)
            lse2 = torch.logaddexp(lse, sk.expand_as(lse))
            o = (o.to(torch.float32) * torch.exp(lse - lse2)[..., None]).to(o.dtype)
            lse = lse2
        if on is not None or variant.residual:
            of = o.to(torch.float32)
            if on is not None:
                # The kernel's epilogue normalises O after dividing by l; O is rounded to the
                # spec dtype first, as an unfused pipeline would store it.
                of = _norm(of.to(dt), on.kind, on.eps, w(NormTarget.O, False), w(NormTarget.O, True))
            if variant.residual:
                xb = xq.transpose(1, 2) if bshd else xq
                of = of + xb.to(torch.float32)
            o = of.to(dt)
        else:
            o = o.to(dt)
        if bshd:
            o = o.transpose(1, 2)
        return o, lse

    return run


def run_flex(
    variant: Variant,
    q: Any,
    k: Any,
    v: Any,
    inputs: Mapping[str, Any] | None = None,
    *,
    compiled: bool = True,
    upcast: bool = False,
) -> tuple[Any, Any]:
    """Compute a variant with FlexAttention (plus torch norms/residual): returns (O, LSE)."""
    if variant.layout == Layout.VARLEN:
        # FlexAttention takes padded [B, H, L, D] batches; the varlen reference is checked against
        # the dense one per sequence instead (tests/reference).
        raise ValueError(f"variant {variant.name}: `layout varlen` has no FlexAttention oracle (it takes padded batches)")
    if compiled:
        return prepare_flex(variant, q, k, v, inputs, compiled=True, upcast=upcast)()
    import warnings

    with warnings.catch_warnings():
        # Eager Flex warns that it materialises the scores: expected for an oracle on small shapes.
        warnings.simplefilter("ignore")
        return prepare_flex(variant, q, k, v, inputs, compiled=False, upcast=upcast)()
