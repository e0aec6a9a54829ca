"""The decode family's plan, render and compile (CPU; nvcc-marked tests need nvcc, not a GPU)."""

from __future__ import annotations

import pytest
from _codegen_util import ALL_VARIANT_IDS, ALL_VARIANTS, DECODE_ONLY, DECODE_ONLY_IDS, variant

from attngen.cuda import compile as compile_cuda
from attngen.lang import frontend
from attngen.plan import decode as plan_decode
from attngen.plan.decode import DECODE_MAX_LQ, Family, choose_family, decode_unsupported
from attngen.plan.op_plan import KernelRole
from attngen.cuda.render_decode import render_decode
from attngen.plan.schedule import Arch

SPEC = """
attention dec {
  dtype bf16
  head_dim 128
  heads 32 kv 8
  kind cross
  input cache_lens: i32[B]
  mask causal && kv < cache_lens[b]
  score softcap(30.0)
  output lse
}
"""


def _v(text: str = SPEC):
    return frontend.loads(text, "<test>").get()


def _shares(T: int, ctas: int) -> list[tuple[int, int]]:
    return [(c * T // ctas, (c + 1) * T // ctas) for c in range(ctas)]


def _segments(dp, B: int, Lq: int, Lk: int, ctas: int) -> dict[int, list[int]]:
    """Row block -> the CTAs whose shares meet it, from the kernels' share rule."""
    n = max(1, -(-Lk // dp.split.chunk))
    seen: dict[int, list[int]] = {}
    for c, (u0, u1) in enumerate(_shares(dp.split.units(B, Lq, Lk), ctas)):
        for blk in range(u0 // n, (u1 - 1) // n + 1) if u1 > u0 else ():
            seen.setdefault(blk, []).append(c)
    return seen


def _share_of(x: int, T: int, ctas: int) -> int:
    return ((x + 1) * ctas - 1) // T  # the kernels' ag_share_of


def test_schedule_fills_one_cta_an_sm_and_covers_every_unit() -> None:
    dp = plan_decode.plan(_v())
    assert dp.split.ctas_per_sm() == 2  # ~109 KB of ring: two CTAs an H200 SM
    for B, Lq, Lk in [(1, 1, 8192), (1, 1, 131072), (8, 1, 32768), (64, 1, 4096), (128, 1, 1024), (3, 7, 1), (1, 16, 999),
                      (2, 5, 0), (5, 3, 64 * 37 + 1)]:
        splits, ctas = dp.split.schedule(B, Lq, Lk, 132)
        base, T = dp.split.row_blocks(B, Lq), dp.split.units(B, Lq, Lk)
        n = max(1, -(-Lk // dp.split.chunk))
        assert ctas == base * splits and 1 <= splits <= n and dp.split.slots(B, Lq, ctas) == splits
        if splits > 1:
            assert ctas <= 132  # splits never take the grid past one CTA an SM
            assert n // splits >= plan_decode.MIN_CHUNKS_PER_SPLIT
        shares = _shares(T, ctas)
        assert all(u1 - u0 in (T // ctas, -(-T // ctas)) for u0, u1 in shares)  # equal to one unit
        segs = _segments(dp, B, Lq, Lk, ctas)
        assert sorted(segs) == list(range(base))  # every row block met
        for blk, cs in segs.items():
            assert len(cs) == splits  # every partial has a slot, every slot a partial
            first = _share_of(blk * n, T, ctas)
            assert cs == list(range(first, first + len(cs)))  # slots are ranks from the kernels' rule
            assert _share_of((blk + 1) * n - 1, T, ctas) == cs[-1]
    assert dp.split.schedule(1, 1, 131072, 132) == (16, 128)  # the H200 sweeps' best (see SplitSchedule.schedule)
    assert dp.split.schedule(8, 1, 32768, 132) == (2, 128)
    assert dp.split.schedule(64, 1, 4096, 132) == (1, 512)  # row blocks past the SMs: one CTA each, no combine
    assert dp.split.schedule(128, 1, 1024, 132) == (1, 1024)


def test_schedule_overrides_and_slots() -> None:
    dp = plan_decode.plan(_v())
    for B, Lq, Lk in [(8, 1, 32768), (3, 7, 500), (1, 16, 999)]:
        base = dp.split.row_blocks(B, Lq)
        n = max(1, -(-Lk // dp.split.chunk))
        for s in range(1, min(n, 9) + 1):
            ctas = dp.split.split_ctas(B, Lq, Lk, s)
            assert dp.split.slots(B, Lq, ctas) == s
            assert all(len(cs) == s for cs in _segments(dp, B, Lq, Lk, ctas).values())
        for ctas in range(1, min(dp.split.units(B, Lq, Lk), 300) + 1, 7):  # equal shares cutting row blocks anywhere
            slots = dp.split.slots(B, Lq, ctas)
            assert max(len(cs) for cs in _segments(dp, B, Lq, Lk, ctas).values()) <= slots
            assert (slots == 1) == (ctas in (1, base))  # one slot: every row block whole in one CTA


def test_workspace_never_grows_with_lk() -> None:
    dp = plan_decode.plan(_v())
    o, lse = dp.split.workspace_shapes(2, 3, 5)
    assert o == (2, 32, 3, 5, 128) and lse == (2, 32, 3, 5)
    split, combine = dp.launches(2, 3, 5, 77)
    assert split.kernel == dp.kernel_name and combine.kernel == dp.kernel(KernelRole.COMBINE).name
    assert split.grid == (77, 1, 1) and dp.split.m_blocks(3) == 1  # group 4 x Lq 3 = 12 rows
    assert dp.split.m_blocks(16) == 4
    (only,) = dp.launches(2, 3, 1, 16)  # one slot a row: the split kernel writes O, no combine
    assert only.kernel == dp.kernel_name
    (merged,) = dp.launches(2, 3, 5, 77, merged=True)  # row-block counters: the split kernel merges
    assert merged.kernel == dp.kernel_name


def test_family_choice() -> None:
    v = _v()
    assert choose_family(v, 1) == Family.DECODE and choose_family(v, DECODE_MAX_LQ) == Family.DECODE
    assert choose_family(v, DECODE_MAX_LQ + 1) == Family.FORWARD
    assert choose_family(v, 1, Family.FORWARD) == Family.FORWARD
    fp32 = _v(SPEC.replace("bf16", "fp32"))
    assert "fp16/bf16" in decode_unsupported(fp32)
    assert choose_family(fp32, 1) == Family.FORWARD
    with pytest.raises(ValueError, match="head dims 64, 128, 256 with Dv == D"):
        plan_decode.plan(_v(SPEC.replace("head_dim 128", "head_dim 96")))


def test_head_dim_256_fits_where_shared_memory_allows() -> None:
    v = _v(SPEC.replace("head_dim 128", "head_dim 256"))
    assert decode_unsupported(v) is None
    big = plan_decode.plan(v, Arch.SM90A)
    assert (big.split.block_n, big.split.stages, big.split.ctas_per_sm()) == (16, 3, 1) and big.smem_bytes <= Arch.SM90A.smem_budget
    a100 = plan_decode.plan(v, Arch.SM80)
    assert (a100.split.block_n, a100.split.stages) == (16, 2) and a100.smem_bytes <= Arch.SM80.smem_budget
    why = decode_unsupported(v, Arch.SM86)  # 99 KiB a block: not even two 66 KiB ring slots
    assert why is not None and "D=256" in why and "sm_86" in why
    with pytest.raises(ValueError, match="sm_86"):
        plan_decode.plan(v, Arch.SM86)
    d128 = plan_decode.plan(_v(), Arch.SM86)  # two ring slots where three do not fit 99 KiB
    assert d128.split.stages == 2 and d128.smem_bytes <= Arch.SM86.smem_budget
    assert plan_decode.plan(_v(), Arch.SM90A).split.stages == 3
    assert "sm_75" in decode_unsupported(v, Arch.SM75)


def test_render_is_stable_and_uses_the_forward_emitters() -> None:
    v = _v()
    a, dp = render_decode(v)
    b, _ = render_decode(_v())
    assert a == b
    assert "// Generated by attngen" in a.splitlines()[0]
    assert "ag_ld_cache_lens" in a and "ag_tanh_fast" in a  # the shared lookup and softcap code
    assert f"{dp.kernel_name}(" in a and f"{dp.kernel(KernelRole.COMBINE).name}(" in a
    # output lse: the row writer (one-segment rows, merges in either kernel) writes the LSE
    assert "p.lse[((long long)b * H + h) * p.Lq + q] = lse;" in a
    assert "p.lse[" not in render_decode(_v(SPEC.replace("  output lse\n", "")))[0]


def test_mask_reading_h_is_classified_head_by_head() -> None:
    a, _ = render_decode(_v(SPEC.replace("mask causal && kv < cache_lens[b]", "mask h % 2 == 0 || kv < 5")))
    assert "for (int h = h0; h <= h1; ++h)" in a
    b, _ = render_decode(_v())
    assert "for (int h = h0; h <= h1; ++h)" not in b


DECODABLE = [(p, n) for p, n in ALL_VARIANTS if decode_unsupported(variant(p, n)) is None]


@pytest.mark.nvcc
@pytest.mark.parametrize("arch", [Arch.SM80, Arch.SM90A], ids=lambda a: a.value)
@pytest.mark.parametrize("text", [
    SPEC, SPEC.replace("head_dim 128", "head_dim 64").replace("bf16", "fp16"), SPEC.replace("head_dim 128", "head_dim 256"),
    SPEC.replace("head_dim 128", "head_dim 256").replace("bf16", "fp16").replace(
        "  output lse", "  input sinks: fp32[H]\n  sink sinks\n  nan_check\n  kv_cache paged(8)\n  output lse"),
], ids=["d128", "d64", "d256", "d256_paged_sink"])
def test_decode_compiles_without_spills_or_warnings(text: str, arch: Arch) -> None:
    src, dp = render_decode(_v(text), arch)
    res = {r.kernel: r for r in compile_cuda.resources(src, arch)}
    assert set(res) == {k.name for k in dp.kernels}
    for r in res.values():
        assert r.spill_stores == 0 and r.spill_loads == 0 and r.stack_bytes == 0, r
    # two CTAs an SM on the H200 need <= 256 registers a thread at 128 threads
    assert res[dp.kernel_name].registers <= 255
    _, log = compile_cuda.nvcc(src, arch, emit="obj")  # device code and the host launcher
    assert "warning" not in log.lower()


@pytest.mark.parametrize("path,name", DECODABLE, ids=[i for (p, n), i in zip(ALL_VARIANTS, ALL_VARIANT_IDS) if (p, n) in DECODABLE])
def test_every_decodable_example_renders_stably(path, name) -> None:
    v = variant(path, name)
    src, dp = render_decode(v)
    assert dp.kernel_name in src and render_decode(v)[0] == src
    again = frontend.loads(path.read_text(encoding="utf-8"), "elsewhere/copy.attn").get(name)
    assert render_decode(again)[0] == src  # no path, no timestamp
    assert str(path.parent) not in src and "/work/" not in src and "/tmp/" not in src


def test_paged_example_exists_and_is_decode_only() -> None:
    assert any("paged" in p.stem for p, _ in DECODE_ONLY)


@pytest.mark.nvcc
@pytest.mark.parametrize("path,name", DECODE_ONLY, ids=DECODE_ONLY_IDS)
@pytest.mark.parametrize("arch", [Arch.SM80, Arch.SM90A], ids=lambda a: a.value)
def test_decode_only_examples_compile_without_spills(path, name, arch: Arch) -> None:
    src, dp = render_decode(variant(path, name), arch)
    res = compile_cuda.resources(src, arch)
    assert {r.kernel for r in res} == {k.name for k in dp.kernels}
    for r in res:
        assert r.spill_stores == 0 and r.spill_loads == 0 and r.stack_bytes == 0, r


PAGED = SPEC.replace("  output lse", "  kv_cache paged(16)\n  output lse")


def test_paged_fields_and_routing() -> None:
    from attngen.cuda import render as render_cuda
    from attngen.cuda.render_decode import decode_fields

    v = _v(PAGED)
    names = [f.name for f in decode_fields(v)]
    assert "num_pages" in names and "in_block_table" in names
    assert choose_family(v, 100) == Family.DECODE  # chunked prefill against the cache too
    assert plan_decode.forward_unsupported(v) is not None
    with pytest.raises(ValueError, match="decode family"):
        render_cuda.plan(v)


@pytest.mark.nvcc
@pytest.mark.parametrize("page", [8, 16, 64, 256])
def test_paged_decode_compiles_without_spills(page: int) -> None:
    src, dp = render_decode(_v(PAGED.replace("paged(16)", f"paged({page})")), Arch.SM90A)
    assert "ag_ld_block_table" in src
    for r in compile_cuda.resources(src, Arch.SM90A):
        assert r.spill_stores == 0 and r.spill_loads == 0 and r.stack_bytes == 0, r
