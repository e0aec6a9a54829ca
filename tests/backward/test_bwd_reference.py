"""The float64 reference backward against finite differences of `reference.attention`.

Rounding is switched off in the reference for these checks (inputs and normalised q/k pass through
in float64 and O is returned in float64), so the forward is the smooth function the backward
differentiates; every gradient (dq, dk, dv and each learnable input) is checked as a directional
derivative along a random direction, for every example and for hypothesis-drawn specs."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "reference"))
import _irb as T  # noqa: E402

from attngen.lang import frontend  # noqa: E402
from attngen.check import reference, reference_bwd, reference_eval, workload  # noqa: E402
from attngen.check.fuzz import spec_strategy  # noqa: E402
from attngen.ir.nodes import AttnKind, DType, Layout, Norm, NormKind, NormScope, NormTarget  # noqa: E402

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.attn"))


@pytest.fixture
def exact(monkeypatch):
    """The reference without rounding: float64 end to end."""

    def no_round(x, d):
        return np.asarray(x, dtype=np.float64)

    real_dtype_of = reference.dtype_of

    def f64(d):
        return np.dtype(np.float64) if d.is_float else real_dtype_of(d)

    for mod in (reference, reference_eval, reference_bwd):
        monkeypatch.setattr(mod, "round_to", no_round)
    for mod in (reference, reference_eval):
        monkeypatch.setattr(mod, "dtype_of", f64)


def _f64(arrays):
    return {n: (np.asarray(a, dtype=np.float64) if np.asarray(a).dtype.kind == "f" or str(np.asarray(a).dtype) == "bfloat16" else a) for n, a in arrays.items()}


def check_directional(v, arrays, rng, wrt=None, rtol=2e-6) -> dict[str, float]:
    """For q, k, v and each learnable input: <grad, r> against the central difference of
    sum(dO * O) along a random direction r. Returns the analytic values (tests check some are
    non-zero so the comparison is not vacuous)."""
    arrays = _f64(arrays)
    q, k, vv = arrays["q"], arrays["k"], arrays["v"]
    rest = {n: a for n, a in arrays.items() if n not in ("q", "k", "v")}
    o, _ = reference.attention(v, q, k, vv, rest)
    dO = rng.normal(size=o.shape)
    names = reference_bwd.learnable_inputs(v) if wrt is None else wrt
    grads = reference_bwd.attention_backward(v, q, k, vv, rest, dO, wrt=names)
    seen = {}
    for name, key in [("q", "dq"), ("k", "dk"), ("v", "dv")] + [(n, n) for n in names]:
        x = arrays[name]
        g = grads[key]
        assert g.shape == x.shape and np.all(np.isfinite(g)), name
        r = rng.normal(size=x.shape)
        h = 1e-6 * max(1.0, float(np.abs(x).max()))

        def f(t):
            a = dict(arrays)
            a[name] = x + t * r
            rr = {n: a[n] for n in rest}
            return float(np.sum(dO * reference.attention(v, a["q"], a["k"], a["v"], rr)[0]))

        fd = (f(h) - f(-h)) / (2 * h)
        an = float(np.sum(g * r))
        bound = rtol * (abs(an) + float(np.linalg.norm(g) * np.linalg.norm(r))) + 1e-7
        assert abs(fd - an) <= bound, f"{v.name}: d/d{name}: analytic {an!r}, finite difference {fd!r}"
        seen[name] = an
    return seen


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_every_example_matches_finite_differences(path, exact):
    prog = frontend.load(path)
    rng = np.random.default_rng(7)
    for v in prog.variants:
        Lq, Lk = (6, 6) if v.kind == AttnKind.SELF else (5, 8)
        arrays = workload.make_inputs(v, 2, Lq, Lk, rng)
        if v.page_size is not None:  # refused, not differentiated: a paged cache is inference state
            with pytest.raises(ValueError, match="kv_cache paged"):
                reference.attention_backward(v, arrays["q"], arrays["k"], arrays["v"],
                                             {n: a for n, a in arrays.items() if n not in ("q", "k", "v")},
                                             np.ones(np.shape(reference.attention(v, arrays["q"], arrays["k"], arrays["v"], {n: a for n, a in arrays.items() if n not in ("q", "k", "v")})[0])))
            continue
        seen = check_directional(v, arrays, rng)
        assert any(abs(x) > 0 for x in seen.values())


def test_fully_masked_rows_give_zero_gradients():
    v = T.variant(T.padding(), (T.softcap(5.0),), D=8, heads=4, kv_heads=2)
    rng = np.random.default_rng(1)
    arrays = workload.make_inputs(v, 2, 9, 9, rng)
    arrays["q_lens"] = np.array([0, 5], dtype=np.int32)
    arrays["kv_lens"] = np.array([9, 0], dtype=np.int32)
    q, k, vv = arrays["q"], arrays["k"], arrays["v"]
    dO = rng.normal(size=q.shape)
    g = reference.attention_backward(v, q, k, vv, {"q_lens": arrays["q_lens"], "kv_lens": arrays["kv_lens"]}, dO)
    assert all(np.all(np.isfinite(x)) for x in g.values())
    assert not np.any(g["dq"][0]) and not np.any(g["dk"][0]) and not np.any(g["dv"][0])  # no query sees anything
    assert not np.any(g["dq"][1]) and not np.any(g["dk"][1]) and not np.any(g["dv"][1])  # no key visible
    # With something visible the gradients are not all zero (the test can fail).
    arrays["q_lens"] = np.array([9, 5], dtype=np.int32)
    g = reference.attention_backward(v, q, k, vv, {"q_lens": arrays["q_lens"], "kv_lens": arrays["kv_lens"]}, dO)
    assert np.any(g["dq"][0]) and not np.any(g["dq"][0][:, 9:])


def test_minus_inf_scores_on_visible_keys_are_empty_not_nan(exact):
    # log(s) is -inf at s = 0 and NaN below: a row whose visible scores are all -inf is empty.
    v = T.variant(T.causal(), (T.call("log", T.call("abs", T.s)),), D=4, heads=1)
    rng = np.random.default_rng(3)
    arrays = workload.make_inputs(v, 1, 4, 4, rng)
    arrays["q"][0, 0, 0] = 0.0  # row 0 sees only kv 0 with s = 0 -> log 0 = -inf
    g = reference.attention_backward(v, arrays["q"], arrays["k"], arrays["v"], {}, rng.normal(size=arrays["q"].shape))
    assert all(np.all(np.isfinite(x)) for x in g.values())
    assert not np.any(g["dq"][0, 0, 0])


def test_learnable_inputs_and_refusals():
    v = frontend.load(Path(__file__).resolve().parents[2] / "examples" / "t5_relative_bias.attn").get()
    assert reference_bwd.learnable_inputs(v) == ("rel_table",)
    rng = np.random.default_rng(0)
    a = workload.make_inputs(v, 1, 4, 4, rng)
    rest = {n: x for n, x in a.items() if n not in ("q", "k", "v")}
    with pytest.raises(ValueError, match="learnable inputs"):
        reference.attention_backward(v, a["q"], a["k"], a["v"], rest, np.zeros(a["q"].shape), wrt=("q_lens",))
    with pytest.raises(ValueError, match="dO: expected shape"):
        reference.attention_backward(v, a["q"], a["k"], a["v"], rest, np.zeros((1, 2, 3)))


NORM_CASES = [
    (NormTarget.Q, NormKind.LAYERNORM, NormScope.HEAD),
    (NormTarget.Q, NormKind.RMSNORM, NormScope.TOKEN),
    (NormTarget.Q, NormKind.LAYERNORM, NormScope.TOKEN),
    (NormTarget.K, NormKind.LAYERNORM, NormScope.HEAD),
    (NormTarget.K, NormKind.RMSNORM, NormScope.HEAD),
    (NormTarget.O, NormKind.LAYERNORM, NormScope.HEAD),
    (NormTarget.O, NormKind.RMSNORM, NormScope.HEAD),
]


@pytest.mark.parametrize("target,kind,scope", NORM_CASES, ids=lambda x: getattr(x, "value", x))
@pytest.mark.parametrize("residual", [False, True])
def test_norms_and_residual(target, kind, scope, residual, exact):
    layout = Layout.BSHD if scope == NormScope.TOKEN else Layout.BHSD
    v = T.variant(
        T.causal(),
        (T.softcap(4.0),),
        D=8,
        heads=4,
        kv_heads=2,
        layout=layout,
        norms=(Norm(target, kind, scope, 1e-5),),
        residual=residual,
    )
    rng = np.random.default_rng(5)
    arrays = workload.make_inputs(v, 2, 7, 7, rng)
    for n in reference_bwd.learnable_inputs(v):  # non-trivial affine weights
        arrays[n] = rng.normal(size=arrays[n].shape).astype(np.float32)
    seen = check_directional(v, arrays, rng)
    assert len(seen) == 3 + (2 if kind == NormKind.LAYERNORM else 1)


def test_flat_hidden_state_q():
    # q passed as a flat [B, L, H*D] hidden state (bshd): dq comes back in the same shape.
    v = T.variant(T.causal(), D=8, heads=2, layout=Layout.BSHD, norms=(Norm(NormTarget.Q, NormKind.RMSNORM, NormScope.TOKEN, 1e-5),))
    rng = np.random.default_rng(0)
    a = workload.make_inputs(v, 1, 5, 5, rng)
    rest = {"q_norm_weight": a["q_norm_weight"]}
    qf = a["q"].reshape(1, 5, 16)
    dO = rng.normal(size=(1, 5, 2, 8))
    g = reference.attention_backward(v, qf, a["k"], a["v"], rest, dO)
    g4 = reference.attention_backward(v, a["q"], a["k"], a["v"], rest, dO)
    assert g["dq"].shape == (1, 5, 16)
    np.testing.assert_array_equal(g["dq"].reshape(g4["dq"].shape), g4["dq"])


@settings(max_examples=25, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(spec_strategy(), st.integers(1, 9), st.integers(1, 9), st.integers(0, 2**31))
def test_random_specs_match_finite_differences(exact, text, Lq, Lk, seed):
    v = frontend.loads(text).get()  # (a drawn varlen spec: B = 1 packed sequence)
    if v.kind == AttnKind.SELF:
        Lk = Lq
    rng = np.random.default_rng(seed)
    arrays = workload.make_inputs(v, 1, Lq, Lk, rng)
    if v.quantized or v.page_size is not None:  # refused, never differentiated: rounding, inference state
        rest = {n: a for n, a in arrays.items() if n not in ("q", "k", "v")}
        o, _ = reference.attention(v, arrays["q"], arrays["k"], arrays["v"], rest)
        with pytest.raises(ValueError, match="quantized attention has no backward" if v.quantized else "kv_cache paged"):
            reference.attention_backward(v, arrays["q"], arrays["k"], arrays["v"], rest, np.ones(np.shape(o)))
        return
    check_directional(v, arrays, rng, rtol=1e-5)


# ---- against torch autograd (float64) of the same composition


def _torch():
    return pytest.importorskip("torch", reason="torch is not installed (CI installs torch 2.13 CPU)")


@pytest.mark.parametrize("case", ["softcap_causal_gqa", "alibi_slopes", "bias4", "rel_bias", "minmax_where"])
def test_against_torch_autograd(case):
    torch = _torch()
    H, Hkv, D, L = 4, 2, 8, 9
    rng = np.random.default_rng(11)
    t = torch.float64
    extra: dict[str, np.ndarray] = {}
    if case == "softcap_causal_gqa":
        v = T.variant(T.causal(), (T.softcap(3.0),), D=D, heads=H, kv_heads=Hkv)
    elif case == "alibi_slopes":
        v = T.variant(T.causal(), (T.alibi(slopes="sl"),), D=D, heads=H, kv_heads=Hkv, inputs=(T.decl("sl", DType.FP32, T.SizeSym.H),))
        extra["sl"] = rng.uniform(0.1, 1, size=H)
    elif case == "bias4":
        v = T.variant(T.TRUE, (T.bias("bb", 4), T.softcap(5.0)), D=D, heads=H, kv_heads=Hkv,
                      inputs=(T.decl("bb", DType.FP32, T.SizeSym.B, T.SizeSym.H, T.SizeSym.LQ, T.SizeSym.LK),))
        extra["bb"] = rng.normal(size=(2, H, L, L))
    elif case == "rel_bias":
        v = T.variant(T.TRUE, (T.rel_bias("rt", 3),), D=D, heads=H, kv_heads=Hkv, inputs=(T.decl("rt", DType.FP32, T.SizeSym.H, 7),))
        extra["rt"] = rng.normal(size=(H, 7))
    else:
        v = T.variant(T.causal(), (T.call("where", T.cmp("<", T.kv, T.ci(4)), T.call("min", T.s, T.cf(0.5)), T.call("max", T.s, T.cf(-0.25))),),
                      D=D, heads=H, kv_heads=Hkv)
    f32 = lambda x: x.astype(np.float32).astype(np.float64)  # noqa: E731  (the reference rounds to fp32)
    q, k, vv = f32(rng.normal(size=(2, H, L, D))), f32(rng.normal(size=(2, Hkv, L, D))), f32(rng.normal(size=(2, Hkv, L, D)))
    extra = {n: f32(a) for n, a in extra.items()}
    dO = rng.normal(size=(2, H, L, D))
    names = reference_bwd.learnable_inputs(v)
    got = reference.attention_backward(v, q, k, vv, extra, dO, wrt=names)

    tq, tk, tv = (torch.tensor(x, dtype=t, requires_grad=True) for x in (q, k, vv))
    tx = {n: torch.tensor(a, dtype=t, requires_grad=True) for n, a in extra.items()}
    kr, vr = tk.repeat_interleave(H // Hkv, dim=1), tv.repeat_interleave(H // Hkv, dim=1)
    s = tq @ kr.transpose(-1, -2) / np.sqrt(D)
    i = torch.arange(L)
    qi, ki = i[:, None], i[None, :]
    hi = torch.arange(H)[:, None, None]
    if case == "softcap_causal_gqa":
        s = 3.0 * torch.tanh(s / 3.0)
    elif case == "alibi_slopes":
        s = s - tx["sl"][:, None, None] * (qi - ki).abs()
    elif case == "bias4":
        s = 5.0 * torch.tanh((s + tx["bb"]) / 5.0)
    elif case == "rel_bias":
        s = s + tx["rt"][hi, (ki - qi).clamp(-3, 3) + 3]
    else:
        s = torch.where(ki < 4, torch.minimum(s, torch.tensor(0.5, dtype=t)), torch.maximum(s, torch.tensor(-0.25, dtype=t)))
    if case in ("softcap_causal_gqa", "alibi_slopes", "minmax_where"):
        s = s.masked_fill(ki > qi, float("-inf"))
    o = torch.softmax(s, dim=-1) @ vr
    (o * torch.tensor(dO)).sum().backward()
    np.testing.assert_allclose(got["dq"], tq.grad.numpy(), rtol=1e-9, atol=1e-11)
    np.testing.assert_allclose(got["dk"], tk.grad.numpy(), rtol=1e-9, atol=1e-11)
    np.testing.assert_allclose(got["dv"], tv.grad.numpy(), rtol=1e-9, atol=1e-11)
    for n in names:
        np.testing.assert_allclose(got[n], tx[n].grad.numpy(), rtol=1e-9, atol=1e-11)


def test_varlen_is_each_sequence_on_its_own(exact):
    # The packed backward equals the padded backward of each sequence alone (empty and one-row
    # sequences included), and matches finite differences.
    import dataclasses

    v = T.variant(T.causal(), (T.softcap(4.0),), D=8, heads=4, kv_heads=2, layout=Layout.VARLEN, residual=True)
    rng = np.random.default_rng(30)
    lens = [6, 0, 1, 9]
    a = workload.make_inputs(v, len(lens), sum(lens), sum(lens), rng)
    a["cu_seqlens"] = workload.cu_seqlens_of(lens)
    rest = {"cu_seqlens": a["cu_seqlens"]}
    dO = rng.normal(size=(sum(lens), 4, 8))
    g = reference.attention_backward(v, a["q"], a["k"], a["v"], rest, dO)
    dense = dataclasses.replace(v, layout=Layout.BSHD)
    cu = a["cu_seqlens"]
    for s0, s1 in zip(cu[:-1], cu[1:]):
        if s1 == s0:
            continue
        gd = reference.attention_backward(dense, a["q"][None, s0:s1], a["k"][None, s0:s1], a["v"][None, s0:s1], {}, dO[None, s0:s1])
        for n in ("dq", "dk", "dv"):
            np.testing.assert_allclose(g[n][s0:s1], gd[n][0], rtol=0, atol=0)
    seen = check_directional(v, a, rng)
    assert all(abs(x) > 0 for x in seen.values())
