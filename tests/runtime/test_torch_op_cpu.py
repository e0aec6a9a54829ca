"""attngen.torch without a GPU: registration, the fake implementation, tracing with
torch.compile(fullgraph=True), and the autograd route (meta tensors; tests/runtime/test_torch_autograd_cpu.py
has the backward's plumbing)."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (the attngen[torch] extra)")

import attngen.runtime.torch as at  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SEED = ROOT / "examples" / "seed_padded_fp32.attn"


def _seed_args(B=4, L=128):
    q, k, v = (torch.empty(B, 8, L, 64, device="meta") for _ in range(3))
    lens = torch.empty(B, dtype=torch.int32, device="meta")
    return q, k, v, lens, lens


def test_registers_as_attngen_op_with_schema():
    op = at.register(SEED)
    assert at.register(str(SEED)) is op  # same variant, same op
    assert op.name == "seed_padded_fp32"
    schema = str(op.op._schema)
    assert schema.startswith("attngen::seed_padded_fp32(Tensor q, Tensor k, Tensor v, Tensor kv_lens, Tensor q_lens")
    assert "bool check_inputs=True" in schema and schema.endswith("-> Tensor")
    assert torch.ops.attngen.seed_padded_fp32.default is op.op


def test_fake_shapes_from_the_plan():
    op = at.register(SEED)
    q, k, v, kl, ql = _seed_args(B=3, L=96)
    o = op(q, k, v, kv_lens=kl, q_lens=ql)
    assert o.shape == (3, 8, 96, 64) and o.dtype == torch.float32 and o.device.type == "meta"
    lse_op = at.register("attention withlse { dtype bf16; head_dim 64; heads 4 kv 2; layout bshd; output lse }")
    q = torch.empty(2, 33, 4, 64, dtype=torch.bfloat16, device="meta")
    kv = torch.empty(2, 33, 2, 64, dtype=torch.bfloat16, device="meta")
    o, lse = lse_op(q, kv, kv)
    assert o.shape == (2, 33, 4, 64) and o.dtype == torch.bfloat16
    assert lse.shape == (2, 4, 33) and lse.dtype == torch.float32


def test_same_name_different_spec_gets_its_own_op():
    a = at.register("attention twin { dtype fp16; head_dim 64; heads 2 }")
    b = at.register("attention twin { dtype fp16; head_dim 64; heads 4 }")
    assert a.name == "twin" and b.name.startswith("twin_") and a.op is not b.op


def test_compile_fullgraph_traces_the_op():
    op = at.register(SEED)
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    def f(q, k, v, kl, ql):
        return op(q, k, v, kv_lens=kl, q_lens=ql) * 2

    torch._dynamo.reset()
    out = torch.compile(f, fullgraph=True, backend=backend)(*_seed_args())
    assert out.shape == (4, 8, 128, 64)
    assert len(graphs) == 1
    targets = [str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function"]
    assert any("attngen.seed_padded_fp32" in t for t in targets), targets


def test_requires_grad_goes_through_the_lse_saving_forward():
    op = at.register(SEED)
    q, k, v, kl, ql = _seed_args()
    o = op(q.requires_grad_(), k, v.requires_grad_(), kv_lens=kl, q_lens=ql)
    assert o.shape == (4, 8, 128, 64) and "seed_padded_fp32_fwd" in type(o.grad_fn).__name__
    with torch.no_grad():  # no grad: the plain op, as before
        assert op(q, k, v, kv_lens=kl, q_lens=ql).grad_fn is None


def test_module_checks_input_names():
    m = at.Attention(SEED)
    q, k, v, kl, ql = _seed_args()
    assert m(q, k, v, kv_lens=kl, q_lens=ql).shape == (4, 8, 128, 64)
    with pytest.raises(ValueError, match="missing q_lens"):
        m(q, k, v, kv_lens=kl)
