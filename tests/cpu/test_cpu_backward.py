"""The CPU backward (`attngen.cpu.backward`): every example variant the backward kernels take matches
the float64 reference gradients (`attngen.check.reference_bwd`) under the GPU's tolerances, torch
autograd on CPU tensors runs it, `attngen fuzz --pass backward --device cpu` runs it, and what it
refuses is refused with the GPU backward's words. One build a variant (on-disk cache), small shapes."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from attngen.check import fuzz_bwd, reference, workload
from attngen.check.fuzz_run import split_inputs
from attngen.cpu import render_bwd
from attngen.ir import abi
from attngen.ir.nodes import AttnKind, Layout
from attngen.plan.validate import load

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
VARIANTS = [(p.name, v) for p in sorted(EXAMPLES.glob("*.attn")) for v in load(p).variants]
TRAINED = [(f, v) for f, v in VARIANTS if render_bwd.unsupported(v) is None]
# Also run with the dQ pass of its own (the schedule where the (batch, kv head) items cannot fill
# the threads): a score with learnable inputs, norms at both scopes, a residual, varlen, masks.
TWO_PASS = {"t5_relative_bias", "qwen3_qk_norm", "whisper_preln_cross", "diff_transformer_subln", "varlen_causal_training",
            "packed_documents", "llama3_gqa_causal", "alphafold_pair_bias", "mqa_decode_cross"}


def _inputs(v, B, Lq, Lk, seed):
    """Workload inputs (norm weights and biases away from 1 and 0, so their gradients matter) and a random dO."""
    rng = np.random.default_rng(seed)
    arrays = workload.make_inputs(v, B, Lq, Lk, rng, "normal")
    for n in v.norms:
        for name, base in ((f"{n.target.value}_norm_weight", 1.0), (f"{n.target.value}_norm_bias", 0.0)):
            if name in arrays:
                arrays[name] = (base + 0.3 * rng.normal(size=arrays[name].shape)).astype(arrays[name].dtype)
    rows = arrays["q"].shape[0] if v.layout == Layout.VARLEN else B
    dO = rng.normal(size=abi.o_shape(v, 1 if v.layout == Layout.VARLEN else B, rows if v.layout == Layout.VARLEN else Lq))
    return arrays, dO.astype(reference.dtype_of(v.dtype))


def _check(v, arrays, dO, **kw):
    """The CPU backward of `v` from the reference forward's O and LSE (no forward build) against
    the reference gradients."""
    from attngen.cpu.backward import compile_backward_cpu
    from attngen.runtime.bwd import o_norm_inputs, training_variant

    q, k, vv, rest = split_inputs(arrays)
    fwd_rest = {n: a for n, a in rest.items() if n not in o_norm_inputs(v)}
    o, lse = reference.attention(training_variant(v), q, k, vv, fwd_rest)
    o, lse = o.astype(reference.dtype_of(v.dtype)), lse.astype(np.float32)
    wrt = fuzz_bwd.wrt_names(v)
    res = compile_backward_cpu(v)(q, k, vv, o, lse, dO, wrt=wrt, **rest, **kw)
    got = {n: np.asarray(x).astype(np.float64) for n, x in zip(("dq", "dk", "dv"), res[:3])}
    if wrt:
        got.update({n: np.asarray(res[3][n], dtype=np.float64) for n in wrt})
    bad = [r.summary() for r in fuzz_bwd.compare_backward(v, arrays, dO, got, wrt) if not r.ok]
    assert not bad, "\n".join(bad)


def test_every_construct_the_gpu_backward_takes_is_trained_on_the_cpu():
    refused = {v.name for _, v in VARIANTS} - {v.name for _, v in TRAINED}
    assert refused == {"paged_decode_llama3"}


@pytest.mark.parametrize("v", [v for _, v in TRAINED], ids=[f"{f}:{v.name}" for f, v in TRAINED])
def test_example_backward_matches_the_reference(v):
    # Lengths off the 64-row tiles, several tiles a side: NEVER, MAYBE and ALWAYS tiles. B > 1
    # where the float64 reference stays cheap (it is most of the time: 112 and 128 heads take B 1).
    B = 2 if v.heads <= 32 else 1
    Lq, Lk = (70, 70) if v.kind == AttnKind.SELF else (9, 133)
    arrays, dO = _inputs(v, B, Lq, Lk, seed=1)
    _check(v, arrays, dO, num_threads=2)  # fused where B * Hkv >= 2
    if v.name in TWO_PASS:
        _check(v, arrays, dO, num_threads=2, two_pass=True)


def test_saved_outputs_lse_gradient_and_positions(cpu_kernel):
    import dataclasses

    from attngen.check import reference_bwd
    from attngen.cpu.kernel import compile_cpu
    from attngen.lang import frontend

    v = frontend.loads("attention t { dtype fp32; head_dim 32; heads 4 kv 2; mask causal }", "<test>").variants[0]
    k = cpu_kernel(v)
    arrays, dO = _inputs(v, 1, 90, 90, seed=3)
    q, kk, vv, _ = split_inputs(arrays)
    # The forward's own O and LSE give the same gradients as the run the backward makes itself.
    o, lse = compile_cpu(dataclasses.replace(v, lse=True))(q, kk, vv)
    a = k.backward(q, kk, vv, dO)
    b = k.backward(q, kk, vv, dO, o=o, lse=lse)
    for x, y in zip(a, b):
        assert np.array_equal(np.asarray(x), np.asarray(y))
    # A gradient at the LSE enters as delta - dlse: d/dq of sum(dlse * LSE) is scale dlse P K.
    dlse = np.random.default_rng(4).normal(size=lse.shape).astype(np.float32)
    c = k.backward(q, kk, vv, np.zeros_like(dO), o=o, lse=lse, dlse=dlse)
    qs, ks = q.astype(np.float64)[0], np.repeat(kk.astype(np.float64)[0], 2, axis=0)
    s = np.einsum("hqd,hkd->hqk", qs, ks) * v.effective_scale
    s = np.where(np.arange(90)[None, :] <= np.arange(90)[:, None], s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    want = v.effective_scale * np.einsum("hq,hqk,hkd->hqd", dlse[0].astype(np.float64), p, ks)
    assert np.abs(np.asarray(c[0], dtype=np.float64)[0] - want).max() < 1e-4 * max(1.0, np.abs(want).max())
    # Positions: the last 26 queries of a 90-token sequence as one chunk of it (q_offset 64).
    rows = np.arange(90)[None, None, :, None] >= 64
    full = reference_bwd.attention_backward(v, q, kk, vv, {}, np.where(rows, dO, 0).astype(np.float64))
    got = k.backward(q[:, :, 64:], kk, vv, dO[:, :, 64:], q_offset=64)
    for g, n, want_g in ((got[0], "dq", full["dq"][:, :, 64:]), (got[1], "dk", full["dk"]), (got[2], "dv", full["dv"])):
        assert np.abs(np.asarray(g, dtype=np.float64) - want_g).max() < 1e-4 * np.abs(want_g).max(), n


def test_wrong_arrays_and_refused_constructs_say_what(cpu_kernel):
    v = load(EXAMPLES / "llama3_gqa_causal.attn").get()
    k = cpu_kernel(v)
    arrays, dO = _inputs(v, 1, 20, 20, seed=0)
    q, kk, vv, _ = split_inputs(arrays)
    with pytest.raises(ValueError, match=r"dO: expected the output's shape \(1, 32, 20, 128\)"):
        k.backward(q, kk, vv, dO[:, :, :10])
    with pytest.raises(ValueError, match="o, lse: expected both"):
        k.backward(q, kk, vv, dO, o=dO)
    with pytest.raises(ValueError, match="wrt: expected names of score inputs or norm weights"):
        k.backward(q, kk, vv, dO, wrt=("slopes",))
    paged = load(EXAMPLES / "paged_decode_llama3.attn").get()
    with pytest.raises(ValueError, match="the cpu backward cannot differentiate it: `kv_cache paged` is decode-time inference state"):
        render_bwd.render(paged)


def test_torch_autograd_on_cpu_tensors_matches_the_reference():
    torch = pytest.importorskip("torch")
    import attngen.torch as at

    for path, name in (("t5_relative_bias.attn", None), ("gpt_oss_sinks.attn", "gpt_oss_sliding"),
                       ("diff_transformer_subln.attn", None)):
        v = next(x for x in load(EXAMPLES / path).variants if name is None or x.name == name)
        op = at.register(v)
        arrays, dO = _inputs(v, 2, 33, 33, seed=5)
        t = {n: _t(torch, a) for n, a in arrays.items()}
        learn = [n for n in op.input_names if t[n].is_floating_point()]
        for n in ("q", "k", "v", *learn):
            t[n].requires_grad_()
        out = op(t["q"], t["k"], t["v"], **{n: t[n] for n in op.input_names})
        o = out[0] if isinstance(out, tuple) else out
        assert o.device.type == "cpu"
        (o.float() * _t(torch, dO).float()).sum().backward()
        got = {"dq": t["q"].grad, "dk": t["k"].grad, "dv": t["v"].grad, **{n: t[n].grad for n in learn}}
        got = {n: g.float().numpy().astype(np.float64) for n, g in got.items()}
        bad = [r.summary() for r in fuzz_bwd.compare_backward(v, arrays, dO, got, tuple(learn)) if not r.ok]
        assert not bad, f"{v.name}: " + "\n".join(bad)


def test_torch_refuses_grad_where_the_cpu_backward_cannot():
    torch = pytest.importorskip("torch")
    import attngen.torch as at

    v = load(EXAMPLES / "paged_decode_llama3.attn").get()
    op = at.register(v)
    arrays = workload.make_inputs(v, 1, 1, 32, np.random.default_rng(0))
    t = {n: _t(torch, a) for n, a in arrays.items()}
    with pytest.raises(ValueError, match="requires grad, but the CPU backward does not support this variant: `kv_cache paged`"):
        op(t["q"].requires_grad_(), t["k"], t["v"], **{n: t[n] for n in op.input_names})


def _t(torch, x):
    x = np.ascontiguousarray(x)
    if x.dtype.name == "bfloat16":
        return torch.from_numpy(x.view(np.int16)).view(torch.bfloat16).clone()
    return torch.from_numpy(x).clone()


def test_fuzz_backward_on_the_cpu_backend(tmp_path, capsys):
    from attngen.tools import cli, cmd_fuzz

    rc = cmd_fuzz.main([str(EXAMPLES / "t5_relative_bias.attn"), "--pass", "backward", "--device", "cpu", "--max-examples", "6",
                        "--seed", "2", "--out", str(tmp_path)])
    cap = capsys.readouterr()
    assert rc == 0, cap.err[-3000:]
    assert "t5_relative_bias (backward): 6" in cap.out and "on the CPU backend" in cap.out
    assert int(re.search(r"(\d+) kernel runs", cap.out).group(1)) == 6
    # A refused variant is a failure that says why, never a green run without kernels.
    rc = cmd_fuzz.main([str(EXAMPLES / "paged_decode_llama3.attn"), "--pass", "backward", "--device", "cpu", "--max-examples", "2",
                        "--out", str(tmp_path)])
    cap = capsys.readouterr()
    assert rc == 1 and "the backward kernels refuse this variant: `kv_cache paged`" in cap.err
    # attngen compile --target cpu --pass backward writes the backward source; a refusal is located.
    out = tmp_path / "bwd.cpp"
    assert cli.main(["compile", str(EXAMPLES / "t5_relative_bias.attn"), "--target", "cpu", "--pass", "backward", "-o", str(out)]) == 0
    text = out.read_text()
    assert "attngen_t5_relative_bias_cpu_bwd_launch" in text and "backward pass" in text and "grad_rel_table" in text
    assert cli.main(["compile", str(EXAMPLES / "paged_decode_llama3.attn"), "--target", "cpu", "--pass", "backward"]) == 1
    err = capsys.readouterr().err
    assert "paged_decode_llama3.attn:" in err and "kv_cache paged" in err and "Traceback" not in err


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["llama3_gqa_causal", "t5_relative_bias", "qwen3_qk_norm", "varlen_causal_training",
                                  "diff_transformer_subln"])
def test_cpu_and_cuda_backward_pass_the_same_reference(name):
    # On a GPU machine: the same drawn inputs through both backwards, each held to the float64
    # reference gradients under the same tolerances (`attngen fuzz --pass backward`'s comparison).
    from attngen.cpu.kernel import compile_cpu
    from attngen.runtime import kernel as runtime

    v = load(EXAMPLES / f"{name}.attn").get()
    arrays, dO = _inputs(v, 2, 70, 70, seed=9)
    wrt = fuzz_bwd.wrt_names(v)
    for kern in (compile_cpu(v), runtime.compile(v, family="forward")):
        got = fuzz_bwd.run_backward(kern, v, arrays, dO, wrt, False)
        bad = [r.summary() for r in fuzz_bwd.compare_backward(v, arrays, dO, got, wrt) if not r.ok]
        assert not bad, f"{getattr(kern, 'target', 'cuda')}: " + "\n".join(bad)
