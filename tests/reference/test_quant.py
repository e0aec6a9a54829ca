"""The quantized reference (attngen.check.quant) against the numerics order of docs/QUANT.md: the
quantizer against a table of every representable value, the attention against a loop written
from the document, the binder's checks of the scale inputs, and the accuracy report."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from attngen.check import quant, quant_accuracy, reference, workload
from attngen.ir import abi
from attngen.ir.dtypes import DType
from attngen.lang import frontend

F32 = np.float32


def _table(d: DType) -> tuple[np.ndarray, np.ndarray]:
    """Every finite value of an fp8 type, sorted, with its bit pattern."""
    bits = np.arange(256, dtype=np.uint8)
    vals = bits.view(ml_dtypes.float8_e4m3fn if d == DType.FP8_E4M3 else ml_dtypes.float8_e5m2).astype(np.float64)
    ok = np.isfinite(vals)
    order = np.argsort(vals[ok], kind="stable")
    return vals[ok][order], bits[ok][order]


def _rq_slow(x: float, d: DType) -> float:
    """Round to nearest, ties to the even bit pattern, after saturating: from the table alone."""
    if d == DType.I8:
        return float(min(127, max(-127, round(x))))  # Python's round is half to even
    vals, bits = _table(d)
    x = min(max(x, -d.info.qmax), d.info.qmax)
    i = int(np.searchsorted(vals, x))
    cands = [j for j in (i - 1, i) if 0 <= j < len(vals)]
    best = min(cands, key=lambda j: (abs(vals[j] - x), int(bits[j]) & 1))
    return float(vals[best]) if vals[best] != 0 else 0.0


@pytest.mark.parametrize("d", [DType.FP8_E4M3, DType.FP8_E5M2, DType.I8], ids=lambda d: d.value)
def test_quantizer_rounds_to_nearest_even_and_saturates(d: DType) -> None:
    rng = np.random.default_rng(1)
    qmax = d.info.qmax
    vals = _table(d)[0] if d != DType.I8 else np.arange(-127, 128, dtype=np.float64)
    mids = (vals[1:] + vals[:-1]) / 2  # exact ties (representable in fp32)
    x = np.concatenate([mids, vals, rng.standard_normal(500) * qmax / 4, [qmax * 3, -qmax * 3, 1e30, -1e30, 0.0]]).astype(F32)
    got = quant.quantize(x, d)
    want = np.array([_rq_slow(float(t), d) for t in x])
    assert np.array_equal(got.astype(np.float64), want)
    assert got.max() == qmax and got.min() == -qmax  # saturated, never -128 or non-finite


def test_scale_pair() -> None:
    s, r = quant.scale_pair(np.array([0.0, 254.0, 3.0], F32), 127.0)
    assert s.tolist() == [1.0, 2.0, np.float32(3.0) / np.float32(127.0)]
    assert r.tolist() == [1.0, 0.5, np.float32(127.0) / np.float32(3.0)]


SAGE = """attention s {
  dtype fp16
  head_dim 16
  heads 2 kv 1
  mask causal
  quant q i8 amax per block(16)
  quant k i8 amax per block(16) smooth mean
  quant v fp8_e4m3 amax per channel
  quant p fp8_e4m3 static(448.0)
}
"""

FP8 = """attention f {
  dtype fp8_e5m2 out bf16
  head_dim 16
  heads 2
  layout bshd
  quant q fp8_e5m2 input per token
  quant k fp8_e5m2 input per head
  quant v fp8_e5m2 input per tensor
  quant p fp8_e5m2 amax per token
}
"""


def _slow_attention(v, q4, k4, v4) -> np.ndarray:
    """docs/QUANT.md's order, one row at a time, for the SAGE and FP8 specs above ([B, H, L, D] inputs)."""
    B, H, L, D = q4.shape
    Gq = v.group_size
    out = np.zeros(q4.shape)
    qq, kk, vq = v.quant(quant.QuantOperand.Q), v.quant(quant.QuantOperand.K), v.quant(quant.QuantOperand.V)

    def amax_scale(a: float, qmax: float) -> tuple[float, float]:
        return (1.0, 1.0) if a == 0 else (float(F32(a) / F32(qmax)), float(F32(qmax) / F32(a)))

    def rq(x: float, d: DType) -> float:
        return _rq_slow(float(x), d)

    for b in range(B):
        for h in range(H):
            hk = h // Gq
            Q = q4[b, h].astype(F32)
            K = k4[b, hk].astype(F32)
            V = v4[b, hk].astype(F32)
            if kk.smooth is not None:
                K = (K - (K.astype(np.float64).sum(axis=0) / L).astype(F32)).astype(F32)
            qd, kd, vd = np.zeros((L, D)), np.zeros((L, D)), np.zeros((L, D))
            if qq.source == quant.ScaleSource.AMAX:  # blocks of 16 rows
                for rows, X, out_ in ((range(L), Q, qd), (range(L), K, kd)):
                    for blk in range(0, L, 16):
                        s, r = amax_scale(float(np.abs(X[blk:blk + 16]).max()), 127.0)
                        for i in range(blk, min(L, blk + 16)):
                            out_[i] = [rq(F32(x) * F32(r), DType.I8) * s for x in X[i]]
                for c in range(D):
                    s, r = amax_scale(float(np.abs(V[:, c]).max()), 448.0)
                    vd[:, c] = [rq(F32(x) * F32(r), DType.FP8_E4M3) * s for x in V[:, c]]
            else:  # stored: values times the given scales (filled in by the caller below)
                qd, kd, vd = Q.astype(np.float64) * v._qs[b, h][:, None], K * v._ks[b, hk], V * v._vs[0]
            s = qd @ kd.T * v.effective_scale
            if v.mask != frontend.loads(FP8).variants[0].mask:
                s = np.where(np.tril(np.ones((L, L), bool)), s, -np.inf)
            m = s.max(axis=1, keepdims=True)
            p = np.exp(s - m)
            l = p.sum(axis=1, keepdims=True)
            pd = np.zeros_like(p)
            pdt = v.quant(quant.QuantOperand.P).dtype
            for i in range(L):
                c = 448.0 if v.quant(quant.QuantOperand.P).static else pdt.info.qmax / float(F32(p[i]).max())
                pd[i] = [rq(F32(x) * F32(c), pdt) * float(F32(1) / F32(c)) for x in p[i]]
            out[b, h] = pd @ vd / l
    return out


def test_reference_follows_the_document_sage() -> None:
    v = frontend.loads(SAGE).variants[0]
    arrays = workload.make_inputs(v, 2, 40, 40, np.random.default_rng(3))
    o, _ = reference.attention(v, arrays["q"], arrays["k"], arrays["v"], {})
    want = _slow_attention(v, arrays["q"], arrays["k"], arrays["v"])
    assert np.allclose(o.astype(np.float64), want, rtol=2e-3, atol=2e-3)  # o rounds to fp16


def test_reference_follows_the_document_stored_fp8() -> None:
    v = frontend.loads(FP8).variants[0]
    arrays = workload.make_inputs(v, 2, 24, 24, np.random.default_rng(4))
    assert arrays["q"].dtype == np.dtype(ml_dtypes.float8_e5m2) and arrays["q_scale"].shape == (2, 2, 24)
    rest = {n: a for n, a in arrays.items() if n not in "qkv"}
    o, _ = reference.attention(v, arrays["q"], arrays["k"], arrays["v"], rest)
    t = lambda x: np.asarray(x).transpose(0, 2, 1, 3)  # noqa: E731
    slow = type("V", (), {})()
    for name in ("group_size", "quant", "effective_scale", "mask"):
        setattr(slow, name, getattr(v, name))
    slow._qs, slow._ks, slow._vs = arrays["q_scale"], arrays["k_scale"], arrays["v_scale"]
    want = _slow_attention(slow, t(arrays["q"]), t(arrays["k"]), t(arrays["v"]))
    assert np.allclose(t(o).astype(np.float64), want, rtol=1e-2, atol=1e-2)  # o rounds to bf16


def test_calibrated_inputs_reproduce_the_values() -> None:
    # Stored fp8 with calibrated per-head scales: dequantized values are within e4m3's rounding.
    v = frontend.loads(FP8.replace("e5m2", "e4m3")).variants[0]
    x = np.random.default_rng(0).standard_normal((1, 8, 2, 16))
    arrays = {"q": x.copy(), "k": x.copy(), "v": x.copy()}
    quant.store_inputs(v, arrays)
    deq = arrays["k"].astype(np.float64) * arrays["k_scale"][:, None, :, None]
    assert np.abs(deq - x).max() <= 2.0**-4 * np.abs(x).max() + 1e-12


def test_binder_checks_the_scale_inputs() -> None:
    v = frontend.loads(SAGE.replace("amax per block(16) smooth mean", "input per block(16)").replace(
        "quant q i8 amax per block(16)", "quant q i8 input per block(16)")).variants[0]
    q = (2, 2, 40, 16)
    k = (2, 1, 40, 16)
    good = {"q_scale": ((2, 2, 3), "float32"), "k_scale": ((2, 1, 3), "float32")}
    assert abi.bind_sizes(v, q, k, k, good).symbol("k_scale_blocks") == 3
    with pytest.raises(ValueError, match=r"k_scale: expected shape \(B=2, Hkv=1, k_scale_blocks=3\) = \(2, 1, 3\), got \(2, 1, 4\)"):
        abi.bind_sizes(v, q, k, k, {**good, "k_scale": ((2, 1, 4), "float32")})
    with pytest.raises(ValueError, match=r"q_scale: expected dtype float32 \(fp32\), got float16"):
        abi.bind_sizes(v, q, k, k, {**good, "q_scale": ((2, 2, 3), "float16")})
    with pytest.raises(ValueError, match="missing k_scale"):
        abi.bind_sizes(v, q, k, k, {"q_scale": good["q_scale"]})


def test_accuracy_report() -> None:
    v = frontend.loads(SAGE).variants[0]
    a = quant_accuracy.accuracy(v, (1, 64, 64))
    assert 1e-3 < a.emulation.rel_l2 < 0.1 and a.full_precision.rel_l2 < a.emulation.rel_l2
    assert a.emulation_outliers.rel_l2 > a.emulation.rel_l2  # outlier channels cost more
    arrays = quant_accuracy.inputs(v, 1, 64, 64)
    truth = quant_accuracy.truth(v, arrays)
    call = quant_accuracy.quantized_call(v, arrays)
    emu, _ = reference.attention(v, call["q"], call["k"], call["v"], {})
    assert quant_accuracy.within_bar(emu, truth, emu)[0]
    worse = emu.astype(np.float64) + 0.2 * a.emulation.rel_l2 * np.abs(truth).max() * np.sign(np.asarray(emu, np.float64) - truth + 1e-30)
    assert not quant_accuracy.within_bar(worse, truth, emu)[0]
    assert math.isfinite(a.emulation.max_abs)


def test_a_running_max_kernel_stays_within_the_derived_p_bound() -> None:
    """A flash kernel's order (keys in tiles of 16, p quantized against the running max, the
    accumulator rescaled): it differs from the reference, within `quant.p_bound` (docs/QUANT.md)."""
    from attngen.check import reference_eval as E
    from attngen.check.fuzz_run import compare

    v = frontend.loads(SAGE.replace("  mask causal\n", "").replace(" smooth mean", "")).variants[0]
    arrays = workload.make_inputs(v, 1, 96, 96, np.random.default_rng(11))
    tensors = E.prepare_tensors(v, {})
    qd, kd, vd = quant.dense_operands(v, arrays["q"], arrays["k"], arrays["v"], tensors)
    c = F32(v.quant(quant.QuantOperand.P).static)
    out = np.zeros(qd.shape)
    for h in range(v.heads):
        hk = h // v.group_size
        s = qd[0, h] @ kd[0, hk].T * v.effective_scale
        m = np.full((s.shape[0], 1), -np.inf)
        l = np.zeros((s.shape[0], 1))
        acc = np.zeros((s.shape[0], vd.shape[-1]))
        for k0 in range(0, s.shape[1], 16):
            st = s[:, k0:k0 + 16]
            m_new = np.maximum(m, st.max(axis=1, keepdims=True))
            alpha = np.exp(m - m_new)
            p = np.exp(st - m_new)
            pq = quant.quantize(p.astype(F32) * c, DType.FP8_E4M3).astype(np.float64) * float(F32(1) / c)
            l = l * alpha + p.sum(axis=1, keepdims=True)
            acc = acc * alpha + pq @ vd[0, hk, k0:k0 + 16]
            m = m_new
        out[0, h] = acc / l
    flash = out.astype(np.float16)
    ref = reference.attention(v, arrays["q"], arrays["k"], arrays["v"], {})
    diff = np.abs(flash.astype(np.float64) - ref[0].astype(np.float64)).max()
    bound = quant.p_bound(v, float(np.abs(vd).max()), 96)
    assert diff > 1e-3  # the orders do differ
    assert diff <= bound < 0.5 * float(np.abs(vd).max())  # within the bound, which is not vacuous
    assert all(r.ok for r in compare(v, arrays, flash, None, ref))
    # Without the p term the fp16 policy alone would refuse this kernel.
    from attngen.check import tolerance

    assert not tolerance.check(flash, ref[0], v.dtype, score_err=quant.score_error(v, qd, kd)).ok
