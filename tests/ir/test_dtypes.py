"""The dtype table (attngen.ir.dtypes): every row is complete and agrees with the libraries that
hold the type, and the facts the rest of the compiler derives from a row are those it had before
the table (the generated code and the tolerances must not move)."""

from __future__ import annotations

import numpy as np
import pytest

from attngen.ir.dtypes import (ATTENTION_DTYPES, DTYPES, FP32_UNIT_ROUNDOFF, INPUT_DTYPES, QUANT_DTYPES, TENSOR_CORE_DTYPES,
                               DType, DTypeInfo, by_numpy_name, by_torch_name, ml_dtype)


def test_every_dtype_has_its_row() -> None:
    assert set(DTYPES) == set(DType)
    for d, row in DTYPES.items():
        assert row.dtype is d and d.info is row
        assert d.itemsize == row.itemsize and d.is_float == row.is_float


@pytest.mark.parametrize("d", list(DType), ids=lambda d: d.value)
def test_numpy_names_and_sizes_agree(d: DType) -> None:
    row = d.info
    assert np.dtype(ml_dtype(d)).name == row.numpy
    assert np.dtype(ml_dtype(d)).itemsize == row.itemsize
    assert np.dtype(row.storage).itemsize == row.itemsize  # the bit patterns' carrier has its width
    assert np.dtype(row.bits).itemsize == row.itemsize
    assert row.foreign == (row.numpy != np.dtype(row.storage).name)
    assert by_numpy_name(row.numpy) is row


@pytest.mark.parametrize("d", list(DType), ids=lambda d: d.value)
def test_torch_names_agree(d: DType) -> None:
    torch = pytest.importorskip("torch")
    t = getattr(torch, d.info.torch)
    assert t.itemsize == d.itemsize and t.is_floating_point == d.is_float
    assert by_torch_name(str(t)) is d.info
    if d.info.foreign:  # the bridge from NumPy views the bits through the same-width integer
        x = np.array([1.5, -2.0]).astype(ml_dtype(d))
        back = torch.from_numpy(x.view(d.info.bits)).view(t)
        assert back.float().tolist() == [1.5, -2.0]


def test_vector_width_follows_the_element_size() -> None:
    # The runtime's 16-byte alignment rule: 4 fp32, 8 fp16/bf16, and 16 for an 8-bit type (the
    # rule it replaced assumed 8 for every tensor-core type).
    assert [DType.FP32.info.vec_elems, DType.FP16.info.vec_elems, DType.BF16.info.vec_elems] == [4, 8, 8]
    assert DType.U8.info.vec_elems == 16
    eight_bit = DTypeInfo(DType.U8, numpy="uint8", storage="uint8", torch="uint8", cuda="x", cpp="x", suffix="x",
                          itemsize=1, is_float=True, attention=True)
    assert eight_bit.vec_elems == 16


def test_the_spellings_the_generated_code_has_always_used() -> None:
    assert {d: d.info.cuda for d in INPUT_DTYPES} == {DType.I32: "int", DType.U8: "unsigned char", DType.FP32: "float",
                                                DType.FP16: "__half", DType.BF16: "__nv_bfloat16"}
    assert {d: d.info.suffix for d in INPUT_DTYPES} == {DType.I32: "i32", DType.U8: "u8", DType.FP32: "f32",
                                                  DType.FP16: "f16", DType.BF16: "bf16"}
    assert [d.info.ptx for d in ATTENTION_DTYPES] == [None, "f16", "bf16"]
    assert [d.info.to_float for d in INPUT_DTYPES] == ["", "ag_to_float", "ag_to_float", "(int)", "(int)"]


def test_attention_and_tensor_core_sets() -> None:
    assert ATTENTION_DTYPES == (DType.FP32, DType.FP16, DType.BF16)
    assert TENSOR_CORE_DTYPES == (DType.FP16, DType.BF16)
    assert [d.info.min_cc for d in ATTENTION_DTYPES] == [0, 75, 80]


def test_tensor_core_shapes_per_arch() -> None:
    def shapes(d: DType, cc: int, arch_specific: bool = False) -> list[str]:
        return [m.shape for m in d.info.mma_shapes(cc, arch_specific)]

    assert shapes(DType.FP16, 75) == ["m16n8k8"]  # sm_75: two k8 MMAs per k16 step
    assert shapes(DType.BF16, 75) == []
    assert shapes(DType.BF16, 80) == ["m16n8k16"]
    assert shapes(DType.FP16, 90) == ["m16n8k8", "m16n8k16"]  # sm_90 without the 'a' features: no wgmma
    assert shapes(DType.FP16, 90, arch_specific=True)[-1] == "m64nNk16"
    assert shapes(DType.FP32, 90, arch_specific=True) == []
    assert DType.BF16.info.has_mma("m16n8k16") and not DType.FP32.info.has_mma("m16n8k16")


def test_rounding_terms() -> None:
    assert DType.FP32.info.unit_roundoff == FP32_UNIT_ROUNDOFF == 2.0**-24
    assert [d.info.rounding_beyond_fp32 for d in INPUT_DTYPES] == [0.0, 2.0**-11, 2.0**-8, 0.0, 0.0]
    for d in ATTENTION_DTYPES:  # the unit roundoff is what rounding to the type does
        x = np.float64(1.0) + 3 * d.info.unit_roundoff
        err = abs(float(np.asarray(x).astype(ml_dtype(d))) - x) / x
        assert 0 < err <= d.info.unit_roundoff


def test_tolerance_policy_is_read_from_the_rows() -> None:
    from attngen.check import tolerance

    assert set(tolerance.POLICY) == set(ATTENTION_DTYPES)
    assert tolerance.tolerance_for("bf16") == tolerance.Tolerance(rel_l2=1.6e-2, max_abs=6.25e-2, lse_abs=1e-4, lse_rel=1e-4)
    assert tolerance.GRAD_MAX_ABS == {DType.FP32: 2e-3, DType.FP16: 1.5e-2, DType.BF16: 4e-2}
    with pytest.raises(ValueError, match="expected fp32, fp16 or bf16"):
        tolerance.tolerance_for(DType.I32)


def test_quantized_rows() -> None:
    # The quantized types are neither attention nor input types; their facts are the hardware's.
    assert QUANT_DTYPES == (DType.FP8_E4M3, DType.FP8_E5M2, DType.I8)
    assert not set(QUANT_DTYPES) & (set(ATTENTION_DTYPES) | set(INPUT_DTYPES))
    assert [d.info.qmax for d in QUANT_DTYPES] == [448.0, 57344.0, 127.0]
    assert [d.info.min_cc for d in QUANT_DTYPES] == [89, 89, 80]
    assert [d.info.cuda for d in QUANT_DTYPES] == ["__nv_fp8_e4m3", "__nv_fp8_e5m2", "signed char"]
    assert [d.info.ptx for d in QUANT_DTYPES] == ["e4m3", "e5m2", "s8"]
    for d in QUANT_DTYPES:
        assert d.info.tolerances is None and d.itemsize == 1
        assert [m.shape for m in d.info.mma_shapes(90, arch_specific=True)] == ["m16n8k32", "m64nNk32"]
        assert [m.shape for m in d.info.mma_shapes(90)] == ["m16n8k32"]
    assert DType.FP8_E4M3.info.mma_shapes(86) == () and DType.I8.info.mma_shapes(80)
    # qmax is the largest finite value: ml_dtypes agrees, and one step beyond is not finite (fp8).
    import ml_dtypes

    assert float(ml_dtypes.finfo(ml_dtypes.float8_e4m3fn).max) == 448.0
    assert float(ml_dtypes.finfo(ml_dtypes.float8_e5m2).max) == 57344.0
    for d in (DType.FP8_E4M3, DType.FP8_E5M2):
        x = np.float32(1.0) + np.float32(d.info.unit_roundoff)  # a tie: rounds to even, 1.0
        assert float(np.asarray(x).astype(ml_dtype(d))) == 1.0
