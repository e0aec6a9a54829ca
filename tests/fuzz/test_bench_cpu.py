"""`attngen bench` and the benchmark suite, the parts that run without a GPU: shapes, work
counting, peer expressibility, tables, bars."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

from attngen.tools import bench
from attngen.lang import frontend
from attngen.check import fuzz, reference
from attngen.ir.abi import Sizes

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def _suite():
    spec = importlib.util.spec_from_file_location("bench_suite", ROOT / "benchmarks" / "suite.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bench_suite"] = mod  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(mod)
    return mod


def test_parse_shape_checks_heads_and_head_dim() -> None:
    v = frontend.load(EXAMPLES / "llama3_gqa_causal.attn").get()  # 32 heads of 128, self
    assert bench.parse_shape("B=2,H=32,L=1024,D=128", v) == (2, 1024, 1024)
    assert bench.parse_shape("L=1024,B=2", v) == (2, 1024, 1024)  # H and D default to the spec's
    with pytest.raises(ValueError, match="heads 32"):
        bench.parse_shape("B=2,H=16,L=1024,D=128", v)
    with pytest.raises(ValueError, match="head_dim 128"):
        bench.parse_shape("B=2,H=32,L=1024,D=64", v)
    with pytest.raises(ValueError, match="Lq must equal Lk"):
        bench.parse_shape("B=2,Lq=512,Lk=1024", v)
    with pytest.raises(ValueError, match="sizes go by name, e.g. B=2,Lq=32,Lk=1024"):
        bench.parse_shape("2,32,1024", v)
    cross = frontend.load(EXAMPLES / "whisper_preln_cross.attn").get()
    assert bench.parse_shape("B=32,H=16,Lq=2048,Lk=512,D=64", cross) == (32, 2048, 512)


@pytest.mark.parametrize("name", ["gpt2_causal_fp16", "packed_documents", "mistral_sliding_window",
                                  "block_sparse_pattern", "paligemma_prefix_lm", "seed_padded_fp32"])
def test_visible_fraction_matches_the_dense_mask(name: str) -> None:
    v = frontend.load(EXAMPLES / f"{name}.attn").get()
    B, L = 2, 300
    arrays = fuzz.case_inputs(v, fuzz.Case(B, L, L, seed=1))
    rest = {n: a for n, a in arrays.items() if n not in ("q", "k", "v")}
    syms = {}
    for d in v.runtime_inputs():
        for dim, n in zip(d.shape, rest[d.name].shape):
            if isinstance(dim, str):
                syms[dim] = n
    want = reference.mask_matrix(v, Sizes(B, L, L, tuple(sorted(syms.items()))), rest).mean()
    assert bench.visible_fraction(v, B, L, L, rest) == pytest.approx(want, abs=1e-12)


def test_dense_flops_and_causal_density() -> None:
    v = frontend.load(EXAMPLES / "gpt2_causal_fp16.attn").get()
    assert bench.dense_flops(v, 2, 1024, 1024) == 2 * 2 * 12 * 1024 * 1024 * (64 + 64)
    frac = bench.visible_fraction(v, 1, 1000, 1000, {})
    assert frac == pytest.approx((1000 * 1001 / 2) / 1000**2)


def test_sdpa_expressibility() -> None:
    def load(name):
        return frontend.load(EXAMPLES / f"{name}.attn").variants[0]

    assert bench.sdpa_expressible(load("gpt2_causal_fp16"), 128, 128) is None
    assert bench.sdpa_expressible(load("gpt2_causal_fp16"), 64, 128) is not None  # causal, Lq != Lk
    assert "fp32" in bench.sdpa_expressible(load("seed_padded_fp32"), 128, 128)
    assert "score" in bench.sdpa_expressible(load("gemma2_local_softcap"), 128, 128)
    assert "mask" in bench.sdpa_expressible(load("mistral_sliding_window"), 128, 128)
    assert bench.sdpa_expressible(load("whisper_preln_cross"), 64, 32) is None  # norms handled by a composite


def test_rotation_sets_exceed_l2() -> None:
    assert bench.rotation_sets(1 << 20) * (1 << 20) >= 2 * bench.L2_BYTES or bench.rotation_sets(1 << 20) == 32
    assert bench.rotation_sets(1 << 30) == 2
    assert bench.rotation_sets(100 << 20) == 2


def test_default_shapes_scale_batch_for_many_heads() -> None:
    bloom = frontend.load(EXAMPLES / "bloom_alibi_causal.attn").get()
    assert all(B >= 1 for B, _, _ in bench.default_shapes(bloom))
    assert bench.default_shapes(frontend.load(EXAMPLES / "gpt2_causal_fp16.attn").get())[0] == (32, 1024, 1024)


def test_format_table_lists_every_row() -> None:
    rows = [bench.Row("w", "v", "attngen", "bf16", 2, 16, 1024, 1024, 128, ms=1.0, tflops_visible=300.0,
                      tflops_dense=600.0, frac_gemm=0.4, agrees=True),
            bench.Row("w", "v", "flex", "bf16", 2, 16, 1024, 1024, 128, ms=1.5, tflops_visible=200.0,
                      tflops_dense=400.0, speedup_vs_peer=1.5, agrees=False),
            bench.Row("w", "v", "sdpa-flash", "bf16", 2, 16, 1024, 1024, 128, error="RuntimeError: no")]
    text = bench.format_table(rows)
    assert "attngen" in text and "1.50x" in text and " NO" in text and "error: RuntimeError" in text


def test_bench_without_gpu_is_a_usage_error(capsys) -> None:
    from attngen.runtime.extras import GpuStatus, gpu_check

    gpu = gpu_check()
    if gpu.ok:
        pytest.skip("a GPU is present")
    assert bench.main([str(EXAMPLES / "gpt2_causal_fp16.attn"), "--shape", "B=1,H=12,L=128,D=64"]) == 2
    err = capsys.readouterr().err
    # "no GPU" only where CuPy is there and the device is not; without CuPy, the extra's install line
    assert ("no GPU" in err) == (gpu.status is GpuStatus.NO_DEVICE), err
    assert ("pip install 'attngen[cuda]'" in err) == (gpu.status is GpuStatus.NO_CUPY), err


def test_bench_shape_errors_come_before_the_gpu(capsys) -> None:
    assert bench.main([str(EXAMPLES / "gpt2_causal_fp16.attn"), "--shape", "B=1,H=8,L=128,D=64"]) == 2
    assert "heads 12" in capsys.readouterr().err


def test_suite_specs_and_workloads_are_consistent() -> None:
    suite = _suite()
    names = {w.name for w in suite.WORKLOADS}
    assert {"dense_d128", "causal_d128", "seed_fp32_padding", "preln_cross_residual", "qk_norm_causal_d128"} <= names
    for w in suite.WORKLOADS:
        v = frontend.loads(suite.SPECS[w.spec]).get()
        if v.kind.value == "self":
            assert w.Lq == w.Lk
        if w.inputs:
            ins = w.inputs(v, w.B, w.Lq, w.Lk)
            assert {d.name for d in v.runtime_inputs()} <= set(ins) | {"q_norm_weight", "q_norm_bias",
                                                                        "k_norm_weight", "k_norm_bias"}
    docs = suite._documents(None, 2, 4096, 4096)["doc"]
    assert docs.shape == (2, 4096) and (np.diff(docs, axis=1) >= 0).all() and docs[:, -1].tolist() == [15, 15]


def test_suite_bars() -> None:
    suite = _suite()

    def row(wl, impl, ms, tf):
        return bench.Row(wl, wl, impl, "bf16", 2, 16, 16384, 16384, 128, ms=ms, tflops_visible=tf)

    rows = [row("dense_d128", "attngen", 1.0, 400.0), row("causal_d128", "attngen", 1.0, 300.0),
            row("seed_fp32_padding", "attngen", 0.012, 1.0), row("sliding_window_1024", "attngen", 1.0, 400.0),
            row("sliding_window_1024", "flex", 1.6, 250.0), row("qk_norm_causal_d128", "attngen", 1.2, 250.0),
            row("preln_cross_residual", "attngen", 0.45, 100.0)]
    by = {b.name: b for b in suite.bars(rows)}
    assert by["bf16 D128 B2 H16 L16384 dense"].met is True
    assert by["bf16 D128 B2 H16 L16384 causal"].met is False
    assert by["seed fp32 B4 H8 L128 D64 padding"].met is True
    assert by["sliding window 1024 vs FlexAttention"].value == pytest.approx(1.6)
    assert by["document-causal 16 docs vs FlexAttention"].met is None
    assert by["pre-LN cross attention + residual B32 H16 Lq2048 Lk512 D64"].met is False
    assert by["QK-norm overhead (vs the same causal kernel)"].value == pytest.approx(20.0)


def test_suite_without_gpu_exits_2(capsys) -> None:
    if fuzz.gpu_status()[0]:
        pytest.skip("a GPU is present")
    assert _suite().main([]) == 2


@pytest.mark.parametrize("name", ["whisper_preln_cross", "qwen3_qk_norm", "diff_transformer_subln"])
def test_torch_composite_peer_computes_the_variant(name: str) -> None:
    """The unfused torch pipeline the suite races (norms + SDPA + residual), checked on the CPU."""
    torch = pytest.importorskip("torch")
    from attngen.check import tolerance

    v = frontend.load(EXAMPLES / f"{name}.attn").get()
    B, Lq = 2, 24
    Lk = 16 if v.kind.value == "cross" else Lq
    arrays = fuzz.case_inputs(v, fuzz.Case(B, Lq, Lk, seed=2))
    q, k, vv, rest = fuzz.split_inputs(arrays)
    peer = bench.torch_composite_peer(v, Lq, Lk, compiled=False)
    assert peer is not None and peer.name == "torch-eager"
    dev = {n: flex_as_torch(a) for n, a in arrays.items()}
    o = peer.make(dev)()
    o_ref, _ = reference.attention(v, q, k, vv, rest)
    tolerance.assert_close(o.to(torch.float32).numpy(), o_ref, v.dtype, f"{name} torch-eager",
                           score_err=tolerance.score_error(q, k, v.effective_scale))


def flex_as_torch(a):
    from attngen.check import flex

    return flex._as_torch(a)
