"""Ring attention across GPUs: runs tests/gpu/ring_gpu_check.py under torchrun on every visible
GPU (at least 2): each rank's rows against the single-GPU kernel on the whole sequence, and its
gradients (autograd through the ring) against the single-GPU backward."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _gpus() -> int:
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except ImportError:
        return 0


@pytest.mark.gpu
@pytest.mark.skipif(_gpus() < 2, reason="ring attention across GPUs needs torch and at least 2 CUDA GPUs")
def test_ring_matches_the_single_gpu_kernel(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={_gpus()}",
                        str(ROOT / "tests/gpu/ring_gpu_check.py"), "--out", str(tmp_path / "ring.json")],
                       capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert r.returncode == 0, (r.stdout + r.stderr)[-6000:]
    assert r.stdout.count("PASS") >= 11, r.stdout  # 7 forward and 4 backward cases


# One GPU: a launch placed inside a longer sequence (q_offset / kv_offset / Lq_total / Lk_total)
# gives the rows of the whole problem, on every engine: wgmma (bf16 D128), mma.sync (fp16 D96) and
# FFMA (fp32 D64), for position-dependent masks and scores.
OFFSET_CASES = [
    ("bf16", 128, "causal && window(300, 0)", "alibi"),
    ("fp16", 96, "document(doc_ids) && causal", "softcap(20.0)"),
    ("fp32", 64, "causal || prefix(77)", "alibi"),
]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,D,mask,score", OFFSET_CASES, ids=[c[0] for c in OFFSET_CASES])
def test_offsets_give_the_rows_of_the_whole_sequence(dtype: str, D: int, mask: str, score: str) -> None:
    torch = pytest.importorskip("torch", reason="this test drives the kernel with torch tensors")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device visible to torch")
    import attngen

    extra = "input doc_ids: i32[B, Lk] sorted;" if "doc_ids" in mask else ""
    kernel = attngen.compile(f"attention off_{dtype} {{ dtype {dtype}; head_dim {D}; heads 4 kv 2; layout bshd; {extra} "
                             f"mask {mask}; score {score}; output lse }}")
    tdt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]
    g = torch.Generator().manual_seed(D)
    B, L = 2, 1000
    q, k, v = (torch.randn(B, L, h, D, generator=g).to(tdt).cuda() for h in (4, 2, 2))
    ins = {}
    if extra:
        ins["doc_ids"] = (torch.arange(L)[None, :] // torch.tensor([[230], [410]])).to(torch.int32).cuda()
    o_full, lse_full = kernel(q, k, v, **ins)
    tol = 1e-5 if dtype == "fp32" else 1e-2
    # Queries 333..732 against every key: the sequence's rows 333..732.
    o, lse = kernel(q[:, 333:733], k, v, q_offset=333, Lq_total=L, Lk_total=L, **ins)
    assert (o.float() - o_full[:, 333:733].float()).abs().max().item() <= tol
    fin = ~torch.isneginf(lse_full[:, :, 333:733])
    assert torch.equal(fin, ~torch.isneginf(lse))
    assert (lse[fin] - lse_full[:, :, 333:733][fin]).abs().max().item() <= 1e-3
    # Chunked prefill: queries 600..999 against keys 0..999 with only q_offset (totals default).
    o, _ = kernel(q[:, 600:], k, v, q_offset=600, **ins)
    assert (o.float() - o_full[:, 600:].float()).abs().max().item() <= tol
    # A key block at an offset: merged with its complement by LSE, it gives the whole rows.
    from attngen.runtime.distributed import merge_partials

    oa, la = kernel(q[:, 333:733], k[:, :517], v[:, :517], q_offset=333, kv_offset=0, Lq_total=L, Lk_total=L, **ins)
    ob, lb = kernel(q[:, 333:733], k[:, 517:], v[:, 517:], q_offset=333, kv_offset=517, Lq_total=L, Lk_total=L, **ins)
    om, _ = merge_partials(oa, la, ob, lb, seq_dim=1)
    assert (om - o_full[:, 333:733].float()).abs().max().item() <= 2 * tol
