"""The prep-kernel plan: which variants get which prep kernels, their workspace fields in the ABI,
and row counts / workspace shapes that agree with the C++ expressions the launcher uses."""

from __future__ import annotations

import pytest

from attngen.cuda import render as render_cuda
from attngen.lang.frontend import loads
from attngen.ir.nodes import DType

CASES = {
    "none": ("dtype bf16; head_dim 64; heads 4; mask causal", []),
    "qk_head": ("dtype bf16; head_dim 128; heads 8 kv 2; norm q rmsnorm(1e-6); norm k rmsnorm(1e-6)", ["ws_q", "ws_k"]),
    "q_token": ("dtype bf16; head_dim 64; heads 4; kind cross; layout bshd; norm q layernorm(1e-5) scope token", ["ws_qstats"]),
    "k_fp32": ("dtype fp32; head_dim 64; heads 2; norm k layernorm(1e-5)", ["ws_k"]),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_prep_fields_follow_the_strides_in_abi_order(name: str) -> None:
    body, want = CASES[name]
    kp = render_cuda.plan(loads(f"attention t {{ {body} }}").variants[0])
    assert [pr.field.name for pr in kp.preps] == want
    names = [f.name for f in kp.fields]
    assert names[names.index("o_ss") + 1: names.index("o_ss") + 1 + len(want)] == want


def test_rows_and_shapes_match_the_launcher_expressions() -> None:
    v = loads("attention t { dtype fp16; head_dim 96; heads 8 kv 2; kind cross; norm q layernorm(1e-5); norm k rmsnorm(1e-6) }").variants[0]
    q, k = render_cuda.plan(v).preps
    B, Lq, Lk = 3, 70, 129
    for pr in (q, k):
        assert pr.rows(B, Lq, Lk) == eval(pr.rows_expr.replace("(long long)", "").replace("p.B", str(B))
                                          .replace("p.Lq", str(Lq)).replace("p.Lk", str(Lk)))
    assert q.workspace_shape(B, Lq, Lk) == (B, 8, Lq, 96) and q.dtype == DType.FP16
    assert k.workspace_shape(B, Lq, Lk) == (B, 2, Lk, 96)
    t = render_cuda.plan(loads("attention t { dtype bf16; head_dim 64; heads 4; kind cross; layout bshd; "
                                "norm q rmsnorm(1e-5) scope token }").variants[0]).preps[0]
    assert t.rows(B, Lq, Lk) == B * Lq and t.workspace_shape(B, Lq, Lk) == (B, 1, Lq, 2) and t.dtype == DType.FP32


def test_prep_grid_is_capped() -> None:
    kp = render_cuda.plan(loads("attention t { dtype bf16; head_dim 64; heads 2; norm k rmsnorm(1e-6) }").variants[0])
    assert kp.prep_grid(1) == 1
    assert kp.prep_grid(10**9) == render_cuda.PREP_MAX_BLOCKS
