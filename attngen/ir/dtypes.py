"""Element types and every fact about each, one row a type (`DTYPES`): how NumPy, torch and CuPy
hold it, its C++ spelling on each backend, its size, the tensor-core instructions its products
run on per arch, the tolerances a kernel's output is held to, and how the reference rounds to it.
Code that needs a fact about a dtype reads its row (`DType.info`), so a new element type is one
row here plus the engines that use it."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class DType(enum.Enum):
    """Element types: the attention ones (`ATTENTION_DTYPES`) for Q/K/V/O, the quantized ones
    (`QUANT_DTYPES`) for stored or in-kernel quantized Q/K/V/P (docs/QUANT.md), the others
    (`INPUT_DTYPES`) for declared runtime inputs."""

    FP32 = "fp32"
    FP16 = "fp16"
    BF16 = "bf16"
    I32 = "i32"
    U8 = "u8"
    FP8_E4M3 = "fp8_e4m3"
    FP8_E5M2 = "fp8_e5m2"
    I8 = "i8"

    @property
    def info(self) -> DTypeInfo:
        """This type's row of the table."""
        return DTYPES[self]

    @property
    def is_float(self) -> bool:
        return DTYPES[self].is_float

    @property
    def itemsize(self) -> int:
        return DTYPES[self].itemsize


@dataclass(frozen=True, slots=True)
class MmaShape:
    """A tensor-core instruction a dtype's products run on, from compute capability `min_cc` on
    (`arch_specific`: only on the arch-specific target of that generation, e.g. sm_90a)."""

    instruction: str  # "mma.sync" or "wgmma"
    shape: str  # e.g. "m16n8k16"; N stands for the tile's width
    min_cc: int
    arch_specific: bool = False


@dataclass(frozen=True, slots=True)
class Tolerances:
    """What a kernel's results in this type are held to against the float64 reference
    (attngen.check.tolerance): output rel. L2 and max abs over max|ref|, LSE absolute and relative,
    and gradients' max abs over max|ref|."""

    rel_l2: float
    max_abs: float
    lse_abs: float
    lse_rel: float
    grad_max_abs: float


FP32_UNIT_ROUNDOFF = 2.0**-24  # the kernels' arithmetic type


@dataclass(frozen=True, slots=True)
class DTypeInfo:
    """One element type's facts."""

    dtype: DType
    numpy: str  # the NumPy dtype name (ml_dtypes' for types NumPy lacks): np.dtype(x).name
    storage: str  # the NumPy / CuPy dtype whose bit patterns carry it where a library lacks the type
    torch: str  # the torch dtype's attribute name (torch.<name>)
    cuda: str  # the CUDA C++ element type
    cpp: str  # a plain C++ element type (a host backend): the storage type where C++ has none
    suffix: str  # its short name in generated entry points (attngen_check_sorted_<suffix>)
    itemsize: int  # bytes
    is_float: bool
    attention: bool = False  # may be Q/K/V/O's type
    min_cc: int = 0  # the oldest compute capability whose kernels take it as Q/K/V (0: every one)
    mma: tuple[MmaShape, ...] = ()  # tensor-core instructions of its products (empty: FFMA in fp32)
    ptx: str | None = None  # its operand type in mma.sync / wgmma PTX
    tma: str | None = None  # its CUtensorMapDataType enumerator
    to_float: str = ""  # the C++ that reads one element as the kernels' float or int arithmetic
    unit_roundoff: float = 0.0  # 2^-p: rounding a real to it errs by at most this, relatively (0: integers)
    tolerances: Tolerances | None = None  # None: never an output type
    large_magnitude: float = 30.0  # the fuzzer's "large" inputs: exp of a raw score overflows, the values stay finite
    # A quantized type (docs/QUANT.md): never an attention or input type, only what `quant` and the
    # per-tensor `dtype` put Q/K/V/P in; products of two of them run in fp32 (fp8) or int32 (i8).
    quant: bool = False
    qmax: float = 0.0  # the saturation bound of quantizing to it: its largest finite magnitude (i8: 127, symmetric)

    @property
    def vec_elems(self) -> int:
        """Elements in one 16-byte vector load or store (the alignment a vectorised row needs)."""
        return 16 // self.itemsize

    @property
    def foreign(self) -> bool:
        """Whether NumPy and CuPy lack it: NumPy holds it through ml_dtypes, CuPy and .npz files as
        `storage` bit patterns, torch's bridge from NumPy through `bits`."""
        return self.storage != self.numpy

    @property
    def bits(self) -> str:
        """The signed integer type of its width, through which torch views its bit patterns."""
        return f"int{8 * self.itemsize}"

    @property
    def tensor_cores(self) -> bool:
        """Whether its products run on tensor cores (on every arch that takes it)."""
        return bool(self.mma)

    @property
    def rounding_beyond_fp32(self) -> float:
        """The unit roundoff of storing an fp32 result in this type: 0 for fp32 itself and for
        integers (the tolerances' rounding terms that the fp32 arithmetic already covers)."""
        return self.unit_roundoff if self.unit_roundoff > FP32_UNIT_ROUNDOFF else 0.0

    def has_mma(self, shape: str) -> bool:
        """Whether its products have the tensor-core shape `shape` on some arch (an engine written
        for that instruction can take it)."""
        return any(m.shape == shape for m in self.mma)

    def mma_shapes(self, cc: int, arch_specific: bool = False) -> tuple[MmaShape, ...]:
        """The tensor-core instructions it has on an arch of compute capability `cc`."""
        return tuple(m for m in self.mma if m.min_cc <= cc and (arch_specific or not m.arch_specific))


_WGMMA = MmaShape("wgmma", "m64nNk16", 90, arch_specific=True)

DTYPES: dict[DType, DTypeInfo] = {
    DType.FP32: DTypeInfo(
        DType.FP32, numpy="float32", storage="float32", torch="float32", cuda="float", cpp="float", suffix="f32",
        itemsize=4, is_float=True, attention=True, tma="CU_TENSOR_MAP_DATA_TYPE_FLOAT32", unit_roundoff=FP32_UNIT_ROUNDOFF,
        tolerances=Tolerances(rel_l2=1e-5, max_abs=1e-4, lse_abs=1e-5, lse_rel=1e-5, grad_max_abs=2e-3)),
    DType.FP16: DTypeInfo(
        DType.FP16, numpy="float16", storage="float16", torch="float16", cuda="__half", cpp="uint16_t", suffix="f16",
        itemsize=2, is_float=True, attention=True, min_cc=75,
        # sm_75 has no m16n8k16: its fp16 products are two m16n8k8 each.
        mma=(MmaShape("mma.sync", "m16n8k8", 75), MmaShape("mma.sync", "m16n8k16", 80), _WGMMA),
        ptx="f16", tma="CU_TENSOR_MAP_DATA_TYPE_FLOAT16", to_float="ag_to_float", unit_roundoff=2.0**-11,
        tolerances=Tolerances(rel_l2=2e-3, max_abs=1e-2, lse_abs=1e-4, lse_rel=1e-4, grad_max_abs=1.5e-2),
        # ±8 keeps q·k products representable in a naive kernel's fp16 accumulators.
        large_magnitude=8.0),
    DType.BF16: DTypeInfo(
        DType.BF16, numpy="bfloat16", storage="uint16", torch="bfloat16", cuda="__nv_bfloat16", cpp="uint16_t",
        suffix="bf16", itemsize=2, is_float=True, attention=True, min_cc=80,
        mma=(MmaShape("mma.sync", "m16n8k16", 80), _WGMMA),
        ptx="bf16", tma="CU_TENSOR_MAP_DATA_TYPE_BFLOAT16", to_float="ag_to_float", unit_roundoff=2.0**-8,
        tolerances=Tolerances(rel_l2=1.6e-2, max_abs=6.25e-2, lse_abs=1e-4, lse_rel=1e-4, grad_max_abs=4e-2)),
    DType.I32: DTypeInfo(
        DType.I32, numpy="int32", storage="int32", torch="int32", cuda="int", cpp="int32_t", suffix="i32",
        itemsize=4, is_float=False, to_float="(int)"),
    DType.U8: DTypeInfo(
        DType.U8, numpy="uint8", storage="uint8", torch="uint8", cuda="unsigned char", cpp="uint8_t", suffix="u8",
        itemsize=1, is_float=False, to_float="(int)"),
}

_FP8_MMA = (MmaShape("mma.sync", "m16n8k32", 89), MmaShape("wgmma", "m64nNk32", 90, arch_specific=True))

DTYPES.update({
    # FP8 (OCP e4m3 without infinities, "fn", and e5m2): products on sm_89+ mma.sync and sm_90a
    # wgmma, both k = 32, fp32 accumulation. No tolerances: never an output type.
    DType.FP8_E4M3: DTypeInfo(
        DType.FP8_E4M3, numpy="float8_e4m3fn", storage="uint8", torch="float8_e4m3fn", cuda="__nv_fp8_e4m3", cpp="uint8_t",
        suffix="e4m3", itemsize=1, is_float=True, min_cc=89, mma=_FP8_MMA, ptx="e4m3", tma="CU_TENSOR_MAP_DATA_TYPE_UINT8",
        to_float="ag_to_float", unit_roundoff=2.0**-4, quant=True, qmax=448.0),
    DType.FP8_E5M2: DTypeInfo(
        DType.FP8_E5M2, numpy="float8_e5m2", storage="uint8", torch="float8_e5m2", cuda="__nv_fp8_e5m2", cpp="uint8_t",
        suffix="e5m2", itemsize=1, is_float=True, min_cc=89, mma=_FP8_MMA, ptx="e5m2", tma="CU_TENSOR_MAP_DATA_TYPE_UINT8",
        to_float="ag_to_float", unit_roundoff=2.0**-3, quant=True, qmax=57344.0),
    # INT8, symmetric (-128 is never produced): s8 x s8 -> s32 on sm_80+ mma.sync m16n8k32 and sm_90a wgmma.
    DType.I8: DTypeInfo(
        DType.I8, numpy="int8", storage="int8", torch="int8", cuda="signed char", cpp="int8_t", suffix="i8",
        itemsize=1, is_float=False, min_cc=80,
        mma=(MmaShape("mma.sync", "m16n8k32", 80), MmaShape("wgmma", "m64nNk32", 90, arch_specific=True)),
        ptx="s8", tma="CU_TENSOR_MAP_DATA_TYPE_UINT8", to_float="(int)", quant=True, qmax=127.0),
})

ATTENTION_DTYPES: tuple[DType, ...] = tuple(d for d in DType if DTYPES[d].attention)
QUANT_DTYPES: tuple[DType, ...] = tuple(d for d in DType if DTYPES[d].quant)
# What a declared runtime input (`input x: T[...]`) may be: every type but the quantized ones.
INPUT_DTYPES: tuple[DType, ...] = tuple(d for d in DType if not DTYPES[d].quant)
TENSOR_CORE_DTYPES: tuple[DType, ...] = tuple(d for d in ATTENTION_DTYPES if DTYPES[d].tensor_cores)


def by_numpy_name(name: str) -> DTypeInfo | None:
    """The row of a NumPy dtype name ("bfloat16"), or None for a type the IR does not have."""
    return next((r for r in DTYPES.values() if r.numpy == name), None)


def by_torch_name(name: str) -> DTypeInfo | None:
    """The row of a torch dtype (`str(t.dtype)`, with or without "torch."), or None."""
    name = name.removeprefix("torch.")
    return next((r for r in DTYPES.values() if r.torch == name), None)


def ml_dtype(d: DType) -> object:
    """The NumPy scalar type of an element type (ml_dtypes' for those NumPy lacks)."""
    import numpy as np

    if hasattr(np, d.info.numpy):
        return getattr(np, d.info.numpy)
    import ml_dtypes

    return getattr(ml_dtypes, d.info.numpy)


__all__ = ["ATTENTION_DTYPES", "DTYPES", "DType", "DTypeInfo", "FP32_UNIT_ROUNDOFF", "INPUT_DTYPES", "MmaShape", "QUANT_DTYPES", "TENSOR_CORE_DTYPES",
           "Tolerances", "by_numpy_name", "by_torch_name", "ml_dtype"]
