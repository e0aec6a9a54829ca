"""Head dims 256 and 192 with value 128 (issue 15) against the NumPy reference (GPU only).

The wgmma engine (the device's own sm_90a target on an H200) and mma.sync (the same specs built for
plain sm_90, whose cubin also runs on a 9.0 device), at odd lengths that leave partial query and key
tiles, with GQA, causal, sliding windows, softcap, LSE, fp16 and bf16, an o post-norm with sink and
nan_check (mma.sync on sm_90a too at Dv 256), and the two gallery examples.
The spec texts are shared with benchmarks/headdim_bench.py (`HEADDIM_SPECS`), so a device run
compiles each once (tools/headdim_gpu_check.sh prebuilds them in parallel into the disk cache).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from attngen.check import fuzz
from attngen.plan.schedule import Arch, Engine

from headdim_specs import GPU_CASES, MMA_ON_SM90A, compiled

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.gpu
@pytest.mark.parametrize("name,arch,cases", GPU_CASES, ids=[f"{n}-{a}" for n, a, _ in GPU_CASES])
def test_wide_head_dims_match_the_reference(name: str, arch: str, cases: tuple[tuple[int, int, int], ...]) -> None:
    v, kernel = compiled(name, arch)
    # The engine the plan promised is the one that ran (wgmma on sm_90a, mma.sync on sm_90).
    want = Engine.WGMMA if Arch(arch) == Arch.SM90A and name not in MMA_ON_SM90A else Engine.MMA_SYNC
    assert kernel.plan.engine == want, (name, arch, kernel.plan.engine)
    for i, (B, Lq, Lk) in enumerate(cases):
        case = fuzz.Case(B=B, Lq=Lq, Lk=Lk, dist=("normal", "large")[i % 2], seed=11 + i)
        arrays = fuzz.case_inputs(v, case)
        out, lse = fuzz.run_kernel(kernel, v, arrays)
        reports = fuzz.compare(v, arrays, out, lse)
        bad = [r.summary() for r in reports if not r.ok]
        assert not bad, f"{name} on {arch} at {case.describe()}:\n" + "\n".join(bad)
        assert len(reports) == (2 if v.lse else 1)


@pytest.mark.gpu
@pytest.mark.parametrize("example", ["gemma3_d256_local", "deepseek_mla_prefill"])
def test_wide_head_dim_examples_match_the_reference(example: str) -> None:
    from attngen.lang import frontend
    from attngen.runtime import kernel as runtime

    v = frontend.load(str(ROOT / "examples" / f"{example}.attn")).get(None)
    kernel = runtime.compile(v, family="forward")
    assert kernel.plan.engine == Engine.WGMMA
    for i, (B, L) in enumerate(((1, 1), (2, 333), (1, 700))):
        case = fuzz.Case(B=B, Lq=L, Lk=L, seed=5 + i)
        arrays = fuzz.case_inputs(v, case)
        out, lse = fuzz.run_kernel(kernel, v, arrays)
        bad = [r.summary() for r in fuzz.compare(v, arrays, out, lse) if not r.ok]
        assert not bad, f"{example} at {case.describe()}:\n" + "\n".join(bad)
