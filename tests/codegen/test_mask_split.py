"""The wgmma forward's per-element mask bits read each lookup once per row and once per key
(`emit.split_by_axis`), and document and window masks at D128 take the short-run tile
(`schedule._short_runs`). The kernels themselves run under the CPU emulation
(test_fwd_wgmma_emu.py, the `documents` case and every example) and on the GPU."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from attngen.cuda import render as render_cuda
from attngen.cuda.emit import MAX_HOISTED_LOOKUPS, ElementEmitter, split_by_axis
from attngen.lang import frontend
from attngen.plan.schedule import SHORT_RUN_TILE, Arch, variant_tile
from attngen.ir.nodes import TileConfig


def _v(body: str, kind: str = "self", d: int = 128):
    return frontend.loads(f"attention x {{ dtype bf16; head_dim {d}; heads 4; kind {kind}; {body} }}").get()


def _vis(src: str) -> str:
    start = src.index("void ag_wg_vis(")
    return src[start:src.index("\n}\n", start)]


def test_document_mask_splits_into_a_row_and_a_key_lookup() -> None:
    sp = split_by_axis(_v("input doc: i32[B, Lk] sorted; mask document(doc) && causal").mask, {})
    assert sp is not None
    assert [(r.ctype, r.code) for r in sp.rows] == [("int", "ag_ld_doc(p, b, q)")]
    assert [(c.ctype, c.code) for c in sp.cols] == [("int", "ag_ld_doc(p, b, kv)")]
    assert "ag_ld_" not in sp.elem and "&&" not in sp.elem and "r0[ri] == c0k" in sp.elem


@pytest.mark.parametrize("body,rows,cols", [
    ("mask padding", 1, 1),                                                        # q < q_lens[b], kv < kv_lens[b]
    ("input plen: i32[B]; mask causal || prefix(plen[b])", 0, 1),
    ("input cache_lens: i32[B]; mask causal && kv < cache_lens[b]", 0, 1),
])
def test_lookups_of_one_axis_are_hoisted(body: str, rows: int, cols: int) -> None:
    sp = split_by_axis(_v(body).mask, {})
    assert sp is not None and (len(sp.rows), len(sp.cols)) == (rows, cols)
    assert "ag_ld_" not in sp.elem and "||" not in sp.elem and "&&" not in sp.elem


def test_cross_documents_split_over_their_two_tensors() -> None:
    sp = split_by_axis(_v("input a: i32[B, Lq] sorted; input c: i32[B, Lk] sorted; mask document(a, c)", "cross").mask, {})
    assert sp is not None and sp.rows[0].code == "ag_ld_a(p, b, q)" and sp.cols[0].code == "ag_ld_c(p, b, kv)"


@pytest.mark.parametrize("body", [
    "mask causal",                                                                 # nothing to hoist
    "input blocks: u8[H, QB, KB]; mask block_sparse(blocks, 128, 128)",            # a lookup over q and kv
    "input t: i32[B, Lk]; mask " + " + ".join(f"t[b, kv + {i}]" for i in range(MAX_HOISTED_LOOKUPS + 1)) + " >= 0",
])
def test_masks_that_do_not_split_keep_the_per_element_form(body: str) -> None:
    assert split_by_axis(_v(body).mask, {}) is None


def test_eager_emission_has_no_short_circuits() -> None:
    m = _v("input doc: i32[B, Lk] sorted; mask document(doc) && (causal || kv < 3)").mask
    assert "&&" in ElementEmitter({}).emit(m) and "||" in ElementEmitter({}).emit(m)
    eager = ElementEmitter({}, eager=True).emit(m)
    assert "&&" not in eager and "||" not in eager and " & " in eager and " | " in eager


def test_the_wgmma_render_reads_hoisted_lookups_and_shuffles_the_keys() -> None:
    src = render_cuda.render(_v("input doc: i32[B, Lk] sorted; mask document(doc) && causal"), Arch.SM90A)
    vis = _vis(src)
    assert "ag_mask(" not in vis and "__shfl_sync" in vis
    # one row read a row and one key read a slot: no lookup inside the element loop
    assert len(re.findall(r"ag_ld_doc\(", vis)) == 2
    src = render_cuda.render(_v("input blocks: u8[H, QB, KB]; mask block_sparse(blocks, 128, 128)"), Arch.SM90A)
    assert "ag_mask(p, b, h, qi, kv)" in _vis(src) and "__shfl_sync" not in _vis(src)


@pytest.mark.parametrize("body,tile", [
    ("input doc: i32[B, Lk] sorted; mask document(doc) && causal", SHORT_RUN_TILE),
    ("mask causal && window(1023, 0)", SHORT_RUN_TILE),
    ("mask window(64, 64)", SHORT_RUN_TILE),
    # score mods and the plain causal mask keep 128 x 128 x 3 (causal has its own short-loop kernel)
    ("mask causal && window(1023, 0); score softcap(30.0)", TileConfig(128, 128, 8, 3)),
    ("mask causal", TileConfig(128, 128, 8, 3)),
    ("input doc: i32[B, Lk] sorted; mask document(doc) && causal; tile block_m 128 block_n 64 warps 8 stages 3", TileConfig(128, 64, 8, 3)),
])
def test_document_and_window_masks_take_the_short_run_tile_at_d128(body: str, tile: TileConfig) -> None:
    assert variant_tile(_v(body), Arch.SM90A) == tile


def test_the_short_run_tile_is_only_for_d128_on_sm90a() -> None:
    doc = "input doc: i32[B, Lk] sorted; mask document(doc) && causal"
    assert variant_tile(_v(doc, d=64), Arch.SM90A) != SHORT_RUN_TILE
    assert variant_tile(_v(doc), Arch.SM80) != SHORT_RUN_TILE


def _bwd_vis(src: str) -> str:
    start = src.index("unsigned vis_bits = 0u;")
    return src[start:src.index("// S^T = K Q^T", start)]


def test_the_wgmma_backward_reads_hoisted_lookups_at_both_head_dims() -> None:
    from attngen.cuda import render_bwd

    doc = "input doc: i32[B, Lk] sorted; mask document(doc) && causal"
    vis = _bwd_vis(render_bwd.render(_v(doc), Arch.SM90A))
    assert "ag_mask(" not in vis and "__shfl_sync" in vis and len(re.findall(r"ag_ld_doc\(", vis)) == 2
    # head dim 64 takes 128-query steps, whose tests stay inside the products (vis_inline): the
    # lookups are read once the products have landed and shuffled inside the elementwise pass
    src = render_bwd.render(_v(doc, d=64), Arch.SM90A)
    # a query and a key read in each of the two passes, and in each of the two loop-bound searches
    # (ag_q_span, ag_kv_span: the sorted ids' spans)
    assert len(re.findall(r"ag_ld_doc\(p, b, (q|kv)\)", src)) == 2 * 2 + 2 * 2
    step = src[src.index("void ag_wg_step("):]
    assert "ag_mask(" not in step[:step.index("\n}\n")]
    # a lookup over both axes keeps the per-element form
    vis = _bwd_vis(render_bwd.render(_v("input blocks: u8[H, QB, KB]; mask block_sparse(blocks, 128, 128)"), Arch.SM90A))
    assert "ag_mask(" in vis and "__shfl_sync" not in vis


def test_the_split_says_which_positions_the_element_part_reads() -> None:
    # the templates declare q / kv in the element loop only where it reads them (nvcc warns of
    # unused locals)
    pad = split_by_axis(_v("mask padding").mask, {})
    assert pad is not None and not pad.elem_q and not pad.elem_kv
    doc = split_by_axis(_v("input doc: i32[B, Lk] sorted; mask document(doc) && causal").mask, {})
    assert doc is not None and doc.elem_q and doc.elem_kv


@pytest.mark.nvcc
def test_split_masks_compile_without_warnings(tmp_path) -> None:
    import shutil
    import subprocess

    from attngen.cuda import render_bwd

    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not on the PATH")
    # padding reads neither position in its element part; documents both (and a key slot `ki`);
    # the backward at head dim 64 tests inside the products; sm_80 is the mma.sync engines
    renders = []
    for body in ("mask padding", "input doc: i32[B, Lk] sorted; mask document(doc) && causal"):
        for d in (64, 128):
            v = _v(body, d=d)
            renders += [(f"fwd{d}", Arch.SM90A, render_cuda.render(v, Arch.SM90A)), (f"bwd{d}", Arch.SM90A, render_bwd.render(v, Arch.SM90A))]
        v = _v(body, d=64)
        renders += [("fwd80", Arch.SM80, render_cuda.render(v, Arch.SM80)), ("bwd80", Arch.SM80, render_bwd.render(v, Arch.SM80))]
    for i, (name, arch, src) in enumerate(renders):
        assert "emit.split_by_axis" in src, name
        cu = tmp_path / f"{name}_{i}.cu"
        cu.write_text(src)
        gencode = "-gencode=arch=compute_90a,code=sm_90a" if arch == Arch.SM90A else "-gencode=arch=compute_80,code=sm_80"
        r = subprocess.run([nvcc, "-c", gencode, str(cu), "-o", str(tmp_path / f"{name}_{i}.o")],
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr[-3000:]
        # the split's loops declare no unused positions (the backward has older unused constants)
        assert not re.search(r'variable "(q|kv|ki)" was declared but never referenced', r.stderr), (name, r.stderr[-3000:])


def test_explain_says_how_partial_tiles_read_the_mask() -> None:
    from attngen.tools.explain import explain

    doc = "input doc: i32[B, Lk] sorted; mask document(doc) && causal"
    assert "partial tiles: the mask's lookups read once per query row: doc[b, q]; once per key: doc[b, kv]" in explain(_v(doc))
    assert "partial tiles: the mask's lookups read once per query row" in explain(_v(doc, d=64), arch=Arch.SM80)
    assert "up to head dim 64" in explain(_v(doc), arch=Arch.SM80)
    sparse = _v("input blocks: u8[H, QB, KB]; mask block_sparse(blocks, 128, 128)")
    assert "its lookups per element (a lookup reads both q and kv" in explain(sparse)
    assert "partial tiles" not in explain(_v("mask causal"))


def test_explain_says_how_the_backward_reads_the_mask() -> None:
    from attngen.tools.explain import explain

    doc = "input doc: i32[B, Lk] sorted; mask document(doc) && causal"
    text = explain(_v(doc))
    assert "dK/dV partial tiles: the mask's lookups read once per query: doc[b, q]; once per key: doc[b, kv]" in text
    assert "dK/dV partial tiles: the mask's lookups read once per query" in explain(_v(doc, d=64), arch=Arch.SM80)
    assert "dK/dV partial tiles: the mask with its lookups per element (the mma.sync engine" in explain(_v(doc), arch=Arch.SM80)
    fp32 = frontend.loads(f"attention x {{ dtype fp32; head_dim 64; heads 4; {doc} }}").get()
    assert "dK/dV partial tiles: the mask with its lookups per element (the FFMA engine)" in explain(fp32)
    assert "dK/dV partial tiles" not in explain(_v("mask causal"))


_EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.attn"))


@pytest.mark.parametrize("arch", [Arch.SM80, Arch.SM90A], ids=lambda a: a.value)
@pytest.mark.parametrize("path", _EXAMPLES, ids=lambda p: p.stem)
def test_backward_mask_split_is_what_the_backward_renders(path: Path, arch: Arch) -> None:
    """render_bwd.mask_split (what explain reports) holds exactly where the rendered dK/dV step
    combines the mask without short circuits (`(cls == 2) | `, the split's form)."""
    from attngen.cuda import render_bwd
    from attngen.plan import bwd as plan_bwd

    for v in frontend.load(path).variants:
        if plan_bwd.unsupported(v):
            continue
        sp = render_bwd.mask_split(v, plan_bwd.plan(v, arch).engine)
        src = render_bwd.render(v, arch)
        assert (sp is not None) == ("((cls == 2) | " in src), (v.name, arch)
