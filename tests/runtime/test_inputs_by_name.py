"""Runtime inputs go by name on every front end: the matching layer, the Kernel call, and the torch
op's callable and module (meta tensors, no GPU). `padding`'s q_lens and kv_lens are both i32[B], so
a positional call could swap them without an error; it is refused instead."""

from __future__ import annotations

import types
from pathlib import Path

import pytest

from attngen.runtime import kernel
from attngen.runtime.inputs import InputNameError, match_inputs

SEED = Path(__file__).resolve().parents[2] / "examples" / "seed_padded_fp32.attn"
NAMES = ("kv_lens", "q_lens")


def test_match_inputs_orders_by_name_whatever_the_keyword_order():
    assert match_inputs("op", NAMES, (), {"q_lens": "Q", "kv_lens": "K"}) == ("K", "Q")
    assert match_inputs("op", (), (), {}) == ()


def test_match_inputs_refuses_positional_and_names_the_fix():
    with pytest.raises(InputNameError) as e:
        match_inputs("attngen::seed", NAMES, ("a", "b"), {})
    msg = str(e.value)
    assert "by name, not by position" in msg and "got 2 positional" in msg
    assert "(q, k, v, kv_lens=kv_lens, q_lens=q_lens)" in msg
    assert isinstance(e.value, TypeError) and isinstance(e.value, ValueError)


@pytest.mark.parametrize("named, words", [
    ({"kv_lens": 1}, ["missing q_lens"]),
    ({"kv_lens": 1, "q_lens": 2, "qlens": 3}, ["unexpected qlens"]),
    ({"kv_len": 1}, ["missing kv_lens, q_lens", "unexpected kv_len"]),
])
def test_match_inputs_missing_and_unexpected(named, words):
    with pytest.raises(InputNameError) as e:
        match_inputs("op", NAMES, (), named)
    for w in words:
        assert w in str(e.value)


def test_kernel_call_refuses_positional_runtime_inputs():
    # The check comes first in the call, before any array is looked at, so a stand-in kernel holds it.
    stand_in = types.SimpleNamespace(variant=types.SimpleNamespace(name="seed_padded_fp32"), _input_names=NAMES)
    with pytest.raises(TypeError, match=r"kernel seed_padded_fp32: runtime inputs go by name.*kv_lens=kv_lens, q_lens=q_lens"):
        kernel.Kernel.__call__(stand_in, "q", "k", "v", "lens_a", "lens_b")


def _meta_args(B=4, L=128):
    torch = pytest.importorskip("torch")
    q, k, v = (torch.empty(B, 8, L, 64, device="meta") for _ in range(3))
    return q, k, v, torch.empty(B, dtype=torch.int32, device="meta"), torch.empty(B, dtype=torch.int32, device="meta")


def test_torch_op_callable_takes_inputs_by_name_only():
    at = pytest.importorskip("attngen.torch")
    op = at.register(SEED)
    q, k, v, kl, ql = _meta_args()
    assert op(q, k, v, q_lens=ql, kv_lens=kl).shape == (4, 8, 128, 64)
    with pytest.raises(TypeError, match="runtime inputs go by name"):
        op(q, k, v, kl, ql)
    with pytest.raises(TypeError, match="unexpected lens"):
        op(q, k, v, kv_lens=kl, q_lens=ql, lens=ql)


def test_torch_op_passes_each_input_to_its_own_schema_slot(monkeypatch):
    # Keyword order must not matter: the op receives kv_lens then q_lens (its schema's order).
    at = pytest.importorskip("attngen.torch")
    op = at.register(SEED)
    q, k, v, kl, ql = _meta_args()
    seen = []
    monkeypatch.setattr(op, "op", lambda *a, **kw: seen.append(a) or q)
    op(q, k, v, q_lens=ql, kv_lens=kl)
    assert seen[0][3] is kl and seen[0][4] is ql


def test_torch_module_refuses_a_missing_name():
    at = pytest.importorskip("attngen.torch")
    m = at.Attention(SEED)
    q, k, v, kl, ql = _meta_args()
    with pytest.raises(ValueError, match="missing q_lens"):
        m(q, k, v, kv_lens=kl)
