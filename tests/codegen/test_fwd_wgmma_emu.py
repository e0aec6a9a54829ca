"""The sm_90a forward kernel (wgmma engine: producer warpgroup, mbarrier rings, consumer
warpgroups) run on the CPU through `_fwd_emu`, against the NumPy reference; the TMA and cp.async
producers against each other, bit for bit; and a protocol bug (a lost mbarrier arrival) reported
rather than hung. Shapes are small but give each of the two persistent CTAs several work tiles, so
the rings and Q buffers wrap and work tiles follow one another."""

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
    # and the residual from shared memory
    "preln_cross_residual": ("dtype bf16; head_dim 64; heads 4; kind cross; layout bshd\n norm q layernorm(1e-5) scope token\n"
                             " residual", (2, 500, 300)),
    # a score mod, a window and a sink
    "softcap_window_sink": ("dtype bf16; head_dim 64; heads 4; mask causal && window(200, 0); score softcap(30.0)\n"
                            " input sinks: fp32[H]\n sink sinks", (1, 500, 500)),
}


def _case(name: str) -> tuple:
    body, (B, Lq, Lk) = CASES[name]
    v = frontend.loads(f"attention {name} {{ {body} }}").get()
    q_lens = kv_lens = None
    if "padding" in body:
        q_lens = tuple(0 if b == 0 else Lq - 37 * b for b in range(B))
        kv_lens = tuple(0 if b == 1 else Lk - 51 * b for b in range(B))
    case = fuzz.Case(B=B, Lq=Lq, Lk=Lk, dist="normal", seed=7, q_lens=q_lens, kv_lens=kv_lens)
    return v, case, fuzz.case_inputs(v, case)


@pytest.mark.parametrize("name", sorted(CASES))
def test_forward_kernel_matches_the_reference(name: str, tmp_path) -> None:
    v, case, arrays = _case(name)
    src, kp = render_with_plan(v, Arch.SM90A)
    assert kp.engine == Engine.WGMMA
    o, lse = _fwd_emu.run(src, kp, v, arrays, workdir=str(tmp_path), timeout=300)
    reports = fuzz.compare(v, arrays, o.astype(np.float32), None if lse is None else lse.astype(np.float32))
    bad = [r.summary() for r in reports if not r.ok]
    assert not bad, f"{name} at {case.describe()}:\n" + "\n".join(bad)


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
