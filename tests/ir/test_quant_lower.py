"""The quantization statements (docs/QUANT.md): the per-tensor `dtype` and `quant` lower to the IR
contract (Quant nodes, InputDTypes, the implied scale inputs), print back, and every combination a
kernel cannot run is a located error."""

from __future__ import annotations

import pytest

from attngen.ir.dtypes import DType
from attngen.ir.nodes import (InputDTypes, Quant, QuantOperand, ScaleGranularity, ScaleSource, SizeSym, Smooth)
from attngen.lang import frontend
from attngen.lang.diagnostics import SpecError
from attngen.lang.printer import print_program
from attngen.plan import validate
from attngen.plan.schedule import Arch

HEAD = "attention a {\n  head_dim 64\n  heads 8 kv 2\n"


def spec(*lines: str) -> str:
    return HEAD + "".join(f"  {ln}\n" for ln in lines) + "}\n"


def lower(text: str, arch: str | None = None):
    p = validate.loads(text, "x.attn", Arch(arch)) if arch else frontend.loads(text, "x.attn")
    return p.variants[0]


def errors(text: str, arch: str | None = None) -> list[tuple[str, int, int]]:
    with pytest.raises(SpecError) as e:
        lower(text, arch)
    return [(d.message, d.span.line, d.span.col) for d in e.value.diagnostics]


FP8_PREFILL = spec("dtype fp8_e4m3 out bf16", "quant q fp8_e4m3 input per head", "quant k fp8_e4m3 input per head",
                   "quant v fp8_e4m3 input per head", "quant p fp8_e4m3 static(448.0)", "mask causal")
SAGE = spec("dtype fp16", "quant q i8 amax per block(64)", "quant k i8 amax per block(64) smooth mean",
            "quant v fp8_e4m3 amax per channel", "quant p fp8_e4m3 static(448.0)")
PAGED = ("attention a {\n  dtype bf16 k fp8_e4m3 v fp8_e4m3\n  head_dim 128\n  heads 32 kv 8\n  kind cross\n"
         "  kv_cache paged(16)\n  quant k fp8_e4m3 input per page\n  quant v fp8_e4m3 input per head\n}\n")


def test_fp8_prefill_lowers_to_the_contract() -> None:
    v = lower(FP8_PREFILL, "sm_90a")
    assert v.dtype == v.out_dtype == DType.BF16
    assert v.input_dtypes == InputDTypes(DType.FP8_E4M3, DType.FP8_E4M3, DType.FP8_E4M3) and v.q_dtype == DType.FP8_E4M3
    assert v.quants[0] == Quant(QuantOperand.Q, DType.FP8_E4M3, ScaleSource.INPUT, ScaleGranularity.HEAD)
    assert v.quant(QuantOperand.P) == Quant(QuantOperand.P, DType.FP8_E4M3, ScaleSource.STATIC, static=448.0)
    assert v.quantized and v.quantized_qk and v.quantized_pv
    assert [(d.name, d.dtype, d.shape) for d in v.scale_inputs()] == [
        (n, DType.FP32, (SizeSym.B, SizeSym.HKV)) for n in ("q_scale", "k_scale", "v_scale")]
    assert [d.name for d in v.runtime_inputs()] == ["k_scale", "q_scale", "v_scale"]  # implied: sorted by name
    hash(v)


def test_sage_and_paged_scale_shapes() -> None:
    v = lower(SAGE)
    assert v.input_dtypes is None and v.dtype == DType.FP16
    assert v.quant(QuantOperand.K) == Quant(QuantOperand.K, DType.I8, ScaleSource.AMAX, ScaleGranularity.BLOCK, 64, smooth=Smooth.MEAN)
    assert v.scale_inputs() == ()  # computed scales are no inputs
    p = lower(PAGED)
    assert [(d.name, d.shape) for d in p.scale_inputs()] == [("k_scale", ("num_pages", SizeSym.HKV)), ("v_scale", (SizeSym.HKV,))]
    tok = lower(spec("dtype bf16", "quant q i8 input per token", "quant k i8 input per block(32)"))
    assert [d.shape for d in tok.scale_inputs()] == [(SizeSym.B, SizeSym.H, SizeSym.LQ), (SizeSym.B, SizeSym.HKV, "k_scale_blocks")]


@pytest.mark.parametrize("text", [FP8_PREFILL, SAGE, PAGED])
def test_print_then_load_is_identity(text: str) -> None:
    p = frontend.loads(text)
    assert frontend.loads(print_program(p)) == p


def test_unquantized_ir_is_unchanged() -> None:
    # `dtype bf16` means all four; the new fields stay at their defaults.
    v = lower(spec("dtype bf16"))
    assert v.input_dtypes is None and v.quants == () and not v.quantized
    assert (v.q_dtype, v.k_dtype, v.v_dtype, v.out_dtype) == (DType.BF16,) * 4
    assert print_program(frontend.loads(spec("dtype bf16"))).splitlines()[1] == "  dtype bf16"


BAD = [
    # (spec lines, (message start, line, col))
    (("dtype fp8_e4m3",), ("the output cannot be fp8_e4m3", 4, 9)),
    (("dtype fp16 k bf16",), ("`k` stored as bf16 with a fp16 output", 4, 16)),
    (("dtype fp16 k i8 v i8",), ("`k`, `v` are stored quantized without a scale", 1, 11)),
    (("dtype fp16 q i8", "quant q i8 amax per token", "quant k i8 amax per token"), ("`q` is stored as i8: its scale cannot", 5, 14)),
    (("dtype fp16 q i8", "quant q fp8_e4m3 input per head", "quant k fp8_e4m3 amax per token"), ("`q` is stored as i8, not fp8_e4m3", 5, 3)),
    (("dtype fp16", "quant p fp8_e4m3 static(448.0)"), ("p is quantized but v is not", 5, 3)),
    (("dtype fp16", "quant k i8 amax per token"), ("`k` is quantized in the kernel but `q` is not", 5, 3)),
    (("dtype fp16", "quant q i8 amax per token smooth mean", "quant k i8 amax per token"), ("smoothing is for k, not `q`", 5, 36)),
    (("dtype fp16", "quant q i8 amax per token", "quant k i8 input per head smooth mean"), ("`smooth mean` needs scales computed", 6, 36)),
    (("dtype fp16", "quant q i8 amax per token", "quant k fp8_e4m3 amax per token"), ("Q·Kᵀ of i8 and fp8_e4m3", 6, 3)),
    (("dtype fp16", "quant q i8 static(1.0)"), ("`static` scales are for p, not `q`", 5, 14)),
    (("dtype fp16", "quant v i8 amax per channel", "quant p i8 input per head"), ("p is computed in the kernel and has no input scale", 6, 14)),
    (("dtype fp16", "quant v i8 input per token"), ("`v` takes no `input` scales `per token`", 5, 24)),
    (("dtype fp16", "quant q i8 amax per block(48)", "quant k i8 amax per token"), ("scale block 48 is not supported", 5, 29)),
    (("dtype fp16", "quant q i8 amax per block(128)", "quant k i8 amax per token", "tile block_m 64"),
     ("scale block 128 does not divide the tile's block_m 64", 5, 3)),
    (("dtype fp16", "quant q i8 amax", "quant k i8 amax per token"), ("say what one scale of `q` covers", 5, 14)),
    (("dtype fp16", "quant q i8 amax per token", "quant q i8 amax per token"), ("`quant q` given twice", 6, 3)),
    (("dtype fp16", "layout varlen", "quant q i8 amax per token", "quant k i8 amax per token"), ("`quant` is not implemented with `layout varlen`", 6, 3)),
    (("dtype fp16 q i8", "layout bshd", "norm q rmsnorm(1e-6)", "quant q i8 input per head", "quant k i8 amax per token"),
     ("`norm q` on `q` stored as i8", 6, 3)),
    (("dtype fp16", "quant q int8 amax per token"), ("unknown quantized type `int8`", 5, 11)),
]


@pytest.mark.parametrize("lines,want", BAD, ids=[w[0][:40] for _, w in BAD])
def test_located_errors(lines: tuple[str, ...], want: tuple[str, int, int]) -> None:
    got = errors(spec(*lines))
    assert got[0][0].startswith(want[0]) and got[0][1:] == want[1:], got


def test_arch_limits() -> None:
    # FP8 needs sm_89 (at the stored type and at each quant statement); INT8 needs sm_80.
    got = errors(FP8_PREFILL, "sm_80")
    assert got[0] == ("fp8_e4m3 needs sm_89 or newer; sm_80 has no fp8_e4m3 tensor cores", 4, 9)
    assert len(got) == 5
    lower(FP8_PREFILL, "sm_89")
    i8 = spec("dtype fp16", "quant q i8 amax per token", "quant k i8 amax per token")
    assert errors(i8, "sm_75")[0][0] == "i8 needs sm_80 or newer; sm_75 has no i8 tensor cores"
    lower(i8, "sm_80")


def test_paged_scales() -> None:
    bad = PAGED.replace("input per page", "input per token")
    assert errors(bad)[0][0].startswith("`k` takes no `input` scales `per token`")
    bad = PAGED.replace("dtype bf16 k fp8_e4m3 v fp8_e4m3", "dtype bf16 v fp8_e4m3").replace("quant k fp8_e4m3 input per page", "quant k fp8_e4m3 amax per token")
    assert errors(bad)[0][0] == "`k` takes no `amax` scales here"


def test_scale_input_names_are_reserved() -> None:
    text = spec("dtype fp16", "input q_scale: fp32[B]", "quant q i8 input per tensor", "quant k i8 input per tensor")
    assert errors(text)[0][0] == "`q_scale` is the name of an implied scale input"


def test_quant_types_are_not_input_types() -> None:
    assert errors(spec("dtype fp16", "input t: fp8_e4m3[H]"))[0][0] == "unknown input dtype `fp8_e4m3`"


def test_cuda_refuses_and_check_warns(tmp_path, capsys) -> None:
    """The FP8 prefill runs on the CUDA forward (plan.quant_fwd); a spec it does not take keeps
    a located refusal naming what is missing, and `check` warns of it."""
    from attngen.plan.decode import decode_unsupported, forward_unsupported
    from attngen.plan.bwd import unsupported as bwd_unsupported
    from attngen.tools import cli

    v = lower(FP8_PREFILL)
    assert forward_unsupported(v) is None
    assert "P·V unquantized next to INT8 Q·Kᵀ" in forward_unsupported(lower(SAGE))
    assert decode_unsupported(lower(PAGED)) is None  # an FP8 KV cache runs on the decode family
    assert "not yet on the CUDA backend" in decode_unsupported(v)
    assert "no backward kernels" in bwd_unsupported(v)[0].message
    f = tmp_path / "q.attn"
    f.write_text(FP8_PREFILL)
    assert cli.main(["check", str(f)]) == 0
    assert "no CUDA kernel yet" not in capsys.readouterr().err
    assert cli.main(["compile", str(f), "-o", str(tmp_path / "a.cu")]) == 0  # sm_90a: the FP8 wgmma engine
    assert "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3" in (tmp_path / "a.cu").read_text()
    assert cli.main(["compile", str(f), "--arch", "sm_89", "-o", str(tmp_path / "a.cu")]) == 0
    assert "m16n8k32.row.col.f32.e4m3.e4m3.f32" in (tmp_path / "a.cu").read_text()
    f.write_text(SAGE)
    assert cli.main(["check", str(f)]) == 0
    assert "warning: `a` has no CUDA kernel yet" in capsys.readouterr().err
    assert cli.main(["compile", str(f), "-o", str(tmp_path / "a.cu")]) != 0
    err = capsys.readouterr().err
    assert "q.attn:5:3: error: the cuda target cannot run `a`" in err and "P·V unquantized next to INT8" in err


def test_smoothing_needs_a_plain_softmax() -> None:
    base = ("dtype fp16", "quant q i8 amax per token", "quant k i8 amax per token smooth mean")
    assert errors(spec(*base, "score softcap(30.0)"))[0][:2] == ("`smooth mean` with `score`", 6)
    assert errors(spec(*base, "output lse"))[0][0] == "`smooth mean` with `output lse`"
    lower(spec(*base, "mask causal"))


def test_quantized_pv_needs_one_v_scale_along_the_keys() -> None:
    bad = PAGED.replace("input per head", "input per page").replace("}\n", "  quant p fp8_e4m3 static(448.0)\n}\n")
    assert errors(bad)[0][0].startswith("P·V runs quantized, and v's scales change from page to page")


def test_fmt_keeps_the_new_statements() -> None:
    from attngen.lang.fmt import format_file
    from attngen.lang.parse import parse

    text = SAGE.replace("quant k i8 amax per block(64) smooth mean", "quant  k i8 amax  per block( 64 )  smooth mean")
    assert format_file(parse(text), text) == SAGE
    assert format_file(parse(FP8_PREFILL), FP8_PREFILL) == FP8_PREFILL


def test_torch_op_refuses_autograd_and_docs_specs_load() -> None:
    import re
    from pathlib import Path

    from attngen.runtime.torch_op import backward_refusal

    assert "quantized attention has no backward kernels yet" in backward_refusal(lower(FP8_PREFILL))
    assert backward_refusal(lower(spec("dtype bf16"))) is None
    page = (Path(__file__).resolve().parents[2] / "docs" / "QUANT.md").read_text(encoding="utf-8")
    blocks = [b for b in re.findall(r"```\n(.*?)```", page, re.S) if b.lstrip().startswith(("#", "attention"))]
    assert len(blocks) == 3  # fp8 prefill, pre-LN INT8, the FP8 paged decode
    for b in blocks:
        assert lower(b).quantized
