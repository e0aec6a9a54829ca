"""Ring attention on CPUs with the gloo backend: sharding, position offsets and the LSE merge,
against the NumPy reference on the whole sequence, and the ring's backward against the
single-device backward, for 2, 3 (odd), 4 and 8 processes.

Each world size runs `_ring_worker.py` in a subprocess (torch.multiprocessing spawns the ranks);
cases cover causal (zigzag and contiguous sharding), causal sliding windows, two-sided windows,
packed documents, softcap (bf16), ALiBi with a prefix, padding, and a full mask, at lengths that do
not divide evenly (with 8 ranks some chunks are empty). The backward cases (fp32, GQA) are listed
in `_ring_worker.BWD_CASES` with their tolerance and why.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="ring attention tests need torch (CPU build is enough)")

HERE = Path(__file__).resolve().parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Rings of 2, 3 (odd), 4 and 8 ranks in one spawn of 8 processes (starting processes dominates the
# cost on small CI machines); the smaller rings are subgroups that do not start at rank 0.
GROUPS = {2: [6, 7], 3: [1, 2, 3], 4: [0, 1, 2, 3], 8: list(range(8))}


@pytest.fixture(scope="module")
def ring_results(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[int, dict]]:
    """Every rank's results of one spawn of `_ring_worker.py` (forward and backward cases)."""
    if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available in this torch build")
    out = tmp_path_factory.mktemp("ring")
    spec = ";".join(",".join(map(str, m)) for m in GROUPS.values())
    r = subprocess.run([sys.executable, str(HERE / "_ring_worker.py"), "8", str(_free_port()), str(out), spec],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
    return [(rank, x) for rank in range(8) for x in json.loads((out / f"rank{rank}.json").read_text())]


def _check(results: list[tuple[int, dict]], which: str, n_cases: int) -> None:
    failures, seen = [], {}
    for rank, x in results:
        if x["pass"] != which:
            continue
        seen[x["world"]] = seen.get(x["world"], 0) + 1
        if not x["ok"]:
            failures.append(f"world {x['world']} rank {rank} {x['case']}: {x['detail']}")
    assert not failures, "\n".join(failures)
    # Every member of every ring checked every case.
    assert seen == {w: len(m) * n_cases for w, m in GROUPS.items()}, seen


def test_rings_of_2_3_4_and_8_ranks_match_the_reference_on_the_whole_sequence(ring_results) -> None:
    _check(ring_results, "fwd", 9)


def test_ring_gradients_of_2_3_4_and_8_ranks_match_the_single_device_backward(ring_results) -> None:
    """dq, dk, dv through autograd on every rank against the float64 backward on the whole sequence:
    dense, causal (zigzag and contiguous), causal window with softcap, documents with ALiBi; GQA;
    with a gradient at the LSE for the dense and causal cases (`_ring_worker.BWD_CASES`)."""
    _check(ring_results, "bwd", 5)


def test_sharding_round_trips_and_balances_causal_work() -> None:
    from attngen.runtime.distributed import Sharding, chunk_bounds, shard, shard_ranges, unshard

    for L in (1, 7, 16, 37, 100):
        for W in (1, 2, 3, 4, 8):
            for scheme in Sharding:
                x = np.arange(2 * L).reshape(1, L, 2)
                parts = [shard(x, W, r, 1, scheme) for r in range(W)]
                assert np.array_equal(unshard(parts, 1, scheme), x)
                covered = sorted(p for r in range(W) for a, b in shard_ranges(L, W, r, scheme) for p in range(a, b))
                assert covered == list(range(L))
    assert chunk_bounds(10, 4) == [(0, 3), (3, 6), (6, 8), (8, 10)]
    # Zigzag: under a causal mask every rank sees the same number of (q, kv) pairs (L = 2W c).
    for W in (2, 4, 8):
        L = 2 * W * 16
        work = [sum(p + 1 for a, b in shard_ranges(L, W, r) for p in range(a, b)) for r in range(W)]
        assert len(set(work)) == 1, work
        contiguous = [sum(p + 1 for a, b in shard_ranges(L, W, r, "contiguous") for p in range(a, b)) for r in range(W)]
        assert len(set(contiguous)) == W  # what zigzag avoids


def test_merge_is_exact_with_an_empty_partial_and_safe_when_both_are_empty() -> None:
    from attngen.runtime.distributed import merge_partials

    g = torch.Generator().manual_seed(0)
    o = torch.randn(2, 5, 3, 8, generator=g).to(torch.bfloat16)  # bshd
    lse = torch.randn(2, 3, 5, generator=g) * 30
    empty_o = torch.zeros_like(o)
    empty_lse = torch.full_like(lse, float("-inf"))
    m, ml = merge_partials(o, lse, empty_o, empty_lse, seq_dim=1)
    assert torch.equal(m.to(torch.bfloat16), o) and torch.equal(ml, lse)
    m, ml = merge_partials(empty_o, empty_lse, o, lse, seq_dim=1)
    assert torch.equal(m.to(torch.bfloat16), o) and torch.equal(ml, lse)
    m, ml = merge_partials(empty_o, empty_lse, empty_o, empty_lse, seq_dim=1)
    assert torch.equal(m, torch.zeros_like(m)) and torch.isneginf(ml).all() and not torch.isnan(m).any()
    # Large LSEs do not overflow, and the merge is the softmax-weighted mean.
    o2 = torch.randn(2, 5, 3, 8, generator=g)
    l1, l2 = torch.full((2, 3, 5), 500.0), torch.full((2, 3, 5), 500.0 + np.log(3.0))
    m, ml = merge_partials(o.float(), l1, o2, l2, seq_dim=1)
    assert torch.allclose(m, 0.25 * o.float() + 0.75 * o2, atol=1e-4)  # fp32 LSEs near 500: ulp 3e-5
    assert torch.allclose(ml, torch.full_like(ml, 500.0 + np.log(4.0)))


def test_the_cpu_backend_kernel_runs_a_ring_forward_and_backward(ring_results) -> None:
    """The CPU backend's kernel (compiled without `output lse`; the ring recompiles it with the
    LSE) as a 2-rank ring's local attention: outputs and gradients against the reference."""
    from attngen.cpu.compile import CompilerNotFound, find_compiler

    try:
        find_compiler()
    except CompilerNotFound as e:
        pytest.skip(str(e))
    got = [(rank, x) for rank, x in ring_results if x["pass"] == "cpu_backend"]
    assert sorted(rank for rank, _ in got) == GROUPS[2]
    assert all(x["ok"] for _, x in got), [x["detail"] for _, x in got]
