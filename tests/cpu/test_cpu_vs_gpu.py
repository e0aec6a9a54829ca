"""On a GPU machine: the CPU backend's kernel and the CUDA kernel of the same spec agree (each is
also held to the reference; here they are held to each other at the looser of the two bounds)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from attngen.check import reference, tolerance, workload
from attngen.check.fuzz_run import run_kernel
from attngen.ir.nodes import AttnKind
from attngen.plan.validate import load

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
NAMES = ["seed_padded_fp32", "llama3_gqa_causal", "gpt_oss_sinks", "varlen_causal_training", "paged_decode_llama3",
         "whisper_preln_cross"]


@pytest.mark.gpu
@pytest.mark.parametrize("name", NAMES)
def test_cpu_and_cuda_kernels_agree(name, cpu_kernel):
    import attngen

    for v in load(EXAMPLES / f"{name}.attn").variants:
        B, Lq, Lk = (2, 70, 70) if v.kind == AttnKind.SELF else (2, 3, 150)
        arrays = workload.make_inputs(v, B, Lq, Lk, np.random.default_rng(7))
        o_cpu, lse_cpu = run_kernel(cpu_kernel(v), v, arrays)
        o_gpu, lse_gpu = run_kernel(attngen.compile(v), v, arrays)
        rest = {n: a for n, a in arrays.items() if n not in ("q", "k", "v")}
        se = reference.score_error(v, arrays["q"], arrays["k"], rest)
        # Both against the reference, then against each other (the GPU output as the yardstick).
        ref = reference.attention(v, arrays["q"], arrays["k"], arrays["v"], rest)
        for o in (o_cpu, o_gpu):
            assert tolerance.check(o, ref[0], v.dtype, score_err=se).ok
        rep = tolerance.check(o_cpu, o_gpu, v.dtype, "O cpu vs cuda", score_err=se)
        assert rep.ok, rep.summary()
        if v.lse:
            rep = tolerance.check_lse(lse_cpu, lse_gpu, v.dtype, "LSE cpu vs cuda", score_err=se)
            assert rep.ok, rep.summary()
