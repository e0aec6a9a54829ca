"""The decode family's FP8 KV cache on the GPU (sm_89+): k and v stored fp8_e4m3/e5m2 with input
scales per tensor, head or page, q and the output bf16/fp16.

Two checks a case: the kernel against the quantized reference (docs/QUANT.md's order: each cache
element dequantized to fp32(x_q * s) and rounded to the output type, then full-precision decode),
under the full-precision tolerance of the output type; and, tighter, bit for bit against the
full-precision decode kernel of the same spec run on those dequantized values with the same
schedule: the dequantization in the split-KV kernel adds no rounding of its own. Contiguous and
paged caches, one split and several, B1 and B8, calibrated (never zero) inputs, and scale inputs of
the wrong shape or dtype refused before launch.
"""

from __future__ import annotations

import re

import ml_dtypes
import numpy as np
import pytest

from attngen.check import fuzz, reference
from attngen.ir.dtypes import ml_dtype
from attngen.ir.nodes import QuantOperand, ScaleGranularity
from gpu_helpers import spec_text, variant_of

pytestmark = pytest.mark.gpu

CACHE = ("input cache_lens: i32[B]",)


def _fp8(name: str, *, dtype: str, D: int, H: int, Hkv: int, k: str, v: str, k_per: str, v_per: str,
         paged: int | None, layout: str = "bhsd", mask: str = "causal", lse: bool = True) -> str:
    extra = [f"kv_cache paged({paged})"] if paged else []
    text = spec_text(name, dtype=dtype, D=D, H=H, Hkv=Hkv, kind="cross", layout=layout, mask=mask, lse=lse,
                     extra=tuple(extra))
    text = text.replace(f"dtype {dtype}", f"dtype {dtype} k {k} v {v}")
    return text.replace("}\n", f"  quant k {k} input per {k_per}\n  quant v {v} input per {v_per}\n}}\n")


SPECS = [
    # The benchmark's shape family: Llama-3 8B heads, pages of 16, a scale per page.
    _fp8("q_paged16_page_bf16_d128", dtype="bf16", D=128, H=32, Hkv=8, k="fp8_e4m3", v="fp8_e4m3", k_per="page",
         v_per="page", paged=16),
    # The gallery's: a scale per kv head.
    _fp8("q_paged16_head_bf16_d128", dtype="bf16", D=128, H=32, Hkv=8, k="fp8_e4m3", v="fp8_e4m3", k_per="head",
         v_per="head", paged=16),
    # Pages smaller than a warp's 32 keys at D64 (two scales a warp step), e5m2 keys, fp16.
    _fp8("q_paged8_mixed_fp16_d64", dtype="fp16", D=64, H=8, Hkv=1, k="fp8_e5m2", v="fp8_e4m3", k_per="page",
         v_per="tensor", paged=8, layout="bshd", mask="kv < cache_lens[b]"),
    _fp8("q_contig_head_bf16_d128", dtype="bf16", D=128, H=32, Hkv=8, k="fp8_e4m3", v="fp8_e4m3", k_per="head",
         v_per="head", paged=None, mask="causal && kv < cache_lens[b]").replace("  quant k", "  " + CACHE[0] + "\n  quant k"),
    _fp8("q_contig_tensor_fp16_d64", dtype="fp16", D=64, H=8, Hkv=2, k="fp8_e5m2", v="fp8_e5m2", k_per="tensor",
         v_per="head", paged=None, layout="bshd", lse=False),
    _fp8("q_paged16_page_bf16_d256", dtype="bf16", D=256, H=16, Hkv=8, k="fp8_e4m3", v="fp8_e4m3", k_per="page",
         v_per="page", paged=16),
]

# (B, Lq, Lk): one key, a partial chunk, B8 with several chunks, B1 with a long cache, a draft.
SHAPES = [(1, 1, 1), (1, 1, 37), (8, 1, 2000), (1, 1, 9000), (2, 4, 300)]


def _id(text: str) -> str:
    return text.split()[1]


def _twin(text: str) -> str:
    """The same spec at full precision (the same kernel family on dequantized values)."""
    text = re.sub(r"dtype (\w+) k \w+ v \w+", r"dtype \1", text)
    return "".join(ln + "\n" for ln in text.splitlines() if not ln.strip().startswith("quant "))


def _scale_view(v, op: QuantOperand, s: np.ndarray) -> np.ndarray:
    """A scale input broadcastable to the stored k/v array (paged [pages, N, Hkv, D], bhsd, bshd)."""
    g = v.quant(op).granularity
    if g == ScaleGranularity.TENSOR:
        return s.reshape(1, 1, 1, 1)
    if v.page_size is not None:
        return s.reshape(1, 1, -1, 1) if g == ScaleGranularity.HEAD else s[:, None, :, None]
    return s[:, :, None, None] if v.layout.value == "bhsd" else s[:, None, :, None]


def _dequantized(v, arrays: dict) -> dict:
    """The call of the full-precision twin: k and v as fp32(x_q * s) rounded to the output type."""
    out = {n: a for n, a in arrays.items() if n not in ("k_scale", "v_scale")}
    for name, op in (("k", QuantOperand.K), ("v", QuantOperand.V)):
        x = arrays[name].astype(np.float32) * _scale_view(v, op, arrays[f"{name}_scale"].astype(np.float32))
        out[name] = x.astype(np.float32).astype(ml_dtype(v.dtype))
    return out


def _kernels(text: str):
    from attngen.runtime import kernel as runtime

    v, twin = variant_of(text), variant_of(_twin(text))
    return v, runtime.compile(v, family="decode"), twin, runtime.compile(twin, family="decode")


def _run(kernel, v, arrays, **kw):
    return fuzz.run_kernel(lambda q, k, vv, **a: kernel(q, k, vv, **kw, **a), v, arrays)


@pytest.mark.parametrize("text", SPECS, ids=_id)
def test_fp8_decode_matches_the_reference_and_the_dequantized_full_precision_kernel(text: str) -> None:
    v, kern, twin, tkern = _kernels(text)
    for seed, (B, Lq, Lk) in enumerate(SHAPES):
        arrays = fuzz.case_inputs(v, fuzz.Case(B=B, Lq=Lq, Lk=Lk, seed=seed))
        assert arrays["k"].dtype == np.dtype(ml_dtype(v.k_dtype))
        assert np.abs(arrays["k"].astype(np.float32)).max() > 0 and np.abs(arrays["v"].astype(np.float32)).max() > 0
        n_chunks = max(1, -(-arrays_len(v, arrays) // kern.plan.split.chunk))
        q, k, vv, rest = fuzz.split_inputs(arrays)
        ref = reference.attention(v, q, k, vv, rest)  # a cross-attention cache: no call positions
        for splits in sorted({1, min(3, n_chunks), n_chunks}):
            out, lse = _run(kern, v, arrays, splits=splits)
            bad = [r.summary() for r in fuzz.compare(v, arrays, out, lse, ref) if not r.ok]
            assert not bad, f"{v.name} B={B} Lq={Lq} Lk={Lk} splits={splits}:\n" + "\n".join(bad)
            t_out, t_lse = _run(tkern, twin, _dequantized(v, arrays), splits=splits)
            assert np.array_equal(np.asarray(out).view(np.uint16), np.asarray(t_out).view(np.uint16)), (
                f"{v.name} B={B} Lq={Lq} Lk={Lk} splits={splits}: O differs from the dequantized bf16/fp16 kernel's")
            if v.lse:
                assert np.array_equal(lse, t_lse, equal_nan=True)
        # The launch-time schedule and equal shares that cut row blocks anywhere.
        out, lse = _run(kern, v, arrays)
        assert all(r.ok for r in fuzz.compare(v, arrays, out, lse, ref))
        ctas = min(5, kern.plan.split.units(B, Lq, arrays_len(v, arrays)))
        out, lse = _run(kern, v, arrays, ctas=ctas)
        assert all(r.ok for r in fuzz.compare(v, arrays, out, lse, ref)), f"{v.name} ctas={ctas}"


def arrays_len(v, arrays: dict) -> int:
    """Lk of a call (a paged cache's capacity: the block table's pages times the page size)."""
    if v.page_size is not None:
        return arrays["block_table"].shape[1] * v.page_size
    k = arrays["k"]
    return k.shape[2] if v.layout.value == "bhsd" else k.shape[1]


def test_fp8_decode_refuses_bad_scales_and_caches_before_launch() -> None:
    v, kern, _, _ = _kernels(SPECS[0])
    arrays = fuzz.case_inputs(v, fuzz.Case(B=2, Lq=1, Lk=100, seed=9))
    q, k, vv, rest = fuzz.split_inputs(arrays)
    dev = lambda d: {n: fuzz.to_device(a) for n, a in d.items()}  # noqa: E731
    pages, hkv = k.shape[0], v.kv_heads

    def call(kk=k, vvv=vv, **over):
        given = {**rest, **over}
        given = {n: a for n, a in given.items() if a is not None}
        return kern(fuzz.to_device(q), fuzz.to_device(kk), fuzz.to_device(vvv), **dev(given))

    with pytest.raises(ValueError, match=r"k_scale: expected shape \(num_pages=%d, Hkv=%d\)" % (pages, hkv)):
        call(k_scale=np.ones((pages - 1, hkv), np.float32))
    with pytest.raises(ValueError, match=r"v_scale: expected shape"):
        call(v_scale=np.ones((hkv,), np.float32))
    with pytest.raises(ValueError, match=r"k_scale: expected dtype float32"):
        call(k_scale=rest["k_scale"].astype(np.float16))
    with pytest.raises(ValueError, match="missing v_scale"):
        call(v_scale=None)
    with pytest.raises(ValueError, match=r"k: expected dtype float8_e4m3fn"):
        call(kk=k.astype(np.float32).astype(ml_dtypes.bfloat16))
    # The good call still runs after the refusals.
    out, lse = _run(kern, v, arrays)
    assert all(r.ok for r in fuzz.compare(v, arrays, out, lse))


def test_other_quantized_specs_keep_the_cuda_refusal() -> None:
    from attngen.runtime import kernel as runtime

    text = _fp8("q_fp8_q", dtype="bf16", D=64, H=4, Hkv=4, k="fp8_e4m3", v="fp8_e4m3", k_per="head", v_per="head",
                paged=None).replace("dtype bf16 k fp8_e4m3 v fp8_e4m3", "dtype fp8_e4m3 out bf16").replace(
        "  quant k", "  quant q fp8_e4m3 input per head\n  quant k")
    with pytest.raises(ValueError, match="not yet on the CUDA backend"):
        runtime.compile(variant_of(text), family="decode")


def test_torch_op_and_cuda_graphs_carry_the_scales() -> None:
    """attngen.torch.register: the op takes the fp8 cache and the scales by name and equals the
    kernel; a CUDA graph of the kernel reads the scales at replay (doubled v scales double O)."""
    torch = pytest.importorskip("torch")
    from attngen.runtime import torch_op

    v, kern, _, _ = _kernels(SPECS[0])
    arrays = fuzz.case_inputs(v, fuzz.Case(B=8, Lq=1, Lk=1000, seed=11))
    q, k, vv, rest = fuzz.split_inputs(arrays)
    dq, dk, dv = fuzz.to_device(q), fuzz.to_device(k), fuzz.to_device(vv)
    drest = {n: fuzz.to_device(a) for n, a in rest.items()}
    assert dk.dtype == torch.float8_e4m3fn and drest["k_scale"].dtype == torch.float32
    o_k, lse_k = kern(dq, dk, dv, **drest)
    op = torch_op.register(v)
    with torch.no_grad():
        o, lse = op(dq, dk, dv, **drest)
    torch.cuda.synchronize()
    assert torch.equal(o, o_k) and torch.equal(lse, lse_k)
    # A graph captured with one set of scales, replayed after copying in doubled v scales: O doubles
    # exactly (a power of two commutes with every rounding), the LSE is unchanged.
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        kern(dq, dk, dv, **drest)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        o_g, lse_g = kern(dq, dk, dv, **drest)
    g.replay()
    torch.cuda.synchronize()
    first, first_lse = o_g.clone(), lse_g.clone()
    torch.testing.assert_close(first.float(), o_k.float(), rtol=1e-2, atol=1e-2)  # the merge may differ
    drest["v_scale"].mul_(2.0)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(o_g.float(), 2 * first.float()) and torch.equal(lse_g, first_lse)
