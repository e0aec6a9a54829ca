"""`attngen explain` of a quantized variant: what is stored and quantized, the numerics order, what
runs it, and the accuracy report (attngen.check.quant_accuracy) plain and with outliers."""

from __future__ import annotations

from typing import Any

from attngen.ir.nodes import QuantOperand, ScaleGranularity, ScaleSource, Variant
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
        out.append(f"  {qn.operand.value}: {qn.dtype.value} (saturate to ±{qn.dtype.info.qmax:g}, round to nearest even), {how}{smooth}")
    qk = "Q·Kᵀ on quantized operands" if v.quantized_qk else "Q·Kᵀ at full precision"
    pv = "P·V on quantized operands" if v.quantized_pv else "P·V at full precision"
    out.append(f"  products: {qk}, {pv}; softmax in fp32")
    if v.quant(QuantOperand.P) is not None:
        out.append("  p is quantized against the row max: the final one in the reference, a flash kernel's running one "
                   "(the fuzz tolerance allows for the difference)")
    return out


def explain(v: Variant, shape: tuple[int, int, int] | None, seed: int) -> str:
    """The plain-words text of a quantized variant (`explain.explain` sends it here)."""
    from attngen.check.quant_accuracy import accuracy
    from attngen.tools import explain as ex
    from attngen.tools.explain import DEFAULT_SHAPE, _computation_lines, _decl_symbolic, _heading_lines, _input_role

    B, Lq, Lk = shape or DEFAULT_SHAPE
    out = _heading_lines(v) + _computation_lines(v) + quant_lines(v)
    out += ["", f"Inputs and outputs (shapes at B={B}, Lq={Lq}, Lk={Lk}):"]
    io = ex.io_shapes(v, B, Lq, Lk)
    rows = [(n, d.value, ex._symbolic(v, n), ex._dims_text(io[n]), role)
            for n, d, role in (("q", v.q_dtype, "queries"), ("k", v.k_dtype, "keys"), ("v", v.v_dtype, "values"))]
    sizes = ex.sample_sizes(v, B, Lq, Lk)
    from attngen.ir import abi

    for d in v.runtime_inputs():
        try:
            concrete = ex._dims_text(abi.input_shape(v, d, sizes))
        except ValueError:
            concrete = "bound at run time"
        role = "scale (dequantize: stored x scale)" if d.name in {qn.scale_input for qn in v.quants} else _input_role(v, d)
        rows.append((d.name, d.dtype.value, _decl_symbolic(v, d), concrete, role))
    rows.append(("o", v.dtype.value, ex._symbolic(v, "o"), ex._dims_text(io["o"]), "output"))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    out += ["  " + "  ".join(r[i].ljust(widths[i]) for i in range(4)) + "  " + r[4] for r in rows]
    a = accuracy(v, accuracy_shape(v), seed)
    b, lq, lk = a.shape
    out += ["", f"Accuracy against the unquantized float64 attention (the reference emulation; B={b}, Lq={lq}, Lk={lk}, seed {seed}):",
            f"  N(0,1) inputs:            quantized {a.emulation.text()}; {a.baseline} {a.full_precision.text()}",
            f"  0.1% channels x20:        quantized {a.emulation_outliers.text()}; {a.baseline} {a.full_precision_outliers.text()}",
            "  (a kernel's error is held to 1.1x the quantized figure: attngen.check.quant_accuracy.within_bar)"]
    from attngen.plan.quant_fwd import forward_problem, qk_i8

    cuda = ("the CUDA forward runs it (mma.sync m16n8k32, " + ("INT8 from sm_80" if qk_i8(v) else "FP8 from sm_89") + ")"
            if forward_problem(v) is None else "no CUDA kernel yet (compile --target cuda refuses it)")
    out += ["", f"Kernels: the CPU backend (--target cpu) runs it; {cuda}; no backward (training refuses it)"]
    return "\n".join(out)


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
