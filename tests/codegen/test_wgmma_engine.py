"""The Hopper wgmma engine: which variants and tiles get it, what its plan promises (threads,
shared memory, registers), and that ptxas neither serialises its wgmma chains nor ignores its
setmaxnreg (marker `nvcc` for the latter: skipped where nvcc is absent)."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from attngen.cuda import compile as compile_cuda, render as render_cuda
from attngen.lang.diagnostics import SpecError
from attngen.lang.frontend import loads
from attngen.plan import validate
from attngen.tools.explain import explain
from attngen.ir.nodes import DType, TileConfig
from attngen.plan.schedule import (
    Arch,
    Engine,
    short_tile,
    smem_bytes,
    validate_tile,
    wgmma_max_block_n,
    wgmma_q_buffers,
    wgmma_regs,
    wgmma_residual_smem,
    wgmma_softmax,
    WgmmaLoads,
    WgmmaSoftmax,
)


def _v(body: str, name: str = "t"):
    return loads(f"attention {name} {{ {body} }}").variants[0]


@pytest.mark.parametrize(
    "body,arch,want",
    [
        ("dtype bf16; head_dim 128; heads 16", Arch.SM90A, Engine.WGMMA),
        ("dtype fp16; head_dim 64; heads 8 kv 2; mask causal", Arch.SM90A, Engine.WGMMA),
        ("dtype bf16; head_dim 128; heads 16", Arch.SM80, Engine.MMA_SYNC),
        ("dtype bf16; head_dim 96; heads 16", Arch.SM90A, Engine.MMA_SYNC),  # not whole 128-byte rows
        ("dtype fp32; head_dim 64; heads 8", Arch.SM90A, Engine.FFMA),
        # An explicit 4-warp tile stays on mma.sync; a single stage cannot feed the pipeline.
        ("dtype bf16; head_dim 128; heads 16; tile block_m 128 block_n 64 warps 4 stages 2", Arch.SM90A, Engine.MMA_SYNC),
        ("dtype bf16; head_dim 128; heads 16; tile block_m 128 block_n 64 warps 8 stages 1", Arch.SM90A, Engine.MMA_SYNC),
        ("dtype bf16; head_dim 128; heads 16; tile block_m 128 block_n 64 warps 8 stages 2", Arch.SM90A, Engine.WGMMA),
    ],
)
def test_engine_choice(body: str, arch: Arch, want: Engine) -> None:
    v = _v(body)
    assert render_cuda.plan(v, arch).engine == want


def test_auto_tiles_on_hopper() -> None:
    kp = render_cuda.plan(_v("dtype bf16; head_dim 128; heads 16; mask causal"), Arch.SM90A)
    assert (kp.tile.block_m, kp.tile.block_n, kp.tile.warps, kp.tile.stages) == (128, 128, 8, 3)
    assert kp.threads == 384  # the producer warpgroup on top of 8 consumer warps
    # Masked D64 without lookups: three consumer warpgroups; with a score mod (registers): two.
    kp = render_cuda.plan(_v("dtype bf16; head_dim 64; heads 16; mask causal"), Arch.SM90A)
    assert (kp.tile.block_m, kp.tile.warps, kp.threads) == (192, 12, 512)
    kp = render_cuda.plan(_v("dtype bf16; head_dim 64; heads 16; mask causal; score softcap(30.0)"), Arch.SM90A)
    assert (kp.tile.block_m, kp.tile.warps) == (128, 8)
    # Pre-LN blocks: three consumer warpgroups on sm_90a (measured), the mma.sync 64 x 32 tile elsewhere.
    preln = _v("dtype bf16; head_dim 64; heads 16; kind cross; layout bshd; "
               "norm q layernorm(1e-5) scope token affine true; residual")
    kp = render_cuda.plan(preln, Arch.SM90A)
    assert (kp.engine, kp.tile.block_m, kp.tile.warps) == (Engine.WGMMA, 192, 12)
    kp = render_cuda.plan(preln, Arch.SM80)
    assert (kp.engine, kp.tile.block_m, kp.tile.block_n) == (Engine.MMA_SYNC, 64, 32)


def test_register_split_fits_the_sm() -> None:
    # setmaxnreg moves registers within what the CTA was launched with: the __launch_bounds__ cap
    # (64K / threads, rounded down to 8) times the threads.
    for warps, bm in ((8, 128), (12, 192)):
        threads = 32 * (warps + 4)
        launched = 65536 // threads // 8 * 8 * threads
        for lookups in (False, True):
            for scores in (False, True):
                prod, cons = wgmma_regs(TileConfig(bm, 128, warps, 3), lookups, scores)
                assert prod % 8 == 0 and cons % 8 == 0 and 24 <= prod and cons <= 256
                assert 128 * prod + 32 * warps * cons <= launched


def test_shared_memory_of_the_ring_and_barriers() -> None:
    t = TileConfig(128, 128, 8, 3)
    # One Q buffer 128x128 (two do not fit) + 3 x (K + V) 128x128 bf16, then full/empty mbarriers of
    # the Q buffer and of each slot, the work-tile indices, and a header a slot.
    assert wgmma_q_buffers(DType.BF16, 128, 128, t, Arch.SM90A) == 1
    assert smem_bytes(DType.BF16, 128, 128, t, Arch.SM90A) == 2 * (128 * 128 + 3 * 128 * 256) + 8 * 8 + 16 + 4 * 3
    # Head dim 64: two Q buffers fit. No fp32 staging of O (the epilogue writes from registers).
    # Two stages: K and V have rings of their own, so two full/empty pairs a stage.
    t = TileConfig(128, 16, 8, 2)
    assert wgmma_q_buffers(DType.BF16, 64, 64, t, Arch.SM90A) == 2
    assert smem_bytes(DType.BF16, 64, 64, t, Arch.SM90A) == 2 * (2 * 128 * 64 + 2 * 16 * 128) + 8 * (4 + 8) + 16 + 4 * 2


def test_token_norm_side_data_and_residual_copy_in_shared_memory() -> None:
    # Pre-LN at D64, 192 x 128 x 12 warps x 3: two Q buffers, each with 192 (mean, rstd) pairs and
    # 2 x 64 fp32 weights beside it, and the raw x rows (192 x (128 + 16) bytes) for the residual.
    t = TileConfig(192, 128, 12, 3)
    plain = smem_bytes(DType.BF16, 64, 64, t, Arch.SM90A)
    assert plain == 2 * (2 * 192 * 64 + 3 * 128 * 128) + 8 * 10 + 16 + 4 * 3
    assert smem_bytes(DType.BF16, 64, 64, t, Arch.SM90A, token_norm=True) == plain + 2 * (192 * 8 + 2 * 64 * 4)
    assert wgmma_residual_smem(DType.BF16, 64, 64, t, Arch.SM90A, token_norm=True, residual=True)
    assert smem_bytes(DType.BF16, 64, 64, t, Arch.SM90A, token_norm=True, residual=True) == plain + 2 * (192 * 8 + 2 * 64 * 4) + 192 * 144
    # No copy without the token norm (the Q buffer is not overwritten), nor where it does not fit.
    assert not wgmma_residual_smem(DType.BF16, 64, 64, t, Arch.SM90A, token_norm=False, residual=True)
    t128 = TileConfig(128, 128, 8, 3)
    assert not wgmma_residual_smem(DType.BF16, 128, 128, t128, Arch.SM90A, token_norm=True, residual=True)
    assert smem_bytes(DType.BF16, 128, 128, t128, Arch.SM90A, token_norm=True, residual=True) <= Arch.SM90A.smem_budget


def test_token_norm_kernel_reads_no_global_memory_in_its_consumers() -> None:
    pre_ln = "dtype bf16; head_dim 64; heads 16; kind cross; layout bshd; norm q layernorm(1e-5) scope token; residual"
    src, kp = render_cuda.render_with_plan(_v(pre_ln), Arch.SM90A)
    assert kp.engine == Engine.WGMMA and f"static_assert(HDR_OFF + 4 * STAGES == {kp.smem_bytes}" in src
    consumer = src[src.index("void ag_consumer("):src.index("void attention_tile(")]
    epilogue = src[src.index("void ag_wg_epilogue("):src.index("ag_lane0_read(")]
    assert "ag_load_qside(" in src and "ws_qstats" not in consumer and "in_q_norm_weight" not in consumer
    assert "RES_OFF" in consumer and "RES_OFF" in epilogue and "p.q +" not in epilogue
    # The same residual without the token norm reads x in the epilogue; no side data at all.
    src2, _ = render_cuda.render_with_plan(_v("dtype bf16; head_dim 64; heads 16; residual"), Arch.SM90A)
    assert "QSIDE_OFF" not in src2 and "RES_OFF" not in src2 and "p.q + (long long)b" in src2


def test_tile_errors_name_the_limits() -> None:
    errs = validate_tile(DType.BF16, 128, 128, TileConfig(192, 64, 12, 3), Arch.SM90A)
    assert any("12 with block_m 192" in e for e in errs)
    big = wgmma_max_block_n(128, TileConfig(128, 128, 8, 3))
    errs = validate_tile(DType.BF16, 128, 128, TileConfig(128, big + 16, 8, 2), Arch.SM90A)
    assert any(f"block_n is at most {big}" in e for e in errs)
    with pytest.raises(SpecError) as ei:
        validate.loads("attention t { dtype bf16; head_dim 128; heads 4; tile block_m 128 block_n 128 warps 8 stages 4 }")
    assert "shared memory" in str(ei.value)


def test_rendered_source_is_stable_and_names_the_engine() -> None:
    v = _v("dtype bf16; head_dim 128; heads 16; mask causal; output lse")
    a = render_cuda.render(v, Arch.SM90A)
    assert a == render_cuda.render(v, Arch.SM90A)
    assert "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16" in a
    assert "setmaxnreg.inc.sync.aligned.u32" in a
    assert "Hopper wgmma" in a.split("namespace")[0]  # the header comment says which engine
    assert "wgmma" not in render_cuda.render(v, Arch.SM80)


WGMMA_SPECS = [
    "dtype bf16; head_dim 128; heads 16; mask causal; output lse",
    "dtype fp16; head_dim 64; heads 16 kv 4; mask causal",
    "dtype bf16; head_dim 64; heads 8; tile block_m 128 block_n 192 warps 8 stages 2",
    "dtype bf16; head_dim 128; heads 8; mask causal; score softcap(30.0)",
    "dtype bf16; head_dim 64; heads 8; kind cross; layout bshd; norm q layernorm(1e-5) scope token; residual; "
    "tile block_m 128 block_n 128 warps 8 stages 3",
]


@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
@pytest.mark.parametrize("body", WGMMA_SPECS)
def test_ptxas_keeps_wgmma_async_and_honours_setmaxnreg(body: str) -> None:
    v = _v(body)
    src, kp = render_cuda.render_with_plan(v, Arch.SM90A)
    assert kp.engine == Engine.WGMMA
    _, log = compile_cuda.nvcc(src, Arch.SM90A, "cubin", extra=("-Xptxas", "-v"))
    # C7515/C7510: wgmma serialised (an accumulator touched mid-pipeline); C7517: a wait injected
    # (a product's registers read while it may be in flight); C7508: setmaxnreg ignored.
    for code in ("C7515", "C7510", "C7508", "C7509", "C7517"):
        assert code not in log, log


@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
def test_a_plain_sm90_build_stops_at_a_clear_error(tmp_path) -> None:
    src = render_cuda.render(_v("dtype bf16; head_dim 64; heads 4"), Arch.SM90A)
    assert "-gencode=arch=compute_90a,code=sm_90a" in src.split("#include")[0]  # the header says how to build
    cu = tmp_path / "k.cu"
    cu.write_text(src)
    r = subprocess.run(["nvcc", "-gencode=arch=compute_90,code=sm_90", "-c", str(cu), "-o", str(tmp_path / "k.o")],
                       capture_output=True, text=True)
    assert r.returncode != 0 and "build it with nvcc -gencode=arch=compute_90a,code=sm_90a" in r.stderr


def test_explain_names_the_engine_and_the_threads() -> None:
    from attngen.tools.explain import explain

    v = _v("dtype bf16; head_dim 64; heads 4; mask causal")
    text = explain(v, arch=Arch.SM90A)
    assert "engine: Hopper wgmma tensor cores, one producer warp (TMA + mbarriers) and 3 consumer warpgroups" in text
    assert "warps 12 (512 threads, with the producer warpgroup)" in text
    assert "engine: mma.sync tensor cores" in explain(v, arch=Arch.SM80)


def test_persistent_grid_and_the_work_counter_in_the_abi() -> None:
    """The wgmma kernel is persistent: at most one CTA an SM (any grid is correct), and its ABI
    carries the work-tile counter, which the C launcher refuses to run without."""
    v = _v("dtype bf16; head_dim 128; heads 16; mask causal")
    kp = render_cuda.plan(v, Arch.SM90A)
    assert kp.grid(16, 2, 16384, 132) == (132, 1, 1)  # 128 query tiles x 16 heads x 2 >> 132 SMs
    assert kp.grid(16, 1, 100, 132) == (16, 1, 1)  # fewer work tiles than SMs: one CTA each
    assert "work_counter" in [f.name for f in kp.fields]
    src = render_cuda.render(v, Arch.SM90A)
    assert "if (p.work_counter == nullptr) return cudaErrorInvalidValue;" in src
    assert "cudaDevAttrMultiProcessorCount" in src
    assert "any grid is correct" in src.split("#include")[0]
    # The other engines launch one CTA a work tile and have no counter.
    for arch, body in ((Arch.SM80, "dtype bf16; head_dim 128; heads 16"), (Arch.SM90A, "dtype fp32; head_dim 64; heads 16")):
        kp = render_cuda.plan(_v(body), arch)
        assert kp.engine != Engine.WGMMA
        assert kp.grid(16, 2, 1000, 132) == (-(-1000 // kp.tile.block_m), 16, 2)
        assert "work_counter" not in [f.name for f in kp.fields]


def test_explain_describes_the_persistent_schedule() -> None:
    from attngen.tools.explain import explain

    text = explain(_v("dtype bf16; head_dim 64; heads 16; kind cross; layout bshd; norm q layernorm(1e-5) scope token; "
                      "residual"), arch=Arch.SM90A)
    assert "two 192 x 64 Q buffers" in text
    assert "over persistent CTAs, at most one an SM" in text
    assert "a 128 x 128 Q tile" in explain(_v("dtype bf16; head_dim 128; heads 16"), arch=Arch.SM90A)


@pytest.mark.parametrize(
    "body,want",
    [
        # Plain D128, unmasked or causal (LSE allowed): 128 x 128 x 2 on split rings up to Lk 4096.
        ("dtype bf16; head_dim 128; heads 16", (TileConfig(128, 128, 8, 2), 4096)),
        ("dtype fp16; head_dim 128; heads 32 kv 8; mask causal; output lse", (TileConfig(128, 128, 8, 2), 4096)),
        # Causal D64: two consumer warpgroups instead of three up to Lk 1024.
        ("dtype bf16; head_dim 64; heads 16; mask causal", (TileConfig(128, 128, 8, 3), 1024)),
        # No second kernel: unmasked D64, other masks, score mods, a tile hint, varlen, fp32.
        ("dtype bf16; head_dim 64; heads 16", None),
        ("dtype bf16; head_dim 128; heads 16; mask causal && window(256, 0)", None),
        ("dtype bf16; head_dim 128; heads 16; mask causal; score softcap(30.0)", None),
        ("dtype bf16; head_dim 128; heads 16; tile block_m 128 block_n 128 warps 8 stages 3", None),
        ("dtype bf16; head_dim 128; heads 4; layout varlen; mask causal", None),
        ("dtype fp32; head_dim 128; heads 16", None),
    ],
)
def test_short_loop_tiles(body: str, want) -> None:
    v = _v(body)
    st = short_tile(v, Arch.SM90A)
    assert (None if st is None else (st.tile, st.max_lk)) == want
    assert short_tile(v, Arch.SM80) is None  # a wgmma choice
    assert (render_cuda.plan(v, Arch.SM90A).short is None) == (st is None)
    if st is not None:
        # The short tile is valid and differs from the main one; explain names both.
        assert not validate_tile(v.dtype, v.head_dim, v.value_head_dim, st.tile, Arch.SM90A)
        kp = render_cuda.plan(v, Arch.SM90A)
        assert st.tile != kp.tile
        # The plan holds the short-loop kernel, chosen once: the same op and ABI at the short tile.
        assert kp.short is not None and kp.short.tile == st.tile and kp.short_max_lk == st.max_lk
        assert kp.short.fields == kp.fields and kp.short.short is None
        text = explain(v, arch=Arch.SM90A)
        assert f"short key loops (Lk <= {st.max_lk}): a second kernel at block_m {st.tile.block_m}, block_n {st.tile.block_n}" in text


def test_main_tiles_of_plain_d128() -> None:
    # Unmasked D128 takes 176-key tiles on split rings; the LSE (8 bytes of spills there) keeps 128 x 128 x 3.
    kp = render_cuda.plan(_v("dtype bf16; head_dim 128; heads 16"), Arch.SM90A)
    assert (kp.tile, kp.smem.kv_split) == (TileConfig(128, 176, 8, 2), True)
    kp = render_cuda.plan(_v("dtype bf16; head_dim 128; heads 16; output lse"), Arch.SM90A)
    assert (kp.tile, kp.smem.kv_split) == (TileConfig(128, 128, 8, 3), False)


def test_softmax_schedule_is_plain() -> None:
    """The plan renders the plain softmax everywhere (docs/DECISIONS.md#wgmma-softmax-schedules);
    only the producer's copies can be overridden."""
    for d in (64, 128):
        assert wgmma_softmax(d, d, TileConfig(128, 128, 8, 3)) == WgmmaSoftmax()
    causal = _v("dtype bf16; head_dim 64; heads 16; mask causal")
    plain, kp0 = render_cuda.render_with_plan(causal, Arch.SM90A)
    assert kp0.attention.softmax == WgmmaSoftmax()
    for part in ("ag_ex2_poly", "EXP2_POLY_GROUPS", "ag_turn_", "TURN_BAR", "Softmax:", "LAST_TILE", "K_STAGES"):
        assert part not in plain
    assert render_cuda.plan(causal, Arch.SM80).attention.softmax is None  # mma.sync: no such schedule


def test_dense_head_dim_64_takes_three_consumer_warpgroups() -> None:
    """Dense D64 runs on 192 x 128 tiles like masked D64 (H200: 521 against 399-414 TFLOP/s for
    128 x 128 at L16k); score mods and runtime inputs still take two warpgroups (registers)."""
    kp = render_cuda.plan(_v("dtype bf16; head_dim 64; heads 16"), Arch.SM90A)
    assert (kp.engine, kp.tile.block_m, kp.tile.block_n, kp.tile.warps, kp.threads) == (Engine.WGMMA, 192, 128, 12, 512)
    kp = render_cuda.plan(_v("dtype bf16; head_dim 64; heads 16; score softcap(30.0)"), Arch.SM90A)
    assert (kp.tile.block_m, kp.tile.warps) == (128, 8)
    kp = render_cuda.plan(_v("dtype bf16; head_dim 128; heads 16"), Arch.SM90A)
    assert (kp.tile.block_m, kp.tile.warps) == (128, 8)


@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
@pytest.mark.parametrize("body,sm", [
    # the cp.async producer (TMA is the default where it applies): split rings and one shared
    # slot, three and two consumer warpgroups, GQA, a tensor-reading mask, the LSE and a sink
    *[(b, WgmmaSoftmax(loads=WgmmaLoads.CP_ASYNC)) for b in (
        "dtype bf16; head_dim 64; heads 16; mask causal",
        "dtype bf16; head_dim 128; heads 16",
        "dtype bf16; head_dim 128; heads 16; mask causal; tile block_m 128 block_n 128 warps 8 stages 2",
        "dtype bf16; head_dim 128; heads 16\n input doc: i32[B, Lk] sorted\n mask document(doc) && causal",
        "dtype fp16; head_dim 128; heads 32 kv 8; mask causal; output lse\n input sinks: fp32[H]\n sink sinks")],
], ids=str)
def test_cp_async_producers_compile_without_spills_or_serialised_wgmma(body: str, sm: WgmmaSoftmax) -> None:
    """The cp.async producer (the override of the TMA default) on three and two consumer
    warpgroups: no spills, wgmma kept asynchronous (no serialisation, no injected waits),
    setmaxnreg honoured."""
    src, kp = render_cuda.render_with_plan(_v(body), Arch.SM90A, softmax=sm)
    _, log = compile_cuda.nvcc(src, Arch.SM90A, "cubin", extra=("-Xptxas", "-v"))
    for code in ("C7515", "C7510", "C7508", "C7509", "C7517"):
        assert code not in log, log
    r = [x for x in compile_cuda._RES.finditer(log) if x.group("name").endswith(kp.kernel_name) or kp.kernel_name in x.group("name")]
    assert r, log
    assert all(int(x.group("st")) == int(x.group("ld")) == int(x.group("stack")) == 0 for x in r), log


@pytest.mark.parametrize("body,tma", [
    ("dtype bf16; head_dim 128; heads 16", True),
    ("dtype fp16; head_dim 64; heads 16; mask causal; layout bshd", True),
    ("dtype bf16; head_dim 128; heads 32 kv 8; mask causal; output lse", True),
    # the descriptors view [B, heads, L, D] tensors: packed sequences, the prep kernels' normalised
    # copies, the residual copy and the wide rows' producer keep cp.async
    ("dtype bf16; head_dim 128; heads 16; layout varlen", False),
    ("dtype bf16; head_dim 128; heads 16\n norm k rmsnorm(1e-6)", False),
    ("dtype bf16; head_dim 64; heads 16; kind cross; layout bshd\n norm q layernorm(1e-5) scope token\n residual", False),
    ("dtype bf16; head_dim 256; heads 8", False),
    # score expressions that read tensors: ptxas spills their TMA kernels (wgmma_tma_ok)
    ("dtype bf16; head_dim 64; heads 8; mask causal\n input pb: fp32[H, Lq, Lk]\n score bias(pb)", False),
    ("dtype bf16; head_dim 128; heads 8; mask causal; score softcap(30.0)", True),
    ("dtype fp32; head_dim 64; heads 8", False),  # FFMA: no wgmma producer at all
], ids=str)
def test_tma_loads_where_the_plan_allows_them(body: str, tma: bool) -> None:
    """`WgmmaLoads.TMA` (the default) is kept only where the descriptors can describe every copy;
    the source then issues cp.async.bulk.tensor from one thread, takes three descriptors after its
    ABI fields, says so in its header, and its C++ launcher encodes them; elsewhere the source is
    the cp.async producer's."""
    v = _v(body)
    src, kp = render_cuda.render_with_plan(v, Arch.SM90A)
    assert kp.attention.tma == tma
    cp_src = render_cuda.render_with_plan(v, Arch.SM90A, softmax=WgmmaSoftmax(loads=WgmmaLoads.CP_ASYNC))[0]
    assert "cp.async.bulk.tensor" not in cp_src
    if not tma:
        assert src == cp_src
        assert "cp.async.bulk.tensor" not in src
        return
    assert "one producer warp (TMA + mbarriers)" in src
    assert [m.name for m in render_cuda.tma_maps(kp)] == ["tm_q", "tm_k", "tm_v"]
    assert "cp.async.bulk.tensor.4d" in src and "__grid_constant__" in src and "cuTensorMapEncodeTiled" in src
    assert "the TMA descriptors of its copies" in src
    producer = src[src.index("void ag_producer("):src.index("ag_cp_async_wait_all();\n}")]
    assert "ag_load_sw128<" not in producer and "ag_cp_async_arrive(" not in producer
    assert "one producer warpgroup (cp.async + mbarriers)" in cp_src


def test_tma_descriptors_only_where_the_parameter_space_has_room() -> None:
    # The three 128-byte descriptors follow the ABI fields (64-byte aligned); a variant whose
    # fields leave less room keeps the cp.async producer rather than overflow the 32,764 bytes.
    from attngen.cuda.render import Field
    from attngen.plan.forward import _tma_param_room
    from attngen.plan.limits import MAX_PARAM_BYTES

    def fields(n: int) -> tuple:
        return tuple(Field("long long", f"f{i}", "") for i in range(n))

    room = (MAX_PARAM_BYTES - 3 * 128) // 64 * 64 // 8  # long longs that still leave room
    assert _tma_param_room(fields(room)) and not _tma_param_room(fields(room + 1))
    assert _tma_param_room(render_cuda.plan(_v("dtype bf16; head_dim 128; heads 16"), Arch.SM90A).fields)
