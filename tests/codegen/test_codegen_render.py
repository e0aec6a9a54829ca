"""Rendering (CPU only): every example variant renders, deterministically, self-describing, and
with nothing in the source that the front end did not validate."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest
from _codegen_util import EXAMPLES, ROOT, VARIANT_IDS, VARIANTS, variant

from attngen import __version__
from attngen.cuda import render as render_cuda
from attngen.lang.frontend import loads, print_program
from attngen.ir.nodes import Program
from attngen.plan.schedule import Arch

ARCHS = [Arch.SM80, Arch.SM90A]


def test_gallery_has_variants():
    assert len(EXAMPLES) >= 14 and len(VARIANTS) >= len(EXAMPLES)


@pytest.mark.parametrize("arch", ARCHS, ids=[a.value for a in ARCHS])
@pytest.mark.parametrize("path,name", VARIANTS, ids=VARIANT_IDS)
def test_renders_deterministically(path, name, arch):
    v = variant(path, name)
    a = render_cuda.render(v, arch)
    b = render_cuda.render(v, arch)
    assert a == b
    assert isinstance(a, str) and a.endswith("\n")
    # A freshly loaded copy of the spec, from another path, gives the same bytes too.
    again = loads(path.read_text(encoding="utf-8"), "elsewhere/copy.attn").get(name)
    assert render_cuda.render(again, arch) == a


@pytest.mark.parametrize("path,name", VARIANTS, ids=VARIANT_IDS)
def test_header_comment_holds_spec_and_kernel_name(path, name):
    v = variant(path, name)
    src, kp = render_cuda.render_with_plan(v)
    assert kp.kernel_name == f"attngen_{name}"
    head = []
    for line in src.splitlines():
        if not line.startswith("//"):
            break
        head.append(line)
    header = "\n".join(head)
    assert head, "the source should open with a header comment"
    assert f"attngen {__version__}" in header
    spec = print_program(Program((v,)))
    for line in spec.rstrip("\n").splitlines():
        if line.strip():
            assert f"//   {line}" in head, f"spec line {line!r} missing from the header comment"
    assert kp.kernel_name in header
    # Every ABI field is listed, in order, in the header.
    positions = [header.index(f" {f.name}: ") for f in kp.fields]
    assert positions == sorted(positions)
    # and the source defines the kernel and the launcher under that name.
    assert f"{kp.kernel_name}(" in src
    assert f'extern "C" cudaError_t {kp.kernel_name}_launch(' in src


def _forbidden_strings() -> list[str]:
    out = {str(ROOT), str(Path.cwd()), os.path.expanduser("~"), "/home/", "/tmp/", "/work/", "/usr/", "C:\\"}
    return sorted(s for s in out if s and s not in ("/",))


_DATE = re.compile(r"\b(19|20)\d\d-\d\d-\d\d\b|\b\d\d:\d\d:\d\d\b|\b(Mon|Tue|Wed|Thu|Fri|Sat|Sun) (Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)\b")


@pytest.mark.parametrize("path,name", VARIANTS, ids=VARIANT_IDS)
def test_no_paths_or_timestamps(path, name):
    src = render_cuda.render(variant(path, name))
    for s in _forbidden_strings():
        assert s not in src, f"the source mentions {s!r}"
    assert path.name not in src and str(path.parent) not in src
    m = _DATE.search(src)
    assert m is None, f"looks like a timestamp: {m.group(0)!r}"


def test_cu_does_not_depend_on_cwd(tmp_path, monkeypatch):
    p, name = VARIANTS[0]
    a = render_cuda.render(variant(p, name))
    copy = tmp_path / "spec.attn"
    shutil.copy(p, copy)
    monkeypatch.chdir(tmp_path)
    from attngen.lang.frontend import load

    assert render_cuda.render(load(str(copy)).get(name)) == a


EVIL = """\
# */ #include "/etc/passwd"  -- comments never reach the output
attention v1 {
  dtype fp16
  head_dim 64
  heads 4
  input evil: fp32[H, Lk]
  input evil_len: i32[B]
  mask kv < evil_len[b]
  score s + evil[h, kv]
}
"""


def _code_only(src: str) -> str:
    """The source without // comments (string literals in the template hold no identifiers)."""
    return "\n".join(line.split("//", 1)[0] for line in src.splitlines())


def test_user_identifiers_only_as_prefixed_names():
    v = loads(EVIL, "evil.attn").get("v1")
    src = render_cuda.render(v)
    assert "/etc/passwd" not in src and "*/" not in src
    code = _code_only(src)
    tokens = set(re.findall(r"\w*evil\w*", code))
    assert tokens, "the inputs should appear in the code"
    ok = re.compile(r"(in_evil(_len)?(_[ns]\d+)?|ag_ld_evil(_len)?)")
    bad = sorted(t for t in tokens if not ok.fullmatch(t))
    assert not bad, f"user identifiers outside in_*/ag_ld_*: {bad}"
    # The variant name only as attngen_v1 / attngen_v1_impl / attngen_v1_launch, the workspace
    # functions and the launcher's TMA descriptor helper (the driver's versioned typedef matches
    # the pattern too).
    assert set(re.findall(r"\w*\bv1\w*|\w+_v1\w*", code)) <= {
        "attngen_v1", "attngen_v1_impl", "attngen_v1_launch", "attngen_v1_workspace_bytes", "attngen_v1_bind_workspace",
        "attngen_v1_tmap", "PFN_cuTensorMapEncodeTiled_v12000"}
    # In comments, user text sits on // lines only (no block comment it could close).
    assert "/*" not in src


@pytest.mark.parametrize(
    "bad",
    ["input ev*/il: fp32[H]", "input ev\nil: fp32[H]", 'input "evil": fp32[H]', "input evil; int x: fp32[H]"],
)
def test_unvalidated_names_are_rejected(bad):
    from attngen.lang.diagnostics import SpecError

    text = EVIL.replace("input evil: fp32[H, Lk]", bad)
    with pytest.raises(SpecError):
        loads(text, "bad.attn")


def test_fp32_path_copies_tiles_asynchronously_and_drains_before_the_combine():
    # One round trip a tile: cp.async with zero-fill. With no visible tile the Q copies may still
    # be in flight, so the cross-warp combine (which reuses Q's and K/V's shared memory) starts only
    # after every thread drained its groups and the block met at a barrier.
    v = loads("attention s { dtype fp32; head_dim 64; heads 8; mask padding }").variants[0]
    src = render_cuda.render(v, Arch.SM80)
    body = src[src.index("void attention_tile("):]
    assert "cp.async.cg.shared.global" in src and "float4 v = make_float4" not in src
    loop = body[body.index("while (cur < n_tiles)"):body.index("cls = ncls;")]
    after = body[body.index("cls = ncls;"):]
    assert after.index("ag_cp_async_wait<0>();") < after.index("__syncthreads();") < after.index("float* dst = sc +")
    # Each warp copies and reads only its own key slice: the main loop has no block-wide barrier.
    assert "__syncthreads" not in loop and loop.count("__syncwarp();") >= 4
    # A token-scope q norm normalises Q in place once every thread's part of it has landed, under
    # the K/V copies, and before the key loop.
    v = loads("attention s { dtype fp32; head_dim 64; heads 8; layout bshd; norm q rmsnorm(1e-6) scope token }").variants[0]
    body = render_cuda.render(v, Arch.SM80)
    body = body[body.index("void attention_tile("):]
    q_wait = body.index("ag_cp_async_wait<2>();")
    assert (body.index("ag_copy_rows_f32<KW, DV") < q_wait < body.index("__syncthreads();", q_wait)
            < body.index("ag_token_norm_q<float>(") < body.index("while (cur < n_tiles)"))