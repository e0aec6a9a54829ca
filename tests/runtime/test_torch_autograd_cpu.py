"""attngen.torch's autograd without a GPU (meta tensors run the fake implementations): which op
a differentiable call runs, the saved LSE, which inputs get gradients (and in which dtype and
shape), the wrt bits and the deterministic flag reaching the backward op, the LSE gradient, the
sink, refusals at the forward, and torch.compile(fullgraph=True) tracing forward and backward."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (the attngen[torch] extra)")

import attngen.runtime.torch as at  # noqa: E402
from attngen.runtime import torch_op  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
EX = ROOT / "examples"

LEARN = ("attention tg_learn { dtype fp16; head_dim 64; heads 4 kv 2; input bb: fp32[H, Lq, Lk]; input sl: fp16[H]; "
         "input lens: i32[B]; input rel: fp32[H, 17]; mask causal; score bias(bb); score alibi(sl); score rel_bias(rel, 8) }")


def meta(*shape, dtype=torch.float16, grad=False):
    return torch.empty(*shape, dtype=dtype, device="meta", requires_grad=grad)


class Spy:
    """Records the calls of an op attribute of an AttnOp (and forwards them)."""

    def __init__(self, op, attr, monkeypatch):
        self.inner = getattr(op, attr)
        self.calls = []
        monkeypatch.setattr(op, attr, self)

    def __call__(self, *args, **kw):
        self.calls.append((args, kw))
        return self.inner(*args, **kw)


def test_grad_inputs_and_schemas():
    op = at.register(LEARN)
    assert op.grad_names == ("bb", "sl", "rel")
    assert op.train_variant.lse and not op.variant.lse
    assert str(op.fwd_op._schema).endswith("bool check_inputs=True, bool deterministic=False) -> (Tensor, Tensor)")
    bwd = str(op.bwd_op._schema)
    assert "Tensor dO, Tensor? dlse, Tensor bb, Tensor sl, Tensor lens, Tensor rel, int wrt=0" in bwd and bwd.endswith("-> Tensor[]")
    # With the LSE declared, the variant is its own training forward.
    lse = at.register("attention tg_lse { dtype bf16; head_dim 64; heads 2; output lse }")
    assert lse.train_variant is lse.variant
    sinks = at.register(EX / "gpt_oss_sinks.attn", "gpt_oss_full")
    assert sinks.grad_names == ("sinks",)
    # A variant named like another's backward op gets a name of its own.
    a = at.register("attention tg_nm { dtype fp16; head_dim 64; heads 2 }")
    b = at.register("attention tg_nm_bwd { dtype fp16; head_dim 64; heads 2 }")
    assert a.name == "tg_nm" and b.name.startswith("tg_nm_bwd_")


def test_gradients_only_for_inputs_that_require_grad(monkeypatch):
    op = at.register(LEARN)
    spy = Spy(op, "bwd_op", monkeypatch)
    q = meta(2, 4, 33, 64, grad=True)
    k, v = meta(2, 2, 33, 64), meta(2, 2, 33, 64, grad=True)
    bb, sl, rel = meta(4, 33, 33, dtype=torch.float32), meta(4, grad=True), meta(4, 17, dtype=torch.float32, grad=True)
    lens = torch.empty(2, dtype=torch.int32, device="meta")
    o = op(q, k, v, bb=bb, sl=sl, lens=lens, rel=rel, deterministic=True)
    assert o.shape == (2, 4, 33, 64) and o.dtype == torch.float16
    o.float().sum().backward()
    (args, kw), = spy.calls
    assert kw["wrt"] == 0b110 and kw["deterministic"] is True  # sl, rel (bits 1, 2); not bb
    assert args[6] is None  # no dlse: the LSE is internal here
    assert args[5].is_contiguous()  # dO of a sum() is expanded; the backward gets it contiguous
    assert q.grad.shape == q.shape and q.grad.dtype == torch.float16
    assert k.grad is None and v.grad.shape == v.shape
    assert bb.grad is None
    assert sl.grad.shape == (4,) and sl.grad.dtype == torch.float16  # cast back to the input's dtype
    assert rel.grad.shape == (4, 17) and rel.grad.dtype == torch.float32


def test_declared_lse_output_passes_its_gradient(monkeypatch):
    op = at.register("attention tg_lse2 { dtype bf16; head_dim 64; heads 2; layout bshd; mask causal; output lse }")
    spy = Spy(op, "bwd_op", monkeypatch)
    q = meta(1, 17, 2, 64, dtype=torch.bfloat16, grad=True)
    k = meta(1, 17, 2, 64, dtype=torch.bfloat16, grad=True)
    o, lse = op(q, k, k)
    assert lse.shape == (1, 2, 17) and lse.dtype == torch.float32
    (o.float().sum() + 3 * lse.sum()).backward()
    (args, _), = spy.calls
    assert args[6] is not None and args[6].shape == (1, 2, 17) and args[6].dtype == torch.float32
    assert q.grad.shape == q.shape and k.grad.shape == k.shape


def test_sink_gradient_is_computed_from_the_saved_lse(monkeypatch):
    op = at.register(EX / "gpt_oss_sinks.attn", "gpt_oss_full")
    spy = Spy(op, "bwd_op", monkeypatch)
    q = meta(1, 64, 9, 64, dtype=torch.bfloat16, grad=True)
    kv = meta(1, 8, 9, 64, dtype=torch.bfloat16)
    sinks = meta(64, dtype=torch.float32, grad=True)
    o, lse = op(q, kv, kv, sinks=sinks)
    o.float().sum().backward()
    (_, kw), = spy.calls
    assert kw["wrt"] == 0  # not a kernel gradient: computed in torch from LSE, O and dO
    assert sinks.grad.shape == (64,) and sinks.grad.dtype == torch.float32


def test_direct_op_call_is_trainable(monkeypatch):
    op = at.register(LEARN)
    fwd = Spy(op, "fwd_op", monkeypatch)
    q = meta(1, 4, 16, 64, grad=True)
    kv = meta(1, 2, 16, 64)
    bb, sl, rel = meta(4, 16, 16, dtype=torch.float32), meta(4), meta(4, 17, dtype=torch.float32, grad=True)
    lens = torch.empty(1, dtype=torch.int32, device="meta")
    o = torch.ops.attngen.tg_learn(q, kv, kv, bb, sl, lens, rel)
    assert not fwd.calls  # the public op ran the plain forward
    o.float().sum().backward()
    assert len(fwd.calls) == 1  # its backward reran the LSE-saving forward (no LSE was saved)
    assert q.grad.shape == q.shape and rel.grad.shape == (4, 17)


@pytest.mark.parametrize("spec, variant, match", [
    (EX / "paged_decode_llama3.attn", None, r"`kv_cache paged` is decode-time inference state, not a training workload"),
    ("attention tg_sink_onorm { dtype bf16; head_dim 64; heads 2; layout bshd; input sk: fp32[H]; sink sk; norm o rmsnorm(1e-6) }",
     None, r"`sink` with `norm o` is not supported"),
])
def test_unsupported_constructs_are_refused_at_the_forward(spec, variant, match):
    op = at.register(spec, variant)
    v = op.variant
    args = []
    for d in v.runtime_inputs():
        shape = [{"B": 1, "Lq": 8, "Lk": 8, "H": v.heads, "Hkv": v.kv_heads, "D": v.head_dim, "Dv": v.value_head_dim}.get(str(getattr(x, "value", x)), x)
                 if not isinstance(x, int) else x for x in d.shape]
        dt = {"i32": torch.int32, "fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16, "u8": torch.uint8}[d.dtype.value]
        args.append(torch.empty(*[s if isinstance(s, int) else 8 for s in shape], dtype=dt, device="meta"))
    dt = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[v.dtype.value]
    shp = (lambda h, d: (1, h, 8, d)) if v.layout.value == "bhsd" else (lambda h, d: (1, 8, h, d))
    q = torch.empty(*shp(v.heads, v.head_dim), dtype=dt, device="meta", requires_grad=True)
    k = torch.empty(*shp(v.kv_heads, v.head_dim), dtype=dt, device="meta")
    vv = torch.empty(*shp(v.kv_heads, v.value_head_dim), dtype=dt, device="meta")
    with pytest.raises(ValueError, match=r"q requires grad, but the backward kernels do not support this variant: " + match):
        op(q, k, vv, **dict(zip(op.input_names, args)))
    with pytest.raises(ValueError, match=match):  # the raw op too, at its autograd setup
        op.op(q, k, vv, *args)
    with torch.no_grad():  # inference is unaffected
        op(q, k, vv, **dict(zip(op.input_names, args)))


def test_compile_fullgraph_traces_forward_and_backward():
    op = at.register(LEARN)
    fw, bw = [], []

    from functorch.compile import make_boxed_func

    def fw_compiler(gm, _):
        fw.append(gm)
        return make_boxed_func(gm.forward)

    def bw_compiler(gm, _):
        bw.append(gm)
        return make_boxed_func(gm.forward)

    from torch._dynamo.backends.common import aot_autograd

    def step(q, k, v, bb, sl, lens, rel):
        return (op(q, k, v, bb=bb, sl=sl, lens=lens, rel=rel).float() ** 2).sum()

    q = meta(2, 4, 40, 64, grad=True)
    k, v = meta(2, 2, 40, 64, grad=True), meta(2, 2, 40, 64, grad=True)
    bb, sl, rel = meta(4, 40, 40, dtype=torch.float32, grad=True), meta(4), meta(4, 17, dtype=torch.float32)
    lens = torch.empty(2, dtype=torch.int32, device="meta")
    torch._dynamo.reset()
    loss = torch.compile(step, fullgraph=True, backend=aot_autograd(fw_compiler=fw_compiler, bw_compiler=bw_compiler))(
        q, k, v, bb, sl, lens, rel)
    loss.backward()
    assert len(fw) == 1 and len(bw) == 1
    fwd_targets = [str(n.target) for n in fw[0].graph.nodes if n.op == "call_function"]
    bwd_targets = [str(n.target) for n in bw[0].graph.nodes if n.op == "call_function"]
    assert any("attngen.tg_learn_fwd" in t for t in fwd_targets), fwd_targets
    assert any("attngen.tg_learn_bwd" in t for t in bwd_targets), bwd_targets
    assert q.grad.shape == q.shape and k.grad.shape == k.shape and bb.grad.shape == (4, 40, 40) and rel.grad is None


def test_opcheck_on_meta_tensors():
    """torch.library.opcheck of the three ops on meta tensors (the fake implementations; the GPU
    suite runs it on real ones): schema, autograd registration, fake tensors, AOT dispatch."""
    op = at.register(LEARN)
    args = (meta(1, 4, 40, 64, grad=True), meta(1, 2, 40, 64, grad=True), meta(1, 2, 40, 64, grad=True),
            meta(4, 40, 40, dtype=torch.float32, grad=True), meta(4, grad=True), torch.empty(1, dtype=torch.int32, device="meta"),
            meta(4, 17, dtype=torch.float32, grad=True))
    want = {"test_schema": "SUCCESS", "test_autograd_registration": "SUCCESS", "test_faketensor": "SUCCESS",
            "test_aot_dispatch_dynamic": "SUCCESS"}
    assert torch.library.opcheck(op.op, args, {"check_inputs": True}) == want
    assert torch.library.opcheck(op.fwd_op, args, {"check_inputs": True, "deterministic": True}) == want
    with torch.no_grad():
        o, lse = op.fwd_op(*args)
    plain = tuple(a.detach() for a in args)
    bargs = (*plain[:3], o, lse, meta(1, 4, 40, 64), None, *plain[3:])
    got = torch.library.opcheck(op.bwd_op, bargs, {"wrt": 0b101, "deterministic": False})
    assert got == want, got


class _StubKernel:
    """Stands in for a compiled forward kernel on CPU tensors: dense attention in torch (causal
    GQA, the LSE), through the same `_run` entry point the ops call."""

    class plan:  # noqa: N801
        class problem:  # noqa: N801
            sorted_inputs = ()

    def __init__(self, v):
        self.variant = v
        self.runs = []

    def _run(self, q, k, v, out, lse, stream, check_inputs, inputs, defer):
        self.runs.append((check_inputs, sorted(inputs), defer))
        g = q.shape[1] // k.shape[1]
        s = (q.float() @ k.float().repeat_interleave(g, 1).transpose(-1, -2)) * self.variant.effective_scale
        L = q.shape[2]
        s = s.masked_fill(torch.ones(L, L, dtype=torch.bool).triu(1), float("-inf"))
        o = (torch.softmax(s, -1) @ v.float().repeat_interleave(g, 1)).to(q.dtype)
        return (o, torch.logsumexp(s, -1)) if self.variant.lse else o


def test_real_implementations_on_cpu_with_stub_kernels(monkeypatch):
    """The ops' real (non-fake) implementations and their argument plumbing, with the kernels
    replaced by stubs: every call convention the dispatcher uses reaches them whole."""
    from attngen.runtime import bwd as runtime_bwd

    op = at.register(LEARN)
    monkeypatch.setattr(torch_op, "_cpu_backend", lambda q: False)  # the CUDA plumbing, on CPU tensors
    stub = _StubKernel(op.train_variant)
    monkeypatch.setattr(op, "train_kernel", lambda: stub)
    calls = []

    def fake_backward(kernel, q, k, v, dO, **kw):
        calls.append((kernel, sorted(kw)))
        grads = (torch.full_like(q, 1.0), torch.full_like(k, 2.0), torch.full_like(v, 3.0))
        if kw.get("wrt"):
            return (*grads, {n: torch.full(kw[n].shape, 4.0) for n in kw["wrt"]})
        return grads

    monkeypatch.setattr(runtime_bwd, "backward", fake_backward)
    q = torch.randn(1, 4, 12, 64).half().requires_grad_()
    k, v = torch.randn(1, 2, 12, 64).half().requires_grad_(), torch.randn(1, 2, 12, 64).half()
    bb, sl, rel = torch.zeros(4, 12, 12), torch.zeros(4, requires_grad=True), torch.zeros(4, 17)
    lens = torch.full((1,), 12, dtype=torch.int32)
    for det in (False, True):
        q.grad = k.grad = sl.grad = None
        o = op(q, k, v, bb=bb, sl=sl, lens=lens, rel=rel, deterministic=det)
        assert o.shape == q.shape and o.dtype == torch.float16
        o.float().sum().backward()
        kernel, kw = calls[-1]
        assert kernel is stub and "lse" in kw and "o" in kw and kw.count("wrt") == 1
        assert torch.equal(q.grad, torch.ones_like(q)) and torch.equal(k.grad, torch.full_like(k, 2.0))
        assert v.grad is None and torch.equal(sl.grad, torch.full((4,), 4.0))
    assert stub.runs[-1] == (True, ["bb", "lens", "rel", "sl"], True)
    plain = _StubKernel(op.variant)
    monkeypatch.setattr(op, "kernel", lambda: plain)
    q.grad = None
    o = torch.ops.attngen.tg_learn(q, k, v, bb, sl, lens, rel, check_inputs=False)
    assert plain.runs == [(False, ["bb", "lens", "rel", "sl"], True)] and o.shape == q.shape
    n_fwd = len(stub.runs)
    o.float().sum().backward()
    assert len(stub.runs) == n_fwd + 1 and stub.runs[-1][0] is False  # the LSE-saving forward reran
    assert torch.equal(q.grad, torch.ones_like(q))


@pytest.mark.parametrize("variant", ["gpt_oss_full", "gpt_oss_sliding"])
def test_sink_gradient_formula_matches_the_reference_backward(variant):
    """The sink gradient computed in torch from O, the LSE and dO (AttnOp._sink_grad) against the
    float64 reference backward's, on the reference's own forward (rows with nothing visible
    included: padding is not in these specs, so a short window leaves none; B=2, Lq=Lk=33)."""
    import dataclasses

    import numpy as np

    from attngen.check import fuzz, reference, reference_bwd

    op = at.register(EX / "gpt_oss_sinks.attn", variant)
    v = op.variant
    arrays = fuzz.case_inputs(v, fuzz.Case(B=2, Lq=33, Lk=33, seed=3))
    arrays["sinks"] = np.random.default_rng(4).normal(size=arrays["sinks"].shape).astype(np.float32)
    q, k, vv, rest = fuzz.split_inputs(arrays)
    o, lse = reference.attention(dataclasses.replace(v, lse=True), q, k, vv, rest)
    dO = np.random.default_rng(5).normal(size=np.shape(o))
    want = reference_bwd.attention_backward(v, q, k, vv, rest, dO, wrt=("sinks",))["sinks"]
    t = lambda a: torch.tensor(np.asarray(a, dtype=np.float64))  # noqa: E731
    got = op._sink_grad(t(q), t(o), t(lse), t(dO), None, t(arrays["sinks"]))
    assert got.shape == (v.heads,)
    np.testing.assert_allclose(got.numpy(), want, rtol=2e-2, atol=1e-6 * float(np.abs(want).max()))
    # With a gradient at the LSE too: d lse / d sink = P_sink.
    dl = np.random.default_rng(6).normal(size=np.shape(lse))
    got2 = op._sink_grad(t(q), t(o), t(lse), t(dO), t(dl), t(arrays["sinks"]))
    psink = np.exp(arrays["sinks"].astype(np.float64)[None, :, None] - lse)
    np.testing.assert_allclose((got2 - got).numpy(), (psink * dl).sum(axis=(0, 2)), rtol=1e-9)


# ---- issue 14: the o post-norm, the token-scope q norm and layout varlen train through the op


ONORM = "attention tg_onorm { dtype bf16; head_dim 64; heads 4 kv 2; layout bshd; mask causal; residual; norm o layernorm(1e-5) }"


def test_o_post_norm_trains_from_the_pre_norm_output(monkeypatch):
    op = at.register(ONORM)
    assert op.o_norm and set(op.grad_names) == {"o_norm_weight", "o_norm_bias"}
    # The training forward is the variant without the post-norm and the residual: its output is O'.
    assert not op.train_variant.norms and not op.train_variant.residual and op.train_variant.lse
    assert op.train_input_names == ()
    assert str(op.fwd_op._schema).endswith("-> (Tensor, Tensor, Tensor)")
    spy = Spy(op, "bwd_op", monkeypatch)
    q = meta(2, 33, 4, 64, dtype=torch.bfloat16, grad=True)
    k = meta(2, 33, 2, 64, dtype=torch.bfloat16, grad=True)
    w, b = meta(64, dtype=torch.float32, grad=True), meta(64, dtype=torch.float32)
    assert op.input_names == ("o_norm_bias", "o_norm_weight")
    y = op(q, k, k, o_norm_bias=b, o_norm_weight=w)
    assert y.shape == (2, 33, 4, 64) and y.dtype == torch.bfloat16
    y.float().sum().backward()
    (args, kw), = spy.calls
    assert kw["wrt"] == 1 << op.grad_names.index("o_norm_weight")  # not the bias's (it does not require grad)
    assert args[3].shape == y.shape  # the saved O', the backward's `o`
    assert q.grad.shape == q.shape and k.grad.shape == k.shape and w.grad.shape == (64,) and b.grad is None
    # A direct op call reruns the training forward in its backward (to get O').
    fwd = Spy(op, "fwd_op", monkeypatch)
    y = op.op(q, k, k, b, w)
    y.float().sum().backward()
    assert len(fwd.calls) == 1


def test_apply_o_norm_is_the_fused_forward():
    import numpy as np

    from attngen.check import reference, workload
    from attngen.lang import frontend
    from attngen.runtime.bwd import apply_o_norm, training_variant

    v = frontend.loads(ONORM.replace("bf16", "fp32")).get()
    rng = np.random.default_rng(3)
    a = workload.make_inputs(v, 2, 19, 19, rng)
    a["o_norm_weight"] = (1 + 0.3 * rng.normal(size=64)).astype(np.float32)
    a["o_norm_bias"] = (0.3 * rng.normal(size=64)).astype(np.float32)
    rest = {n: x for n, x in a.items() if n not in ("q", "k", "v")}
    y, _ = reference.attention(v, a["q"], a["k"], a["v"], rest)
    o_pre, _ = reference.attention(training_variant(v), a["q"], a["k"], a["v"], {})
    got = apply_o_norm(v, torch.from_numpy(o_pre), torch.from_numpy(a["q"]), torch.from_numpy(a["o_norm_weight"]),
                       torch.from_numpy(a["o_norm_bias"]))
    np.testing.assert_allclose(got.numpy(), y, rtol=1e-5, atol=1e-5)


def test_token_scope_q_norm_flat_hidden_state_trains(monkeypatch):
    op = at.register(EX / "whisper_preln_cross.attn")
    assert op.refusal is None and set(op.grad_names) == {"q_norm_weight", "q_norm_bias"}
    spy = Spy(op, "bwd_op", monkeypatch)
    x = meta(2, 9, 16 * 64, dtype=torch.bfloat16, grad=True)  # the decoder hidden state [B, Lq, H*D]
    kv = meta(2, 13, 16, 64, dtype=torch.bfloat16, grad=True)
    w, b = meta(1024, dtype=torch.float32, grad=True), meta(1024, dtype=torch.float32, grad=True)
    assert op.input_names == ("q_norm_bias", "q_norm_weight")
    y = op(x, kv, kv, q_norm_bias=b, q_norm_weight=w)
    assert y.shape == (2, 9, 16, 64)
    y.float().sum().backward()
    (_, kw), = spy.calls
    assert kw["wrt"] == 0b11
    assert x.grad.shape == x.shape and kv.grad.shape == kv.shape and w.grad.shape == (1024,) and b.grad.shape == (1024,)


def test_varlen_trains_with_the_packed_lse(monkeypatch):
    op = at.register(EX / "varlen_causal_training.attn")
    assert op.refusal is None
    spy = Spy(op, "bwd_op", monkeypatch)
    q = meta(300, 16, 128, dtype=torch.bfloat16, grad=True)
    cu = torch.empty(4, dtype=torch.int32, device="meta")
    o, lse = op(q, q, q, cu_seqlens=cu)
    assert o.shape == (300, 16, 128) and lse.shape == (16, 300)
    (o.float().sum() + lse.sum()).backward()
    (args, _), = spy.calls
    assert args[6] is not None and args[6].shape == (16, 300)  # the declared LSE's gradient, [H, total_q]
    assert q.grad.shape == q.shape


def test_compile_fullgraph_traces_the_o_post_norm_step():
    # The o-norm's training forward has three outputs (y, lse, O'); torch.compile traces it and
    # its backward without a graph break.
    op = at.register(ONORM)
    fw, bw = [], []

    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    def fw_compiler(gm, _):
        fw.append(gm)
        return make_boxed_func(gm.forward)

    def bw_compiler(gm, _):
        bw.append(gm)
        return make_boxed_func(gm.forward)

    def step(q, k, b, w):
        return (op(q, k, k, o_norm_bias=b, o_norm_weight=w).float() ** 2).sum()

    q = meta(2, 40, 4, 64, dtype=torch.bfloat16, grad=True)
    k = meta(2, 40, 2, 64, dtype=torch.bfloat16, grad=True)
    b, w = meta(64, dtype=torch.float32, grad=True), meta(64, dtype=torch.float32, grad=True)
    torch._dynamo.reset()
    loss = torch.compile(step, fullgraph=True, backend=aot_autograd(fw_compiler=fw_compiler, bw_compiler=bw_compiler))(q, k, b, w)
    loss.backward()
    assert len(fw) == 1 and len(bw) == 1
    assert any("attngen.tg_onorm_fwd" in str(n.target) for n in fw[0].graph.nodes if n.op == "call_function")
    assert any("attngen.tg_onorm_bwd" in str(n.target) for n in bw[0].graph.nodes if n.op == "call_function")
    assert q.grad.shape == q.shape and k.grad.shape == k.shape and b.grad.shape == (64,) and w.grad.shape == (64,)
