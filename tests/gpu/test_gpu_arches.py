"""Targets other than the device's own, run on a Hopper GPU (9.0):

- sm_90: the mma.sync path built for plain sm_90 (what `--arch sm_90` gives).
- sm_75: Turing's source (synchronous tile loads instead of cp.async, fp16 as two m16n8k8 MMAs,
  the 64 KiB tile choice) built for sm_90, the closest thing to a Turing GPU a Hopper can run:
  the same code, only the cubin's target differs.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings

from attngen.plan import validate
from attngen.check import fuzz
from attngen.plan.schedule import Arch
from gpu_helpers import examples

EX = Path(__file__).resolve().parents[2] / "examples"

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module", autouse=True)
def _hopper():
    import cupy

    cc = int(cupy.cuda.Device().compute_capability)
    if cc != 90:
        pytest.skip(f"these checks build sm_90 code: the device is {cc // 10}.{cc % 10}, not 9.0")


def _check(kernel, v, n: int) -> None:
    @settings(max_examples=n, deadline=None)
    @given(fuzz.case_strategy(v, max_len=512))
    def run(case: fuzz.Case) -> None:
        arrays = fuzz.case_inputs(v, case)
        out, lse = fuzz.run_kernel(kernel, v, arrays)
        bad = [r.summary() for r in fuzz.compare(v, arrays, out, lse) if not r.ok]
        assert not bad, f"{v.name} at {case.describe()}:\n" + "\n".join(bad)

    run()


def test_device_arch_of_hopper_is_sm90a():
    from attngen.runtime import kernel as runtime

    assert runtime.device_arch() == Arch.SM90A


# t5_relative_bias and mqa_decode_cross: head dim 64 under padding masks, whose lookups the mma.sync
# engine reads once per row and key (render.mask_split).
@pytest.mark.parametrize("name", ["gpt2_causal_fp16", "llama3_gqa_causal", "seed_padded_fp32", "t5_relative_bias", "mqa_decode_cross"])
def test_sm90_target_runs_on_hopper(name):
    from attngen.runtime import kernel as runtime

    v = validate.load(EX / f"{name}.attn", arch=Arch.SM90).get()
    k = runtime.compile(v, arch="sm_90")
    assert k.plan.arch == Arch.SM90 and k.plan.engine.value in ("mma.sync", "ffma")
    _check(k, v, examples(1 / 10, minimum=4))


@pytest.mark.parametrize("name", ["gpt2_causal_fp16", "dilated_causal", "seed_padded_fp32", "alphafold_pair_bias"])
def test_turing_source_built_for_hopper_matches_reference(name, monkeypatch):
    from attngen.cuda import compile as compile_cuda
    from attngen.runtime import kernel as runtime

    built = []

    def compile_for_hopper(source, arch, **kw):
        built.append((arch, source))
        return compile_cuda.compile_source(source, Arch.SM90 if arch == Arch.SM75 else arch, **kw)

    monkeypatch.setattr(runtime, "compile_source", compile_for_hopper)
    v = validate.load(EX / f"{name}.attn", arch=Arch.SM75).get()
    try:
        k = runtime.compile(v, arch=Arch.SM75)
        assert built and built[0][0] == Arch.SM75, "runtime.compile no longer compiles through runtime.compile_source"
        src = built[0][1]
        assert 'asm volatile("cp.async' not in src
        if v.dtype.value == "fp16":
            assert "mma.sync.aligned.m16n8k8" in src and "mma.sync.aligned.m16n8k16" not in src
        _check(k, v, examples(1 / 10, minimum=4))
    finally:
        runtime._KERNELS.pop((v, Arch.SM75, __import__("cupy").cuda.Device().id), None)


@pytest.mark.parametrize("tile", ["128 64 4", "64 32 4"], ids=["two_row_tiles_a_warp", "one_row_tile_a_warp"])
def test_sm90_target_split_document_mask(tile):
    # The mma.sync forward with a document mask split by axis, on both of its visibility paths.
    from attngen.cuda import render
    from attngen.lang import frontend
    from attngen.runtime import kernel as runtime

    bm, bn, w = tile.split()
    v = frontend.loads(f"attention mma_doc_{bm}x{bn} {{ dtype bf16; head_dim 64; heads 4 kv 2; input doc: i32[B, Lk] sorted; "
                       f"mask document(doc) && causal; output lse; tile block_m {bm} block_n {bn} warps {w} stages 2 }}").get()
    k = runtime.compile(v, arch="sm_90")
    assert k.plan.engine.value == "mma.sync" and render.mask_split(v, k.plan.engine) is not None
    assert "emit.split_by_axis" in k.source
    _check(k, v, examples(1 / 10, minimum=4))
