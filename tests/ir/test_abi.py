"""The runtime shape contract: shapes per layout, binding sizes, and the errors for wrong arrays."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "reference"))
from _irb import block_sparse, decl, document, padding, variant  # noqa: E402

from attngen.ir import abi  # noqa: E402
from attngen.ir.abi import Sizes  # noqa: E402
from attngen.ir.nodes import AttnKind, DType, Layout, Norm, NormKind, NormScope, NormTarget, SizeSym  # noqa: E402


def gqa(layout=Layout.BHSD, **kw):
    return variant(heads=16, kv_heads=8, D=128, Dv=64, layout=layout, **kw)


def test_shapes_per_layout():
    v = gqa()
    assert abi.q_shape(v, 2, 10) == (2, 16, 10, 128)
    assert abi.kv_shape(v, 2, 7, value=False) == (2, 8, 7, 128)
    assert abi.kv_shape(v, 2, 7, value=True) == (2, 8, 7, 64)
    assert abi.o_shape(v, 2, 10) == (2, 16, 10, 64)
    assert abi.lse_shape(v, 2, 10) == (2, 16, 10)
    s = gqa(Layout.BSHD)
    assert abi.q_shape(s, 2, 10) == (2, 10, 16, 128)
    assert abi.kv_shape(s, 2, 7, value=True) == (2, 7, 8, 64)
    assert abi.o_shape(s, 2, 10) == (2, 10, 16, 64)
    assert abi.lse_shape(s, 2, 10) == (2, 16, 10)


def test_bind_self_and_cross():
    v = gqa()
    sz = abi.bind_sizes(v, (2, 16, 512, 128), (2, 8, 512, 128), (2, 8, 512, 64), {})
    assert sz == Sizes(2, 512, 512)
    c = gqa(kind=AttnKind.CROSS)
    assert abi.bind_sizes(c, (2, 16, 5, 128), (2, 8, 9, 128), (2, 8, 9, 64)) == Sizes(2, 5, 9)


def test_bind_error_message_shows_expected_picture():
    v = gqa()
    with pytest.raises(ValueError) as e:
        abi.bind_sizes(v, (2, 16, 512, 128), (2, 16, 512, 128), (2, 8, 512, 64), {})
    assert str(e.value) == (
        "k: expected shape (B=2, Hkv=8, Lk=512, D=128) = (2, 8, 512, 128) for layout bhsd, got (2, 16, 512, 128)"
    )
    c = gqa(kind=AttnKind.CROSS)
    with pytest.raises(ValueError) as e:
        abi.bind_sizes(c, (2, 16, 5, 128), (2, 16, 512, 128), (2, 8, 512, 64))
    assert str(e.value) == (
        "k: expected shape (B=2, Hkv=8, Lk, D=128) = (2, 8, *, 128) for layout bhsd, got (2, 16, 512, 128)"
    )


@pytest.mark.parametrize(
    "qs,ks,vs,match",
    [
        ((2, 16, 4, 64), (2, 8, 4, 128), (2, 8, 4, 64), r"q: expected shape \(B, H=16, Lq, D=128\)"),
        ((2, 16, 4), (2, 8, 4, 128), (2, 8, 4, 64), "q: expected shape"),  # rank
        ((2, 16, 4, 128), (3, 8, 4, 128), (2, 8, 4, 64), r"k: .*B=2"),  # batch mismatch
        ((2, 16, 4, 128), (2, 8, 5, 128), (2, 8, 5, 64), r"Lk=4"),  # self: Lq == Lk
        ((2, 16, 4, 128), (2, 8, 4, 128), (2, 8, 4, 128), r"v: expected shape .*Dv=64"),
        ((2, 16, 4, 128), (2, 8, 4, 128), (2, 8, 3, 64), r"v: .*Lk=4"),
        ((0, 16, 4, 128), (0, 8, 4, 128), (0, 8, 4, 64), "B >= 1"),
        ((2, 16, 0, 128), (2, 8, 0, 128), (2, 8, 0, 64), "Lq >= 1"),
    ],
)
def test_bind_rejects(qs, ks, vs, match):
    with pytest.raises(ValueError, match=match):
        abi.bind_sizes(gqa(), qs, ks, vs, {})


def test_bshd_layout_named_in_errors():
    with pytest.raises(ValueError, match=r"\(B, Lq, H=16, D=128\) = \(\*, \*, 16, 128\) for layout bshd"):
        abi.bind_sizes(gqa(Layout.BSHD), (2, 16, 4, 128), (2, 4, 8, 128), (2, 4, 8, 64), {})


def test_runtime_inputs_missing_unexpected_and_shapes():
    v = variant(padding())
    qs = (2, 2, 4, 8)
    with pytest.raises(ValueError, match="expected kv_lens, q_lens; got missing q_lens"):
        abi.bind_sizes(v, qs, qs, qs, {"kv_lens": ((2,), "int32")})
    with pytest.raises(ValueError, match="unexpected extra"):
        abi.bind_sizes(v, qs, qs, qs, {"kv_lens": ((2,), "int32"), "q_lens": ((2,), "int32"), "extra": ((1,), "int32")})
    with pytest.raises(ValueError, match=r"q_lens: expected shape \(B=2\) = \(2,\), got \(3,\)"):
        abi.bind_sizes(v, qs, qs, qs, {"kv_lens": ((2,), "int32"), "q_lens": ((3,), "int32")})
    with pytest.raises(ValueError, match="kv_lens: expected dtype int32 \\(i32\\), got int64"):
        abi.bind_sizes(v, qs, qs, qs, {"kv_lens": ((2,), "int64"), "q_lens": ((2,), "int32")})
    # The reference rounds what it is given, so it can skip the dtype check.
    ok = abi.bind_sizes(v, qs, qs, qs, {"kv_lens": ((2,), "int64"), "q_lens": ((2,), "int32")}, check_dtypes=False)
    assert ok == Sizes(2, 4, 4)


def test_free_symbols_bind_and_must_agree():
    v = variant(
        block_sparse("a", 2, 16, 16),
        inputs=(decl("a", DType.U8, "nq", "nk"), decl("c", DType.I32, "nk", 3)),
        kind=AttnKind.CROSS,
    )
    qs, ks = (1, 2, 40, 8), (1, 2, 70, 8)
    sz = abi.bind_sizes(v, qs, ks, ks, {"a": ((3, 5), "uint8"), "c": ((5, 3), "int32")})
    assert sz.symbols == (("nk", 5), ("nq", 3)) and sz.symbol("nk") == 5
    assert abi.input_shape(v, v.inputs[1], sz) == (5, 3)
    with pytest.raises(ValueError, match=r"c: expected shape \(nk=5, 3\) = \(5, 3\), got \(4, 3\)"):
        abi.bind_sizes(v, qs, ks, ks, {"a": ((3, 5), "uint8"), "c": ((4, 3), "int32")})
    with pytest.raises(ValueError, match="free dim 'zz' is not bound"):
        sz.symbol("zz")


def test_input_shape_resolves_size_symbols():
    v = variant(document("ids"), heads=4, kv_heads=2, inputs=(decl("ids", DType.I32, SizeSym.B, SizeSym.LK, SizeSym.HKV, SizeSym.DV, 7),))
    assert abi.input_shape(v, v.inputs[0], Sizes(3, 9, 9)) == (3, 9, 2, 8, 7)


def test_token_scope_q_may_be_flat():
    v = variant(heads=4, D=8, layout=Layout.BSHD, norms=(Norm(NormTarget.Q, NormKind.RMSNORM, NormScope.TOKEN, 1e-6, False),))
    assert abi.bind_sizes(v, (2, 5, 32), (2, 5, 4, 8), (2, 5, 4, 8)) == Sizes(2, 5, 5)
    assert abi.bind_sizes(v, (2, 5, 4, 8), (2, 5, 4, 8), (2, 5, 4, 8)) == Sizes(2, 5, 5)
    with pytest.raises(ValueError, match=r"H\*D=32"):
        abi.bind_sizes(v, (2, 5, 31), (2, 5, 4, 8), (2, 5, 4, 8))
    # Without a token-scope norm, a flat q is a rank error.
    with pytest.raises(ValueError, match="q: expected shape"):
        abi.bind_sizes(variant(heads=4, layout=Layout.BSHD), (2, 5, 32), (2, 5, 4, 8), (2, 5, 4, 8))


def test_check_dtype():
    abi.check_dtype("q", DType.BF16, "bfloat16")
    with pytest.raises(ValueError, match="q: expected dtype bfloat16 \\(bf16\\), got float16"):
        abi.check_dtype("q", DType.BF16, "float16")
