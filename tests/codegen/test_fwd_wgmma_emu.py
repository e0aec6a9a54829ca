"""The sm_90a forward kernel (wgmma engine: producer warpgroup, mbarrier rings, consumer
warpgroups) run on the CPU through `_fwd_emu`, against the NumPy reference; the chained consumer
(`WgmmaSoftmax.chain`) against the plain one, bit for bit; and a protocol bug (a lost mbarrier
arrival) reported rather than hung. Shapes are small but give each of the two persistent CTAs
several work tiles, so the rings and Q buffers wrap and (chained) work tiles follow one another."""

from __future__ import annotations

import numpy as np
import pytest

from attngen.check import fuzz
from attngen.cuda.render import render_with_plan
from attngen.lang import frontend
from attngen.plan.schedule import Arch, Engine, WgmmaSoftmax

import _fwd_emu

pytestmark = pytest.mark.skipif(_fwd_emu.available() is not None, reason=f"no host emulation: {_fwd_emu.available()}")

# (.attn body, (B, Lq, Lk)): the tiles and features the wgmma consumer branches on.
CASES = {
    # three consumer warpgroups (192 x 128), two Q buffers
    "d64_causal": ("dtype bf16; head_dim 64; heads 2; mask causal", (1, 450, 450)),
    # 128 x 176 on split K/V rings, one Q buffer
    "d128_dense": ("dtype bf16; head_dim 128; heads 2", (1, 400, 400)),
    # the short-loop tile: 128 x 128 x 2 stages on split rings, two Q buffers
    "d128_short": ("dtype bf16; head_dim 128; heads 2; tile block_m 128 block_n 128 warps 8 stages 2", (1, 520, 520)),
    # GQA, token-major layout, the LSE, fp16
    "gqa_lse_bshd": ("dtype fp16; head_dim 128; heads 4 kv 2; layout bshd; mask causal; output lse", (2, 300, 300)),
    # a mask that reads a tensor (visibility bits while S is in flight), random documents
    "documents": ("dtype bf16; head_dim 64; heads 2\n input doc: i32[B, Lk] sorted\n mask document(doc) && causal", (2, 400, 400)),
    # cross attention with padding: batch 0 has no queries, batch 1 no keys (work tiles with no
    # visible key tile between others)
    "padding_cross": ("dtype bf16; head_dim 64; heads 2; kind cross; mask padding && causal; output lse", (3, 300, 420)),
    # the suite's pre-LN row in small: a token-scope LayerNorm of q (prep kernel, in-place norm)
    # and the residual from shared memory (chained: one copy a Q buffer, the late step only)
    "preln_cross_residual": ("dtype bf16; head_dim 64; heads 4; kind cross; layout bshd\n norm q layernorm(1e-5) scope token\n"
                             " residual", (2, 500, 300)),
    # a score mod, a window and a sink
    "softcap_window_sink": ("dtype bf16; head_dim 64; heads 4; mask causal && window(200, 0); score softcap(30.0)\n"
                            " input sinks: fp32[H]\n sink sinks", (1, 500, 500)),
}


def _case(name: str) -> tuple:
    body, (B, Lq, Lk) = CASES[name] if name in CASES else RING_CASES[name]
    v = frontend.loads(f"attention {name} {{ {body} }}").get()
    q_lens = kv_lens = None
    if "padding" in body:
        q_lens = tuple(0 if b == 0 else Lq - 37 * b for b in range(B))
        kv_lens = tuple(0 if b == 1 else Lk - 51 * b for b in range(B))
    case = fuzz.Case(B=B, Lq=Lq, Lk=Lk, dist="normal", seed=7, q_lens=q_lens, kv_lens=kv_lens)
    return v, case, fuzz.case_inputs(v, case)


@pytest.mark.parametrize("name", sorted(CASES))
def test_forward_kernel_matches_the_reference_and_chaining_changes_no_bit(name: str, tmp_path) -> None:
    v, case, arrays = _case(name)
    plain_src, kp = render_with_plan(v, Arch.SM90A)
    assert kp.engine == Engine.WGMMA
    o, lse = _fwd_emu.run(plain_src, kp, v, arrays, workdir=str(tmp_path), timeout=300)
    reports = fuzz.compare(v, arrays, o.astype(np.float32), None if lse is None else lse.astype(np.float32))
    bad = [r.summary() for r in reports if not r.ok]
    assert not bad, f"{name} at {case.describe()}:\n" + "\n".join(bad)
    chain_src, kpc = render_with_plan(v, Arch.SM90A, softmax=WgmmaSoftmax(chain=True))
    assert kpc.attention.softmax.chain
    # A patient readiness test takes the chained step wherever a next tile exists; one that always
    # says no takes the late step (the next tile waited for under the last P.V) there instead.
    for patience, step in ((200, "chained"), (-1, "late")):
        oc, lsec = _fwd_emu.run(chain_src, kpc, v, arrays, workdir=str(tmp_path), timeout=300, test_patience_ms=patience)
        yes, no = _fwd_emu.last_votes
        if "scope token" in CASES[name][0]:  # the late step only: no vote is taken
            assert (yes, no) == (0, 0), f"{name}: votes {yes} / {no}"
        else:
            assert (yes > 0) if step == "chained" else (yes == 0 and no > 0), f"{name}: votes {yes} / {no}"
        assert oc.tobytes() == o.tobytes(), f"{name}, {step} step: O differs from the plain consumer's"
        if lse is not None:
            assert lsec.tobytes() == lse.tobytes(), f"{name}, {step} step: the LSE differs"


def test_a_lost_arrival_is_reported_not_hung(tmp_path) -> None:
    # The producer's arrival that publishes a slot's header, removed: every consumer waits on that
    # slot forever. The emulation must name the mbarrier wait instead of hanging.
    v, case, arrays = _case("d64_causal")
    src, kp = render_with_plan(v, Arch.SM90A)
    line = "        ag_bar_arrive(bar_full + 8 * slot);  // releases the header\n"
    assert line in src
    with pytest.raises(RuntimeError, match=r"waited 3 s for parity \d \(a lost arrival\?\)"):
        _fwd_emu.run(src.replace(line, ""), kp, v, arrays, workdir=str(tmp_path), timeout=120, wait_seconds=3)


@pytest.mark.parametrize("v", _fwd_emu.example_params())
def test_every_example_on_the_wgmma_engine_matches_the_reference(v, tmp_path) -> None:
    # Lengths scaled so each case is a few seconds of emulation (the work grows with H L^2 D) and
    # still spans more than one key tile and query tile.
    src, kp = _fwd_emu.example_kernel(v, Arch.SM90A, Engine.WGMMA)
    L = max(130, min(300, int((8 * 220 * 220 * 64 / (v.heads * max(v.head_dim, v.value_head_dim))) ** 0.5)))
    case = fuzz.Case(B=1, Lq=L, Lk=L + 33 if v.kind.value == "cross" else L, dist="normal", seed=5)
    arrays = fuzz.case_inputs(v, case)
    o, lse = _fwd_emu.run(src, kp, v, arrays, workdir=str(tmp_path), timeout=300)
    reports = fuzz.compare(v, arrays, o.astype(np.float32), None if lse is None else lse.astype(np.float32))
    bad = [r.summary() for r in reports if not r.ok]
    assert not bad, f"{v.name} at {case.describe()}:\n" + "\n".join(bad)


RING_CASES = {
    "d128_short": CASES["d128_short"],
    # a split ring under a mask, the LSE and GQA at odd lengths (the user's tile, stages 2)
    "d128_split_window_gqa_lse": ("dtype fp16; head_dim 128; heads 4 kv 2; mask causal && window(150, 0); output lse; "
                                  "tile block_m 128 block_n 128 warps 8 stages 2", (1, 333, 333)),
}


@pytest.mark.parametrize("sm", [WgmmaSoftmax(k_slot=True), WgmmaSoftmax(v_slot=True), WgmmaSoftmax(v_slot=True, chain=True)],
                         ids=["k_slot", "v_slot", "v_slot_chain"])
@pytest.mark.parametrize("name", sorted(RING_CASES))
def test_deeper_k_or_v_ring_changes_no_bit(name: str, sm: WgmmaSoftmax, tmp_path) -> None:
    # WgmmaSoftmax.k_slot / v_slot: one ring a slot deeper than the other, so the slots of K and V
    # wrap at different points; the output must be the plain kernel's, bit for bit.
    v, case, arrays = _case(name)
    plain_src, kp = render_with_plan(v, Arch.SM90A)
    assert kp.smem.kv_split and not kp.smem.k_stages
    o, lse = _fwd_emu.run(plain_src, kp, v, arrays, workdir=str(tmp_path), timeout=300)
    reports = fuzz.compare(v, arrays, o.astype(np.float32), None if lse is None else lse.astype(np.float32))
    assert all(r.ok for r in reports), [r.summary() for r in reports if not r.ok]
    src, kpr = render_with_plan(v, Arch.SM90A, softmax=sm)
    assert (kpr.attention.softmax.k_slot, kpr.attention.softmax.v_slot) == (sm.k_slot, sm.v_slot)
    assert (kpr.smem.k_stages, kpr.smem.v_stages) == (2 + sm.k_slot, 2 + sm.v_slot)
    assert kpr.smem.bytes == kp.smem.bytes + 128 * 128 * 2 + 16 + 4 * sm.k_slot
    assert ("constexpr int K_STAGES = %d;" % (2 + sm.k_slot)) in src and "constexpr int K_STAGES" not in plain_src
    orr, lser = _fwd_emu.run(src, kpr, v, arrays, workdir=str(tmp_path), timeout=300)
    assert orr.tobytes() == o.tobytes(), f"{name} {sm}: O differs from the plain kernel's"
    if lse is not None:
        assert lser.tobytes() == lse.tobytes(), f"{name} {sm}: the LSE differs"


def test_ring_slot_is_turned_off_where_it_does_not_fit() -> None:
    # The 176-key dense D128 tile has no room for a third K or V tile; shared K/V slots (three
    # stages) have no split rings to deepen; asking for both is refused the same way.
    dense = frontend.loads("attention a { dtype bf16; head_dim 128; heads 2 }").get()
    causal = frontend.loads("attention b { dtype bf16; head_dim 128; heads 2; mask causal }").get()
    short = frontend.loads("attention c { dtype bf16; head_dim 128; heads 2; tile block_m 128 block_n 128 warps 8 stages 2 }").get()
    for v, sm in ((dense, WgmmaSoftmax(k_slot=True)), (causal, WgmmaSoftmax(v_slot=True)), (short, WgmmaSoftmax(k_slot=True, v_slot=True))):
        src, kp = render_with_plan(v, Arch.SM90A, softmax=sm)
        assert not (kp.attention.softmax.k_slot or kp.attention.softmax.v_slot) and not kp.smem.k_stages
        assert src == render_with_plan(v, Arch.SM90A)[0]


@pytest.mark.parametrize("name", ["d128_short", "gqa_lse_bshd", "padding_cross", "d64_causal"])
def test_tma_and_cp_async_producers_land_the_same_bytes(name: str, tmp_path) -> None:
    # WgmmaLoads: the default TMA producer (one thread, the copy engine's swizzle and zero fill,
    # arrivals that expect bytes) against every producer thread's cp.async: the same output, bit
    # for bit, on split rings and shared slots, GQA in the token-major layout, empty work tiles.
    from attngen.plan.schedule import WgmmaLoads

    v, case, arrays = _case(name)
    tma_src, kpt = render_with_plan(v, Arch.SM90A)
    assert kpt.attention.tma and "cp.async.bulk.tensor" in tma_src
    cp_src, kpc = render_with_plan(v, Arch.SM90A, softmax=WgmmaSoftmax(loads=WgmmaLoads.CP_ASYNC))
    assert not kpc.attention.tma and "cp.async.bulk.tensor" not in cp_src
    ot, lset = _fwd_emu.run(tma_src, kpt, v, arrays, workdir=str(tmp_path), timeout=300)
    oc, lsec = _fwd_emu.run(cp_src, kpc, v, arrays, workdir=str(tmp_path), timeout=300)
    assert ot.tobytes() == oc.tobytes(), f"{name}: O differs between the producers"
    if lset is not None:
        assert lset.tobytes() == lsec.tobytes(), f"{name}: the LSE differs"
