"""The backward's tile loops bounded by the mask (`analysis.kv_bounds` turned around in
`render_bwd`): what the rendered kernels contain, and, under the host emulation
(tests/backward/_host_emu.py), gradients equal to the float64 reference on documents of uneven
lengths (a document shorter than a tile, a query tile over three documents, an id with no tokens,
a single-token document) and on windows whose bounds cut the walks on both sides, on every engine
(wgmma, mma.sync, FFMA) and with the deterministic dQ kernel, which walks key tiles."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _host_emu  # noqa: E402

from attngen.check import reference, workload  # noqa: E402
from attngen.cuda import render_bwd  # noqa: E402
from attngen.ir.nodes import DType  # noqa: E402
from attngen.lang import frontend  # noqa: E402
from attngen.plan.bwd import BwdEngine  # noqa: E402
from attngen.plan.schedule import Arch  # noqa: E402

emu = pytest.mark.skipif(_host_emu.available() is not None, reason=f"no host emulation: {_host_emu.available()}")

TOL = {DType.FP32: 2e-4, DType.FP16: 8e-3, DType.BF16: 3e-2}
# (arch, dtype, head dim) -> the engine the plan picks
ENGINES = {
    BwdEngine.WGMMA: (Arch.SM90A, "bf16", 64),
    BwdEngine.MMA: (Arch.SM80, "bf16", 64),
    BwdEngine.FFMA: (Arch.SM80, "fp32", 16),
}


def _variant(mask: str, engine: BwdEngine, extra: str = "", heads: str = "heads 4 kv 2"):
    _, dtype, d = ENGINES[engine]
    return frontend.loads(f"attention t {{ dtype {dtype}; head_dim {d}; {heads}; {extra} mask {mask} }}", "<t>").get()


def _render(v, engine: BwdEngine, deterministic: bool = False):
    src, bp = render_bwd.render_with_plan(v, ENGINES[engine][0], deterministic=deterministic)
    assert bp.engine == engine, bp.engine_reason
    return src, bp


@pytest.mark.parametrize("engine", list(ENGINES))
def test_window_backward_walks_the_bounded_query_tiles(engine):
    src, _ = _render(_variant("window(100, 0) && causal", engine), engine)
    # both edges of the window bound the query rows of a key tile
    assert "__device__ __forceinline__ long long ag_kv_hi(const Params& p, long long q)" in src
    assert "__device__ __forceinline__ long long ag_kv_lo(const Params& p, long long q)" in src
    assert "ag_q_span(p, b, k0, k1, lo, hi);" in src
    assert "q_tiles of them from row q_base" in src
    assert "const int q_tiles = (p.Lq" not in src  # no walk over every query tile is left
    if engine != BwdEngine.FFMA:
        assert "q_tiles, off, q_base)" in src and "* BM + q_base;" in src


def test_deterministic_dq_walks_the_bounded_key_tiles():
    src, _ = _render(_variant("window(40, 3)", BwdEngine.FFMA), BwdEngine.FFMA, deterministic=True)
    assert "ag_kv_span(p, b, q0, q1, lo, hi);" in src
    assert "const int k0 = kt * BLOCK_N + k_base;" in src
    assert "const int k_tiles = (p.Lk" not in src


def test_document_backward_searches_the_sorted_ids():
    v = _variant("document(doc) && causal", BwdEngine.WGMMA, "input doc: i32[B, Lk] sorted;")
    src, _ = _render(v, BwdEngine.WGMMA)
    assert "template <bool UPPER, typename F>\n__device__ __forceinline__ int ag_search(" in src
    assert "auto qval = [&](int q) -> long long { return ag_ld_doc(p, b, q); };" in src
    assert "ag_walk_tile(cp, q_tiles) * WG_BLOCK_M + q_base;" in src


@pytest.mark.parametrize("mask, extra", [
    ("true", ""),
    ("causal || prefix(8)", ""),  # a disjunction bounds nothing
    ("document(doc)", "input doc: i32[B, Lk];"),  # ids not promised sorted
])
def test_unbounded_masks_keep_the_full_walk(mask, extra):
    for engine in ENGINES:
        src, _ = _render(_variant(mask, engine, extra), engine)
        assert "ag_q_span(" not in src and "+ q_base" not in src
        assert "const int q_tiles = (p.Lq" in src


def _run(v, engine: BwdEngine, Lq: int, Lk: int, *, deterministic: bool = False, ids=None, seed: int = 0):
    rng = np.random.default_rng(seed)
    arrays = workload.make_inputs(v, 1, Lq, Lk, rng)
    for name, val in (ids or {}).items():
        arrays[name] = np.asarray(val, dtype=np.int32)[None, :]
    rest = {n: a for n, a in arrays.items() if n not in ("q", "k", "v")}
    o, lse = reference.attention(v, arrays["q"], arrays["k"], arrays["v"], rest)
    dO = rng.normal(size=o.shape).astype(o.dtype)
    want = reference.attention_backward(v, arrays["q"], arrays["k"], arrays["v"], rest, dO.astype(np.float64))
    src, bp = _render(v, engine, deterministic)
    assert "ag_q_span(p, b, k0, k1, lo, hi);" in src
    got = _host_emu.run(src, bp, v, arrays, lse, dO, o)
    for n in ("dq", "dk", "dv"):
        assert np.all(np.isfinite(got[n]))
        scale = float(np.abs(want[n]).max())
        err = float(np.abs(got[n] - want[n]).max())
        assert scale > 0 and err <= TOL[v.dtype] * scale, f"{n}: max error {err:.3g} vs max |ref| {scale:.3g}"


def _ids(lengths: list[int], skip_after: int) -> np.ndarray:
    """Document ids for documents of `lengths`, with one id left without tokens after document
    `skip_after` (sorted, not consecutive)."""
    out, doc = [], 0
    for i, n in enumerate(lengths):
        out += [doc] * n
        doc += 2 if i == skip_after else 1
    return np.array(out)


# 320 rows; documents start at rows 0, 3, 4, 63, 64, 70, 75, 129, 191, 256 and 257: two
# documents smaller than any tile at the start, one-token documents (row 3, row 64 at a tile's
# start, row 256), four documents inside the query tile of rows 64-127, and boundaries one row
# before, at and after tile edges (tiles of 32, 64 and 128 rows), where a span one row short or
# long would drop or add a tile. An id is left without tokens after the fourth document. The
# length, a multiple of 32, makes the last key tile's search end on its final probe.
DOC_LENGTHS = [3, 1, 59, 1, 6, 5, 54, 62, 65, 1, 63]


@emu
@pytest.mark.parametrize("engine, deterministic", [(BwdEngine.WGMMA, False), (BwdEngine.MMA, False), (BwdEngine.FFMA, True)])
def test_uneven_documents_match_the_reference(engine, deterministic):
    v = _variant("document(doc) && causal", engine, "input doc: i32[B, Lk] sorted;")
    _run(v, engine, 320, 320, deterministic=deterministic, ids={"doc": _ids(DOC_LENGTHS, 3)}, seed=1)


@emu
def test_cross_documents_of_other_lengths_deterministic():
    # Queries and keys with their own ids and lengths: the spans search the query ids for a key
    # tile and the key ids for a query tile (the deterministic dQ kernel's walk). The query tile
    # of rows 64-119 starts in id 1, whose keys are rows 63-64: a span one key short drops the
    # first key tile.
    v = _variant("document(qd, kd)", BwdEngine.FFMA, "kind cross; input qd: i32[B, Lq] sorted; input kd: i32[B, Lk] sorted;",
                 heads="heads 2")
    q_ids = _ids([5, 60, 1, 30, 24], 1)        # 120 queries, documents from rows 0, 5, 65, 66, 96
    k_ids = _ids([63, 2, 1, 62, 1, 71], 1)     # 200 keys, from rows 0, 63, 65, 66, 128, 129
    _run(v, BwdEngine.FFMA, 120, 200, deterministic=True, ids={"qd": q_ids, "kd": k_ids}, seed=2)


@emu
@pytest.mark.parametrize("engine, deterministic", [(BwdEngine.WGMMA, False), (BwdEngine.MMA, False), (BwdEngine.FFMA, True)])
def test_window_bounded_on_both_sides_matches_the_reference(engine, deterministic):
    # A window of one key back and one ahead over 400 rows: a key tile from row k0 (a multiple of
    # the tile) is seen by rows k0 - 1 .. k1 + 1, the last row of one query tile and the first of
    # another, each a third of its keys' rows: a span one row short on either side drops a tile
    # and gradients far outside the tolerance. Rows at both ends are clipped by the lengths.
    v = _variant("window(1, 1)", engine)
    _run(v, engine, 400, 400, deterministic=deterministic, seed=3)
