"""The kernel against the NumPy reference over hypothesis-drawn shapes and inputs (GPU only).

Synthetic specs are built as .attn text: a grid of every dtype × every supported head_dim (with
GQA ratios 1/2/4/8, both layouts, self and cross, causal, LSE), and feature specs for the masks and
scores the backend must fuse first (none, causal, window, padding with lengths 0..L, softcap) in
combination. Shapes come from `attngen.check.fuzz.case_strategy`: B 1–4, Lq/Lk from 1 to ~2000 with
tile-boundary values favoured, normal/large/uniform inputs, padding lengths including 0 and full.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings

from attngen.check import fuzz
from gpu_helpers import COMPILES, check_case, examples, kernel_for, spec_text, variant_of

DTYPES = ("fp32", "fp16", "bf16")
HEAD_DIMS = (32, 64, 96, 128)
RATIOS = (1, 2, 4, 8)


def _grid() -> list[str]:
    out = []
    for i, (dt, D) in enumerate(itertools.product(DTYPES, HEAD_DIMS)):
        ratio = RATIOS[i % 4]
        hkv = 1 if ratio == 8 else 2
        layout = ("bhsd", "bshd")[(i // 2) % 2]
        kind = ("self", "cross")[(i // 4) % 2] if i % 3 else "self"
        out.append(spec_text(f"grid_{dt}_d{D}", dtype=dt, D=D, H=ratio * hkv, Hkv=hkv, kind=kind, layout=layout,
                             mask="causal", lse=True))
    return out


FEATURES = [
    spec_text("f_none_fp16", dtype="fp16", D=64, H=4, lse=True),
    spec_text("f_window_bf16", dtype="bf16", D=128, H=8, Hkv=2, layout="bshd", mask="window(100, 0)"),
    spec_text("f_window_causal_fp32", dtype="fp32", D=64, H=4, Hkv=1, mask="window(32, 32) && causal", lse=True),
    spec_text("f_padding_cross_fp16", dtype="fp16", D=96, H=4, kind="cross", layout="bshd", mask="padding", lse=True),
    spec_text("f_seed_padding_fp32", dtype="fp32", D=64, H=8, mask="padding", lse=True),
    spec_text("f_softcap_cross_bf16", dtype="bf16", D=32, H=8, Hkv=1, kind="cross", scores=("softcap(30.0)",), lse=True),
    spec_text("f_causal_softcap_fp32", dtype="fp32", D=96, H=4, Hkv=2, layout="bshd", mask="causal",
              scores=("softcap(20.0)",), lse=True),
    spec_text("f_padding_causal_cross_bf16", dtype="bf16", D=64, H=2, Hkv=1, kind="cross", mask="padding && causal",
              lse=True),
    spec_text("f_none_cross_fp32", dtype="fp32", D=128, H=2, kind="cross", layout="bshd", lse=True),
    spec_text("f_window_padding_fp16", dtype="fp16", D=32, H=4, Hkv=2, mask="window(64, 16) && padding", lse=True),
    spec_text("f_causal_softcap_bf16_gqa8", dtype="bf16", D=128, H=8, Hkv=1, layout="bshd", mask="causal",
              scores=("softcap(50.0)",)),
]


def _id(text: str) -> str:
    return text.split()[1]


@pytest.mark.gpu
@pytest.mark.parametrize("text", _grid(), ids=_id)
def test_dtype_head_dim_grid(text: str) -> None:
    v = variant_of(text)

    @settings(max_examples=examples(1 / 12))
    @given(fuzz.case_strategy(v))
    def run(case: fuzz.Case) -> None:
        check_case(v, case)

    run()


@pytest.mark.gpu
@pytest.mark.parametrize("text", FEATURES, ids=_id)
def test_masks_and_scores(text: str) -> None:
    v = variant_of(text)

    @settings(max_examples=examples(1 / 10))
    @given(fuzz.case_strategy(v))
    def run(case: fuzz.Case) -> None:
        check_case(v, case)

    run()


@pytest.mark.gpu
@pytest.mark.parametrize("Lq,Lk", [(1, 1), (1, 2000), (2000, 1), (17, 1000), (129, 65)])
def test_extreme_cross_lengths(Lq: int, Lk: int) -> None:
    # Decoding-like (Lq = 1) and the reverse, where bottom-right causal alignment leaves rows empty.
    v = variant_of(spec_text("x_cross_causal", dtype="bf16", D=64, H=4, Hkv=1, kind="cross", mask="causal", lse=True))
    for seed, dist in ((1, "normal"), (2, "large")):
        check_case(v, fuzz.Case(B=2, Lq=Lq, Lk=Lk, dist=dist, seed=seed))


@pytest.mark.gpu
def test_fully_masked_rows_are_zero_with_lse_minus_inf() -> None:
    # q_lens 0 and kv_lens 0 leave whole rows with nothing visible: O = 0, LSE = -inf, never NaN.
    v = variant_of(spec_text("x_pad_empty", dtype="fp16", D=64, H=2, mask="padding", lse=True))
    check_case(v, fuzz.Case(B=3, Lq=65, Lk=65, q_lens=(0, 65, 30), kv_lens=(65, 0, 1)))


@pytest.mark.gpu
def test_one_kernel_serves_every_shape(monkeypatch) -> None:
    """Dynamic shapes: one compile, then many (B, L) with the same kernel object, no rebuild."""
    from attngen.runtime import kernel as runtime

    builds = []
    real = runtime.compile_source
    monkeypatch.setattr(runtime, "compile_source", lambda *a, **k: builds.append(a) or real(*a, **k))
    v = variant_of(spec_text("x_dynamic_shapes", dtype="bf16", D=64, H=4, Hkv=2, mask="causal", lse=True))
    k = kernel_for(v)
    for B, L in ((1, 1), (4, 17), (2, 128), (3, 1000), (1, 2000)):
        check_case(v, fuzz.Case(B=B, Lq=L, Lk=L, seed=B * L))
        assert kernel_for(v) is k
    assert COMPILES[v.name] == 1
    # Zero when an earlier test built them, never once per shape: one build a kernel (on sm_90a the
    # variant also has its short-loop kernel, which the shapes up to Lk 1024 ran).
    assert len(builds) <= 1 + (k.short is not None)


@pytest.mark.gpu
@pytest.mark.parametrize("stages", [3, 2], ids=["shared_ring", "split_rings"])
def test_persistent_kernel_back_to_back_on_two_streams(stages: int) -> None:
    """The wgmma kernel's CTAs draw work tiles from a counter that each launch leaves at 0 and
    that the runtime keeps per stream: launches queued back to back on two streams, without a
    synchronisation in between, each compute every work tile (outputs poisoned before launch)."""
    import cupy

    from attngen.ir import abi
    from attngen.plan.schedule import Arch, persistent
    from attngen.runtime.kernel import device_arch

    if device_arch() != Arch.SM90A:
        pytest.skip(f"the persistent kernel is the wgmma engine's (sm_90a); this device compiles for {device_arch().value}")
    # Tile hints: the kernel that runs is the one whose counters are checked (without a hint these
    # lengths would go to the short-loop kernel); two stages take the split K/V rings.
    v = variant_of(spec_text(f"x_persistent_streams_s{stages}", dtype="bf16", D=128, H=4, Hkv=2, mask="causal",
                             extra=(f"tile block_m 128 block_n 128 warps 8 stages {stages}",)))
    k = kernel_for(v)
    if not persistent(k.plan.engine):
        pytest.skip(f"the {k.plan.engine.value} engine on this device is not persistent")
    cases = [fuzz.case_inputs(v, fuzz.Case(B=2, Lq=L, Lk=L, seed=s)) for s, L in enumerate((700, 1000, 333, 1000, 129))]
    dev = []
    for arrays in cases:
        q, kk, vv, _ = fuzz.split_inputs(arrays)
        out = fuzz.empty_device(abi.o_shape(v, q.shape[0], q.shape[2]), v.dtype)
        dev.append((fuzz.to_device(q), fuzz.to_device(kk), fuzz.to_device(vv), out))
    fuzz.synchronize()  # inputs and poisoned outputs in place before the streams start
    streams = [cupy.cuda.Stream(non_blocking=True) for _ in range(2)]
    for i, (dq, dk, dv, out) in enumerate(dev):
        k(dq, dk, dv, out=out, stream=streams[i % 2])
    for s in streams:
        s.synchronize()
    for arrays, (_, _, _, out) in zip(cases, dev):
        reports = fuzz.compare(v, arrays, fuzz.to_host(out, v.dtype), None)
        assert all(r.ok for r in reports), [r.summary() for r in reports]
    assert len(k._counters) >= 2 and all(int(c.get().max()) == 0 for c in k._counter_blocks)


@pytest.mark.gpu
def test_kernel_in_a_cuda_graph() -> None:
    """Captured into a torch CUDA graph without a warm-up on the capture stream (the persistent
    kernel's counter must not be allocated during capture), then replayed with new inputs copied
    into the captured buffers: every replay matches the reference."""
    torch = pytest.importorskip("torch")

    from attngen.ir import abi

    v = variant_of(spec_text("x_graph", dtype="bf16", D=64, H=4, Hkv=2, mask="causal"))
    k = kernel_for(v)
    cases = [fuzz.case_inputs(v, fuzz.Case(B=2, Lq=517, Lk=517, seed=s)) for s in range(3)]
    q0, k0, v0, _ = fuzz.split_inputs(cases[0])
    dq, dk, dv = (torch.empty(x.shape, dtype=torch.bfloat16, device="cuda") for x in (q0, k0, v0))
    out = torch.empty(abi.o_shape(v, q0.shape[0], q0.shape[2]), dtype=torch.bfloat16, device="cuda")
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        k(dq, dk, dv, out=out)
    for arrays in cases:
        q, kk, vv, _ = fuzz.split_inputs(arrays)
        for dst, src in ((dq, q), (dk, kk), (dv, vv)):
            dst.copy_(fuzz.to_device(src))
        out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        reports = fuzz.compare(v, arrays, fuzz.to_host(out, v.dtype), None)
        assert all(r.ok for r in reports), [r.summary() for r in reports]
