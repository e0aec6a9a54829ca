"""The backward pass's generated source: stable bytes, the derivative hook, the CLI (`--pass
backward`, located refusals), and nvcc for sm_80 and sm_90a over every example it supports (all
but the paged decode cache; the examples' sources in one translation unit per arch: each lives in
its own namespace)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from attngen.cuda import compile as compile_cuda, render_bwd
from attngen.lang import frontend
from attngen.plan import bwd as plan_bwd
from attngen.plan.schedule import Arch

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.attn"))


def _variants():
    for path in EXAMPLES:
        for v in frontend.load(path).variants:
            yield path, v


SUPPORTED = [(p, v) for p, v in _variants() if not plan_bwd.unsupported(v)]
REFUSED = [(p, v) for p, v in _variants() if plan_bwd.unsupported(v)]


def test_every_example_is_rendered_or_refused_with_a_location():
    assert len(SUPPORTED) >= 10
    # Issue 14: every example trains except the paged decode cache (inference state).
    assert [v.name for _, v in REFUSED] == ["paged_decode_llama3"]
    for path, v in REFUSED:
        with pytest.raises(ValueError, match="not supported by the backward kernels yet|kv_cache paged. is decode-time inference state, not a training workload"):
            render_bwd.render(v)
        for d in plan_bwd.unsupported(v):
            assert d.span is not None and d.span.line > 0


def test_stable_bytes_and_hooks():
    for _, v in SUPPORTED:
        for det in (False, True):
            a = render_bwd.render(v, Arch.SM90A, deterministic=det)
            assert a == render_bwd.render(v, Arch.SM90A, deterministic=det)
            assert "ag_dscore" in a and "ag_classify" in a
            # dQ by atomics only in the default mode (score-input gradients always use atomics);
            # the wgmma engine's are vector reductions (red.global.add.v2.f32, by the consumers or by
            # the dQ warpgroup) or bulk reductions from shared memory (cp.reduce.async.bulk), by its mode.
            assert ("ag_bwd_dq(p)" in a) == det
            assert any(r in a for r in ("atomicAdd(p.ws_dq", "ag_red_add2(row", "ag_red_add2(g", "ag_bulk_reduce_add(p.ws_dq")) == (not det)
    v = frontend.load(ROOT / "examples" / "gemma2_local_softcap.attn").get()
    src = render_bwd.render(v)
    # softcap's derivative 1 - tanh(s/c)^2, emitted with libm's tanhf (the FFMA engine's accuracy).
    body = src.split("float ag_dscore(")[1].split("}")[0]
    assert "return (1.0f - (tanhf((s / 50.0f)) * tanhf((s / 50.0f))));" in body, body
    # Without score modifications the derivative is the constant 1.
    v = frontend.load(ROOT / "examples" / "llama3_gqa_causal.attn").get()
    assert "return 1.0f;" in render_bwd.render(v).split("float ag_dscore(")[1].split("}")[0]


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "attngen", *args], capture_output=True, text=True, cwd=ROOT, check=False)


def test_cli_pass_backward():
    r = _cli("compile", "examples/llama3_gqa_causal.attn", "--pass", "backward")
    assert r.returncode == 0 and "_bwd_dkdv" in r.stdout and "(backward pass)" in r.stdout
    det = _cli("compile", "examples/llama3_gqa_causal.attn", "--pass", "backward", "--deterministic")
    assert det.returncode == 0 and "_bwd_dq(" in det.stdout
    fwd = _cli("compile", "examples/llama3_gqa_causal.attn", "--pass", "forward")
    assert fwd.returncode == 0 and fwd.stdout == _cli("compile", "examples/llama3_gqa_causal.attn").stdout
    bad = _cli("compile", "examples/paged_decode_llama3.attn", "--pass", "backward")
    assert bad.returncode == 1 and "Traceback" not in bad.stderr
    assert "paged_decode_llama3.attn:" in bad.stderr and "not a training workload" in bad.stderr and "^" in bad.stderr
    onorm = _cli("compile", "examples/diff_transformer_subln.attn", "--pass", "backward")
    assert onorm.returncode == 0 and "ag_onorm_bwd<false>" in onorm.stdout  # the o post-norm's backward (RMSNorm) in the pre kernel
    tok = _cli("compile", "examples/whisper_preln_cross.attn", "--pass", "backward")
    assert tok.returncode == 0 and "ag_tok_norm_bwd" in tok.stdout  # the token-scope q norm's backward, a token a row
    ok = _cli("compile", "examples/qwen3_qk_norm.attn", "--pass", "backward")
    assert ok.returncode == 0 and "_bwd_prep" in ok.stdout and "ag_norm_row_bwd" in ok.stdout
    use = _cli("compile", "examples/llama3_gqa_causal.attn", "--deterministic")
    assert use.returncode == 2 and "--pass backward" in use.stderr


@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on the PATH")
@pytest.mark.parametrize("arch", [Arch.SM80, Arch.SM90A], ids=lambda a: a.value)
def test_nvcc_compiles_every_supported_example(arch):
    # Each source is its own namespace plus extern "C" entry points with distinct names (the
    # deterministic and atomic renderings of one variant share names: one mode per arch here).
    for det in (arch == Arch.SM80,):
        unit = "\n".join(render_bwd.render(v, arch, deterministic=det) for _, v in SUPPORTED)
        res = compile_cuda.resources(unit, arch)
        names = {r.kernel for r in res}
        from attngen.plan import bwd as pb
        assert names == {k.name for _, v in SUPPORTED for k in pb.plan(v, arch, deterministic=det).kernels}, sorted(names)
        for r in res:
            # Small spills (a few words of the interval classification) are tolerated; report them.
            assert r.spill_stores <= 64, f"{r.kernel}: {r.spill_stores} bytes of spill stores on {arch.value}"
