"""attngen as a Hugging Face transformers attention implementation (the `attngen[hf]` extra).

    import attngen.integrations.transformers             # registers "attngen"
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="attngen")

Importing this module registers an attention function and its mask function under the name
`attngen` (`AttentionInterface.register`, `AttentionMaskInterface.register`: transformers 4.53 or
newer, where the mask interface appeared; without a registered mask function transformers hands a
custom implementation no mask at all, and padding would be lost). Each call of an attention module:

1. builds the module's `.attn` spec (`spec_text`) from validated numbers and enums only: heads and
   kv heads (from the tensors' shapes), head dims, the scaling, `is_causal`, `sliding_window`, the
   logit softcap (Gemma-2), attention sinks (gpt-oss) and the dtype. The parsed variant is cached
   by those numbers (`SpecParams`), so every layer of a model shares one compiled kernel.
2. reads the mask (`mask_plan`): none (the module's own causal/window pattern over every key), a
   2-D padding mask, or the 4-D boolean or additive mask transformers builds. A 4-D mask is proven,
   element by element, to be the module's pattern restricted to one contiguous range of keys per
   batch row (padding on either side, or the empty slots of a static cache); the range becomes
   the `padding` builtin's `kv_lens`, and a `kv_start` input for left padding. Packed sequences
   (position_ids that restart) become `document(doc_ids)`. Anything else (custom mask functions,
   an additive bias, a mask that differs between heads) raises `UnsupportedAttention` naming the
   attribute. The proof reads one result back from the device, once per mask tensor: all layers
   that share a mask share the proof.
3. runs (`execute`): CUDA tensors through the attngen torch op (autograd included); CPU tensors
   through the CPU backend where it is installed (training through the torch op's CPU backward),
   or through the NumPy float64 reference after `use_reference_on_cpu(True)` (a testing aid: slow, exact); otherwise it raises.
   There is never a silent fallback to eager attention.

Outputs match eager attention's on every row but one kind: a query row that sees no key at all (a
left-padded position under a causal mask) comes out as zeros, where eager attention averages over
masked keys. Such rows are padding, which losses and generated tokens never read.

Not supported, each with an error at the call: attention dropout while training, head masks,
returned attention weights, and masks other than the above.
"""

from __future__ import annotations

import enum
import math
import threading
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from attngen.ir.nodes import DType, Variant

NAME = "attngen"
SPEC_NAME = "hf_attention"

_DTYPES = {torch.float32: DType.FP32, torch.float16: DType.FP16, torch.bfloat16: DType.BF16}


class UnsupportedAttention(ValueError):
    """An attention module's attribute, argument or mask that attngen cannot express."""


class MaskMode(enum.Enum):
    """Which keys of a batch row a call sees, beyond the module's own causal/window pattern."""

    NONE = "none"  # every key
    PADDED = "padded"  # keys [0, kv_lens[b])
    RANGE = "range"  # keys [kv_start[b], kv_lens[b])
    DOCUMENTS = "documents"  # keys of the query's own document (packed sequences): doc_ids[b, i]


@dataclass(frozen=True, slots=True)
class SpecParams:
    """Everything a module's spec depends on; each field a validated number or enum."""

    dtype: DType
    heads: int
    kv_heads: int
    head_dim: int
    value_head_dim: int
    scale: float | None  # None: 1/sqrt(head_dim), the spec's `scale auto`
    causal: bool
    window: tuple[int, int] | None  # (left, right) of `window(left, right)`
    softcap: float | None
    sinks: bool
    mask: MaskMode
    cross: bool  # Lq != Lk at this call (decoding with a cache)


@dataclass(frozen=True, slots=True)
class MaskPlan:
    """What a mask asks of a call: its mode, how many leading keys to pass (trailing keys that no
    row sees, such as a static cache's empty slots, are cut), and the per-row key range as int32
    device tensors (None in mode NONE)."""

    mode: MaskMode
    keys: int
    kv_start: torch.Tensor | None = None
    kv_lens: torch.Tensor | None = None
    q_lens: torch.Tensor | None = None  # every query row runs: transformers masks keys only
    doc_ids: torch.Tensor | None = None  # int32 [B, Lk], non-decreasing along each row


def _float_literal(x: float) -> str:
    """A float as a spec literal that reads back as the same value."""
    text = repr(float(x))
    assert float(text) == float(x) and math.isfinite(float(x))
    return text


def spec_text(p: SpecParams) -> str:
    """The `.attn` source of one module's attention, in the canonical form `attngen fmt` prints."""
    dims = f"{p.head_dim}" if p.value_head_dim == p.head_dim else f"{p.head_dim} value {p.value_head_dim}"
    heads = f"{p.heads}" if p.kv_heads == p.heads else f"{p.heads} kv {p.kv_heads}"
    lines = [f"attention {SPEC_NAME} {{", f"  dtype {p.dtype.value}", f"  head_dim {dims}", f"  heads {heads}",
             "  layout bshd"]
    if p.cross:
        lines.append("  kind cross")
    if p.scale is not None:
        lines.append(f"  scale {_float_literal(p.scale)}")
    if p.mask == MaskMode.RANGE:
        lines.append("  input kv_start: i32[B]")
    if p.mask == MaskMode.DOCUMENTS:
        lines.append("  input doc_ids: i32[B, Lk] sorted")
    if p.sinks:
        lines.append("  input sinks: fp32[H]")
    terms = []
    if p.causal:
        terms.append("causal")
    if p.window is not None:
        terms.append(f"window({int(p.window[0])}, {int(p.window[1])})")
    if p.mask in (MaskMode.PADDED, MaskMode.RANGE):
        terms.append("padding")
    if p.mask == MaskMode.RANGE:
        terms.append("kv >= kv_start[b]")
    if p.mask == MaskMode.DOCUMENTS:
        terms.append("document(doc_ids)")
    if terms:
        lines.append("  mask " + " && ".join(terms))
    if p.softcap is not None:
        lines.append(f"  score softcap({_float_literal(p.softcap)})")
    if p.sinks:
        lines.append("  sink sinks")
    lines.append("}")
    return "\n".join(lines) + "\n"


_SPECS: dict[SpecParams, Variant] = {}
_SPECS_LOCK = threading.Lock()


def build_variant(p: SpecParams, owner: str = "attention") -> Variant:
    """The validated variant of `spec_text(p)`, parsed once per distinct `p`; a spec attngen
    refuses (a head dim it has no kernels for, say) raises UnsupportedAttention with its diagnostic."""
    v = _SPECS.get(p)
    if v is not None:
        return v
    from attngen.lang.diagnostics import SpecError
    from attngen.plan.validate import loads

    try:
        v = loads(spec_text(p), f"<{owner}>").get()
    except SpecError as e:
        raise UnsupportedAttention(f"{owner}: attngen cannot run this attention:\n{e}") from None
    with _SPECS_LOCK:
        return _SPECS.setdefault(p, v)


# ------------------------------------------------------------------------------------------------
# module attributes -> SpecParams


def _positive_int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or int(value) < 1:
        raise UnsupportedAttention(f"{what}: expected a positive integer, got {value!r}")
    return int(value)


def _positive_float(value: Any, what: str) -> float:
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise UnsupportedAttention(f"{what}: expected a positive number, got {value!r}") from None
    if isinstance(value, bool) or not math.isfinite(x) or x <= 0:
        raise UnsupportedAttention(f"{what}: expected a positive finite number, got {value!r}")
    return x


def _attribute(module: Any, name: str, default: Any = None) -> Any:
    """A plain attribute of a module, looked up without nn.Module's slow __getattr__ (which runs
    for every missing name, on every layer's every call)."""
    d = getattr(module, "__dict__", {})
    return d[name] if name in d else getattr(type(module), name, default)


def module_pattern(module: Any, is_causal: Any, sliding_window: Any) -> tuple[bool, tuple[int, int] | None]:
    """(causal, window) of a module: `is_causal` (the call's override, else the attribute) and
    `sliding_window` as transformers' masks define it: a causal window of w keys is the key itself
    and the w - 1 before it, `window(w - 1, 0)`; a bidirectional one reaches w keys either side."""
    name = type(module).__name__
    causal = _attribute(module, "is_causal", True) if is_causal is None else is_causal
    if not isinstance(causal, (bool, np.bool_)):
        raise UnsupportedAttention(f"{name}.is_causal: expected True or False, got {causal!r}")
    if sliding_window is None:
        return bool(causal), None
    w = _positive_int(sliding_window, f"{name}.sliding_window")
    return bool(causal), ((w - 1, 0) if causal else (w, w))


def spec_params(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *, scaling: Any,
                causal: bool, window: tuple[int, int] | None, softcap: Any, sinks: Any, plan: MaskPlan) -> SpecParams:
    """The SpecParams of one call: sizes from the tensors ([B, H, L, D], as transformers passes
    them), numbers from the module's arguments, each checked before it reaches the spec text."""
    name = type(module).__name__
    for t, what in ((query, "query"), (key, "key"), (value, "value")):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise UnsupportedAttention(f"{name}: {what}: expected a 4-D tensor [batch, heads, length, head_dim], "
                                       f"got {getattr(t, 'shape', type(t).__name__)}")
    dtype = _DTYPES.get(query.dtype)
    if dtype is None or key.dtype != query.dtype or value.dtype != query.dtype:
        raise UnsupportedAttention(f"{name}: query, key, value: expected one dtype of float32, float16, bfloat16, got "
                                   f"{query.dtype}, {key.dtype}, {value.dtype}")
    heads, kv_heads = int(query.shape[1]), int(key.shape[1])
    if kv_heads < 1 or heads % kv_heads or value.shape[1] != kv_heads:
        raise UnsupportedAttention(f"{name}: expected query heads a multiple of key/value heads, got {heads} query, "
                                   f"{kv_heads} key, {int(value.shape[1])} value heads")
    head_dim, value_head_dim = int(query.shape[3]), int(value.shape[3])
    if key.shape[3] != head_dim:
        raise UnsupportedAttention(f"{name}: key head dim {int(key.shape[3])} differs from the query's {head_dim}")
    scale = None
    if scaling is not None:
        scale = _positive_float(scaling, f"{name}.scaling")
        if math.isclose(scale, head_dim ** -0.5, rel_tol=1e-12):
            scale = None
    cap = None if softcap is None else _positive_float(softcap, f"{name}.attn_logit_softcapping (softcap)")
    if sinks is not None and (not isinstance(sinks, torch.Tensor) or tuple(sinks.shape) != (heads,)):
        raise UnsupportedAttention(f"{name}.sinks (s_aux): expected one logit a query head, shape ({heads},), got "
                                   f"{getattr(sinks, 'shape', type(sinks).__name__)}")
    return SpecParams(dtype=dtype, heads=heads, kv_heads=kv_heads, head_dim=head_dim, value_head_dim=value_head_dim,
                      scale=scale, causal=causal, window=window, softcap=cap, sinks=sinks is not None, mask=plan.mode,
                      cross=int(query.shape[2]) != plan.keys)


# ------------------------------------------------------------------------------------------------
# the model's mask -> MaskPlan

_PLANS: dict[int, tuple[Any, tuple[Any, ...], MaskPlan]] = {}
_PLANS_LOCK = threading.Lock()
_PLANS_MAX = 64


def _pattern_name(causal: bool, window: tuple[int, int] | None) -> str:
    terms = (["causal"] if causal else []) + ([f"window({window[0]}, {window[1]})"] if window else [])
    return " && ".join(terms) or "full attention"


def _allowed(mask: torch.Tensor, B: int, Lq: int, Lk: int, causal: bool, window: tuple[int, int] | None,
             owner: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(allowed [B, Lq, Lk] bool, a 0-d bool tensor: the mask's values are ones attngen reads)."""
    if mask.dim() == 2:
        # A padding mask over keys (1 = a real token), the module's pattern on top.
        if tuple(mask.shape) != (B, Lk):
            raise UnsupportedAttention(f"{owner}: attention_mask: expected a 2-D padding mask of shape ({B}, {Lk}), "
                                       f"got {tuple(mask.shape)}")
        keys = mask.to(torch.bool)
        return _pattern(Lq, Lk, Lk, causal, window, mask.device)[None] & keys[:, None, :], torch.ones((), dtype=torch.bool, device=mask.device)
    if mask.dim() != 4 or mask.shape[0] not in (1, B) or mask.shape[1] != 1 or tuple(mask.shape[2:]) != (Lq, Lk):
        raise UnsupportedAttention(f"{owner}: attention_mask: expected shape ({B}, 1, {Lq}, {Lk}) (one mask for every "
                                   f"head), got {tuple(mask.shape)}")
    m = mask[:, 0].expand(B, Lq, Lk)
    if m.dtype == torch.bool:
        return m, torch.ones((), dtype=torch.bool, device=mask.device)
    if not m.is_floating_point():
        raise UnsupportedAttention(f"{owner}: attention_mask: expected a bool or floating mask, got {m.dtype}")
    # An additive mask: 0 where visible; -inf or the dtype's most negative value (eager's) where not.
    blocked = m <= torch.finfo(m.dtype).min / 2
    return m == 0, ((m == 0) | blocked).all()


def _pattern(Lq: int, keys: Any, Lk: int, causal: bool, window: tuple[int, int] | None, device: Any) -> torch.Tensor:
    """[Lq, Lk] bool: the module's pattern when the first `keys` keys are passed (bottom-right
    aligned: the last query sits at key keys - 1, as in attngen's `causal` and `window`)."""
    q = torch.arange(Lq, device=device)[:, None]
    kv = torch.arange(Lk, device=device)[None, :]
    shift = keys - Lq
    out = kv < keys
    if causal:
        out = out & (kv <= q + shift)
    if window is not None:
        out = out & (kv >= q + shift - window[0]) & (kv <= q + shift + window[1])
    return out


def _derive_plan(mask: torch.Tensor, B: int, Lq: int, Lk: int, causal: bool, window: tuple[int, int] | None,
                 owner: str) -> MaskPlan:
    allowed, values_ok = _allowed(mask, B, Lq, Lk, causal, window, owner)
    dev = allowed.device
    valid = allowed.any(dim=1)  # [B, Lk]: keys some query sees
    seen = valid.any(dim=-1)
    zero = torch.zeros((), dtype=torch.int64, device=dev)
    lo = torch.where(seen, valid.to(torch.int8).argmax(dim=-1), zero)
    hi = torch.where(seen, Lk - valid.flip(-1).to(torch.int8).argmax(dim=-1), zero)
    kmax = hi.max()
    rows = (torch.arange(Lk, device=dev)[None, :] >= lo[:, None]) & (torch.arange(Lk, device=dev)[None, :] < hi[:, None])
    # Two alignments of the module's pattern: over all Lk keys, or over the first max(hi) keys (a
    # static cache whose trailing slots are empty); the mask must equal one of them element by element.
    fits = [((_pattern(Lq, k, Lk, causal, window, dev)[None] & rows[:, None, :]) == allowed).all() for k in (Lk, kmax)]
    facts = [values_ok, *fits, (lo == 0).all(), (hi == Lk).all(), (hi == kmax).all(), kmax]
    values, fit_full, fit_cut, lo_zero, hi_full, hi_cut, k_max = torch.stack([f.to(torch.int64) for f in facts]).tolist()
    if not values:
        raise UnsupportedAttention(f"{owner}: attention_mask: holds values other than 0 (visible) and -inf or the "
                                   f"dtype's minimum (masked): an additive bias, which attngen does not take as a mask")
    if not (fit_full or fit_cut):
        docs = _documents(allowed, Lq, Lk, causal, window)
        if docs is not None:
            return docs
        raise UnsupportedAttention(
            f"{owner}: attention_mask: not the module's pattern ({_pattern_name(causal, window)}, from is_causal and "
            f"sliding_window) restricted to one contiguous range of keys per batch row, nor that pattern within "
            f"packed documents; attngen cannot express this mask (a custom mask function, padding inside packed "
            f"documents, or a mask that varies otherwise)")
    keys = Lk if fit_full else max(k_max, 1)
    if lo_zero and (hi_full if fit_full else hi_cut):
        return MaskPlan(MaskMode.NONE, keys)
    i32 = torch.int32
    return MaskPlan(MaskMode.PADDED if lo_zero else MaskMode.RANGE, keys, lo.to(i32), hi.to(i32),
                    torch.full((B,), Lq, dtype=i32, device=dev))


def _documents(allowed: torch.Tensor, Lq: int, Lk: int, causal: bool, window: tuple[int, int] | None) -> MaskPlan | None:
    """The plan of a packed-sequence mask (transformers builds one from position_ids that restart):
    the module's causal pattern within documents of consecutive tokens. A document starts where a
    token cannot see the token before it; the mask must then equal pattern && same document."""
    if not causal or Lq != Lk or Lk < 2 or (window is not None and window[0] < 1):
        return None
    B, dev = allowed.shape[0], allowed.device
    i = torch.arange(1, Lk, device=dev)
    starts = torch.ones(B, Lk, dtype=torch.int32, device=dev)
    starts[:, 1:] = (~allowed[:, i, i - 1]).to(torch.int32)
    doc = starts.cumsum(dim=-1, dtype=torch.int32) - 1
    same = doc[:, :, None] == doc[:, None, :]
    if not bool(((_pattern(Lq, Lk, Lk, causal, window, dev)[None] & same) == allowed).all()):
        return None
    return MaskPlan(MaskMode.DOCUMENTS, Lk, doc_ids=doc.contiguous())


def mask_plan(mask: Any, B: int, Lq: int, Lk: int, causal: bool, window: tuple[int, int] | None,
              owner: str = "attention") -> MaskPlan:
    """The MaskPlan of `mask` (None, a 2-D padding mask or a 4-D bool/additive mask) for a module
    whose own pattern is (causal, window); UnsupportedAttention where no plan expresses it. Cached
    per mask tensor, so the layers that share a mask read the device once."""
    if mask is None:
        return MaskPlan(MaskMode.NONE, Lk)
    if not isinstance(mask, torch.Tensor):
        raise UnsupportedAttention(f"{owner}: attention_mask: expected None or a tensor, got {type(mask).__name__} "
                                   f"(was the model built with attn_implementation='{NAME}'?)")
    try:
        version = mask._version
    except RuntimeError:  # an inference-mode tensor has no version counter (nor is written in place)
        version = -1
    key = (B, Lq, Lk, causal, window, mask.shape, mask.dtype, version)
    hit = _PLANS.get(id(mask))
    if hit is not None and hit[0]() is mask and hit[1] == key:
        return hit[2]
    plan = _derive_plan(mask, B, Lq, Lk, causal, window, owner)
    with _PLANS_LOCK:
        if len(_PLANS) >= _PLANS_MAX:
            for k in [k for k, (ref, _, _) in _PLANS.items() if ref() is None] or list(_PLANS)[: _PLANS_MAX // 2]:
                _PLANS.pop(k, None)
        _PLANS[id(mask)] = (weakref.ref(mask), key, plan)
    return plan


# ------------------------------------------------------------------------------------------------
# execution: the one place that picks where a call runs

_REFERENCE_ON_CPU = False
_TORCH_OPS: dict[int, Any] = {}


def use_reference_on_cpu(enabled: bool = True) -> None:
    """A testing aid: run attention on CPU tensors through the NumPy float64 reference
    (`attngen.check.reference`, forward and backward; exact, and slow: minutes for one layer of a
    real model). Off by default, when CPU tensors take the CPU backend where it is installed
    (forward and backward) and raise otherwise."""
    global _REFERENCE_ON_CPU
    _REFERENCE_ON_CPU = bool(enabled)


def _cpu_kernel(variant: Variant) -> Any:
    """The CPU backend's kernel of `variant`, or None where attngen has no CPU backend installed."""
    import importlib.util

    if importlib.util.find_spec("attngen.cpu") is None:
        return None
    from attngen.backend import compile as compile_kernel

    return compile_kernel(variant, device="cpu")


def execute(variant: Variant, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """Runs `variant` on q [B, Lq, H, D], k, v [B, Lk, Hkv, D] and its runtime inputs by name;
    returns o [B, Lq, H, Dv], differentiable where the path is (see the module doc)."""
    if q.device.type == "cuda":
        return _through_op(variant, q, k, v, inputs)
    if q.device.type != "cpu":
        raise RuntimeError(f"attngen runs on CUDA or CPU tensors, got tensors on {q.device}")
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v, *inputs.values()))
    if not _REFERENCE_ON_CPU:
        kernel = _cpu_kernel(variant)
        if kernel is not None:
            # training: the torch op's CPU implementation, differentiable through the CPU backward
            return _through_op(variant, q, k, v, inputs) if grad else kernel(q, k, v, **inputs)
    if _REFERENCE_ON_CPU:
        names = tuple(inputs)
        return _ReferenceAttention.apply(variant, names, q, k, v, *(inputs[n] for n in names))
    raise RuntimeError(
        "attngen: attention on CPU tensors needs attngen's CPU backend, which is not installed; "
        "move the model to a CUDA device, or for tests call "
        "attngen.integrations.transformers.use_reference_on_cpu(True) (the float64 NumPy reference, slow)")


def _through_op(variant: Variant, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, inputs: dict[str, Any]) -> torch.Tensor:
    """`variant`'s torch op (registered once a variant) on q, k, v and its runtime inputs."""
    op = _TORCH_OPS.get(id(variant))
    if op is None:
        from attngen.runtime.torch_op import register

        op = _TORCH_OPS.setdefault(id(variant), register(variant))  # (variants live on in _SPECS)
    # The integration builds every runtime input itself (doc_ids, the one `sorted` input, is a
    # cumsum), so the device check, and the read-back it costs at every layer, is skipped.
    return op(q, k, v, check_inputs=False, **{n: inputs[n] for n in op.input_names})


def _numpy(t: torch.Tensor) -> np.ndarray:
    t = t.detach()
    return (t.to(torch.float32) if t.dtype in (torch.float16, torch.bfloat16) else t).numpy()


class _ReferenceAttention(torch.autograd.Function):
    """The NumPy reference as an autograd function (CPU tensors, `use_reference_on_cpu`)."""

    @staticmethod
    def forward(ctx: Any, variant: Variant, names: tuple[str, ...], q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                *arrays: torch.Tensor) -> torch.Tensor:
        from attngen.check import reference

        ctx.variant, ctx.names = variant, names
        ctx.save_for_backward(q, k, v, *arrays)
        o, _ = reference.attention(variant, _numpy(q), _numpy(k), _numpy(v), {n: _numpy(a) for n, a in zip(names, arrays)})
        return torch.from_numpy(np.ascontiguousarray(o, dtype=np.float32)).to(q.dtype)

    @staticmethod
    def backward(ctx: Any, do: torch.Tensor) -> tuple[Any, ...]:
        from attngen.check import reference

        q, k, v, *arrays = ctx.saved_tensors
        var, names = ctx.variant, ctx.names
        wrt = tuple(n for i, n in enumerate(names) if n == var.sink and ctx.needs_input_grad[5 + i])
        g = reference.attention_backward(var, _numpy(q), _numpy(k), _numpy(v), {n: _numpy(a) for n, a in zip(names, arrays)},
                                         _numpy(do), wrt=wrt)

        def back(x: np.ndarray, like: torch.Tensor) -> torch.Tensor:
            return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).to(like.dtype)

        rest = [back(g[n], a) if n in wrt else None for n, a in zip(names, arrays)]
        return (None, None, back(g["dq"], q), back(g["dk"], k), back(g["dv"], v), *rest)


# ------------------------------------------------------------------------------------------------
# the functions transformers calls

_CALLS: dict[tuple[Any, ...], Variant] = {}


def attention_forward(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: Any,
                      scaling: float | None = None, dropout: float = 0.0, sliding_window: int | None = None,
                      softcap: float | None = None, s_aux: torch.Tensor | None = None,
                      **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature: query [B, H, Lq, D], key/value [B, Hkv, Lk, D]
    (not repeated for GQA) -> (attention output [B, Lq, H, Dv], None: no attention weights).

    QK-norm (Qwen3, OLMo-2) needs nothing here: the model normalises q and k before RoPE, before
    this call, so the spec carries no `norm` statement."""
    name = type(module).__name__
    if dropout and getattr(module, "training", False):
        raise UnsupportedAttention(f"{name}.attention_dropout: {dropout!r} while training; attngen has no attention "
                                   f"dropout (set config.attention_dropout = 0.0)")
    if kwargs.get("head_mask") is not None:
        raise UnsupportedAttention(f"{name}: head_mask: attngen does not take head masks")
    if kwargs.get("output_attentions"):
        raise UnsupportedAttention(f"{name}: output_attentions: attngen never forms the attention weights; use "
                                   f"attn_implementation='eager' to inspect them")
    if sliding_window is None:
        sliding_window = _attribute(module, "sliding_window")
    if softcap is None:
        softcap = _attribute(module, "attn_logit_softcapping")
    causal, window = module_pattern(module, kwargs.get("is_causal"), sliding_window)
    B, Lq, Lk = int(query.shape[0]), int(query.shape[2]), int(key.shape[2])
    plan = mask_plan(attention_mask, B, Lq, Lk, causal, window, name)
    # The variant of this call, validated once per distinct set of the numbers it is built from.
    call = (query.dtype, key.dtype, value.dtype, query.shape[1], key.shape[1], value.shape[1], query.shape[3],
            key.shape[3], value.shape[3], scaling, causal, window, softcap,
            None if s_aux is None else tuple(s_aux.shape), plan.mode, Lq != plan.keys)
    variant = _CALLS.get(call)
    if variant is None:
        p = spec_params(module, query, key, value, scaling=scaling, causal=causal, window=window, softcap=softcap,
                        sinks=s_aux, plan=plan)
        variant = _CALLS.setdefault(call, build_variant(p, name))
    q = query.transpose(1, 2)  # [B, Lq, H, D]: the bshd views of transformers' tensors, no copies
    if plan.keys != Lk:
        key, value = key[:, :, : plan.keys], value[:, :, : plan.keys]
    k, v = key.transpose(1, 2), value.transpose(1, 2)
    inputs: dict[str, torch.Tensor] = {}
    if plan.mode == MaskMode.DOCUMENTS:
        inputs["doc_ids"] = plan.doc_ids
    elif plan.mode != MaskMode.NONE:
        inputs["q_lens"] = plan.q_lens
        inputs["kv_lens"] = plan.kv_lens
        if plan.mode == MaskMode.RANGE:
            inputs["kv_start"] = plan.kv_start
    if s_aux is not None:
        inputs["sinks"] = s_aux.to(torch.float32)
    return execute(variant, q, k, v, inputs), None


def _pattern_is_the_modules(kw: dict[str, Any]) -> bool:
    """Whether a mask request is the module's own pattern over every key, so that no mask need be
    built: transformers allows the causal skip only for its plain causal or local masks (custom,
    packed or blockwise masks turn it off), the keys end where the queries end (attngen aligns
    bottom-right), the local pattern is inside its window, and no key is padding."""
    if not kw.get("allow_is_causal_skip", False) or kw.get("use_vmap", False):
        return False
    q_len, q_off, kv_len, kv_off = (kw.get(n) for n in ("q_length", "q_offset", "kv_length", "kv_offset"))
    if not all(isinstance(x, int) and not isinstance(x, bool) for x in (q_len, q_off, kv_len, kv_off)):
        return False  # (older transformers pass cache_position; a static cache passes a tensor offset)
    if q_off + q_len != kv_off + kv_len:
        return False
    local = kw.get("local_size")
    if local is not None and kv_len > local:
        return False
    padding = kw.get("attention_mask")
    if padding is None:
        return True
    if padding.dim() != 2 or padding.shape[-1] < kv_off + kv_len:
        return False
    return bool(padding[:, kv_off: kv_off + kv_len].all())  # (one read back, as sdpa's own check)


def mask_function(*args: Any, **kwargs: Any) -> torch.Tensor | None:
    """The `attngen` mask function: None where the module's own pattern covers every key, else the
    4-D boolean mask transformers' sdpa path builds, which `attention_forward` turns into key
    ranges (or refuses, naming what it cannot express)."""
    from transformers.masking_utils import AttentionMaskInterface

    if _pattern_is_the_modules(kwargs):
        return None
    kwargs["allow_is_causal_skip"] = False
    kwargs["allow_is_bidirectional_skip"] = False
    return AttentionMaskInterface._global_mapping["sdpa"](*args, **kwargs)


def register() -> None:
    """Registers `attention_forward` and `mask_function` as transformers' `attngen` (idempotent;
    importing this module does it)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(NAME, attention_forward)
    AttentionMaskInterface.register(NAME, mask_function)


register()

__all__ = ["NAME", "MaskMode", "MaskPlan", "SpecParams", "UnsupportedAttention", "attention_forward", "build_variant",
           "execute", "mask_function", "mask_plan", "module_pattern", "register", "spec_params", "spec_text",
           "use_reference_on_cpu"]
