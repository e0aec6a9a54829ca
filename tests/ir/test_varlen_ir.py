"""`layout varlen` in the IR: the implied cu_seqlens inputs (one for kind self, two for cross,
sorted i32[B+1]), the ABI shapes, and the print/load round trip."""

from __future__ import annotations

from attngen.ir import abi
from attngen.ir.nodes import CU_SEQLENS_DIM, DType, Layout
from attngen.lang.frontend import loads, print_program

SELF = "attention a {\n  dtype bf16; head_dim 128; heads 16; layout varlen\n  mask causal\n}\n"
CROSS = "attention c {\n  dtype fp16; head_dim 64; heads 8 kv 2; layout varlen; kind cross\n  input lens: i32[B]\n  mask kv < lens[b]\n}\n"


def test_self_implies_one_shared_cu_seqlens() -> None:
    v = loads(SELF).get()
    assert v.layout == Layout.VARLEN and v.varlen
    assert v.cu_seqlens_names == ("cu_seqlens", "cu_seqlens")
    (d,) = v.runtime_inputs()
    assert (d.name, d.dtype, d.shape, d.sorted) == ("cu_seqlens", DType.I32, (CU_SEQLENS_DIM,), True)


def test_cross_implies_two_after_the_declared_inputs() -> None:
    v = loads(CROSS).get()
    assert [d.name for d in v.runtime_inputs()] == ["lens", "cu_seqlens_k", "cu_seqlens_q"]
    assert all(d.sorted for d in v.runtime_inputs()[1:])


def test_shapes_are_packed() -> None:
    v = loads(CROSS).get()
    assert abi.q_shape(v, 3, 100) == (100, 8, 64)
    assert abi.kv_shape(v, 3, 70, value=True) == (70, 2, 64)
    assert abi.o_shape(v, 3, 100) == (100, 8, 64)
    assert abi.lse_shape(v, 3, 100) == (8, 100)


def test_round_trip() -> None:
    for text in (SELF, CROSS):
        p = loads(text)
        assert loads(print_program(p)) == p
        assert "layout varlen" in print_program(p)


def test_other_layouts_imply_nothing() -> None:
    v = loads(SELF.replace("varlen", "bshd")).get()
    assert v.cu_seqlens_names == () and v.runtime_inputs() == ()
