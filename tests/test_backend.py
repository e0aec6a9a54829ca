"""attngen.backend: the registry of backends and the protocol the command line and the runtime use.
Each adapter must give exactly what its backend's own functions give (the renders byte for byte),
and names outside the registry are refused with the names in it."""

from __future__ import annotations

from pathlib import Path

import pytest

import attngen
from attngen import backend
from attngen.plan.schedule import DEFAULT_ARCH, Arch
from attngen.plan.validate import load, resolve

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
LLAMA = EXAMPLES / "llama3_gqa_causal.attn"
PAGED = EXAMPLES / "paged_decode_llama3.attn"


def test_registry_holds_both_backends_behind_the_protocol():
    assert list(backend.BACKENDS) == ["cuda", "cpu"]
    for name, b in backend.BACKENDS.items():
        assert b.name == name and backend.get(name) is b
        for stage in ("targets", "unsupported", "render", "header", "load"):
            assert callable(getattr(b, stage)), (name, stage)
    assert backend.get("cuda").targets() == tuple(a.value for a in Arch) and "sm_90a" in backend.get("cuda").targets()
    assert backend.get("cpu").targets() == ()


def test_unknown_device_names_the_registered_ones():
    with pytest.raises(ValueError, match=r"device: expected 'cuda' or 'cpu', got 'tpu'"):
        backend.get("tpu")
    with pytest.raises(ValueError, match="'cuda' or 'cpu'"):
        attngen.compile(str(LLAMA), device="tpu")


def test_public_compile_is_the_dispatcher():
    assert attngen.compile is backend.compile
    from attngen.runtime import kernel

    with pytest.raises(ValueError, match=r"attngen\.compile\(\.\.\., device=\.\.\.\) picks the backend"):
        kernel.compile(str(LLAMA), device="cpu")


def test_cuda_adapter_renders_what_the_cuda_backend_renders():
    from attngen.cuda import render as render_cuda
    from attngen.cuda.header import render_decode_header, render_header
    from attngen.cuda.render_decode import render_decode

    cuda = backend.get("cuda")
    v = load(LLAMA).variants[0]
    assert cuda.unsupported(v) is None
    assert cuda.render(v, backend.Options()) == render_cuda.render_with_plan(v, DEFAULT_ARCH, prefix="attngen")[0]
    o80 = backend.Options(prefix="eng", arch="sm_80")
    assert cuda.render(v, o80) == render_cuda.render_with_plan(v, Arch.SM80, prefix="eng")[0]
    assert cuda.header(v, o80) == render_header(v, Arch.SM80, "eng")
    assert cuda.render(v, backend.Options(family="decode")) == render_decode(v, DEFAULT_ARCH, prefix="attngen")[0]
    paged = load(PAGED).variants[0]  # a paged cache runs on the decode family under "auto"
    assert cuda.render(paged, backend.Options()) == render_decode(paged, DEFAULT_ARCH, prefix="attngen")[0]
    assert cuda.header(paged, backend.Options()) == render_decode_header(paged, DEFAULT_ARCH, "attngen")


def test_cpu_adapter_renders_what_the_cpu_backend_renders():
    from attngen.cpu import render as render_cpu

    cpu = backend.get("cpu")
    v = load(LLAMA).variants[0]
    assert cpu.unsupported(v) == render_cpu.unsupported(v)
    assert cpu.render(v, backend.Options(prefix="eng")) == render_cpu.render(v, "eng")
    assert cpu.header(v, backend.Options()) == render_cpu.render_header(v)


def test_cpu_refuses_the_gpu_choices():
    with pytest.raises(ValueError, match="arch, family and softmax choose GPU kernels"):
        attngen.compile(str(LLAMA), device="cpu", arch="sm_80")


def test_resolve_reads_every_spec_form():
    prog = load(LLAMA)
    v = prog.variants[0]
    text = LLAMA.read_text(encoding="utf-8")
    assert resolve(v) is v
    assert resolve(prog) == v == resolve(LLAMA) == resolve(str(LLAMA)) == resolve(text)
