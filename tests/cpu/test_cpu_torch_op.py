"""`torch.ops.attngen.<name>` on CPU tensors runs the CPU backend (forward, and the backward under autograd)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from attngen.check import reference, tolerance, workload  # noqa: E402
from attngen.check.fuzz_device import to_host_cpu  # noqa: E402
from attngen.plan.validate import load  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _t(x: np.ndarray) -> "torch.Tensor":
    x = np.ascontiguousarray(x)
    if x.dtype.name == "bfloat16":
        return torch.from_numpy(x.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(x)


def test_torch_op_on_cpu_tensors_matches_the_reference():
    import attngen.torch as at

    v = load(EXAMPLES / "packed_documents.attn").get()
    op = at.register(v)
    a = workload.make_inputs(v, 2, 50, 50, np.random.default_rng(2))
    t = {n: _t(x) for n, x in a.items()}
    o = op(t["q"], t["k"], t["v"], **{n: t[n] for n in op.input_names})
    assert o.device.type == "cpu" and o.dtype == t["q"].dtype
    rest = {n: a[n] for n in op.input_names}
    ref, _ = reference.attention(v, a["q"], a["k"], a["v"], rest)
    rep = tolerance.check(to_host_cpu(o), ref, v.dtype, score_err=reference.score_error(v, a["q"], a["k"], rest))
    assert rep.ok, rep.summary()
    # The registered op itself, and the module around it.
    o2 = getattr(torch.ops.attngen, op.name)(t["q"], t["k"], t["v"], *(t[n] for n in op.input_names))
    assert torch.equal(o, o2)
    o3 = at.Attention(v)(t["q"], t["k"], t["v"], **{n: t[n] for n in op.input_names})
    assert torch.equal(o, o3)


def test_cpu_tensors_that_require_grad_train_on_the_cpu_backward():
    import attngen.torch as at

    v = load(EXAMPLES / "llama3_gqa_causal.attn").get()
    op = at.register(v)
    a = workload.make_inputs(v, 1, 20, 20, np.random.default_rng(0))
    q, k, vv = _t(a["q"]).requires_grad_(), _t(a["k"]), _t(a["v"])
    o, lse = op(q, k, vv)
    with torch.no_grad():
        o2, lse2 = op(q, k, vv)
    assert torch.equal(o, o2) and torch.equal(lse, lse2) and lse.shape == (1, v.heads, 20)
    o.float().sum().backward()
    assert q.grad is not None and q.grad.shape == q.shape and q.grad.dtype == q.dtype and torch.isfinite(q.grad.float()).all()
