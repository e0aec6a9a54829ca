"""The binder, the input checks and the torch op on the GPU: sorted inputs checked before the
launch, the driver launch path agreeing with CuPy's, CUDA-graph capture, torch.compile, opcheck."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the torch op tests need torch")

DOC = """attention doc_sorted {
  dtype fp16
  head_dim 64
  heads 2
  layout bhsd
  input doc: i32[B, Lk] sorted
  mask document(doc)
}
"""
NAN = """attention op_nan_check {
  dtype fp16
  head_dim 64
  heads 2
  layout bhsd
  nan_check
}
"""
SEED_PATH = Path(__file__).resolve().parents[2] / "examples" / "seed_padded_fp32.attn"


def _doc_inputs(B=2, L=200, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, 2, L, 64, generator=g).half().cuda() for _ in range(3))
    doc = torch.sort(torch.randint(0, 5, (B, L), generator=g), dim=1).values.int().cuda()
    return q, k, v, doc


def _doc_reference(q, k, v, doc):
    mask = (doc[:, :, None] == doc[:, None, :])[:, None]
    return torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask)


def _rel(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm())


@pytest.mark.gpu
def test_sorted_input_is_checked_and_named():
    import attngen
    from attngen.runtime.kernel import InputCheckError

    kern = attngen.compile(DOC)
    q, k, v, doc = _doc_inputs()
    o = kern(q, k, v, doc=doc)
    assert _rel(o, _doc_reference(q, k, v, doc)) < 2e-3
    bad = doc.clone()
    perm = torch.randperm(bad.shape[1], generator=torch.Generator().manual_seed(3))
    bad[1] = bad[1][perm.cuda()]
    host = bad.cpu().numpy()
    dec = np.nonzero(host[:, 1:] < host[:, :-1])
    first = min(zip(dec[0].tolist(), (dec[1] + 1).tolist()))
    with pytest.raises(InputCheckError, match=re.escape(f"doc[{first[0]}, {first[1]}]")) as e:
        kern(q, k, v, doc=bad)
    assert isinstance(e.value, ValueError) and "sorted" in str(e.value)
    kern(q, k, v, doc=bad, check_inputs=False)  # opted out: no error (and no promise)
    o2 = kern(q, k, v, doc=doc)  # the error word was reset: a good call passes again
    assert torch.equal(o2, o)


@pytest.mark.gpu
def test_bindings_cached_per_signature():
    import attngen
    from attngen.runtime import kernel as runtime

    kern = attngen.compile(DOC)
    assert kern.plan.attention.tma  # a TMA kernel: its descriptors travel in the binding
    q, k, v, doc = _doc_inputs(B=3, L=130, seed=1)
    n0 = len(kern._bindings)
    a = kern(q, k, v, doc=doc)
    b = kern(q, k, v, doc=doc)
    assert len(kern._bindings) == n0 + 1 and torch.equal(a, b)
    assert runtime.driver() is runtime.driver()


@pytest.mark.gpu
def test_kernel_call_in_a_cuda_graph():
    import attngen

    kern = attngen.compile(SEED_PATH)
    B, L = 4, 128
    q, k, v = (torch.randn(B, 8, L, 64, device="cuda") for _ in range(3))
    ql = torch.tensor([128, 100, 7, 64], dtype=torch.int32, device="cuda")
    kl = torch.tensor([128, 90, 128, 1], dtype=torch.int32, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        kern(q, k, v, q_lens=ql, kv_lens=kl)  # warm: the binding exists before capture
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = kern(q, k, v, q_lens=ql, kv_lens=kl)
    for seed in range(2):
        torch.manual_seed(seed)
        for t in (q, k, v):
            t.copy_(torch.randn_like(t))
        g.replay()
        torch.cuda.synchronize()
        want = kern(q, k, v, q_lens=ql, kv_lens=kl)
        assert torch.equal(out, want)


@pytest.mark.gpu
def test_torch_op_opcheck_compile_and_module():
    import attngen.runtime.torch as at

    op = at.register(DOC)
    q, k, v, doc = _doc_inputs(seed=4)
    torch.library.opcheck(op.op, (q, k, v, doc), {"check_inputs": True})
    eager = op(q, k, v, doc=doc)
    assert _rel(eager, _doc_reference(q, k, v, doc)) < 2e-3
    torch._dynamo.reset()
    f = torch.compile(lambda q, k, v, d: op(q, k, v, doc=d) + 1, fullgraph=True)
    assert torch.allclose(f(q, k, v, doc), eager + 1)
    m = at.Attention(DOC)
    assert torch.equal(m(q, k, v, doc=doc), eager)
    # Trainable now (tests/gpu/test_gpu_autograd.py checks the gradients): a finite dq comes back.
    op(q.requires_grad_(), k, v, doc=doc).float().sum().backward()
    assert q.grad is not None and q.grad.shape == q.shape and bool(torch.isfinite(q.grad).all())


@pytest.mark.gpu
def test_torch_op_in_a_cuda_graph_defers_nan_check_and_input_checks():
    import attngen.runtime.torch as at
    from attngen.runtime.kernel import InputCheckError, NaNCheckError

    op = at.register(NAN)
    q, k, v = (torch.randn(1, 2, 64, 64, device="cuda").half() for _ in range(3))
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        op(q, k, v)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = op(q, k, v)
    g.replay()
    at.raise_pending()  # clean inputs: nothing pending
    v[0, 0, 3, 5] = float("inf")
    g.replay()  # no host sync inside: the flag waits on the device
    with pytest.raises(NaNCheckError, match="op_nan_check"):
        at.raise_pending()
    at.raise_pending()  # reported once, then reset
    assert not torch.isfinite(out).all()

    dop = at.register(DOC)
    q, k, v, doc = _doc_inputs(seed=5)
    with torch.cuda.stream(s):
        dop(q, k, v, doc=doc)
    torch.cuda.current_stream().wait_stream(s)
    g2 = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g2):
        dop(q, k, v, doc=doc)
    doc[0, 1] = -1  # below doc[0, 0] >= 0: the first offending element is [0, 1]
    g2.replay()
    with pytest.raises(InputCheckError, match=r"doc\[0, 1\]"):
        at.raise_pending()


@pytest.mark.gpu
def test_calls_from_threads_that_never_touched_cuda():
    """A thread with no current CUDA context (torch's autograd worker running a backward after a
    single-threaded warm-up, or a user's fresh thread): the driver calls bind the device's
    primary context instead of failing with CUDA_ERROR_INVALID_CONTEXT, and the results equal
    the main thread's."""
    import threading

    import attngen.runtime.torch as at

    op = at.register(DOC)
    q, k, v, doc = _doc_inputs(seed=6)
    q.requires_grad_()
    g = torch.randn_like(q)

    def step():
        return torch.autograd.grad(op(q, k, v, doc=doc), (q,), g)[0]

    torch.autograd.set_multithreading_enabled(False)
    try:
        want = step()  # warms the allocator and every binding on the main thread
    finally:
        torch.autograd.set_multithreading_enabled(True)
    torch.cuda.synchronize()
    same = lambda a: torch.allclose(a, want, rtol=1e-3, atol=1e-3)  # noqa: E731 (dq's atomics: any order)
    assert same(step())  # the backward on autograd's device thread
    got: list = []
    t = threading.Thread(target=lambda: got.append(step()))
    t.start()
    t.join()
    assert len(got) == 1 and same(got[0])
