"""The decode family's FP8 KV cache (CPU; nvcc-marked tests need nvcc, not a GPU): which quantized
specs it takes, the ABI that carries the cache bytes and the scales, the located refusals, and the
kernels compiling for sm_89 and sm_90a without spills. tests/gpu/test_gpu_decode_fp8.py runs them."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from _codegen_util import ROOT

from attngen.check import fuzz, quant
from attngen.cuda import compile as compile_cuda
from attngen.cuda.render_decode import decode_fields, render_decode
from attngen.lang import frontend
from attngen.plan import decode as plan_decode
from attngen.plan.schedule import Arch
from attngen.tools import cli

GALLERY = ROOT / "examples" / "quant" / "fp8_paged_decode.attn"

PAGED = """attention kv8 {
  dtype bf16 k fp8_e4m3 v fp8_e4m3
  head_dim 128
  heads 32 kv 8
  kind cross
  kv_cache paged(16)
  mask causal
  quant k fp8_e4m3 input per page
  quant v fp8_e4m3 input per page
  output lse
}
"""
CONTIGUOUS = """attention kv8c {
  dtype fp16 k fp8_e5m2 v fp8_e4m3
  head_dim 64
  heads 8 kv 2
  kind cross
  layout bshd
  mask causal
  quant k fp8_e5m2 input per tensor
  quant v fp8_e4m3 input per head
}
"""


def _v(text: str):
    return frontend.loads(text, "<test>").get()


def test_the_decode_family_takes_an_fp8_kv_cache_and_refuses_other_quantized_specs() -> None:
    for text in (PAGED, CONTIGUOUS, GALLERY.read_text(encoding="utf-8")):
        v = _v(text)
        assert plan_decode.fp8_kv(v) and plan_decode.decode_unsupported(v, Arch.SM90A) is None
        assert plan_decode.forward_unsupported(v) is not None  # the forward kernels do not read it
    fp8_q = _v(CONTIGUOUS.replace("dtype fp16 k fp8_e5m2 v fp8_e4m3", "dtype fp8_e4m3 out fp16").replace(
        "quant k fp8_e5m2", "quant q fp8_e4m3 input per head\n  quant k fp8_e4m3"))
    assert not plan_decode.fp8_kv(fp8_q)
    assert "not yet on the CUDA backend" in plan_decode.decode_unsupported(fp8_q)
    with pytest.raises(ValueError, match="not yet on the CUDA backend"):
        render_decode(fp8_q, Arch.SM90A)
    # sm_86 has cp.async and bf16 mma but not the fp8 conversions.
    with pytest.raises(ValueError, match="sm_89"):
        plan_decode.plan(_v(PAGED), Arch("sm_86"))


def test_the_abi_carries_the_cache_bytes_and_the_scales() -> None:
    v = _v(PAGED)
    fields = {f.name: f for f in decode_fields(v)}
    assert fields["k"].ctype == fields["v"].ctype == "const unsigned char* __restrict__"
    assert fields["q"].ctype == "const elem_t* __restrict__"
    assert {"in_k_scale", "in_v_scale", "in_k_scale_n1", "in_block_table"} <= set(fields)
    src, dp = render_decode(v, Arch.SM90A)
    assert "in_k_scale: runtime input k_scale: fp32" in src and "k, fp8_e4m3 bytes" not in src
    assert "keys, fp8_e4m3 bytes, dequantized as read: fp32(k * k_scale) to bf16" in src
    # Per-page scales travel with their rows through the ring (no dependent loads in the step).
    assert "ag_cp_async4(ag_smem_addr(ks_slot + kv_row), ok ? p.in_k_scale + (long long)page * p.in_k_scale_s0" in src
    assert "ag_ld_k_scale" not in src.split("ag_dequant_rows")[1]
    assert "cvt.rn.f16x2.e4m3x2" in src and "typedef unsigned char kv_t;" in src
    # Half the ring bytes of the bf16 cache's: 3 slots of fp8 plus one bf16 staging chunk.
    full = _v(PAGED.replace("dtype bf16 k fp8_e4m3 v fp8_e4m3", "dtype bf16").replace(
        "  quant k fp8_e4m3 input per page\n  quant v fp8_e4m3 input per page\n", ""))
    assert dp.smem_bytes < render_decode(full, Arch.SM90A)[1].smem_bytes
    assert "kv_t" not in render_decode(full, Arch.SM90A)[0]  # the full-precision kernel is untouched
    c = render_decode(_v(CONTIGUOUS), Arch.SM90A)[0]
    assert "ag_ld_k_scale(p, 0)" in c and "ag_ld_v_scale(p, b, hk)" in c and "cvt.rn.f16x2.e5m2x2" in c


def test_kernel_dequantization_matches_the_reference_operands() -> None:
    """What the kernel's staging holds, fp32(x_q * s) rounded to the output type, is the reference's
    K' and V' (docs/QUANT.md), for per-page scales gathered through a shuffled block table."""
    v = _v(PAGED)
    arrays = fuzz.case_inputs(v, fuzz.Case(B=2, Lq=1, Lk=70, seed=3))
    assert arrays["k"].dtype == np.dtype(ml_dtypes.float8_e4m3fn) and arrays["k_scale"].shape == (arrays["k"].shape[0], 8)
    assert np.abs(arrays["k"].astype(np.float32)).max() > 100  # calibrated: the values use e4m3's range
    rest = {n: a for n, a in arrays.items() if n not in ("q", "k", "v")}
    _, kd, vd = quant.dense_operands(v, arrays["q"], arrays["k"], arrays["v"], rest)
    table, lens = arrays["block_table"], arrays["cache_lens"]
    for x, s, dense in ((arrays["k"], arrays["k_scale"], kd), (arrays["v"], arrays["v_scale"], vd)):
        staged = (x.astype(np.float32) * s[:, None, :, None]).astype(np.float32).astype(ml_dtypes.bfloat16)
        for b in range(2):
            for kv in range(int(lens[b])):
                page = table[b, kv // 16]
                got = staged[page, kv % 16].astype(np.float64)  # [Hkv, D]
                assert np.array_equal(got, dense[b, :, kv]), (b, kv)


def test_cli_compiles_the_gallery_spec_and_refuses_sm80_located(capsys, tmp_path) -> None:
    for arch in ("sm_89", "sm_90a"):
        out = tmp_path / f"{arch}.cu"
        assert cli.main(["compile", str(GALLERY), "--arch", arch, "-o", str(out)]) == 0
        src = out.read_text()
        assert "_decode_launch(" in src and "in_k_scale: runtime input k_scale: fp32" in src
    assert cli.main(["compile", str(GALLERY), "--arch", "sm_90a", "--emit", "header", "-o", str(tmp_path / "h.h")]) == 0
    assert "const unsigned char* k;" in (tmp_path / "h.h").read_text().replace("  ", " ").replace("  ", " ")
    capsys.readouterr()
    assert cli.main(["compile", str(GALLERY), "--arch", "sm_80"]) == 1
    err = capsys.readouterr().err
    assert "fp8_paged_decode.attn:6:16: error: fp8_e4m3 needs sm_89 or newer" in err and "Traceback" not in err
    assert cli.main(["check", str(GALLERY)]) == 0
    assert "no CUDA kernel yet" not in capsys.readouterr().err


@pytest.mark.nvcc
@pytest.mark.parametrize("arch", [Arch("sm_89"), Arch.SM90A], ids=lambda a: a.value)
@pytest.mark.parametrize("text", [
    PAGED, PAGED.replace("per page", "per head"), CONTIGUOUS,
    PAGED.replace("head_dim 128", "head_dim 256").replace("paged(16)", "paged(8)"),
], ids=["paged_page", "paged_head", "contiguous_d64", "paged8_d256"])
def test_fp8_decode_compiles_without_spills_or_warnings(text: str, arch: Arch) -> None:
    if "head_dim 256" in text and arch.smem_budget < 150 * 1024:
        pytest.skip("D256 needs more shared memory a block than sm_89 has (as the full-precision ring does)")
    src, dp = render_decode(_v(text), arch)
    res = {r.kernel: r for r in compile_cuda.resources(src, arch)}
    assert set(res) == {k.name for k in dp.kernels}
    for r in res.values():
        assert r.spill_stores == 0 and r.spill_loads == 0 and r.stack_bytes == 0, r
    assert res[dp.kernel_name].registers <= 255
    _, log = compile_cuda.nvcc(src, arch, emit="obj")  # device code and the host launcher
    assert "warning" not in log.lower()


def test_the_reference_of_an_fp8_cache_is_full_precision_attention_on_its_dequantized_values() -> None:
    """The contract the kernel keeps (and tests/gpu/test_gpu_decode_fp8.py checks bit for bit against
    the full-precision kernel): the quantized reference equals the full-precision reference of the
    same spec on k and v dequantized to fp32(x_q * s) and rounded to the output type."""
    from attngen.check import reference

    v = _v(PAGED)
    full = _v(PAGED.replace("dtype bf16 k fp8_e4m3 v fp8_e4m3", "dtype bf16").replace(
        "  quant k fp8_e4m3 input per page\n  quant v fp8_e4m3 input per page\n", ""))
    arrays = fuzz.case_inputs(v, fuzz.Case(B=2, Lq=3, Lk=90, seed=4))
    q, k, vv, rest = fuzz.split_inputs(arrays)
    deq = {n: (a.astype(np.float32) * rest[f"{n}_scale"][:, None, :, None]).astype(np.float32).astype(ml_dtypes.bfloat16)
           for n, a in (("k", k), ("v", vv))}
    plain = {n: a for n, a in rest.items() if not n.endswith("_scale")}
    o, lse = reference.attention(v, q, k, vv, rest)
    o2, lse2 = reference.attention(full, q, deq["k"], deq["v"], plain)
    assert np.array_equal(np.asarray(o).view(np.uint16), np.asarray(o2).view(np.uint16))
    assert np.array_equal(lse, lse2) and np.isfinite(lse).all()
