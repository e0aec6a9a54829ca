"""The quantized gallery (examples/quant/) on the CPU backend: each checks (with a warning that no
CUDA kernel runs it yet), explains with its accuracy report, compiles for the CPU, and its kernel
computes what the reference computes (docs/QUANT.md's order); the CUDA target refuses it, located."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from attngen import backend
from attngen.check import fuzz_run, workload
from attngen.check.fuzz_cases import Case, case_inputs
from attngen.lang import frontend
from attngen.tools import cli

ROOT = Path(__file__).resolve().parents[2]
QUANT = sorted((ROOT / "examples" / "quant").glob("*.attn"))
SHAPES = {"fp8_paged_decode": (2, 3, 100), "whisper_preln_int8": (2, 40, 56)}


def test_the_quantized_gallery() -> None:
    assert [p.stem for p in QUANT] == ["fp8_paged_decode", "fp8_prefill", "sage_int8", "whisper_preln_int8"]


@pytest.mark.parametrize("path", QUANT, ids=[p.stem for p in QUANT])
def test_cpu_kernel_matches_the_reference(path: Path) -> None:
    v = frontend.load(str(path)).get()
    B, Lq, Lk = SHAPES.get(v.name, (1, 48, 48))
    arrays = workload.make_inputs(v, B, Lq, Lk, np.random.default_rng(5))
    kernel = backend.compile(v, device="cpu")
    out, lse = fuzz_run.run_kernel(kernel, v, arrays)
    reps = fuzz_run.compare(v, arrays, out, lse)
    assert all(r.ok for r in reps), [r.summary() for r in reps]
    # Stronger than the tolerance: the same quantized values and order give the same outputs
    # but for an output rounding (the products and softmax are double in both).
    q, k, vv, rest = fuzz_run.split_inputs(arrays)
    from attngen.check import reference

    ref, _ = reference.attention(v, q, k, vv, rest)
    d = np.abs(np.asarray(out, np.float64) - np.asarray(ref, np.float64))
    assert (d > 0).mean() < 1e-3, f"{int((d > 0).sum())} of {d.size} outputs differ"
    # A decode-step or any case the fuzzer draws takes the same path.
    arrays = case_inputs(v, Case(B=1, Lq=min(Lq, 7), Lk=Lk if v.kind.value == "cross" else min(Lq, 7), seed=2))
    out, lse = fuzz_run.run_kernel(kernel, v, arrays)
    assert all(r.ok for r in fuzz_run.compare(v, arrays, out, lse))


def test_cpu_kernel_refuses_wrong_scales() -> None:
    v = frontend.load(str(ROOT / "examples/quant/fp8_prefill.attn")).get()
    arrays = workload.make_inputs(v, 1, 16, 16, np.random.default_rng(0))
    q, k, vv, rest = fuzz_run.split_inputs(arrays)
    kernel = backend.compile(v, device="cpu")
    with pytest.raises(ValueError, match=r"k_scale: expected shape \(B=1, Hkv=8\) = \(1, 8\), got \(8,\)"):
        kernel(q, k, vv, **{**rest, "k_scale": rest["k_scale"][0]})
    with pytest.raises(ValueError, match=r"q: expected dtype float8_e4m3fn \(fp8_e4m3\), got bfloat16"):
        kernel(q.astype(np.float32).astype(__import__("ml_dtypes").bfloat16), k, vv, **rest)


# The gallery specs a CUDA kernel runs (docs/QUANT.md, "Where it runs"); sage_int8's FP8 P·V beside
# INT8 Q·Kᵀ has none yet.
CUDA_RUNS = {"fp8_prefill", "whisper_preln_int8", "fp8_paged_decode"}


@pytest.mark.parametrize("path", QUANT, ids=[p.stem for p in QUANT])
def test_check_explain_and_targets(path: Path, tmp_path: Path, capsys) -> None:
    cuda_runs = path.stem in CUDA_RUNS
    assert cli.main(["check", str(path)]) == 0
    assert ("has no CUDA kernel yet" in capsys.readouterr().err) != cuda_runs
    assert cli.main(["compile", str(path), "--target", "cpu", "-o", str(tmp_path / "k.cpp")]) == 0
    assert "ag_rq(" in (tmp_path / "k.cpp").read_text()  # the quantized kernel
    rc = cli.main(["compile", str(path), "-o", str(tmp_path / "k.cu")])
    err = capsys.readouterr().err
    if cuda_runs:  # the quantized forward (FP8, INT8 Q·Kᵀ) or the decode family's FP8 KV cache
        assert rc == 0 and (tmp_path / "k.cu").read_text().startswith("//")
    else:  # located, naming what no CUDA kernel takes
        assert rc != 0 and "the cuda target cannot run" in err
    assert cli.main(["explain", str(path)]) == 0
    text = capsys.readouterr().out
    assert "Accuracy against the unquantized float64 attention" in text and "0.1% channels x20" in text


def test_torch_op_on_cpu_takes_fp8_and_refuses_autograd() -> None:
    torch = pytest.importorskip("torch")
    import attngen.torch as at
    from attngen.check import reference
    from attngen.check.fuzz_device import to_host_cpu

    v = frontend.load(str(ROOT / "examples/quant/fp8_prefill.attn")).get()
    a = workload.make_inputs(v, 1, 24, 24, np.random.default_rng(2))

    def t(x):
        x = np.ascontiguousarray(x)
        if x.dtype.name == "bfloat16" or x.dtype.name.startswith("float8"):
            bits = np.int16 if x.dtype.itemsize == 2 else np.int8
            return torch.from_numpy(x.view(bits)).view(getattr(torch, x.dtype.name))
        return torch.from_numpy(x)

    ts = {n: t(x) for n, x in a.items()}
    op = at.register(v)
    rest = {n: ts[n] for n in op.input_names}
    o = op(ts["q"], ts["k"], ts["v"], **rest)
    ref, _ = reference.attention(v, a["q"], a["k"], a["v"], {n: a[n] for n in op.input_names})
    assert o.dtype == torch.bfloat16
    assert np.abs(to_host_cpu(o).astype(np.float64) - ref.astype(np.float64)).max() <= 2.0**-7 * np.abs(ref.astype(np.float64)).max()
    with pytest.raises(ValueError, match="q_scale requires grad, but the backward kernels do not support this variant: "
                                         "quantized attention has no backward kernels yet"):
        op(ts["q"], ts["k"], ts["v"], **{**rest, "q_scale": rest["q_scale"].clone().requires_grad_()})
