"""A paged cache's lengths in the decode family: the rendered kernel bounds each row by
cache_lens[b] (no chunk past it, no block-table entry past it, the last chunk masked) and aligns
`causal` to the row's own end; the generated mask and tile classification, run on the host with
g++, agree with the reference element by element; nvcc compiles it without spills.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from attngen.check import reference, workload
from attngen.cuda import compile as compile_cuda
from attngen.cuda.emit import INT_UNKNOWN, ElementEmitter, IntervalEmitter, tensor_ctype
from attngen.cuda.render import _environment, _tensor_ctx
from attngen.cuda.render_decode import decode_fields, render_decode
from attngen.ir import abi, names
from attngen.ir.nodes import SizeSym
from attngen.lang import frontend
from attngen.plan.schedule import Arch

ROOT = Path(__file__).resolve().parents[2]
SPEC = """
attention draft {
  dtype bf16
  head_dim 128
  heads 8 kv 2
  kind cross
  kv_cache paged(16)
  mask causal
  output lse
}
"""


def _v(text: str = SPEC):
    return frontend.loads(text, "<test>").get()


def test_cache_lens_is_an_ordinary_runtime_input_field() -> None:
    """The lengths travel as any runtime input does (pointer, size, stride; after block_table):
    no special case in the binder."""
    fields = [f.name for f in decode_fields(_v())]
    tail = [names.input_field("block_table"), "in_block_table_n0", "in_block_table_n1", "in_block_table_s0",
            "in_block_table_s1", names.input_field("cache_lens"), "in_cache_lens_n0", "in_cache_lens_s0"]
    assert fields[-len(tail):] == tail


def test_render_bounds_each_row_by_its_length() -> None:
    src, _ = render_decode(_v())
    loader = names.input_loader("cache_lens")
    assert f"const int kv_len = min({loader}(p, b), p.Lk);" in src
    assert "c_end = min(c_end, (kv_len + CHUNK - 1) / CHUNK);" in src
    assert "pages[t] = kv < kv_len ? ag_ld_block_table(p, b, kv / PAGE) : -1;" in src
    assert src.count("ag_chunk_pages(p, b, fetch * CHUNK, kv_len, tid, pages)") == 3  # each lookup: D128 prefetches
    mask = src[src.index("__device__ __forceinline__ bool ag_mask("):]
    mask = mask[: mask.index("}")]
    assert mask.count(loader) == 2  # the aligned causal bound and the length bound
    assert "// ---- mask: causal && kv < cache_lens[b]" in src
    assert "p.Lk_total" not in mask  # aligned to the row's end, not the capacity


def test_contiguous_decode_keeps_the_capacity_alignment() -> None:
    src, _ = render_decode(_v(SPEC.replace("  kv_cache paged(16)\n", "")))
    assert "kv_len" not in src and "cache_lens" not in src
    assert "c_end = min(c_end, (p.Lk + CHUNK - 1) / CHUNK);" in src


def _host_program(v, data: dict, Lq: int, Lk: int, tiles: list[tuple[int, int, int, int, int]]) -> str:
    """The decode kernel's ag_mask and ag_classify (the render's emitters over v.visibility()) and
    its lookups, compiled for the host: prints each tile's class and its visibility bits."""
    consts = {SizeSym.H: v.heads, SizeSym.HKV: v.kv_heads, SizeSym.D: v.head_dim, SizeSym.DV: v.value_head_dim}
    decls = {d.name: d for d in v.runtime_inputs()}
    mask = v.visibility()
    el = ElementEmitter(consts, fast_math=False).emit(mask)
    lines, res = IntervalEmitter(consts, decls).classify(mask)
    env = _environment()
    helpers = env.get_template("common/_helpers.cu.j2").render(int_unknown=INT_UNKNOWN)
    lookups = env.get_template("common/_lookups.cu.j2").render(tensors=_tensor_ctx(v))
    fields = ["int B;", "int Lq;", "int Lk;", "int q_offset;", "int kv_offset;", "int Lq_total;", "int Lk_total;"]
    B = data["cache_lens"].shape[0]
    init = [str(B), str(Lq), str(Lk), "0", "0", str(Lq), str(Lk)]
    arrays = []
    for name, d in decls.items():
        a = np.ascontiguousarray(data[name])
        arrays.append(f"static const {tensor_ctype(d.dtype)} data_{name}[] = {{{', '.join(str(int(x)) for x in a.ravel())}}};")
        fields.append(f"const {tensor_ctype(d.dtype)}* {names.input_field(name)};")
        init.append(f"data_{name}")
        fields += [f"int {names.input_size_field(name, i)};" for i in range(a.ndim)]
        init += [str(n) for n in a.shape]
        fields += [f"long long {names.input_stride_field(name, i)};" for i in range(a.ndim)]
        init += [str(s // a.itemsize) for s in a.strides]
    body = "\n  ".join(lines)
    tile_rows = ", ".join("{" + ", ".join(map(str, t)) + "}" for t in tiles)
    return f"""
#define AG_HOST_TEST 1
#include <cmath>
#include <cstdio>
#include <algorithm>
using std::min; using std::max; using std::abs;
#define __device__
#define __host__
#define __forceinline__ inline
#ifndef INFINITY
#define INFINITY HUGE_VALF
#endif
struct Params {{ {' '.join(fields)} }};
{helpers}
{lookups}
{chr(10).join(arrays)}
bool ag_mask(const Params& p, int b, int h, int q, int kv) {{ (void)h; return {el}; }}
int ag_classify(const Params& p, int b, int h, int q0, int q1, int k0, int k1) {{
  (void)p; (void)b; (void)h; (void)q0; (void)q1; (void)k0; (void)k1;
  {body}
  return {res};
}}
static const int tiles[][5] = {{{tile_rows}}};
int main() {{
  const Params p = {{ {', '.join(init)} }};
  for (const auto& T : tiles) {{
    std::printf("%d ", ag_classify(p, T[0], 0, T[1], T[2], T[3], T[4]));
    for (int q = T[1]; q <= T[2]; ++q) for (int kv = T[3]; kv <= T[4]; ++kv) std::putchar(ag_mask(p, T[0], 0, q, kv) ? '1' : '0');
    std::putchar('\\n');
  }}
  return 0;
}}
"""


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not on the PATH")
@pytest.mark.parametrize("mask", ["causal", "window(5, 0)", "kv >= cache_lens[b] - 9", "true"])
def test_generated_mask_and_classification_match_the_reference(tmp_path: Path, mask: str) -> None:
    """Speculative drafts (Lq 1 to 5) over rows of mixed lengths, including only-the-draft and
    full rows: every tile's class is sound (0: nothing visible, 2: all visible) and every element
    agrees with the reference; the chunks past a row's length classify as skipped."""
    text = SPEC.replace("mask causal", f"mask {mask}") if mask != "true" else SPEC.replace("  mask causal\n", "")
    v = _v(text)
    rng = np.random.default_rng(len(mask))
    seen = {0: 0, 1: 0, 2: 0}
    for Lq in (1, 4, 5):
        a = workload.make_inputs(v, 5, Lq, 80, rng)
        Lk = a["block_table"].shape[1] * 16
        a["cache_lens"][1] = Lq + 1
        data = {n: a[n] for n in ("block_table", "cache_lens")}
        tiles = [(b, 0, Lq - 1, k0, min(k0 + 15, Lk - 1)) for b in range(5) for k0 in range(0, Lk, 16)]
        for _ in range(40):
            q0 = int(rng.integers(0, Lq))
            k0 = int(rng.integers(0, Lk))
            tiles.append((int(rng.integers(0, 5)), q0, int(rng.integers(q0, Lq)), k0, int(rng.integers(k0, Lk))))
        (tmp_path / "h.cpp").write_text(_host_program(v, data, Lq, Lk, tiles))
        r = subprocess.run(["g++", "-std=c++17", "-O0", "-w", "h.cpp", "-o", "h"], cwd=tmp_path, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr[:4000]
        out = subprocess.run([str(tmp_path / "h")], capture_output=True, text=True, check=True).stdout.splitlines()
        sizes = abi.Sizes(5, Lq, Lk, (("max_pages", Lk // 16),))
        ref = reference.mask_matrix(v, sizes, data, h=0)
        for (b, q0, q1, k0, k1), line in zip(tiles, out, strict=True):
            cls_s, bits = line.split(" ")
            cls = int(cls_s)
            seen[cls] += 1
            want = ref[b, q0:q1 + 1, k0:k1 + 1].ravel()
            where = f"{mask}: Lq={Lq} b={b} len={data['cache_lens'][b]} q=[{q0},{q1}] kv=[{k0},{k1}]"
            assert np.array_equal(np.array([c == "1" for c in bits]), want), where
            assert cls != 2 or want.all(), where
            assert cls != 0 or not want.any(), where
            if k0 >= data["cache_lens"][b]:
                assert cls == 0, f"{where}: keys past the row's length must classify as skipped"
    assert seen[0] and seen[1], seen


@pytest.mark.nvcc
@pytest.mark.parametrize("text,arch", [
    (SPEC, Arch.SM80), (SPEC, Arch.SM90A),
    (SPEC.replace("head_dim 128", "head_dim 256").replace("paged(16)", "paged(8)").replace("  mask causal\n", ""), Arch.SM90A),
], ids=["d128_sm80", "d128_sm90a", "d256_page8_nomask_sm90a"])
def test_paged_lengths_compile_without_spills(text: str, arch: Arch) -> None:
    """ptxas (-v) on the split and combine kernels: no spills or stack, at most 255 registers (two
    CTAs an SM at 128 threads)."""
    src, dp = render_decode(_v(text), arch)
    res = {r.kernel: r for r in compile_cuda.resources(src, arch)}
    assert set(res) == {k.name for k in dp.kernels}
    for r in res.values():
        assert r.spill_stores == 0 and r.spill_loads == 0 and r.stack_bytes == 0, r
    assert res[dp.kernel_name].registers <= 255
