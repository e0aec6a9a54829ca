"""Full attention semantics: `reference.attention` against plain loops, and invariants."""

from __future__ import annotations

import math
import tracemalloc

import ml_dtypes
import numpy as np
import pytest

import _brute as bf
from _irb import (
    and_,
    alibi,
    bias,
    call,
    causal,
    cf,
    ci,
    cmp,
    decl,
    kv,
    mul,
    padding,
    q,
    rel_bias,
    s,
    slope_table,
    softcap,
    sub,
    variant,
    window,
)
from attngen.check import reference as ref
from attngen.ir.nodes import AttnKind, DType, IndexVar, Layout, Norm, NormKind, NormScope, NormTarget, SizeSym

ALL = lambda *a: True  # noqa: E731


def rand(rng, *shape, dtype=DType.FP32):
    return rng.standard_normal(shape).astype(ref.dtype_of(dtype))


def f64(x):
    return np.asarray(x).astype(np.float64)


def qkv(rng, B=2, H=2, Hkv=None, Lq=5, Lk=5, D=8, Dv=None, dtype=DType.FP32):
    Hkv = Hkv or H
    return (
        rand(rng, B, H, Lq, D, dtype=dtype),
        rand(rng, B, Hkv, Lk, D, dtype=dtype),
        rand(rng, B, Hkv, Lk, Dv or D, dtype=dtype),
    )


def check(v, q_, k_, v_, inputs, visible, score=lambda x, b, h, i, j: x, rtol=1e-6):
    O, L = ref.attention(v, q_, k_, v_, inputs)
    Ob, Lb = bf.attention(f64(q_), f64(k_), f64(v_), scale=v.effective_scale, visible=visible, score=score)
    np.testing.assert_allclose(f64(O), Ob, rtol=rtol, atol=1e-6)
    np.testing.assert_allclose(L, Lb, rtol=1e-6, atol=1e-6)
    assert not np.isnan(f64(O)).any()
    return O, L


def test_plain_mha_and_scale():
    rng = np.random.default_rng(0)
    check(variant(), *qkv(rng), None, ALL)
    check(variant(scale=0.5), *qkv(rng), None, ALL)


@pytest.mark.parametrize("Lq,Lk", [(3, 7), (7, 3), (4, 4)])
def test_causal_cross_alignment(Lq, Lk):
    rng = np.random.default_rng(1)
    v = variant(causal(), kind=AttnKind.CROSS)
    O, L = check(v, *qkv(rng, Lq=Lq, Lk=Lk), None, lambda b, h, i, j: j <= i + Lk - Lq)
    if Lq > Lk:
        # Queries above the diagonal see nothing: O = 0, LSE = -inf.
        assert np.all(f64(O)[:, :, : Lq - Lk] == 0) and np.all(L[:, :, : Lq - Lk] == -np.inf)


def test_softcap():
    rng = np.random.default_rng(2)
    v = variant(causal(), (softcap(2.0),), scale=1.0)
    check(v, *qkv(rng), None, lambda b, h, i, j: j <= i, score=lambda x, *_: 2.0 * math.tanh(x / 2.0))


# BLOOM's slopes (transformers' build_alibi_tensor), written out by hand.
BLOOM_8 = [2**-1, 2**-2, 2**-3, 2**-4, 2**-5, 2**-6, 2**-7, 2**-8]
BLOOM_12 = BLOOM_8 + [2**-0.5, 2**-1.5, 2**-2.5, 2**-3.5]


@pytest.mark.parametrize("H,table", [(8, BLOOM_8), (12, BLOOM_12)])
def test_alibi_standard_slopes(H, table):
    assert ref.standard_alibi_slopes(H) == pytest.approx(table, rel=1e-15)
    rng = np.random.default_rng(3)
    Lq, Lk = 3, 6
    v = variant(causal(), (alibi(heads=H),), heads=H, kind=AttnKind.CROSS)
    check(
        v,
        *qkv(rng, B=1, H=H, Lq=Lq, Lk=Lk),
        None,
        lambda b, h, i, j: j <= i + Lk - Lq,
        score=lambda x, b, h, i, j: x - table[h] * abs(i + Lk - Lq - j),
    )


def test_alibi_slope_table_is_evaluated():
    env = ref.Env({IndexVar.H: np.arange(12)}, {})
    np.testing.assert_allclose(ref.evaluate(slope_table(12), env), BLOOM_12)


def test_alibi_with_slopes_tensor():
    rng = np.random.default_rng(4)
    slopes = np.array([0.3, 0.05], dtype=np.float32)
    v = variant(scores=(alibi(slopes="sl"),), inputs=(decl("sl", DType.FP32, SizeSym.H),))
    check(v, *qkv(rng), {"sl": slopes}, ALL, score=lambda x, b, h, i, j: x - float(slopes[h]) * abs(i - j))


@pytest.mark.parametrize("rank", [2, 3, 4])
def test_bias_ranks(rank):
    rng = np.random.default_rng(10 + rank)
    B, H, L = 2, 2, 5
    shape = {2: (L, L), 3: (H, L, L), 4: (B, H, L, L)}[rank]
    dims = {2: (SizeSym.LQ, SizeSym.LK), 3: (SizeSym.H, SizeSym.LQ, SizeSym.LK), 4: (SizeSym.B, SizeSym.H, SizeSym.LQ, SizeSym.LK)}[rank]
    t = rng.standard_normal(shape).astype(np.float32)
    v = variant(scores=(bias("bt", rank),), inputs=(decl("bt", DType.FP32, *dims),))

    def sc(x, b, h, i, j):
        return x + float(t[{2: (i, j), 3: (h, i, j), 4: (b, h, i, j)}[rank]])

    check(v, *qkv(rng, B=B, H=H, Lq=L, Lk=L), {"bt": t}, ALL, score=sc)


def test_bias_fp16_tensor_is_rounded():
    rng = np.random.default_rng(5)
    t = rng.standard_normal((5, 5))  # float64 given for an fp16 input: rounded like the kernel reads it
    t16 = t.astype(np.float16)
    v = variant(scores=(bias("bt", 2),), inputs=(decl("bt", DType.FP16, SizeSym.LQ, SizeSym.LK),))
    a = ref.attention(v, *qkv(rng), {"bt": t})
    rng = np.random.default_rng(5)
    rng.standard_normal((5, 5))
    b_ = ref.attention(v, *qkv(rng), {"bt": t16})
    np.testing.assert_array_equal(a[0], b_[0])


def test_rel_bias_cross():
    rng = np.random.default_rng(6)
    m, Lq, Lk = 2, 4, 7
    t = rng.standard_normal((2, 2 * m + 1)).astype(np.float32)
    v = variant(scores=(rel_bias("rb", m),), kind=AttnKind.CROSS, inputs=(decl("rb", DType.FP32, SizeSym.H, 5),))

    def sc(x, b, h, i, j):
        return x + float(t[h, min(max(j - (i + Lk - Lq), -m), m) + m])

    check(v, *qkv(rng, Lq=Lq, Lk=Lk), {"rb": t}, ALL, score=sc)


def test_scores_apply_in_order():
    rng = np.random.default_rng(7)
    # (s * 2) then softcap(1): order matters.
    v = variant(scores=(mul(s, cf(2.0)), softcap(1.0)))
    check(v, *qkv(rng), None, ALL, score=lambda x, *_: math.tanh(2 * x))


def test_custom_score_with_indices():
    rng = np.random.default_rng(8)
    v = variant(causal(), (call("where", cmp(">", sub(q, kv), ci(1)), sub(s, cf(1.5)), s),))
    check(v, *qkv(rng), None, lambda b, h, i, j: j <= i, score=lambda x, b, h, i, j: x - 1.5 if i - j > 1 else x)


def test_minus_inf_scores_make_rows_empty_not_nan():
    rng = np.random.default_rng(9)
    # Keys 0 and 1 get score log(0) = -inf; query 0 sees only key 0 (causal) -> empty row.
    v = variant(causal(), (call("where", cmp("<", kv, ci(2)), call("log", cf(0.0)), s),))
    O, L = ref.attention(v, *qkv(rng))
    assert not np.isnan(f64(O)).any() and not np.isnan(L).any()
    assert np.all(f64(O)[:, :, :2] == 0) and np.all(L[:, :, :2] == -np.inf)
    assert np.all(np.isfinite(L[:, :, 2:]))


def test_padding_rows_and_zero_lengths():
    rng = np.random.default_rng(11)
    ql = np.array([5, 2, 0], dtype=np.int32)
    kl = np.array([0, 3, 5], dtype=np.int32)
    v = variant(padding())
    O, L = check(v, *qkv(rng, B=3), {"q_lens": ql, "kv_lens": kl}, lambda b, h, i, j: i < ql[b] and j < kl[b])
    assert np.all(L[0] == -np.inf) and np.all(L[2] == -np.inf) and np.isfinite(L[1, :, :2]).all()


@pytest.mark.parametrize("H,Hkv", [(4, 2), (4, 1), (6, 3)])
def test_gqa_mqa_match_repeated_kv(H, Hkv):
    rng = np.random.default_rng(12)
    q_, k_, v_ = qkv(rng, H=H, Hkv=Hkv)
    vg = variant(causal(), heads=H, kv_heads=Hkv)
    O, L = check(vg, q_, k_, v_, None, lambda b, h, i, j: j <= i)
    rep = H // Hkv
    vm = variant(causal(), heads=H)
    Om, Lm = ref.attention(vm, q_, np.repeat(k_, rep, axis=1), np.repeat(v_, rep, axis=1))
    np.testing.assert_array_equal(O, Om)
    np.testing.assert_array_equal(L, Lm)


@pytest.mark.parametrize("dtype", [DType.FP32, DType.FP16, DType.BF16])
def test_bshd_is_transposed_bhsd(dtype):
    rng = np.random.default_rng(13)
    q_, k_, v_ = qkv(rng, H=4, Hkv=2, Lq=3, Lk=6, dtype=dtype, Dv=4)
    mk = dict(heads=4, kv_heads=2, kind=AttnKind.CROSS, dtype=dtype, Dv=4)
    Ob, Lb = ref.attention(variant(window(1, 1), **mk), q_, k_, v_)
    t = lambda x: x.transpose(0, 2, 1, 3)  # noqa: E731
    Os, Ls = ref.attention(variant(window(1, 1), layout=Layout.BSHD, **mk), t(q_), t(k_), t(v_))
    assert Ob.dtype == ref.dtype_of(dtype) and Os.shape == (2, 3, 4, 4)
    np.testing.assert_array_equal(t(Os), Ob)
    np.testing.assert_array_equal(Ls, Lb)


def test_output_dtype_and_input_rounding():
    rng = np.random.default_rng(14)
    q64, k64, v64 = (rng.standard_normal((1, 2, 4, 8)) for _ in range(3))
    v = variant(dtype=DType.BF16)
    O1, L1 = ref.attention(v, q64, k64, v64)
    cast = lambda x: x.astype(ml_dtypes.bfloat16)  # noqa: E731
    O2, L2 = ref.attention(v, cast(q64), cast(k64), cast(v64))
    assert O1.dtype == np.dtype(ml_dtypes.bfloat16) and L1.dtype == np.float32
    np.testing.assert_array_equal(O1, O2)
    np.testing.assert_array_equal(L1, L2)


# ---- norms and residual


def _ln(x, eps, w=None, b=None):
    mu = x.mean(-1, keepdims=True)
    y = (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + eps)
    return y * (1 if w is None else w) + (0 if b is None else b)


def _rms(x, eps, w=None):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * (1 if w is None else w)


def _r(x, dtype):
    return ref.round_to(x, dtype)


@pytest.mark.parametrize("kind", [NormKind.LAYERNORM, NormKind.RMSNORM])
@pytest.mark.parametrize("dtype", [DType.FP32, DType.BF16])
def test_head_scope_qk_norm(kind, dtype):
    rng = np.random.default_rng(15)
    q_, k_, v_ = qkv(rng, dtype=dtype, Lq=4, Lk=4)
    norms = (Norm(NormTarget.Q, kind, NormScope.HEAD, 1e-5), Norm(NormTarget.K, kind, NormScope.HEAD, 1e-6))
    v = variant(causal(), dtype=dtype, norms=norms)
    ins = {"q_norm_weight": 1 + 0.1 * rng.standard_normal(8).astype(np.float32),
           "k_norm_weight": 1 + 0.1 * rng.standard_normal(8).astype(np.float32)}
    if kind == NormKind.LAYERNORM:
        ins["q_norm_bias"] = 0.1 * rng.standard_normal(8).astype(np.float32)
        ins["k_norm_bias"] = 0.1 * rng.standard_normal(8).astype(np.float32)
    assert {d.name for d in v.runtime_inputs()} == set(ins)
    if kind == NormKind.LAYERNORM:
        qn = _ln(f64(q_), 1e-5, f64(ins["q_norm_weight"]), f64(ins["q_norm_bias"]))
        kn = _ln(f64(k_), 1e-6, f64(ins["k_norm_weight"]), f64(ins["k_norm_bias"]))
    else:
        qn = _rms(f64(q_), 1e-5, f64(ins["q_norm_weight"]))
        kn = _rms(f64(k_), 1e-6, f64(ins["k_norm_weight"]))
    O, L = ref.attention(v, q_, k_, v_, ins)
    Ob, Lb = bf.attention(_r(qn, dtype), _r(kn, dtype), f64(v_), scale=v.effective_scale, visible=lambda b, h, i, j: j <= i)
    np.testing.assert_allclose(f64(O), f64(_r(Ob, dtype)), rtol=1e-2 if dtype == DType.BF16 else 1e-6, atol=1e-2 if dtype == DType.BF16 else 1e-6)
    np.testing.assert_allclose(L, Lb, rtol=1e-6, atol=1e-5)


def test_token_scope_q_layernorm_with_flat_input_and_residual():
    rng = np.random.default_rng(16)
    B, Lq, H, D = 2, 4, 3, 8
    x = rng.standard_normal((B, Lq, H * D)).astype(np.float32)
    k_ = rand(rng, B, Lq, H, D)
    v_ = rand(rng, B, Lq, H, D)
    w = (1 + 0.1 * rng.standard_normal(H * D)).astype(np.float32)
    bb = (0.1 * rng.standard_normal(H * D)).astype(np.float32)
    v = variant(heads=H, layout=Layout.BSHD, residual=True,
                norms=(Norm(NormTarget.Q, NormKind.LAYERNORM, NormScope.TOKEN, 1e-5),))
    O, L = ref.attention(v, x, k_, v_, {"q_norm_weight": w, "q_norm_bias": bb})
    O4, _ = ref.attention(v, x.reshape(B, Lq, H, D), k_, v_, {"q_norm_weight": w, "q_norm_bias": bb})
    np.testing.assert_array_equal(O, O4)  # flat and 4-D q mean the same
    qn = _ln(f64(x), 1e-5, f64(w), f64(bb)).reshape(B, Lq, H, D).transpose(0, 2, 1, 3)
    t = lambda a: f64(a).transpose(0, 2, 1, 3)  # noqa: E731
    Ob, Lb = bf.attention(qn, t(k_), t(v_), scale=v.effective_scale, visible=ALL)
    want = Ob + t(x.reshape(B, Lq, H, D))
    np.testing.assert_allclose(t(O), want, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(L, Lb, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("kind,affine", [(NormKind.RMSNORM, True), (NormKind.LAYERNORM, False), (NormKind.LAYERNORM, True)])
def test_post_norm_on_o(kind, affine):
    rng = np.random.default_rng(17)
    q_, k_, v_ = qkv(rng, Dv=4)
    v = variant(causal(), Dv=4, norms=(Norm(NormTarget.O, kind, NormScope.HEAD, 1e-5, affine),))
    ins = {}
    if affine:
        ins["o_norm_weight"] = (1 + 0.1 * rng.standard_normal(4)).astype(np.float32)
        if kind == NormKind.LAYERNORM:
            ins["o_norm_bias"] = (0.1 * rng.standard_normal(4)).astype(np.float32)
    O, _ = ref.attention(v, q_, k_, v_, ins)
    Ob, _ = bf.attention(f64(q_), f64(k_), f64(v_), scale=v.effective_scale, visible=lambda b, h, i, j: j <= i)
    w = f64(ins["o_norm_weight"]) if affine else None
    want = _ln(Ob, 1e-5, w, f64(ins["o_norm_bias"]) if "o_norm_bias" in ins else None) if kind == NormKind.LAYERNORM else _rms(Ob, 1e-5, w)
    np.testing.assert_allclose(f64(O), want, rtol=1e-5, atol=1e-5)


def test_residual_keeps_x_on_empty_rows():
    rng = np.random.default_rng(18)
    q_, k_, v_ = qkv(rng, B=1)
    v = variant(padding(), residual=True)
    O, _ = ref.attention(v, q_, k_, v_, {"q_lens": np.array([2], np.int32), "kv_lens": np.array([5], np.int32)})
    np.testing.assert_array_equal(O[:, :, 2:], q_[:, :, 2:])  # nothing visible: out = x + 0


# ---- invariants


def test_rows_sum_to_one():
    rng = np.random.default_rng(19)
    q_, k_, _ = qkv(rng, Lq=6, Lk=6)
    ones = np.ones((2, 2, 6, 8), np.float32)
    ql = np.array([6, 3], np.int32)
    kl = np.array([4, 0], np.int32)
    v = variant(and_(causal(), padding()))
    O, L = ref.attention(v, q_, k_, ones, {"q_lens": ql, "kv_lens": kl})
    vis = np.isfinite(L)
    assert vis.sum() == 2 * 6  # batch 0: every row sees a key; batch 1: kv length 0
    np.testing.assert_allclose(f64(O)[vis], 1.0, rtol=1e-12)
    assert np.all(f64(O)[~vis] == 0)


def test_kv_permutation_invariance():
    rng = np.random.default_rng(20)
    q_, k_, v_ = qkv(rng, Lk=7, Lq=3)
    v = variant(kind=AttnKind.CROSS, scores=(softcap(3.0),))
    perm = rng.permutation(7)
    O1, L1 = ref.attention(v, q_, k_, v_)
    O2, L2 = ref.attention(v, q_, k_[:, :, perm], v_[:, :, perm])
    np.testing.assert_allclose(O1, O2, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(L1, L2, rtol=1e-12)


def test_lse_is_logsumexp_of_visible_scores():
    rng = np.random.default_rng(21)
    q_, k_, v_ = qkv(rng, B=1, H=1, Lq=4, Lk=4)
    v = variant(causal(), heads=1, scale=0.3)
    _, L = ref.attention(v, q_, k_, v_)
    sc = 0.3 * f64(q_)[0, 0] @ f64(k_)[0, 0].T
    for i in range(4):
        assert L[0, 0, i] == pytest.approx(np.log(np.exp(sc[i, : i + 1]).sum()), rel=1e-6)


def test_chunking_does_not_change_results(monkeypatch):
    rng = np.random.default_rng(22)
    q_, k_, v_ = qkv(rng, H=4, Hkv=2, Lq=9, Lk=9)
    v = variant(window(3, 1), (softcap(5.0),), heads=4, kv_heads=2)
    O1, L1 = ref.attention(v, q_, k_, v_)
    monkeypatch.setattr(ref, "CHUNK_BYTES", 8 * 2 * 9 * 2)  # two query rows a step
    O2, L2 = ref.attention(v, q_, k_, v_)
    np.testing.assert_array_equal(O1, O2)
    np.testing.assert_array_equal(L1, L2)


def test_memory_stays_bounded_for_long_sequences():
    rng = np.random.default_rng(23)
    L = 2048
    q_, k_, v_ = (rng.standard_normal((1, 2, L, 16)).astype(np.float16) for _ in range(3))
    v = variant(causal(), dtype=DType.FP16, D=16)
    tracemalloc.start()
    try:
        O, _ = ref.attention(v, q_, k_, v_)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # The full float64 score matrix alone would be 2 * 2048 * 2048 * 8 = 64 MiB.
    assert peak < 64 << 20, peak
    assert np.isfinite(f64(O)).all()
