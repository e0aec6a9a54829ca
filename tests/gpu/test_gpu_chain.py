"""The chained wgmma consumer (`schedule.WgmmaSoftmax.chain`: a work tile's first S and softmax run
under the last P.V of the tile before) against the plain consumer and the reference (GPU only).

Chaining changes when products run, never what they compute, so its outputs must equal the plain
kernel's bit for bit. The shapes give every CTA several work tiles (more tiles than the H200's
132 SMs), tails past a tile multiple, and with `padding` whole work tiles with no visible key tile
between chained ones (batch 0 has no queries, batch 1 no keys), which the consumer must finish
alone and start again from; and a token-scope pre-norm with the residual, whose next Q is
normalised under the last P.V.
"""

from __future__ import annotations

import pytest

from attngen.check import fuzz
from attngen.plan.schedule import WgmmaSoftmax
from attngen.runtime import kernel as runtime
from gpu_helpers import kernel_for, spec_text, variant_of

SPECS = [
    spec_text("ch_d64_causal", dtype="bf16", D=64, H=8, mask="causal"),
    spec_text("ch_d64_dense_lse", dtype="fp16", D=64, H=8, lse=True),
    spec_text("ch_d128_dense", dtype="bf16", D=128, H=8),
    spec_text("ch_d128_causal_gqa", dtype="bf16", D=128, H=8, Hkv=2, layout="bshd", mask="causal", lse=True),
    spec_text("ch_d128_softcap_window", dtype="fp16", D=128, H=4, mask="causal && window(300, 0)", scores=("softcap(20.0)",)),
    spec_text("ch_d64_padding_cross", dtype="bf16", D=64, H=4, kind="cross", mask="padding && causal", lse=True),
    spec_text("ch_d128_documents", dtype="bf16", D=128, H=4, mask="document(doc) && causal",
              extra=("input doc: i32[B, Lk] sorted",)),
    # a token-scope pre-norm with the residual (chained: the late step, one residual copy a Q buffer)
    spec_text("ch_preln_cross", dtype="bf16", D=64, H=4, kind="cross", layout="bshd",
              extra=("norm q layernorm(1e-5) scope token", "residual")),
]
# (B, Lq, Lk): self-attention specs take Lk = Lq. Lengths to 2k run the short-loop kernel where
# the plan has one (schedule.short_tile: D128 to 4k, D64 to 1k), 4100 the main one.
SHAPES = [(4, 1000, 1000), (3, 2048, 2048), (2, 700, 1500), (1, 4100, 4100)]


def _case(text: str, B: int, Lq: int, Lk: int, seed: int) -> fuzz.Case:
    if "cross" not in text:
        Lk = Lq
    q_lens = kv_lens = None
    if "padding" in text:
        q_lens = tuple(0 if b == 0 else Lq - 37 * b for b in range(B))
        kv_lens = tuple(0 if b == 1 else Lk - 91 * b for b in range(B))
    return fuzz.Case(B=B, Lq=Lq, Lk=Lk, dist="normal", seed=seed, q_lens=q_lens, kv_lens=kv_lens)


@pytest.mark.gpu
@pytest.mark.parametrize("text", SPECS, ids=lambda t: t.split()[1])
def test_chained_consumer_equals_plain_and_reference(text: str) -> None:
    v = variant_of(text)
    plain = kernel_for(v)
    chained = runtime.compile(v, family="forward", softmax=WgmmaSoftmax(chain=True))
    assert chained.plan.attention.softmax.chain, "the plan turned chaining off for this variant"
    assert "under the last P.V of the tile before" in chained.source
    if chained.short is not None:
        assert chained.short.plan.attention.softmax.chain
    _same_as_plain(text, v, plain, chained, SHAPES, seed=10)


def _same_as_plain(text: str, v, plain, other, shapes, seed: int) -> None:
    """`other` (a schedule of the same variant) gives the plain kernel's O and LSE bit for bit on
    each shape, and those agree with the reference."""
    for i, (B, Lq, Lk) in enumerate(shapes):
        case = _case(text, B, Lq, Lk, seed=seed + i)
        arrays = fuzz.case_inputs(v, case)
        o_plain, lse_plain = fuzz.run_kernel(plain, v, arrays)
        o, lse = fuzz.run_kernel(other, v, arrays)
        assert o.tobytes() == o_plain.tobytes(), f"{v.name} at {case.describe()}: O differs from the plain kernel"
        if v.lse:
            assert lse.tobytes() == lse_plain.tobytes(), f"{v.name} at {case.describe()}: LSE differs"
        bad = [r.summary() for r in fuzz.compare(v, arrays, o, lse) if not r.ok]
        assert not bad, f"{v.name} at {case.describe()}:\n" + "\n".join(bad)


# Split rings of their own depths (`WgmmaSoftmax.k_slot` / `v_slot`): only kernels on split K/V
# rings with room for one more tile take them (the short-loop D128 kernel; a user's `stages 2`
# tile); the slots of K and V then wrap at different points.
RING_SPECS = [
    spec_text("ring_d128_dense", dtype="bf16", D=128, H=8),
    spec_text("ring_d128_causal_gqa", dtype="bf16", D=128, H=8, Hkv=2, layout="bshd", mask="causal", lse=True),
    spec_text("ring_d128_window_tile", dtype="fp16", D=128, H=4, mask="causal && window(300, 0)", lse=True,
              extra=("tile block_m 128 block_n 128 warps 8 stages 2",)),
]


@pytest.mark.gpu
@pytest.mark.parametrize("sm", [WgmmaSoftmax(k_slot=True), WgmmaSoftmax(v_slot=True), WgmmaSoftmax(chain=True, v_slot=True)],
                         ids=["k_slot", "v_slot", "v_slot_chain"])
@pytest.mark.parametrize("text", RING_SPECS, ids=lambda t: t.split()[1])
def test_deeper_ring_equals_plain_and_reference(text: str, sm: WgmmaSoftmax) -> None:
    v = variant_of(text)
    plain = kernel_for(v)
    deep = runtime.compile(v, family="forward", softmax=sm)
    k = deep if deep.short is None else deep.short  # the kernel with split rings (L <= 2k)
    assert k.plan.smem.k_stages == 2 + sm.k_slot and k.plan.smem.v_stages == 2 + sm.v_slot, k.plan.smem
    _same_as_plain(text, v, plain, deep, SHAPES[:3], seed=20)


# TMA loads (`WgmmaSoftmax.loads`, the default where the plan allows them) against the cp.async
# producer: the copies change, never the bytes that land in shared memory (the engine's 128-byte
# swizzle is the layout the consumers read, its zero fill past the length is cp.async's), so every
# output is the same bit for bit. Strided (bshd) and GQA layouts, padded rows, batch 1 (a dimension
# of size 1), split rings and one shared slot.
TMA_SPECS = [
    spec_text("tma_d64_causal", dtype="bf16", D=64, H=8, mask="causal"),
    spec_text("tma_d64_dense_lse", dtype="fp16", D=64, H=8, lse=True),
    spec_text("tma_d128_dense", dtype="bf16", D=128, H=8),
    spec_text("tma_d128_causal_gqa", dtype="bf16", D=128, H=8, Hkv=2, layout="bshd", mask="causal", lse=True),
    spec_text("tma_d64_padding_cross", dtype="bf16", D=64, H=4, kind="cross", mask="padding && causal", lse=True),
    spec_text("tma_d128_documents", dtype="bf16", D=128, H=4, mask="document(doc) && causal",
              extra=("input doc: i32[B, Lk] sorted",)),
]


@pytest.mark.gpu
@pytest.mark.parametrize("text", TMA_SPECS, ids=lambda t: t.split()[1])
def test_tma_loads_equal_plain_and_reference(text: str) -> None:
    from attngen.plan.schedule import WgmmaLoads

    v = variant_of(text)
    tma = kernel_for(v)
    assert tma.plan.attention.tma and "cp.async.bulk.tensor" in tma.source
    if tma.short is not None:
        assert tma.short.plan.attention.tma
    cp = runtime.compile(v, family="forward", softmax=WgmmaSoftmax(loads=WgmmaLoads.CP_ASYNC))
    assert not cp.plan.attention.tma and "cp.async.bulk.tensor" not in cp.source
    _same_as_plain(text, v, cp, tma, SHAPES, seed=30)
