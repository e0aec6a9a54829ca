"""The torch op's two routes without a GPU: eager calls on plain CUDA tensors run the kernels
without the dispatcher (`_Train`, or the kernel directly), everything else the registered custom
ops; both give the same outputs, gradients and arguments to the kernels. And the family a no-grad
call runs: decode steps (few query rows) go to the split-KV decode family of a `Dispatch`.

CPU tensors stand in for CUDA ones here (`_cpu_backend` answers False) and stub kernels for the
compiled ones, so what runs is the op's own plumbing."""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (the attngen[torch] extra)")

import attngen.runtime.torch as at  # noqa: E402
from attngen.plan.schedule import Arch  # noqa: E402
from attngen.runtime import bwd as runtime_bwd  # noqa: E402
from attngen.runtime import decode as runtime_decode  # noqa: E402
from attngen.runtime import torch_op  # noqa: E402

LEARN = ("attention tr_learn { dtype fp16; head_dim 64; heads 4 kv 2; input sl: fp16[H]; input lens: i32[B]; "
         "mask causal; score alibi(sl) }")
LSE = "attention tr_lse { dtype bf16; head_dim 64; heads 2; mask causal; output lse }"
# A decode step of a Hugging Face model (attngen.integrations.transformers' spec): one query
# against a cache, padding from the attention mask.
HF_STEP = ("attention tr_hf_step { dtype bf16; head_dim 64; heads 4 kv 2; layout bshd; kind cross; "
           "mask causal && padding }")


class StubKernel:
    """A forward kernel on CPU tensors: o = a fixed function of q, k, v (and the LSE); records calls."""

    class plan:  # noqa: N801
        class problem:  # noqa: N801
            sorted_inputs = ()

    def __init__(self, variant, tag=0.0):
        self.variant = variant
        self.tag = tag
        self.runs = []

    def _run(self, q, k, v, out, lse, stream, check_inputs, inputs, defer, positions=None):
        self.runs.append((check_inputs, sorted(inputs), defer))
        o = (q.float() * 2 + k.float().mean() + v.float().mean() + self.tag).to(q.dtype)
        if self.variant.lse:
            return o, q.float().sum(-1).transpose(1, 2).contiguous() if self.variant.layout.value == "bshd" else q.float().sum(-1)
        return o


class Backward:
    """A stand-in for runtime.bwd.backward: gradients from dO and the saved LSE, calls recorded."""

    def __init__(self):
        self.calls = []

    def __call__(self, kernel, q, k, v, dO, **kw):
        self.calls.append((kernel, kw))
        d = dO.float().sum()
        dl = 0.0 if kw.get("dlse") is None else kw["dlse"].sum()
        grads = ((dO.float() + dl).to(q.dtype), torch.full_like(k, 2.0) * d, torch.full_like(v, 3.0) * d)
        if kw.get("wrt"):
            return (*grads, {n: torch.full(kw[n].shape, 4.0) for n in kw["wrt"]})
        return grads


@pytest.fixture
def stubs(monkeypatch):
    monkeypatch.setattr(torch_op, "_cpu_backend", lambda q: False)
    bwd = Backward()
    monkeypatch.setattr(runtime_bwd, "backward", bwd)

    def install(op):
        fwd, train = StubKernel(op.variant), StubKernel(op.train_variant)
        monkeypatch.setattr(op, "kernel", lambda: fwd)
        monkeypatch.setattr(op, "train_kernel", lambda: train)
        return fwd, train, bwd

    return install


def _learn_args(grad=True):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 10, 64, generator=g).half().requires_grad_(grad)
    k = torch.randn(2, 2, 10, 64, generator=g).half().requires_grad_(grad)
    v = torch.randn(2, 2, 10, 64, generator=g).half()
    sl = torch.randn(4, generator=g).half().requires_grad_(grad)
    lens = torch.full((2,), 10, dtype=torch.int32)
    return q, k, v, sl, lens


def _step(op, q, k, v, sl, lens, route, monkeypatch, **kw):
    monkeypatch.setattr(torch_op, "_eager", torch_op._eager if route == "eager" else (lambda q: False))
    for t in (q, k, sl):
        t.grad = None
    o = op(q, k, v, sl=sl, lens=lens, **kw)
    (o.float() * torch.linspace(0, 1, o.shape[-1])).sum().backward()
    return o, q.grad, k.grad, sl.grad


def test_eager_and_dispatch_routes_agree(stubs, monkeypatch):
    op = at.register(LEARN)
    fwd, train, bwd = stubs(op)
    args = _learn_args()
    got = {}
    for route in ("eager", "dispatch"):
        got[route] = _step(op, *args, route, monkeypatch, deterministic=True)
        kernel, kw = bwd.calls[-1]
        assert kernel is train and kw["wrt"] == ("sl",) and kw["deterministic"] is True and kw["variant"] is op.variant
        assert kw["dlse"] is None and kw["lse"] is not None and kw["o"] is not None
    (o1, *g1), (o2, *g2) = got["eager"], got["dispatch"]
    assert "_Train" in type(o1.grad_fn).__name__ and "tr_learn_fwd" in type(o2.grad_fn).__name__
    assert torch.equal(o1, o2)
    for a, b in zip(g1, g2):
        assert a is not None and torch.equal(a, b)
    assert train.runs == [(True, ["lens", "sl"], True)] * 2 and not fwd.runs
    # An input that does not require grad gets none, on both routes.
    q, k, v, sl, lens = _learn_args()
    sl.requires_grad_(False)
    for route in ("eager", "dispatch"):
        assert _step(op, q, k, v, sl, lens, route, monkeypatch)[3] is None
        assert bwd.calls[-1][1]["wrt"] == ()


ONORM = "attention tr_onorm { dtype bf16; head_dim 64; heads 4 kv 2; layout bshd; mask causal; residual; norm o layernorm(1e-5) }"
SINKS = "attention tr_sinks { dtype bf16; head_dim 64; heads 4 kv 2; input sinks: fp32[H]; mask causal; sink sinks; output lse }"


@pytest.mark.parametrize("spec", [ONORM, SINKS])
def test_routes_agree_on_the_o_post_norm_and_sinks(spec, stubs, monkeypatch):
    """The o post-norm (applied in torch, O' saved) and the sink (its gradient from the saved LSE)."""
    op = at.register(spec)
    _, _, bwd = stubs(op)
    g = torch.Generator().manual_seed(1)
    shape = (2, 9, 4, 64) if "bshd" in spec else (2, 4, 9, 64)
    kv_shape = (2, 9, 2, 64) if "bshd" in spec else (2, 2, 9, 64)
    got = {}
    for route in ("eager", "dispatch"):
        monkeypatch.setattr(torch_op, "_eager", torch_op._eager if route == "eager" else (lambda q: False))
        q = torch.randn(*shape, generator=g).bfloat16().requires_grad_()
        k = torch.randn(*kv_shape, generator=g).bfloat16().requires_grad_()
        ins = {n: torch.linspace(0.5, 1.5, 64 if "norm" in n else 4).requires_grad_() for n in op.input_names}
        out = op(q, k, k, **ins)
        o, lse = out if isinstance(out, tuple) else (out, None)
        loss = (o.float() * torch.linspace(-1, 1, 64)).sum() + (0 if lse is None else lse.sum())
        loss.backward()
        got[route] = (o, q.grad, k.grad, *(ins[n].grad for n in op.input_names))
        g = torch.Generator().manual_seed(1)  # the same inputs for the other route
        if "norm" in spec:
            assert bwd.calls[-1][1]["o"].shape == o.shape  # O', the pre-norm output
    for a, b in zip(got["eager"], got["dispatch"]):
        assert a is not None and torch.equal(a, b)


def test_eager_route_passes_the_lse_gradient(stubs, monkeypatch):
    op = at.register(LSE)
    _, train, bwd = stubs(op)
    q = torch.randn(1, 2, 9, 64).bfloat16().requires_grad_()
    for route in ("eager", "dispatch"):
        monkeypatch.setattr(torch_op, "_eager", torch_op._eager if route == "eager" else (lambda q: False))
        o, lse = op(q, q, q)
        (o.float().sum() + 3 * lse.sum()).backward()
        dl = bwd.calls[-1][1]["dlse"]
        assert dl is not None and dl.dtype == torch.float32 and torch.equal(dl, torch.full_like(lse, 3.0))
        # A loss that reads only the LSE: dO comes as zeros (the custom op materialises it too).
        q.grad = None
        op(q, q, q)[1].sum().backward()
        assert bwd.calls[-1][1]["dlse"] is not None and q.grad is not None


def test_eager_inference_calls_the_kernel_directly(stubs, monkeypatch):
    op = at.register(LEARN)
    fwd, train, _ = stubs(op)
    q, k, v, sl, lens = _learn_args(grad=False)
    dispatched = []
    real = op.op
    monkeypatch.setattr(op, "op", lambda *a, **kw: dispatched.append(a) or real(*a, **kw))
    o = op(q, k, v, sl=sl, lens=lens, check_inputs=False)
    assert o.grad_fn is None and not dispatched and fwd.runs == [(False, ["lens", "sl"], True)]
    monkeypatch.setattr(torch_op, "_eager", lambda q: False)
    assert torch.equal(op(q, k, v, sl=sl, lens=lens, check_inputs=False), o) and len(dispatched) == 1


def test_tracers_meta_and_subclasses_take_the_custom_ops(monkeypatch):
    monkeypatch.setattr(torch_op, "_cpu_backend", lambda q: False)
    plain = torch.empty(1, 2, 3, 64)
    assert torch_op._eager(plain)
    assert not torch_op._eager(torch.empty(1, 2, 3, 64, device="meta"))

    class Sub(torch.Tensor):
        pass

    assert not torch_op._eager(plain.as_subclass(Sub))
    from torch.utils._python_dispatch import TorchDispatchMode

    class Mode(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    with Mode():
        assert not torch_op._eager(plain)
    seen = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # (torch.jit.trace's deprecation)
        torch.jit.trace(lambda x: seen.append(torch_op._eager(x)) or x * 2, plain, check_trace=False)
    assert seen and not seen[0]  # (while tracing)
    torch.vmap(lambda x: seen.append(torch_op._eager(x)) or x * 2)(plain)
    assert not seen[-1]
    monkeypatch.setattr(torch_op, "_cpu_backend", lambda q: q.device.type == "cpu")
    assert not torch_op._eager(plain)  # the CPU backend's tensors run its registration


def test_refusals_still_come_before_the_eager_route(stubs):
    op = at.register(LEARN)
    stubs(op)
    q, k, v, sl, lens = _learn_args()
    with pytest.raises(TypeError, match="runtime inputs go by name"):
        op(q, k, v, sl, lens)
    with pytest.raises(ValueError, match="missing lens"):
        op(q, k, v, sl=sl)
    paged = at.register("attention tr_paged { dtype bf16; head_dim 64; heads 2; kind cross; kv_cache paged(16) }")
    stubs(paged)
    x = torch.empty(1, 2, 4, 64, dtype=torch.bfloat16, requires_grad=True)
    with pytest.raises(ValueError, match="require.* grad, but the backward kernels do not support this variant"):
        paged(x, x, x, **{n: torch.zeros(1, 1, dtype=torch.int32) for n in paged.input_names})


# ---- the family of a no-grad call


class StubDecode(StubKernel, runtime_decode.DecodeKernel):
    """The decode family's stand-in (its output is the forward stub's plus 1)."""


def _dispatch(v):
    """A Dispatch over stub kernels (its decode family set, so that nothing compiles)."""
    d = runtime_decode.Dispatch(StubKernel(v, 0.0), Arch.SM90A)
    d._decode = StubDecode(v, 1.0)
    return d


def _hf_step_args(Lq, Lk=300, B=2):
    q = torch.randn(B, Lq, 4, 64).bfloat16()
    kv = torch.randn(B, Lk, 2, 64).bfloat16()
    lens = torch.tensor([Lk, Lk - 7], dtype=torch.int32)
    return q, kv, {"q_lens": torch.full((B,), Lq, dtype=torch.int32), "kv_lens": lens}


def test_route_sends_decode_steps_to_the_decode_family():
    op = at.register(HF_STEP)
    d = _dispatch(op.variant)
    for Lq, family in ((1, "decode"), (16, "decode"), (17, "forward"), (300, "forward")):
        q, _, _ = _hf_step_args(Lq)
        assert torch_op.route(d, q) is (d.decode if family == "decode" else d.forward), Lq
    # A forward or decode kernel runs itself.
    assert torch_op.route(d.forward, q) is d.forward and torch_op.route(d.decode, q) is d.decode
    # Variants the decode family cannot run stay on the forward (a `sorted` input has no decode check).
    docs = at.register("attention tr_docs { dtype bf16; head_dim 64; heads 4 kv 2; layout bshd; "
                       "input doc: i32[B, Lk] sorted; mask causal && document(doc) }")
    dd = _dispatch(docs.variant)
    assert torch_op.route(dd, torch.empty(1, 1, 4, 64)) is dd.forward


def test_no_grad_decode_step_runs_the_decode_family(stubs, monkeypatch):
    op = at.register(HF_STEP)
    _, train, _ = stubs(op)
    d = _dispatch(op.variant)
    monkeypatch.setattr(op, "kernel", lambda: d)
    q, kv, inputs = _hf_step_args(1)
    eager = torch_op._eager
    for route in ("eager", "dispatch"):
        monkeypatch.setattr(torch_op, "_eager", eager if route == "eager" else (lambda q: False))
        with torch.no_grad():
            o = op(q, kv, kv, check_inputs=False, **inputs)
        # (the decode stub adds 1: its output tells which family ran)
        assert torch.equal(o, (q.float() * 2 + 2 * kv.float().mean() + 1).to(q.dtype))
        assert d.decode.runs[-1] == ((None, None, None, False), ["kv_lens", "q_lens"], True)
    routed = []
    monkeypatch.setattr(torch_op, "route", lambda kern, q, real=torch_op.route: routed.append(q.shape) or real(kern, q))
    monkeypatch.setattr(torch_op, "_eager", eager)
    with torch.no_grad():
        op(q, kv, kv, check_inputs=False, **inputs)  # Lq 1 planned, decode compiled: the shortcut, same call
    assert not routed and d.decode.runs[-1] == ((None, None, None, False), ["kv_lens", "q_lens"], True)
    assert len(d.decode.runs) == 3
    n_fwd = len(d.forward.runs)
    q, kv, inputs = _hf_step_args(40, 40)
    with torch.no_grad():
        op(q, kv, kv, **inputs)  # a prefill: the forward family
    assert len(d.forward.runs) == n_fwd + 1 and len(d.decode.runs) == 3
    # With grad, the LSE-saving training forward runs (the backward reads its LSE), never decode.
    q, kv, inputs = _hf_step_args(1)
    op(q.requires_grad_(), kv, kv, **inputs)
    assert len(train.runs) == 1 and len(d.decode.runs) == 3


PLAIN_STEP = "attention tr_plain_step { dtype bf16; head_dim 64; heads 4 kv 2; kind cross }"


def test_plain_decode_steps_take_the_decode_kernels_call_directly(stubs, monkeypatch):
    # A step with no runtime inputs, once its Lq is planned and the decode family compiled, goes
    # straight to the decode kernels' call with what `_launch` and `Dispatch.__call__` pass.
    op = at.register(PLAIN_STEP)
    stubs(op)
    d = _dispatch(op.variant)
    monkeypatch.setattr(op, "kernel", lambda: d)
    routed = []
    monkeypatch.setattr(torch_op, "route", lambda kern, q, real=torch_op.route: routed.append(q.shape) or real(kern, q))
    q, kv = torch.randn(2, 4, 1, 64).bfloat16(), torch.randn(2, 2, 300, 64).bfloat16()
    with torch.no_grad():
        first = op(q, kv, kv)  # through `_launch` (route plans Lq 1)
        assert d.ready_decode(1) is d.decode and d.ready_decode(40) is None and len(routed) == 1
        second = op(q, kv, kv)  # the shortcut: no route
    assert len(routed) == 1 and torch.equal(first, second)
    assert d.decode.runs == [((None, None, None, False), [], True)] * 2
    d(q, kv, kv)  # Dispatch's own: the call's defaults, read back (not deferred)
    assert d.decode.runs[-1] == ((None, None, None, True), [], False)
    with torch.no_grad():
        op(torch.randn(2, 4, 40, 64).bfloat16(), kv, kv)  # a prefill: the forward family
    assert len(d.forward.runs) == 1 and len(d.decode.runs) == 3
