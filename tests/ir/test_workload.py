"""Random inputs: valid for the ABI, meaningful for each builtin, and usable by the reference."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "reference"))
from _irb import (  # noqa: E402
    alibi,
    and_,
    b,
    bias,
    block_sparse,
    causal,
    decl,
    document,
    load,
    or_,
    padding,
    prefix,
    rel_bias,
    variant,
)

from attngen.ir import abi  # noqa: E402
from attngen.check import reference  # noqa: E402
from attngen.ir.nodes import AttnKind, DType, Layout, Norm, NormKind, NormScope, NormTarget, SizeSym  # noqa: E402
from attngen.check.workload import make_inputs  # noqa: E402


def rich_variant(dtype=DType.BF16, layout=Layout.BSHD):
    mask = and_(or_(causal(), prefix(load("plen", b))), and_(padding(), block_sparse("blk", 4, 16, 32)))
    return variant(
        and_(mask, document("ids")),
        (bias("bt", 3), rel_bias("rb", 4), alibi(slopes="sl")),
        dtype=dtype,
        heads=4,
        kv_heads=2,
        D=16,
        layout=layout,
        norms=(
            Norm(NormTarget.Q, NormKind.LAYERNORM, NormScope.HEAD, 1e-5),
            Norm(NormTarget.K, NormKind.RMSNORM, NormScope.HEAD, 1e-6),
        ),
        inputs=(
            decl("plen", DType.I32, SizeSym.B),
            decl("blk", DType.U8, SizeSym.B, SizeSym.H, "nq", "nk"),
            decl("ids", DType.I32, SizeSym.B, SizeSym.LK, sorted=True),
            decl("bt", DType.FP16, SizeSym.H, SizeSym.LQ, SizeSym.LK),
            decl("rb", DType.FP32, SizeSym.H, 9),
            decl("sl", DType.FP32, SizeSym.H),
            decl("tab", DType.I32, "n"),
        ),
    )


@pytest.mark.parametrize("dtype", [DType.BF16, DType.FP16, DType.FP32])
def test_inputs_pass_the_abi_and_the_reference(dtype):
    v = rich_variant(dtype)
    rng = np.random.default_rng(0)
    x = make_inputs(v, 3, 100, 100, rng)
    want = {"q", "k", "v"} | {d.name for d in v.runtime_inputs()}
    assert set(x) == want
    runtime = {n: (a.shape, a.dtype.name) for n, a in x.items() if n not in ("q", "k", "v")}
    sizes = abi.bind_sizes(v, x["q"].shape, x["k"].shape, x["v"].shape, runtime)  # checks dtypes too
    assert sizes.symbol("nq") == 7 and sizes.symbol("nk") == 4  # ceil(100/16), ceil(100/32)
    for n in "qkv":
        abi.check_dtype(n, dtype, x[n].dtype.name)
    assert x["q"].shape == (3, 100, 4, 16)  # bshd
    O, L = reference.attention(v, x["q"], x["k"], x["v"], {n: x[n] for n in runtime})
    assert not np.isnan(O.astype(np.float64)).any() and not np.isnan(L).any()


def test_lengths_include_empty_and_full():
    v = variant(padding(), kind=AttnKind.CROSS)
    x = make_inputs(v, 4, 9, 13, np.random.default_rng(1))
    for name, L in (("q_lens", 9), ("kv_lens", 13)):
        lens = x[name]
        assert lens.dtype == np.int32 and lens.min() >= 0 and lens.max() <= L
        assert L in lens and 0 in lens


def test_document_ids_sorted_and_few():
    v = variant(document("ids"), inputs=(decl("ids", DType.I32, SizeSym.B, SizeSym.LK, sorted=True),))
    for seed in range(5):
        ids = make_inputs(v, 2, 64, 64, np.random.default_rng(seed))["ids"]
        assert np.all(np.diff(ids, axis=-1) >= 0)
        assert len(np.unique(ids)) <= 4


def test_block_sparse_density_near_half():
    v = rich_variant()
    blk = make_inputs(v, 2, 512, 512, np.random.default_rng(2))["blk"]
    assert set(np.unique(blk)) <= {0, 1} and 0.35 < blk.mean() < 0.65


def test_norm_weights_slopes_and_free_symbols():
    v = rich_variant()
    x = make_inputs(v, 1, 8, 8, np.random.default_rng(3), symbols={"n": 5})
    assert x["tab"].shape == (5,)
    assert abs(x["q_norm_weight"].mean() - 1) < 0.2 and abs(x["q_norm_bias"].mean()) < 0.2
    assert x["q_norm_weight"].dtype == np.float32
    assert np.all(x["sl"] > 0)
    assert 0 <= x["plen"].min() and x["plen"].max() <= 8


@pytest.mark.parametrize("dtype,bound", [(DType.BF16, 30), (DType.FP32, 30), (DType.FP16, 8)])
def test_large_distribution(dtype, bound):
    v = variant(dtype=dtype, D=64, heads=2)
    x = make_inputs(v, 2, 64, 64, np.random.default_rng(4), dist="large")
    q = x["q"].astype(np.float64)
    assert np.abs(q).max() <= bound + 0.5 and np.abs(q).max() > 0.8 * bound
    if dtype == DType.FP16:
        # Raw scores overflow fp16's exp, so a naive kernel would fail here and ours must not.
        s = np.einsum("bhqd,bhkd->bhqk", q, x["k"].astype(np.float64)) / 8
        assert s.max() > 11.1  # exp(11.1) > 65504
        O, _ = reference.attention(v, x["q"], x["k"], x["v"])
        assert np.isfinite(O.astype(np.float64)).all()


def test_normal_and_uniform_nonzero():
    v = variant()
    for dist in ("normal", "uniform"):
        x = make_inputs(v, 1, 4, 4, np.random.default_rng(5), dist=dist)
        assert all(np.any(x[n]) for n in "qkv")
    u = make_inputs(v, 1, 64, 64, np.random.default_rng(5), dist="uniform")["q"]
    assert np.abs(u).max() <= 1.0


def test_bad_arguments():
    with pytest.raises(ValueError, match="dist: expected one of normal, large, uniform, got 'wide'"):
        make_inputs(variant(), 1, 4, 4, np.random.default_rng(0), dist="wide")
    with pytest.raises(ValueError, match="Lq == Lk for self attention"):
        make_inputs(variant(), 1, 4, 5, np.random.default_rng(0))


def test_deterministic_for_a_seed():
    v = rich_variant()
    a = make_inputs(v, 2, 32, 32, np.random.default_rng(7))
    c = make_inputs(v, 2, 32, 32, np.random.default_rng(7))
    assert all(np.array_equal(a[n], c[n]) for n in a)
