"""The mma.sync forward engine (sm_80-89, and head dims the wgmma engine does not take) run on the
CPU under the execution-model emulation (`_fwd_emu.py`, whose ldmatrix / mma.sync follow the PTX
fragment layouts), against the float64 reference: every example rendered for sm_80, and the mask
split by axis (`emit.split_by_axis`: lookups read once per row and per key, shuffled) against the
per-element form it replaced, bit for bit, on both visibility paths (two row tiles a warp, and
one, which the split moves before the S product)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _fwd_emu  # noqa: E402

from attngen.check import fuzz, reference, tolerance  # noqa: E402
from attngen.cuda import render  # noqa: E402
from attngen.lang import frontend  # noqa: E402
from attngen.plan.schedule import Arch, Engine  # noqa: E402

pytestmark = pytest.mark.skipif(_fwd_emu.available() is not None, reason=f"no host emulation: {_fwd_emu.available()}")



def _check(v, case: fuzz.Case, src: str, kp, tmp_path, heads: tuple[int, ...] | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """Run the kernel (on `heads` only, if given) and compare those heads with the reference."""
    arrays = fuzz.case_inputs(v, case)
    tmp_path.mkdir(parents=True, exist_ok=True)
    o, lse = _fwd_emu.run(src, kp, v, arrays, workdir=str(tmp_path), timeout=300, heads=heads)
    if heads is None:
        reports = fuzz.compare(v, arrays, o.astype(np.float32), None if lse is None else lse.astype(np.float32))
    else:
        q, k, vv, rest = fuzz.split_inputs(arrays)
        o_ref, lse_ref = reference.attention(v, q, k, vv, rest)
        se = reference.score_error(v, q, k, rest)
        hs = list(heads)
        o_axis = 1 if v.layout.value == "bhsd" else 2
        reports = [tolerance.check(np.take(o, hs, o_axis), np.take(o_ref, hs, o_axis), v.dtype, "O", score_err=se)]
        if v.lse:
            reports.append(tolerance.check_lse(lse[:, hs], lse_ref[:, hs], v.dtype, "LSE", score_err=se))
    bad = [r.summary() for r in reports if not r.ok]
    assert not bad, f"{v.name} at {case.describe()}:\n" + "\n".join(bad)
    return o, lse


@pytest.mark.parametrize("v", _fwd_emu.example_params())
def test_every_example_on_the_mma_engine_matches_the_reference(v, tmp_path) -> None:
    src, kp = _fwd_emu.example_kernel(v, Arch.SM80, Engine.MMA_SYNC)
    # Two query tiles and three key tiles at least (a partial last one); the first, second and last
    # query heads (the last of the last kv group), so that a 128-head example costs what a
    # 3-head one does (each emulated mma.sync is two warp barriers).
    L = kp.tile.block_m + 11
    case = fuzz.Case(B=1, Lq=L, Lk=2 * kp.tile.block_n + 17 if v.kind.value == "cross" else L, dist="normal", seed=5)
    heads = tuple(sorted({0, 1, v.heads - 1}))
    _check(v, case, src, kp, tmp_path, heads)


# Masks that read tensors and split: documents (rows and keys), a prefix-LM (a per-batch length
# and a per-key flag), and a padding mask (per-batch lengths: rows only), each on a
# tile of two row tiles a warp (128 x 64, the visibility words before S already) and of one (64 x
# 32, where the split moves the mask before S), causal documents with the LSE.
SPLIT_CASES = {
    "documents": ("dtype bf16; head_dim 64; heads 2; input doc: i32[B, Lk] sorted; mask document(doc) && causal; output lse",
                  (2, 203, 203)),
    "prefix_lm": ("dtype fp16; head_dim 64; heads 2; input plen: i32[B]; mask causal || prefix(plen[b])", (2, 150, 150)),
    "padding": ("dtype bf16; head_dim 64; heads 2; mask padding; output lse", (3, 140, 140)),
}
TILES = {"128x64": "tile block_m 128 block_n 64 warps 4 stages 2", "64x32": "tile block_m 64 block_n 32 warps 4 stages 2"}


def _split_case(name: str, tile: str):
    body, (B, Lq, Lk) = SPLIT_CASES[name]
    v = frontend.loads(f"attention {name} {{ {body}; {TILES[tile]} }}").get()
    q_lens = kv_lens = None
    if "padding" in body:
        q_lens = tuple(0 if b == 0 else Lq - 37 * b for b in range(B))
        kv_lens = tuple(0 if b == 1 else Lk - 51 * b for b in range(B))
    return v, fuzz.Case(B=B, Lq=Lq, Lk=Lk, dist="normal", seed=11, q_lens=q_lens, kv_lens=kv_lens)


@pytest.mark.parametrize("tile", sorted(TILES))
@pytest.mark.parametrize("name", sorted(SPLIT_CASES))
def test_split_mask_changes_no_bit(name: str, tile: str, tmp_path, monkeypatch) -> None:
    v, case = _split_case(name, tile)
    src, kp = render.render_with_plan(v, Arch.SM80)
    assert kp.engine == Engine.MMA_SYNC
    assert "(emit.split_by_axis), as in the wgmma" in src
    assert "ag_mask(p, b, h, qi, kv)" not in src, "the split leaves no per-element mask call"
    o, lse = _check(v, case, src, kp, tmp_path / "split")
    monkeypatch.setattr(render, "_fwd_split", lambda *a: None)
    plain, kp2 = render.render_with_plan(v, Arch.SM80)
    assert "ag_mask(p, b, h, qi, kv)" in plain and kp2.tile == kp.tile
    o2, lse2 = _check(v, case, plain, kp2, tmp_path / "plain")
    assert np.array_equal(o, o2, equal_nan=True)
    assert lse is None or np.array_equal(lse, lse2, equal_nan=True)


def test_a_wrong_split_mask_is_caught(tmp_path) -> None:
    # The comparison above can fail: the same kernel with its element test negated is refused.
    v, case = _split_case("documents", "64x32")
    src, kp = render.render_with_plan(v, Arch.SM80)
    needle = "vis[mt][half] |= (unsigned)m << (2 * j + e);"
    assert src.count(needle) == 1
    with pytest.raises(AssertionError, match="out of bounds|NaN"):
        _check(v, case, src.replace(needle, "vis[mt][half] |= (unsigned)!m << (2 * j + e);"), kp, tmp_path)


def test_split_stays_off_above_head_dim_64() -> None:
    # Its tiles hold 255 registers there, and ptxas spilled more with the split for documents and
    # prefix-LM masks (render.MMA_SPLIT_MAX_HEAD_DIM, results/mma_split_ptxas.txt); the wgmma engine
    # takes it at every head dim it runs.
    text = "attention a {{ dtype bf16; head_dim {D}; heads 2; input doc: i32[B, Lk] sorted; mask document(doc) && causal }}"
    src, kp = render.render_with_plan(frontend.loads(text.format(D=128)).get(), Arch.SM80)
    assert kp.engine == Engine.MMA_SYNC and "emit.split_by_axis" not in src and "ag_mask(p, b, h, qi, kv)" in src
    src, kp = render.render_with_plan(frontend.loads(text.format(D=64)).get(), Arch.SM80)
    assert kp.engine == Engine.MMA_SYNC and "emit.split_by_axis" in src and "ag_mask(p, b, h, qi, kv)" not in src
    src, kp = render.render_with_plan(frontend.loads(text.format(D=128)).get(), Arch.SM90A)
    assert kp.engine == Engine.WGMMA and "emit.split_by_axis" in src
