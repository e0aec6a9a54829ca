"""Input validation happens before the launch: wrong arrays give a ValueError that names what was
expected, and the (NaN-poisoned) output stays untouched. Also: CuPy and torch inputs agree, and
nan_check turns NaN/Inf in the output into NaNCheckError naming the variant."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from attngen.check import fuzz
from gpu_helpers import kernel_for, spec_text, variant_of

FP16 = spec_text("val_fp16", dtype="fp16", D=64, H=4, Hkv=2, mask="causal", lse=True)
PAD = spec_text("val_padding", dtype="fp32", D=64, H=2, mask="padding")


def _dev_inputs(v, B=2, L=33, seed=0):
    arrays = fuzz.case_inputs(v, fuzz.Case(B=B, Lq=L, Lk=L, seed=seed))
    return arrays, {n: fuzz.to_device(a) for n, a in arrays.items()}


def _expect_error(v, pattern: str, *, q=None, k=None, vv=None, **overrides) -> None:
    """Call with one thing wrong; assert ValueError matching `pattern` and an untouched output."""
    _, dev = _dev_inputs(v)
    q = dev.pop("q") if q is None else q
    k = dev.pop("k") if k is None else k
    vv = dev.pop("v") if vv is None else vv
    for n in ("q", "k", "v"):
        dev.pop(n, None)
    dev.update(overrides)
    B, L = 2, 33
    out = fuzz.empty_device((B, v.heads, L, v.value_head_dim), v.dtype)
    kw = {"out": out}
    with pytest.raises(ValueError, match=pattern):
        kernel_for(v)(q, k, vv, **kw, **dev)
    fuzz.synchronize()
    assert np.isnan(np.asarray(fuzz.to_host(out, v.dtype), dtype=np.float32)).all(), "launched despite the error"


@pytest.mark.gpu
def test_wrong_dtype_names_the_expected_dtype() -> None:
    v = variant_of(FP16)
    arrays, _ = _dev_inputs(v)
    q32 = fuzz.to_device(arrays["q"].astype(np.float32))
    _expect_error(v, r"q: expected dtype float16", q=q32)


@pytest.mark.gpu
def test_wrong_heads_names_the_expected_shape() -> None:
    v = variant_of(FP16)
    rng = np.random.default_rng(0)
    q_bad = fuzz.to_device(rng.standard_normal((2, 3, 33, 64)).astype(np.float16))  # H=3, spec says 4
    _expect_error(v, r"q: expected shape .*H=4", q=q_bad)


@pytest.mark.gpu
def test_wrong_head_dim_of_k() -> None:
    v = variant_of(FP16)
    rng = np.random.default_rng(1)
    k_bad = fuzz.to_device(rng.standard_normal((2, 2, 33, 32)).astype(np.float16))
    _expect_error(v, r"k: expected shape .*D=64", k=k_bad)


@pytest.mark.gpu
def test_self_attention_needs_equal_lengths() -> None:
    v = variant_of(FP16)
    rng = np.random.default_rng(2)
    k_bad = fuzz.to_device(rng.standard_normal((2, 2, 40, 64)).astype(np.float16))
    _expect_error(v, r"k: expected shape .*Lk=33", k=k_bad)


@pytest.mark.gpu
def test_non_contiguous_last_dim() -> None:
    v = variant_of(FP16)
    rng = np.random.default_rng(3)
    wide = fuzz.to_device(rng.standard_normal((2, 4, 33, 128)).astype(np.float16))
    _expect_error(v, r"q: expected the last dimension to be contiguous", q=wide[..., ::2])


@pytest.mark.gpu
def test_host_array_is_rejected() -> None:
    v = variant_of(FP16)
    arrays, _ = _dev_inputs(v)
    _expect_error(v, r"q: expected a device array", q=arrays["q"])


@pytest.mark.gpu
def test_cpu_torch_tensor_is_rejected() -> None:
    torch = pytest.importorskip("torch")
    v = variant_of(FP16)
    arrays, _ = _dev_inputs(v)
    _expect_error(v, r"q: expected a CUDA tensor", q=torch.from_numpy(arrays["q"]))


@pytest.mark.gpu
def test_missing_runtime_input_is_named() -> None:
    v = variant_of(PAD)
    arrays, dev = _dev_inputs(v)
    out = fuzz.empty_device((2, 2, 33, 64), v.dtype)
    with pytest.raises(ValueError, match=r"missing .*kv_lens"):
        kernel_for(v)(dev["q"], dev["k"], dev["v"], out=out, q_lens=dev["q_lens"])
    fuzz.synchronize()
    assert np.isnan(fuzz.to_host(out)).all()


@pytest.mark.gpu
def test_runtime_input_wrong_dtype() -> None:
    v = variant_of(PAD)
    arrays, _ = _dev_inputs(v)
    _expect_error(v, r"q_lens: expected dtype int32", q_lens=fuzz.to_device(arrays["q_lens"].astype(np.float32)))


@pytest.mark.gpu
def test_strided_norm_weight_is_refused() -> None:
    # The kernels read norm weights as one flat row: a strided view would be read wrongly.
    v = variant_of(spec_text("val_qnorm", dtype="fp16", D=64, H=2, extra=("norm q rmsnorm(1e-6)",)))
    arrays, _ = _dev_inputs(v)
    w = arrays["q_norm_weight"]
    strided = fuzz.to_device(np.repeat(w, 2))[::2]
    _expect_error(v, r"q_norm_weight: expected a contiguous array \(stride 1\)", q_norm_weight=strided)


@pytest.mark.gpu
def test_wrong_output_shape() -> None:
    v = variant_of(FP16)
    _, dev = _dev_inputs(v)
    bad_out = fuzz.empty_device((2, 4, 32, 64), v.dtype)
    with pytest.raises(ValueError, match=r"out: expected shape \(2, 4, 33, 64\)"):
        kernel_for(v)(dev["q"], dev["k"], dev["v"], out=bad_out)


@pytest.mark.gpu
def test_cupy_and_torch_inputs_agree() -> None:
    cupy = pytest.importorskip("cupy")
    torch = pytest.importorskip("torch")
    v = variant_of(FP16)
    arrays, _ = _dev_inputs(v, seed=5)
    k = kernel_for(v)
    o_c, lse_c = k(cupy.asarray(arrays["q"]), cupy.asarray(arrays["k"]), cupy.asarray(arrays["v"]))
    o_t, lse_t = k(*(torch.from_numpy(arrays[n]).cuda() for n in ("q", "k", "v")))
    torch.cuda.synchronize()
    assert isinstance(o_c, cupy.ndarray) and isinstance(o_t, torch.Tensor)
    np.testing.assert_array_equal(cupy.asnumpy(o_c), o_t.cpu().numpy())
    np.testing.assert_array_equal(cupy.asnumpy(lse_c), lse_t.cpu().numpy())


@pytest.mark.gpu
def test_nan_check_raises_naming_the_variant() -> None:
    from attngen.runtime.kernel import NaNCheckError

    v = variant_of(spec_text("val_nan_check", dtype="fp16", D=64, H=2, extra=("nan_check",)))
    arrays, _ = _dev_inputs(v, seed=7)
    bad_v = arrays["v"].copy()
    bad_v[0, 0, 3, 5] = np.float16(math.inf)
    dev = {n: fuzz.to_device(a) for n, a in arrays.items()}
    dev["v"] = fuzz.to_device(bad_v)
    with pytest.raises(NaNCheckError, match=re.escape("val_nan_check")):
        kernel_for(v)(dev["q"], dev["k"], dev["v"])
    # And clean inputs pass the same check.
    out = kernel_for(v)(fuzz.to_device(arrays["q"]), fuzz.to_device(arrays["k"]), fuzz.to_device(arrays["v"]))
    assert np.isfinite(np.asarray(fuzz.to_host(out, v.dtype), dtype=np.float32)).all()


@pytest.mark.gpu
@pytest.mark.parametrize("lib", ["torch", "cupy"])
def test_explicit_stream_with_prep_kernels(lib: str) -> None:
    """`stream=` another stream than the current one: the prep kernels, their workspace and the
    nan flag all follow it, and the result matches the reference (and the current-stream call)."""
    cupy = pytest.importorskip("cupy")
    v = variant_of(spec_text("val_stream_norms", dtype="fp16", D=64, H=4, Hkv=2, mask="causal",
                             extra=("norm q layernorm(1e-5) affine false", "norm k rmsnorm(1e-6) affine false", "nan_check")))
    arrays = fuzz.case_inputs(v, fuzz.Case(B=2, Lq=300, Lk=300, seed=9))
    k = kernel_for(v)
    if lib == "torch":
        torch = pytest.importorskip("torch")
        dev = [torch.from_numpy(arrays[n]).cuda() for n in ("q", "k", "v")]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            out_side = torch.empty_like(dev[0])
        out_side = k(*dev, out=out_side, stream=side)
        side.synchronize()
        host = out_side.cpu().numpy()
    else:
        dev = [cupy.asarray(arrays[n]) for n in ("q", "k", "v")]
        side = cupy.cuda.Stream(non_blocking=True)
        with side:
            out_side = cupy.empty_like(dev[0])
        cupy.cuda.get_current_stream().synchronize()
        out_side = k(*dev, out=out_side, stream=side)
        side.synchronize()
        host = cupy.asnumpy(out_side)
    ref = fuzz.compare(v, arrays, host, None)
    assert all(r.ok for r in ref), "\n".join(r.summary() for r in ref)
    current = fuzz.to_host(k(*dev), v.dtype)
    np.testing.assert_array_equal(host, current)


@pytest.mark.gpu
def test_torch_launch_raises_no_deprecation_warning() -> None:
    """Launching on torch's current stream and on a raw stream handle wraps those streams without
    CuPy's deprecated ExternalStream (which warned once a call), and still computes the right O."""
    import warnings

    torch = pytest.importorskip("torch")
    v = variant_of(PAD)
    arrays, _ = _dev_inputs(v, seed=3)
    dev = {n: torch.from_numpy(np.ascontiguousarray(a)).cuda() for n, a in arrays.items()}
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        out = kernel_for(v)(**dev)
        out_raw = kernel_for(v)(**dev, stream=side.cuda_stream)
    side.synchronize()
    for o in (out, out_raw):
        ref = fuzz.compare(v, arrays, o.cpu().numpy(), None)
        assert all(r.ok for r in ref), "\n".join(r.summary() for r in ref)
