"""`attngen explain` of a quantized variant: what is stored and quantized, the numerics order, what
runs it, and the accuracy report (attngen.check.quant_accuracy) plain and with outliers."""

from __future__ import annotations

from typing import Any

from attngen.ir.nodes import NormTarget, QuantOperand, ScaleGranularity, ScaleSource, Variant
from attngen.lang.printer import quant_words

# The accuracy report's shape: small enough that explain stays interactive (the float64 reference
# runs four times), large enough for the errors to be typical.
ACCURACY_SHAPE = (1, 128, 128)
DECODE_ACCURACY_SHAPE = (1, 1, 512)

_SOURCE = {ScaleSource.INPUT: "runtime input", ScaleSource.AMAX: "computed in the kernel (amax / qmax)",
           ScaleSource.STATIC: "static"}
_GRAN = {ScaleGranularity.TENSOR: "one for the tensor", ScaleGranularity.HEAD: "one per (batch, kv head)",
         ScaleGranularity.TOKEN: "one per (batch, head, position)", ScaleGranularity.BLOCK: "one per block of {n} positions",
         ScaleGranularity.CHANNEL: "one per (batch, kv head, channel)", ScaleGranularity.PAGE: "one per (page, kv head)"}


def accuracy_shape(v: Variant) -> tuple[int, int, int]:
    """(B, Lq, Lk) the report is measured at."""
    return DECODE_ACCURACY_SHAPE if v.page_size is not None else ACCURACY_SHAPE


def quant_lines(v: Variant) -> list[str]:
    """The stored types, each quantized operand, and which products run quantized."""
    out = ["", "Quantization (docs/QUANT.md):",
           f"  stored: q {v.q_dtype.value}, k {v.k_dtype.value}, v {v.v_dtype.value}; output {v.out_dtype.value}"]
    for qn in v.quants:
        if qn.source == ScaleSource.STATIC:
            how = f"x {qn.static!r} before rounding (static)"
        else:
            gran = _GRAN[qn.granularity].format(n=qn.block) if qn.granularity else ""  # type: ignore[index]
            how = f"scales {_SOURCE[qn.source]}, {gran}" + (f": input {qn.scale_input}" if qn.scale_input else "")
        smooth = "; k minus its per-channel mean over tokens first" if qn.smooth else ""
        target = {QuantOperand.Q: NormTarget.Q, QuantOperand.K: NormTarget.K}.get(qn.operand)
        if target is not None and v.norm(target) is not None and qn.source == ScaleSource.AMAX:
            smooth += "; the norm's output, the scale folded into its gamma and beta (one FMA an element)"
        out.append(f"  {qn.operand.value}: {qn.dtype.value} (saturate to ±{qn.dtype.info.qmax:g}, round to nearest even), {how}{smooth}")
    qk = "Q·Kᵀ on quantized operands" if v.quantized_qk else "Q·Kᵀ at full precision"
    pv = "P·V on quantized operands" if v.quantized_pv else "P·V at full precision"
    out.append(f"  products: {qk}, {pv}; softmax in fp32")
    if v.quant(QuantOperand.P) is not None:
        out.append("  p is quantized against the row max: the final one in the reference, a flash kernel's running one "
                   "(the fuzz tolerance allows for the difference)")
    return out


def accuracy_lines(v: Variant, seed: int) -> list[str]:
    """The accuracy report in words: the emulation's error and the full-precision spec's, plain and with outliers."""
    from attngen.check.quant_accuracy import accuracy

    from attngen.plan.decode import fp8_kv
    from attngen.plan.quant_fwd import forward_problem, qk_i8

    a = accuracy(v, accuracy_shape(v), seed)
    b, lq, lk = a.shape
    if fp8_kv(v):
        cuda = "the CUDA decode family runs it on sm_89+ (the FP8 cache dequantized in the split-KV kernel)"
    elif forward_problem(v) is None:
        cuda = "the CUDA forward runs it (mma.sync m16n8k32, " + ("INT8 from sm_80" if qk_i8(v) else "FP8 from sm_89") + ")"
    else:
        cuda = "no CUDA kernel yet (compile --target cuda refuses it)"
    return ["", f"Accuracy against the unquantized float64 attention (the reference emulation; B={b}, Lq={lq}, Lk={lk}, seed {seed}):",
            f"  N(0,1) inputs:            quantized {a.emulation.text()}; {a.baseline} {a.full_precision.text()}",
            f"  0.1% channels x20:        quantized {a.emulation_outliers.text()}; {a.baseline} {a.full_precision_outliers.text()}",
            "  (a kernel's error is held to 1.1x the quantized figure: attngen.check.quant_accuracy.within_bar)",
            "", f"Kernels: the CPU backend (--target cpu) runs it; {cuda}; no backward (training refuses it)"]


def input_role(v: Variant, name: str) -> str | None:
    """What an implied scale input is for (None for any other input)."""
    return "scale (dequantize: stored x scale)" if name in {qn.scale_input for qn in v.quants} else None


def json_fields(v: Variant, seed: int = 0) -> dict[str, Any]:
    """`explain --json`'s quantization fields: the stored types, the quant statements, the accuracy."""
    from attngen.check.quant_accuracy import accuracy

    return {"quant": quant_json(v), "accuracy": accuracy(v, accuracy_shape(v), seed).as_dict()}


def quant_json(v: Variant) -> dict[str, Any]:
    """`check --json`'s description of a quantized variant's types and quant statements."""
    return {"stored": {"q": v.q_dtype.value, "k": v.k_dtype.value, "v": v.v_dtype.value, "out": v.out_dtype.value},
            "statements": [{"operand": qn.operand.value, "dtype": qn.dtype.value, "source": qn.source.value,
                            "granularity": qn.granularity.value if qn.granularity else None, "block": qn.block,
                            "static": qn.static, "smooth": qn.smooth.value if qn.smooth else None,
                            "scale_input": qn.scale_input} for qn in v.quants],
            "text": quant_words(v)}
