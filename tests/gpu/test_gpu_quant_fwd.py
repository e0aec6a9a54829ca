"""The quantized forward kernels (backends/cuda/fwd/_mma_q8.cu.j2: FP8 from sm_89, INT8 Q·Kᵀ from sm_80; on
sm_90a FP8 Q·Kᵀ + FP8 P·V at head dim 128 on the wgmma engine, fwd/_wgmma_q8.cu.j2) on the GPU against the quantized
NumPy reference (attngen.check.quant): non-zero N(0,1) inputs, plain and with outlier channels,
dense and causal, GQA, odd lengths; P quantized or not, V stored fp8 or bf16; per-tensor and
per-head descales; the torch op (eager, torch.compile, a CUDA graph) and its refusals. The bound of
P's quantization against the running max is docs/QUANT.md's; the accuracy bar (kernel error against
the float64 unquantized truth at most 1.1x the emulation's) is attngen.check.quant_accuracy's."""

from __future__ import annotations

import numpy as np
import pytest

from attngen.check import quant_accuracy, reference
from attngen.ir.nodes import QuantOperand
from attngen.lang import frontend

torch = pytest.importorskip("torch", reason="the quantized forward GPU tests need torch")

pytestmark = pytest.mark.gpu

# u_p and δ_p·c of docs/QUANT.md ("What a flash kernel does differently")
P_TERMS = {"fp8_e4m3": (2.0 ** -4, 2.0 ** -10), "fp8_e5m2": (2.0 ** -3, 2.0 ** -17)}


@pytest.fixture(scope="module", autouse=True)
def _fp8_device():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    major, minor = torch.cuda.get_device_capability()
    if major * 10 + minor < 80:
        pytest.skip(f"INT8 tensor cores need sm_80 or newer, the device is {major}.{minor}")


def _needs(name: str) -> None:
    major, minor = torch.cuda.get_device_capability()
    if not name.startswith("sage") and major * 10 + minor < 89:
        pytest.skip(f"FP8 tensor cores need sm_89 or newer, the device is {major}.{minor}")


def spec(name: str, *, D: int = 128, H: int = 8, Hkv: int = 2, layout: str = "bshd", mask: str = "causal",
         stored: str = "dtype fp8_e4m3 out bf16", per: str = "head", v_per: str | None = None, p: str | None = "fp8_e4m3 static(448.0)",
         qk: str = "fp8_e4m3", kind: str = "cross", extra: str = "") -> str:
    lines = [f"attention {name} {{", f"  {stored}", f"  head_dim {D}", f"  heads {H} kv {Hkv}", f"  kind {kind}",
             f"  layout {layout}", *([f"  mask {mask}"] if mask else []), f"  quant q {qk} input per {per}", f"  quant k {qk} input per {per}"]
    if v_per is not None:
        lines.append(f"  quant v fp8_e4m3 input per {v_per}")
    if p is not None:
        lines.append(f"  quant p {p}")
    if extra:
        lines.append(f"  {extra}")
    return "\n".join(lines + ["}", ""])


CASES = {
    # FA3-style: e4m3 Q/K/V per (batch, kv head), FP8 P·V
    "fp8_pv": spec("fp8_pv", v_per="head"),
    # the FP8 wgmma engine's other side on sm_90a (plan.quant_fwd.wgmma_q8): dense, per-tensor V, the LSE
    "fp8_pv_dense_d128": spec("fp8_pv_dense_d128", H=4, Hkv=4, mask="", layout="bhsd", v_per="tensor", extra="output lse"),
    "fp8_pv_dense_d64": spec("fp8_pv_dense_d64", D=64, H=4, Hkv=4, mask="", layout="bhsd", v_per="tensor"),
    # V stored fp8, P·V in bf16 (V dequantized a tile at a time)
    "fp8_vdeq": spec("fp8_vdeq", v_per="head", p=None, extra="output lse"),
    # Q·Kᵀ only: V stored bf16
    "fp8_qk": spec("fp8_qk", stored="dtype bf16 q fp8_e4m3 k fp8_e4m3", p=None, per="tensor", mask=""),
    # e5m2 P with e5m2 V, fp16 output, a score modification
    "fp8_e5m2": spec("fp8_e5m2", stored="dtype fp16 q fp8_e4m3 k fp8_e4m3 v fp8_e5m2", D=64, H=4, Hkv=1,
                     v_per="tensor", p="fp8_e5m2 static(57344.0)", extra="score softcap(30.0)").replace(
                         "quant v fp8_e4m3", "quant v fp8_e5m2"),
    # Sage-style INT8 Q·Kᵀ (sm_80+): q and k quantized in the prep kernels, P·V in the output's type
    "sage_token": "attention sage_token {\n  dtype bf16\n  head_dim 128\n  heads 8 kv 2\n  kind cross\n  layout bshd\n"
                  "  mask causal\n  quant q i8 amax per token\n  quant k i8 amax per token\n}\n",
    "sage_block": "attention sage_block {\n  dtype fp16\n  head_dim 64\n  heads 4\n  kind cross\n  layout bhsd\n  output lse\n"
                  "  quant q i8 amax per block(64)\n  quant k i8 amax per block(32)\n}\n",
    # SageAttention's recipe: K smoothed by its mean over the keys, then per-block scales
    "sage_smooth": "attention sage_smooth {\n  dtype bf16\n  head_dim 128\n  heads 8 kv 2\n  kind cross\n  layout bshd\n"
                   "  mask causal\n  quant q i8 amax per token\n  quant k i8 amax per block(64) smooth mean\n}\n",
    # the seed pre-LN INT8 cross attention: the token-scope layernorm fused into q's quantization, residual
    "sage_preln": "attention sage_preln {\n  dtype bf16\n  head_dim 64\n  heads 16\n  kind cross\n  layout bshd\n"
                  "  norm q layernorm(1e-5) scope token\n  residual\n  quant q i8 amax per token\n  quant k i8 amax per token\n}\n",
}
SHAPES = [(2, 1000, 1000), (1, 77, 333), (3, 129, 64), (1, 1, 1)]


def _variant(name: str):
    return frontend.loads(CASES[name], "<quant-gpu>").get(name)


def to_torch(a: np.ndarray) -> "torch.Tensor":
    """A NumPy array (ml_dtypes fp8 / bf16 included) as a CUDA tensor of the same type and bits."""
    name = a.dtype.name
    if name in ("float8_e4m3fn", "float8_e5m2", "bfloat16"):
        t = torch.from_numpy(np.ascontiguousarray(a).view(np.int16 if name == "bfloat16" else np.uint8))
        return t.view(getattr(torch, name)).cuda()
    return torch.from_numpy(np.ascontiguousarray(a)).cuda()


def _bound(v, vd: np.ndarray, lk: int) -> float:
    qp = v.quant(QuantOperand.P)
    if qp is None:
        return 0.0
    u, d = P_TERMS[qp.dtype.value]
    return 2.0 * float(np.abs(vd).max()) * (u + d / qp.static * lk)


def _run(v, call):
    import attngen

    kern = attngen.compile(v)
    rest = {n: to_torch(a) for n, a in call.items() if n not in ("q", "k", "v")}
    res = kern(to_torch(call["q"]), to_torch(call["k"]), to_torch(call["v"]), **rest)
    o, lse = res if v.lse else (res, None)
    torch.cuda.synchronize()
    return o.float().cpu().numpy().astype(np.float64), (None if lse is None else lse.cpu().numpy())


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("outliers", [False, True], ids=["plain", "outliers"])
def test_kernel_matches_quantized_reference(name, shape, outliers):
    from attngen.check import reference_eval as E
    from attngen.check.quant import dense_operands

    _needs(name)
    v = _variant(name)
    B, Lq, Lk = shape
    call = quant_accuracy.quantized_call(v, quant_accuracy.inputs(v, B, Lq, Lk, seed=11, outliers=outliers))
    rest = {n: a for n, a in call.items() if n not in ("q", "k", "v")}
    o_ref, lse_ref = reference.attention(v, call["q"], call["k"], call["v"], rest)
    o_ref = np.asarray(o_ref, np.float64)
    o, lse = _run(v, call)
    assert np.isfinite(o).all()
    vd = dense_operands(v, call["q"], call["k"], call["v"], E.prepare_tensors(v, rest))[2]
    tol = 4 * 2.0 ** -8 * float(np.abs(o_ref).max()) + _bound(v, vd, Lk)
    err = float(np.abs(o - o_ref).max())
    assert err <= tol, f"{name} {shape}: max |O - O_ref| {err:.3g} > {tol:.3g}"
    if v.quant(QuantOperand.P) is None:  # P in the output's type: the full-precision kernel's roundings only
        assert quant_accuracy.error(o, o_ref).rel_l2 < 5e-3
    if lse is not None:
        assert np.allclose(lse, lse_ref, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("outliers", [False, True], ids=["plain", "outliers"])
def test_kernel_within_the_accuracy_bar(name, outliers):
    """Against the float64 unquantized truth, the kernel's error is at most 1.1x the emulation's
    (attngen.check.quant_accuracy.within_bar): the kernel adds nothing beyond the declared quantization."""
    v = _variant(name)
    arrays = quant_accuracy.inputs(v, 1, 512, 512, seed=5, outliers=outliers)
    call = quant_accuracy.quantized_call(v, arrays)
    rest = {n: a for n, a in call.items() if n not in ("q", "k", "v")}
    emu, _ = reference.attention(v, call["q"], call["k"], call["v"], rest)
    o, _ = _run(v, call)
    ok, ke, ee = quant_accuracy.within_bar(o, quant_accuracy.truth(v, arrays), np.asarray(emu, np.float64))
    assert ok, f"{name}: kernel {ke.text()} vs emulation {ee.text()}"


def test_binder_refuses_wrong_types_and_scales():
    import attngen

    _needs("fp8_pv")
    v = _variant("fp8_pv")
    call = quant_accuracy.quantized_call(v, quant_accuracy.inputs(v, 1, 64, 64, seed=1))
    kern = attngen.compile(v)
    q, k, vv = (to_torch(call[n]) for n in ("q", "k", "v"))
    scales = {n: to_torch(call[n]) for n in ("q_scale", "k_scale", "v_scale")}
    with pytest.raises(ValueError, match="q: expected dtype float8_e4m3fn"):
        kern(q.to(torch.bfloat16), k, vv, **scales)
    with pytest.raises(ValueError, match="k_scale"):
        kern(q, k, vv, **{**scales, "k_scale": scales["k_scale"][:, :1].contiguous()})
    with pytest.raises(ValueError, match="v_scale"):
        kern(q, k, vv, **{**scales, "v_scale": scales["v_scale"].double()})


def test_torch_op_eager_compiled_graph_and_no_autograd():
    import attngen.runtime.torch as at

    _needs("fp8_pv")
    v = _variant("fp8_pv")
    call = quant_accuracy.quantized_call(v, quant_accuracy.inputs(v, 2, 300, 300, seed=2))
    q, k, vv = (to_torch(call[n]) for n in ("q", "k", "v"))
    scales = {n: to_torch(call[n]) for n in ("q_scale", "k_scale", "v_scale")}
    op = at.register(CASES["fp8_pv"])
    eager = op(q, k, vv, **scales)
    o_ref, _ = reference.attention(v, call["q"], call["k"], call["v"], {n: call[n] for n in scales})
    assert quant_accuracy.error(eager.float().cpu().numpy(), np.asarray(o_ref, np.float64)).rel_l2 < 2e-2
    torch._dynamo.reset()
    f = torch.compile(lambda q, k, v, a, b, c: op(q, k, v, q_scale=a, k_scale=b, v_scale=c), fullgraph=True)
    assert torch.equal(f(q, k, vv, scales["q_scale"], scales["k_scale"], scales["v_scale"]), eager)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        op(q, k, vv, **scales)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = op(q, k, vv, **scales)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager)
    with pytest.raises(ValueError, match="backward"):
        op(q, k, vv, **{**scales, "q_scale": scales["q_scale"].clone().requires_grad_()})


def test_int8_prep_workspaces_through_the_torch_op():
    """INT8 Q·Kᵀ's prep workspaces come from the pool in eager calls and in a CUDA graph."""
    import attngen.runtime.torch as at

    v = _variant("sage_token")
    call = quant_accuracy.quantized_call(v, quant_accuracy.inputs(v, 2, 200, 300, seed=4))
    q, k, vv = (to_torch(call[n]) for n in ("q", "k", "v"))
    op = at.register(CASES["sage_token"])
    eager = op(q, k, vv)
    o_ref, _ = reference.attention(v, call["q"], call["k"], call["v"], {})
    assert quant_accuracy.error(eager.float().cpu().numpy(), np.asarray(o_ref, np.float64)).rel_l2 < 1e-2
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        op(q, k, vv)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = op(q, k, vv)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager)


@pytest.mark.parametrize("name", ["fp8_pv", "fp8_pv_dense_d128", "fp8_pv_dense_d64"])
def test_sm90a_runs_fp8_on_the_wgmma_engine(name):
    """On an sm_90a device FP8 Q·Kᵀ + FP8 P·V at head dims 64 and 128 runs on the wgmma engine, V^T written
    by its prep kernel first (plan.quant_fwd.wgmma_q8), and matches the reference: causal with GQA
    and dense, at lengths that are no multiple of its 128 x 128 tile, and at one query and key."""
    import attngen
    from attngen.plan.schedule import Engine

    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the FP8 wgmma engine runs on sm_90a")
    v = _variant(name)
    kern = attngen.compile(v)
    assert kern.plan.engine == Engine.WGMMA and [pr.func for pr in kern.plan.preps] == ["ag_prep_vt"]
    for B, Lq, Lk in ((1, 1, 1), (2, 300, 700), (1, 129, 1), (1, 2048, 2048)):
        call = quant_accuracy.quantized_call(v, quant_accuracy.inputs(v, B, Lq, Lk, seed=13))
        rest = {n: a for n, a in call.items() if n not in ("q", "k", "v")}
        o_ref, lse_ref = reference.attention(v, call["q"], call["k"], call["v"], rest)
        o, lse = _run(v, call)
        assert np.isfinite(o).all()
        assert quant_accuracy.error(o, np.asarray(o_ref, np.float64)).rel_l2 < 3e-2, (name, B, Lq, Lk)
        if lse is not None:
            assert np.allclose(lse, lse_ref, rtol=1e-3, atol=1e-3)
