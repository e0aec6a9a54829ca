"""The call paths' host shortcuts: the workspace pool's memo, the backward's gradients from one
allocation, and a decode loop's direct route through `Dispatch`."""

from __future__ import annotations

import threading
import types

import pytest

from attngen.ir.nodes import DType
from attngen.runtime import binder, bwd, decode


def test_pool_memo_gives_the_same_buffers_until_one_is_replaced():
    pool = binder.WorkspacePool()
    made = []
    alloc = lambda shape, dt, zero=False: made.append((shape, dt)) or object()  # noqa: E731
    small, big = [(10, DType.FP32)], [(20, DType.FP32)]
    ka, kb = pool.keys((True, 0, 7), small), pool.keys((True, 0, 7), big)  # two bindings, one pool key
    first = pool.take(ka, small, alloc)
    assert pool.take(ka, small, alloc) is first and len(made) == 1  # the memo: no lookup, no allocation
    grown = pool.take(kb, big, alloc)  # replaces the buffer: every memo entry is dropped
    assert grown[0] is not first[0] and len(made) == 2
    assert pool.take(ka, small, alloc)[0] is grown[0] and len(made) == 2  # the larger buffer serves the smaller call
    pool.clear()
    assert pool.take(ka, small, alloc)[0] is not grown[0] and len(made) == 3


def test_backward_run_gives_each_gradient_its_own_allocation(monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(binder, "_DRIVER", types.SimpleNamespace(capturing=lambda s: False))
    launched = []
    monkeypatch.setattr(binder, "launch_driver", lambda ln, sp: launched.append(ln))
    shapes = [(1, 4, 32, 64), (1, 2, 32, 64), (1, 2, 32, 64)]
    args = binder.ArgBuffer([0] * 8)
    allocs = []

    def alloc(shape, dt, zero=False):
        allocs.append(shape)
        return torch.empty(shape, dtype=torch.bfloat16)

    grad_new = tuple(binder.maker(alloc, sh, DType.BF16) for sh in shapes)
    b = types.SimpleNamespace(aligned=(), alloc=alloc, is_torch=True, dtype=DType.BF16, grad_new=grad_new, ws_specs=[], pool_keys=(), param_slots=[], args=args,
                              array_slots=[0], grad_slots=[1, 2, 3], ws_slots=[], tmaps=[], launches=["pre", "main"], pre=0,
                              delta=0, lock=threading.Lock())
    dq, dk, dv, params = bwd._run(b, [0x1000], None, 0)
    assert allocs == shapes and launched == ["pre", "main"] and params == {}
    assert [tuple(g.shape) for g in (dq, dk, dv)] == shapes and all(g.is_contiguous() for g in (dq, dk, dv))
    assert [args.vals[i] for i in (1, 2, 3)] == [g.data_ptr() for g in (dq, dk, dv)]
    # separate storages: the dispatched op (torch.compile, opcheck) refuses outputs that alias
    assert len({g.untyped_storage().data_ptr() for g in (dq, dk, dv)}) == 3


def test_dispatch_ready_decode_only_after_a_decode_call():
    d = decode.Dispatch.__new__(decode.Dispatch)
    d._decode, d._families = None, {}
    assert d.ready_decode(1) is None
    d._decode = object()
    d._families.update({1: decode.Family.DECODE, 512: decode.Family.FORWARD})
    assert d.ready_decode(1) is d._decode and d.ready_decode(512) is None and d.ready_decode(2) is None


def test_raise_pending_reads_the_short_loop_kernels_words(monkeypatch):
    # A deferred error (nan_check in the torch op, a check under capture) of a call the short-loop
    # kernel ran sits in that kernel's status words: raise_pending reads them too.
    from attngen.runtime import kernel as runtime

    read = []
    monkeypatch.setattr(runtime.Kernel, "_read_status", lambda self, sp: read.append((self.source, sp)))
    main = runtime.Kernel(None, "main", None, 0.0, "none", True)
    main.raise_pending(stream=7)
    assert read == [("main", 7)]
    main.short = runtime.Kernel(None, "short", None, 0.0, "none", True)
    main.raise_pending(stream=7)
    assert read[1:] == [("main", 7), ("short", 7)]
