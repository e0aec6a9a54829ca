"""attngen.torch trained through torch.autograd on the GPU: every gradient (q, k, v, learnable
score inputs, norm weights, sinks, a loss that reads the declared LSE) against the float64
reference backward (or float64 torch autograd), fully masked rows, the direct op call,
torch.compile(fullgraph=True) of forward + backward, torch.library.opcheck (autograd registration
included), a CUDA graph of forward + backward, and positions reaching the backward runtime."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the autograd tests need torch")

from gpu_helpers import variant_of  # noqa: E402

from attngen.check import fuzz, fuzz_bwd, reference_bwd, tolerance  # noqa: E402
from attngen.ir.nodes import DType  # noqa: E402
from attngen.plan import bwd as plan_bwd  # noqa: E402

SPECS = {
    "ag_fp32_softcap_gqa": "dtype fp32; head_dim 64; heads 4 kv 2; mask causal; score softcap(5.0)",
    "ag_bf16_learnable": ("dtype bf16; head_dim 64; heads 4 kv 2; layout bshd; input bb: fp32[H, Lq, Lk]; input sl: fp32[H]; "
                          "input rel: fp32[H, 17]; mask causal; score bias(bb); score alibi(sl); score rel_bias(rel, 8)"),
    "ag_fp16_padding_cross": "dtype fp16; head_dim 128; heads 2; kind cross; mask padding",
    "ag_fp16_qk_norm_residual": ("dtype fp16; head_dim 64; heads 2; residual; mask window(30, 0); "
                                 "norm q layernorm(1e-5); norm k rmsnorm(1e-6)"),
    "ag_bf16_sinks": "dtype bf16; head_dim 64; heads 4 kv 2; input sinks: fp32[H]; mask causal; sink sinks; output lse",
}
TORCH_DT = {DType.FP32: torch.float32, DType.FP16: torch.float16, DType.BF16: torch.bfloat16}


def _variant(name):
    return variant_of(f"attention {name.replace('ag_', 'tg_')} {{ {SPECS[name]} }}")


def _op(name):
    import attngen.runtime.torch as at

    return at.register(_variant(name))


def _case(name, B=2, Lq=77, Lk=77, seed=0):
    v = _variant(name)
    if v.kind.value == "self":
        Lk = Lq
    q_lens = kv_lens = None
    if "padding" in SPECS[name]:
        q_lens, kv_lens = tuple([0, Lq - 3][:B]), tuple([Lk, 0][:B])  # batch 0 no queries, batch 1 no keys
    case = fuzz.Case(B=B, Lq=Lq, Lk=Lk, seed=seed, q_lens=q_lens, kv_lens=kv_lens)
    arrays, dO = fuzz_bwd.backward_inputs(v, case)
    return v, case, arrays, dO


def _leaf(a, grad):
    t = fuzz.to_device(a).clone()
    return t.requires_grad_(grad and t.dtype.is_floating_point)


def _train(name, arrays, dO, *, deterministic=False, direct=False):
    """Gradients through torch.autograd of sum(o * dO) for every float input."""
    op = _op(name)
    ts = {n: _leaf(a, True) for n, a in arrays.items()}
    args = [ts["q"], ts["k"], ts["v"], *(ts[n] for n in op.input_names)]
    out = op.op(*args) if direct else op(*args[:3], deterministic=deterministic, **dict(zip(op.input_names, args[3:])))
    o = out[0] if isinstance(out, tuple) else out
    (o.float() * fuzz.to_device(dO).float()).sum().backward()
    return {n: t.grad for n, t in ts.items() if t.requires_grad}


def _compare(v, arrays, dO, grads):
    q, k, vv, rest = fuzz.split_inputs(arrays)
    wrt = tuple(n for n in reference_bwd.learnable_inputs(v) if n in grads)
    want = reference_bwd.attention_backward(v, q, k, vv, rest, dO.astype(np.float64), wrt=wrt)
    amax = lambda a: float(np.abs(np.asarray(a, dtype=np.float64)).max())  # noqa: E731
    atol = tolerance.grad_atol(v.dtype, q_max=amax(q), k_max=amax(k), v_max=amax(vv), do_max=amax(dO.astype(np.float64)),
                               value_head_dim=v.value_head_dim, scale=v.effective_scale, residual=v.residual)
    B, Lq, Lk = q.shape[0], want["dq"].size // (q.shape[0] * v.heads * v.head_dim), want["dk"].size // (q.shape[0] * v.kv_heads * v.head_dim)
    o_max = amax(vv) + (amax(q) if v.residual else 0.0)
    for g, n in (("dq", "q"), ("dk", "k"), ("dv", "v"), *((w, w) for w in wrt)):
        got = fuzz.to_host(grads[n]).astype(np.float64)
        floor = atol if n in "qkv" else tolerance.param_grad_atol(
            do_max=amax(dO.astype(np.float64)), o_max=o_max, contributions=B * v.heads * Lq * Lk / max(1, want[g].size),
            dtype=v.dtype, value_head_dim=v.value_head_dim)
        if n in plan_bwd.norm_params(v):
            # A norm weight's gradient sums dq (or dk) times the normalised rows over every token:
            # where the reference cancels to 0 exactly (one key: dS = 0), the kernel keeps dq / dk's
            # own rounding floor (`atol`, set by O rounded to fp16/bf16), summed over the tokens.
            floor = max(floor, atol * np.sqrt(B * max(Lq, Lk) * v.heads))
        rep = tolerance.check_grad(got, want[g], v.dtype, g, atol=floor)
        assert rep.ok, f"{v.name}: {rep.summary()}"
    assert set(grads) == {"q", "k", "v", *wrt}, (sorted(grads), wrt)


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(SPECS))
def test_autograd_matches_the_reference(name):
    for B, Lq, Lk, seed in ((2, 77, 130, 1), (1, 1, 1, 2), (2, 129, 64, 3)):
        v, case, arrays, dO = _case(name, B, Lq, Lk, seed)
        grads = _train(name, arrays, dO, deterministic=seed % 2 == 0)
        _compare(v, arrays, dO, grads)
        if case.q_lens is not None and case.q_lens[0] == 0:
            assert not grads["q"][0].any() and not grads["k"][0].any() and not grads["v"][0].any()


@pytest.mark.gpu
def test_direct_op_and_deterministic_mode():
    name = "ag_bf16_learnable"
    v, _, arrays, dO = _case(name, 2, 150, 150, 7)
    a = _train(name, arrays, dO, deterministic=True)
    b = _train(name, arrays, dO, deterministic=True)
    # The promise is about q, k, v: score-input gradients (slopes, tables) are fp32 atomics sums
    # in every mode, so their last bits may differ between runs (the H200 run showed it).
    for n in ("q", "k", "v"):
        assert torch.equal(a[n], b[n]), n
    c = _train(name, arrays, dO, direct=True)  # the backward reruns the LSE-saving forward
    _compare(v, arrays, dO, c)


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(SPECS))
def test_eager_route_matches_the_dispatched_ops(name, monkeypatch):
    """The callable's eager route (`_Train`: no custom-op dispatch) and the registered custom ops
    it stands in for: the same o and, with deterministic=True, bitwise the same dq, dk, dv (score
    inputs' fp32-atomic sums within rounding); the eager route dispatches nothing."""
    from attngen.runtime import torch_op

    op = _op(name)
    _, _, arrays, dO = _case(name, 2, 77, 77, 8)
    got, dispatched = {}, []
    real = op.fwd_op
    monkeypatch.setattr(op, "fwd_op", lambda *a, **kw: dispatched.append(1) or real(*a, **kw))
    for route in ("eager", "dispatch"):
        if route == "dispatch":
            monkeypatch.setattr(torch_op, "_eager", lambda q: False)
        ts = {n: _leaf(a, True) for n, a in arrays.items()}
        out = op(ts["q"], ts["k"], ts["v"], deterministic=True, **{n: ts[n] for n in op.input_names})
        o = out[0] if isinstance(out, tuple) else out
        (o.float() * fuzz.to_device(dO).float()).sum().backward()
        got[route] = (o.detach(), {n: t.grad for n, t in ts.items() if t.requires_grad})
        assert len(dispatched) == (0 if route == "eager" else 1), route
    (o1, g1), (o2, g2) = got["eager"], got["dispatch"]
    assert torch.equal(o1, o2) and set(g1) == set(g2)
    for n in g1:
        if n in ("q", "k", "v"):
            assert torch.equal(g1[n], g2[n]), n
        else:
            # fp32 atomics add the score inputs' terms in any order; their sums cancel (the
            # learnable slopes' reach -58 from terms of hundreds), so hold them to the largest
            # gradient's scale, not to each element's
            a, b = g1[n].float(), g2[n].float()
            assert torch.allclose(a, b, rtol=1e-4, atol=1e-5 * float(b.abs().max())), n


@pytest.mark.gpu
def test_gradient_through_the_declared_lse_matches_float64_torch():
    import attngen.runtime.torch as at

    op = at.register("attention tg_lse_grad { dtype fp32; head_dim 64; heads 4 kv 2; mask causal; output lse }")
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, h, 45, 64, generator=g).cuda().requires_grad_() for h in (4, 2, 2))
    do, dl = torch.randn(2, 4, 45, 64, generator=g).cuda(), torch.randn(2, 4, 45, generator=g).cuda()
    o, lse = op(q, k, v)
    ((o * do).sum() + (lse * dl).sum()).backward()
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    s = q64 @ k64.repeat_interleave(2, 1).transpose(-1, -2) / 8.0
    s = s.masked_fill(torch.ones(45, 45, dtype=torch.bool, device="cuda").triu(1), float("-inf"))
    l64 = torch.logsumexp(s, -1)
    o64 = torch.softmax(s, -1) @ v64.repeat_interleave(2, 1)
    ((o64 * do.double()).sum() + (l64 * dl.double()).sum()).backward()
    for got, want in ((q.grad, q64.grad), (k.grad, k64.grad), (v.grad, v64.grad)):
        err = float((got.double() - want).abs().max())
        assert err <= 2e-3 * float(want.abs().max()) + 1e-5, err


@pytest.mark.gpu
def test_compile_fullgraph_forward_and_backward():
    name = "ag_bf16_learnable"
    op = _op(name)
    v, _, arrays, dO = _case(name, 2, 96, 96, 4)
    do = fuzz.to_device(dO).float()

    def step(*args):
        return (op(*args[:3], **dict(zip(op.input_names, args[3:]))).float() * do).sum()

    def run(fn):
        ts = {n: _leaf(a, True) for n, a in arrays.items()}
        fn(ts["q"], ts["k"], ts["v"], *(ts[n] for n in op.input_names)).backward()
        return {n: t.grad for n, t in ts.items() if t.requires_grad}

    torch._dynamo.reset()
    eager = run(step)
    compiled = run(torch.compile(step, fullgraph=True, backend="aot_eager"))  # AOTAutograd: fwd + bwd graphs (inductor adds minutes of compile here)
    for n in eager:
        assert torch.allclose(eager[n].float(), compiled[n].float(), rtol=1e-2, atol=1e-2), n
    _compare(v, arrays, dO, compiled)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["ag_fp32_softcap_gqa", "ag_bf16_learnable", "ag_bf16_sinks"])
def test_opcheck(name):
    op = _op(name)
    _, _, arrays, dO = _case(name, 1, 40, 40, 5)
    ts = {n: _leaf(a, True) for n, a in arrays.items()}
    args = (ts["q"], ts["k"], ts["v"], *(ts[n] for n in op.input_names))
    torch.library.opcheck(op.op, args, {"check_inputs": True})
    torch.library.opcheck(op.fwd_op, args, {"check_inputs": True, "deterministic": False})
    with torch.no_grad():
        o, lse = op.fwd_op(*args)
    dargs = (*(t.detach() for t in args[:3]), o, lse, fuzz.to_device(dO), None, *(t.detach() for t in args[3:]))
    # Deterministic dq, dk, dv; of the score inputs only the bias (bit 0: one term per element at
    # B=1): slopes and tables are sums by fp32 atomics, whose order (and last bits) vary per run.
    torch.library.opcheck(op.bwd_op, dargs, {"wrt": 1 if name == "ag_bf16_learnable" else 0, "deterministic": True},
                          test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic"))


@pytest.mark.gpu
def test_cuda_graph_of_forward_and_backward():
    name = "ag_fp16_qk_norm_residual"
    op = _op(name)
    _, _, arrays, dO = _case(name, 2, 100, 100, 6)
    ts = {n: _leaf(a, True) for n, a in arrays.items()}
    args = (ts["q"], ts["k"], ts["v"], *(ts[n] for n in op.input_names))
    do = fuzz.to_device(dO)

    def step():
        for t in ts.values():
            t.grad = None
        (op(*args[:3], **dict(zip(op.input_names, args[3:]))).float() * do.float()).sum().backward()

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(s)
    want = {n: t.grad.clone() for n, t in ts.items() if t.grad is not None}
    g = torch.cuda.CUDAGraph()
    for t in ts.values():
        t.grad = None
    with torch.cuda.graph(g):
        (op(*args[:3], **dict(zip(op.input_names, args[3:]))).float() * do.float()).sum().backward()
    grads = {n: t.grad for n, t in ts.items() if t.grad is not None}
    for _ in range(2):
        g.replay()
        torch.cuda.synchronize()
        for n in want:
            assert torch.allclose(grads[n].float(), want[n].float(), rtol=1e-3, atol=1e-3), n
    with torch.no_grad():
        ts["q"].mul_(0.5)
    g.replay()
    torch.cuda.synchronize()
    assert not torch.allclose(grads["q"].float(), want["q"].float())  # the replay recomputed them


@pytest.mark.gpu
def test_positions_reach_the_backward():
    """dq of a query shard placed at q_offset equals the rows of the whole sequence's dq."""
    from attngen.runtime import kernel as runtime

    v = variant_of("attention tg_pos { dtype fp32; head_dim 64; heads 2; kind cross; mask causal && window(40, 0); score softcap(8.0) }")
    kern = runtime.compile(v, family="forward")
    g = torch.Generator().manual_seed(1)
    L, a, n = 150, 61, 50
    q, k, vv, do = (torch.randn(1, 2, L, 64, generator=g).cuda() for _ in range(4))
    dq, _, _ = kern.backward(q, k, vv, do)
    qs, dos = q[:, :, a:a + n].contiguous(), do[:, :, a:a + n].contiguous()
    dq_s, dk_s, dv_s = kern.backward(qs, k, vv, dos, q_offset=a, Lq_total=L)
    torch.cuda.synchronize()
    assert torch.allclose(dq_s, dq[:, :, a:a + n], rtol=1e-4, atol=1e-5)
    # The shard's keys beyond its last query's window see nothing: zero dk there.
    assert not dk_s[:, :, a + n:].any() and dk_s[:, :, a:a + n].abs().max() > 0
    plain, _, _ = kern.backward(qs, k, vv, dos)  # without the offset: a different (wrong) placement
    assert not torch.allclose(plain, dq_s, rtol=1e-3, atol=1e-4)
