"""A quantized variant → its C++17 source for the CPU (stage: render), `backends/cpu/quant.cpp.j2`.

The same params struct, C ABI and expression emitters as the full-precision kernel
(attngen.cpu.render); the kernel computes what attngen.check.quant computes, in the numerics
order of docs/QUANT.md: software fp8/int8 rounding in fp32, the products and softmax in double.
Python decides every per-operand fact here (stored type, source, group, the scale input's C++
lookup); the template branches on them.
"""

from __future__ import annotations

from attngen.cuda.emit import CPU, ElementEmitter, float_literal, tensor_ctype
from attngen.ir.dtypes import DType
from attngen.ir.nodes import (NormKind, NormScope, NormTarget, Quant, QuantOperand, ScaleGranularity, ScaleSource, SizeSym,
                              Variant)
from attngen.lang.printer import print_expr

G = ScaleGranularity
_KIND = {DType.FP8_E4M3: "AG_E4M3", DType.FP8_E5M2: "AG_E5M2", DType.I8: "AG_I8"}
_GROUP = {G.TOKEN: "AG_TOKEN", G.BLOCK: "AG_BLOCK", G.CHANNEL: "AG_CHANNEL"}
# How each stored type is read as a float: its C++ element type and conversion.
_LOAD = {DType.FP32: ("float", "ag_f32"), DType.FP16: ("uint16_t", "ag_h2f"), DType.BF16: ("uint16_t", "ag_bf2f"),
         DType.FP8_E4M3: ("uint8_t", "ag_e4m3f"), DType.FP8_E5M2: ("uint8_t", "ag_e5m2f"), DType.I8: ("int8_t", "ag_i8f")}
_STORE = {DType.FP32: "ag_f32", DType.FP16: "ag_f2h", DType.BF16: "ag_f2bf"}


def unsupported(v: Variant) -> str | None:
    """What the CPU backend's quantized kernel does not run (None: it runs `v`)."""
    if v.residual and v.head_dim != v.value_head_dim:
        return f"residual needs Dv == D, got D={v.head_dim}, Dv={v.value_head_dim}"
    return None


def _scale_expr(v: Variant, qn: Quant) -> str:
    """The C++ lookup of an element's given scale: `b`, `h`, `pos` for q; `b`, `hk`, `kv`, `page`, `c` for k/v."""
    name = f"ag_ld_{qn.scale_input}"
    g, is_q = qn.granularity, qn.operand == QuantOperand.Q
    head, pos = ("h", "pos") if is_q else ("hk", "kv")
    if g == G.TENSOR:
        return f"{name}(p, 0)"
    if g == G.HEAD:
        if v.page_size is not None and not is_q:
            return f"{name}(p, hk)"
        return f"{name}(p, b, h / G)" if is_q else f"{name}(p, b, hk)"
    if g == G.TOKEN:
        return f"{name}(p, b, {head}, {pos})"
    if g == G.BLOCK:
        return f"{name}(p, b, {head}, {pos} / {qn.block})"
    if g == G.CHANNEL:
        return f"{name}(p, b, hk, c)"
    if g == G.PAGE:
        return f"{name}(p, page, hk)"
    raise ValueError(f"no scale input for {qn.operand.value} per {g}")


def _norm(v: Variant, target: NormTarget) -> dict | None:
    n = v.norm(target)
    if n is None:
        return None
    ln = n.kind == NormKind.LAYERNORM
    return dict(layernorm=ln, ln="true" if ln else "false", eps=repr(float(n.eps)), affine=n.affine, token=n.scope == NormScope.TOKEN)


def _operand(v: Variant, op: QuantOperand, stored: DType, partner: QuantOperand) -> dict:
    qn = v.quant(op)
    ctype, load = _LOAD[stored]
    norm = _norm(v, {QuantOperand.Q: NormTarget.Q, QuantOperand.K: NormTarget.K}.get(op, NormTarget.O)) if op != QuantOperand.V else None
    out = dict(ctype=ctype, load=load, quant=qn is not None, norm=norm, given=False, amax=False, stored="false",
               kind="AG_I8", gran="AG_TOKEN", block=1, smooth=False, round_out="false", scale_expr="1.f")
    if qn is None:
        return out
    out.update(kind=_KIND[qn.dtype], stored="true" if stored.info.quant else "false",
               round_out="false" if v.quant(partner) is not None else "true", smooth=qn.smooth is not None)
    if qn.source == ScaleSource.INPUT:
        out.update(given=True, scale_expr=_scale_expr(v, qn))
    else:
        out.update(amax=True, gran=_GROUP[qn.granularity], block=qn.block or 1)  # type: ignore[index]
    return out


def context(v: Variant) -> dict:
    """The template's context, beyond the params struct and names (attngen.cpu.render adds those)."""
    consts = {SizeSym.H: v.heads, SizeSym.HKV: v.kv_heads, SizeSym.D: v.head_dim, SizeSym.DV: v.value_head_dim}
    elem = ElementEmitter(consts, fast_math=False, dialect=CPU)
    vis = v.visibility()
    pq = v.quant(QuantOperand.P)
    convert = {DType.FP32: "", DType.FP16: "ag_h2f", DType.BF16: "ag_bf2f", DType.I32: "(int)", DType.U8: "(int)"}
    on = _norm(v, NormTarget.O)
    return dict(
        D=v.head_dim, DV=v.value_head_dim, H=v.heads, HKV=v.kv_heads, scale=repr(float(v.effective_scale)),
        paged=v.page_size is not None, page_size=v.page_size or 0,
        out_ctype=_LOAD[v.dtype][0], out_load=_LOAD[v.dtype][1], out_store=_STORE[v.dtype],
        tensors=[dict(name=d.name, dims=list(range(len(d.shape))), value_ctype="float" if d.dtype.is_float else "int",
                      convert=convert[d.dtype]) for d in v.runtime_inputs()],
        mask_text=print_expr(vis).replace("\n", " "), mask_code=elem.emit(vis),
        score_codes=[elem.emit(s) for s in v.scores], score_texts=[print_expr(s).replace("\n", " ") for s in v.scores],
        ops={"q": _operand(v, QuantOperand.Q, v.q_dtype, QuantOperand.K), "k": _operand(v, QuantOperand.K, v.k_dtype, QuantOperand.Q),
             "v": _operand(v, QuantOperand.V, v.v_dtype, QuantOperand.P)},
        p_quant=pq is not None, p_kind=_KIND[pq.dtype] if pq else "AG_I8",
        p_static=float_literal(pq.static) if pq is not None and pq.static is not None else "",
        p_text=(f"{pq.dtype.value}, " + (f"static({pq.static!r})" if pq.static is not None else "amax per token")) if pq else "",
        o_norm=on, sink=v.sink is not None, sink_tensor=v.sink or "", residual=v.residual, nan_check=v.nan_check, lse=v.lse,
        ctype_note=tensor_ctype(v.dtype, CPU),
    )


__all__ = ["context", "unsupported"]
