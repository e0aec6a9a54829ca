"""Length-dependent tiles on sm_90a (GPU only): the short-loop kernel (`schedule.short_tile`) and the
main kernel each against the NumPy reference, the dispatch at its threshold, and the wide-key and
split K/V ring tiles of plain variants at odd shapes (through tile hints, so that short calls do
not divert them to the short kernel)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings

from attngen.check import fuzz
from gpu_helpers import check_case, examples, kernel_for, spec_text, variant_of


def _require_sm90a(v) -> None:
    from attngen.plan.schedule import Arch

    arch = kernel_for(v).plan.arch
    if arch != Arch.SM90A:
        pytest.skip(f"short-loop tiles and split K/V rings are sm_90a (wgmma) choices, this device compiles for {arch.value}")


@pytest.mark.gpu
@pytest.mark.parametrize(
    "text,threshold",
    [
        (spec_text("len_causal_d128", dtype="bf16", D=128, H=4, Hkv=2, mask="causal", lse=True), 4096),
        (spec_text("len_dense_d128", dtype="fp16", D=128, H=2, kind="cross", layout="bshd"), 4096),
        (spec_text("len_causal_d64", dtype="bf16", D=64, H=2, mask="causal"), 1024),
    ],
    ids=lambda x: x.split()[1] if isinstance(x, str) else str(x),
)
def test_calls_go_to_the_short_kernel_up_to_the_threshold(text: str, threshold: int) -> None:
    v = variant_of(text)
    _require_sm90a(v)
    k = kernel_for(v)
    assert k.short is not None and k.short_max_lk == threshold
    assert k.short.tile != k.tile
    cross = "cross" in text
    for Lk, short in ((threshold, True), (threshold + 1, False), (77, True)):
        before = (len(k._bindings), len(k.short._bindings))
        check_case(v, fuzz.Case(B=1, Lq=(33 if cross else Lk), Lk=Lk, dist="normal", seed=Lk))
        after = (len(k._bindings), len(k.short._bindings))
        # A new shape makes a new binding in the kernel that ran it.
        assert after == ((before[0], before[1] + 1) if short else (before[0] + 1, before[1])), (Lk, before, after)


WIDE = [
    # The main tile of unmasked D128 (176 keys, two stages of split rings), as its hint.
    spec_text("wide_dense_d128_176", dtype="bf16", D=128, H=4, Hkv=2, kind="cross",
              extra=("tile block_m 128 block_n 176 warps 8 stages 2",)),
    # The short tile (128 keys, split rings, two Q buffers) with causal and LSE.
    spec_text("split_causal_d128_128", dtype="fp16", D=128, H=2, mask="causal", lse=True, layout="bshd",
              extra=("tile block_m 128 block_n 128 warps 8 stages 2",)),
    # D64 at two stages: split rings with three consumer warpgroups.
    spec_text("split_causal_d64_192", dtype="bf16", D=64, H=4, Hkv=1, mask="causal",
              extra=("tile block_m 192 block_n 128 warps 12 stages 2",)),
]


@pytest.mark.gpu
@pytest.mark.parametrize("text", WIDE, ids=lambda t: t.split()[1])
def test_split_ring_tiles_at_odd_shapes(text: str) -> None:
    v = variant_of(text)
    _require_sm90a(v)
    assert kernel_for(v).short is None  # a hinted tile runs at every length

    @settings(max_examples=examples(1 / 6))
    @given(fuzz.case_strategy(v))
    def run(case: fuzz.Case) -> None:
        check_case(v, case)

    run()
