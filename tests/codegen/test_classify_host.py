"""The generated C++ mask code, run on the host: tile classification is never wrong and the
per-element mask agrees with the NumPy reference.

The CUDA kernel skips tiles classified NEVER and drops per-element checks in tiles classified
ALWAYS, so a wrong classification is a silently wrong answer. Here the exact C++ that the kernel
template splices in (`ag_classify`, `ag_mask`, the lookups and the integer/interval helpers) is
compiled with g++ for random masks (builtins and random expression trees over sorted and unsorted
tensors) and run over random tiles; the program prints each tile's class and visibility, and the
test checks them against `attngen.reference.evaluate`.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "reference"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ir"))
from _irb import add, cf, ci, cmp, h, kv, load, mul, q, sub  # noqa: E402
from test_intervals import H_, B_, bool_expr, brute, make_data, the_variant  # noqa: E402

from attngen.ir.nodes import DType, ScalarType, SizeSym  # noqa: E402
from attngen.cuda.emit import INT_UNKNOWN, ElementEmitter, IntervalEmitter, tensor_ctype  # noqa: E402
from attngen.cuda.render import _environment, _tensor_ctx  # noqa: E402


def _tensor_ctx_of(decls):
    """The lookups' template context for a set of declarations (the renderer's, per variant)."""
    import dataclasses

    from attngen.ir.nodes import TRUE

    carrier = dataclasses.replace(the_variant(TRUE), inputs=tuple(decls))
    return _tensor_ctx(carrier)

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not on the PATH")

N_MASKS = 30
TILES_PER_MASK = 60


def _program(masks, Lq: int, Lk: int, data: dict, symbols: dict, tiles, offsets: tuple[int, int] = (0, 0)) -> str:
    """Lq, Lk are the global lengths; the launch's local rows start at `offsets` (q, kv)."""
    decls = {}
    for m in masks:  # padding implies q_lens/kv_lens only for the masks that use it
        decls.update({d.name: d for d in the_variant(m).runtime_inputs()})
    env = _environment()
    helpers = env.get_template("common/_helpers.cu.j2").render(int_unknown=INT_UNKNOWN)
    lookups = env.get_template("common/_lookups.cu.j2").render(tensors=_tensor_ctx_of(decls.values()))
    qo, ko = offsets
    fields = ["int B;", "int Lq;", "int Lk;", "int q_offset;", "int kv_offset;", "int Lq_total;", "int Lk_total;"]
    init = [str(B_), str(Lq - qo), str(Lk - ko), str(qo), str(ko), str(Lq), str(Lk)]
    arrays = []
    for name, d in decls.items():
        a = np.ascontiguousarray(data[name])
        ctype = tensor_ctype(d.dtype)
        values = ", ".join(repr(float(x)) + "f" if d.dtype == DType.FP32 else str(int(x)) for x in a.ravel())
        arrays.append(f"static const {ctype} data_{name}[] = {{{values}}};")
        fields.append(f"const {ctype}* in_{name};")
        init.append(f"data_{name}")
        for i in range(a.ndim):
            fields.append(f"int in_{name}_n{i};")
            init.append(str(a.shape[i]))
        for i in range(a.ndim):
            fields.append(f"long long in_{name}_s{i};")
            init.append(str(a.strides[i] // a.itemsize))
    consts = {SizeSym.H: H_, SizeSym.HKV: H_, SizeSym.D: 16, SizeSym.DV: 16}
    funcs = []
    for i, m in enumerate(masks):
        el = ElementEmitter(consts, fast_math=False).emit(m)
        lines, res = IntervalEmitter(consts, decls).classify(m)
        body = "\n  ".join(lines)
        funcs.append(
            f"bool mask_{i}(const Params& p, int b, int h, int q, int kv) {{ (void)p; (void)b; (void)h; (void)q; (void)kv; return {el}; }}\n"
            f"int classify_{i}(const Params& p, int b, int h, int q0, int q1, int k0, int k1) {{\n"
            f"  (void)p; (void)b; (void)h; (void)q0; (void)q1; (void)k0; (void)k1;\n  {body}\n  return {res};\n}}"
        )
    calls = "\n".join(
        f"  for (int t = 0; t < {len(tiles[i])}; ++t) {{ const int* T = tiles_{i}[t]; emit(classify_{i}(p, T[0], T[1], T[2], T[3], T[4], T[5]), "
        f"[&](int q, int kv) {{ return mask_{i}(p, T[0], T[1], q + p.q_offset, kv + p.kv_offset); }}, T); }}"
        for i in range(len(masks))
    )
    tile_arrays = "\n".join(
        f"static const int tiles_{i}[][6] = {{{', '.join('{' + ', '.join(map(str, t)) + '}' for t in tiles[i])}}};"
        for i in range(len(masks))
    )
    return f"""
#define AG_HOST_TEST 1
#include <cmath>
#include <cstdio>
#include <cstdlib>
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
{chr(10).join(funcs)}
{tile_arrays}
template <typename F> void emit(int cls, F vis, const int* T) {{
  std::printf("%d ", cls);
  for (int q = T[2]; q <= T[3]; ++q) for (int kv = T[4]; kv <= T[5]; ++kv) std::putchar(vis(q, kv) ? '1' : '0');
  std::putchar('\\n');
}}
int main() {{
  const Params p = {{ {', '.join(init)} }};
{calls}
  return 0;
}}
"""


def _check(masks, Lq: int, Lk: int, sizes, data: dict, tiles, d: Path, seen: dict, offsets: tuple[int, int] = (0, 0)) -> None:
    """Compile and run the program in `d`; every tile's mask and class must match the reference.
    Tiles are in local rows; with `offsets` the reference evaluates them at global positions."""
    src = _program(masks, Lq, Lk, data, dict(sizes.symbols), tiles, offsets)
    qo, ko = offsets
    (d / "h.cpp").write_text(src)
    r = subprocess.run(["g++", "-std=c++17", "-O0", "-w", "h.cpp", "-o", "h"], cwd=d, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[:4000]
    out = iter(subprocess.run([str(d / "h")], capture_output=True, text=True, check=True).stdout.splitlines())
    for i, m in enumerate(masks):
        v = the_variant(m)
        for t in tiles[i]:
            cls_s, bits = next(out).split(" ")
            cls = int(cls_s)
            seen[cls] += 1
            bb, hh, q0, q1, k0, k1 = t
            ref = brute(m, v, sizes, data, bb, hh, q0 + qo, q1 + qo, k0 + ko, k1 + ko).ravel()
            got = np.array([c == "1" for c in bits])
            where = f"mask {i} ({m!r:.300}) tile b={bb} h={hh} q=[{q0},{q1}] kv=[{k0},{k1}] offsets {offsets}"
            assert np.array_equal(got, ref), f"{where}: the C++ element mask disagrees with the reference"
            if cls == 2:
                assert ref.all(), f"{where}: classified ALWAYS but some element is masked"
            if cls == 0:
                assert not ref.any(), f"{where}: classified NEVER but some element is visible"
    assert next(out, None) is None, "more output lines than tiles"


@pytest.mark.parametrize("shard", [False, True], ids=["whole", "shard"])
def test_generated_classification_and_mask_match_the_reference(tmp_path_factory, shard: bool) -> None:
    """`shard`: the launch sits inside the sequence (a ring's block, a prefill chunk), at random
    offsets: the kernel must see global positions q + q_offset, kv + kv_offset and global lengths."""
    seen = {0: 0, 1: 0, 2: 0}

    # Each example compiles one C++ program; a failure names the mask and tile, so no shrinking.
    @settings(max_examples=4, deadline=None, phases=[Phase.explicit, Phase.generate])
    @given(
        masks=st.lists(bool_expr(2), min_size=N_MASKS, max_size=N_MASKS),
        Lq=st.integers(1, 24),
        Lk=st.integers(1, 24),
        seed=st.integers(0, 2**31),
    )
    def run(masks, Lq, Lk, seed) -> None:
        rng = np.random.default_rng(seed)
        sizes, data = make_data(rng, Lq, Lk)
        qo, ko = (int(rng.integers(0, Lq)), int(rng.integers(0, Lk))) if shard else (0, 0)
        tiles = []
        for _ in masks:
            ts = []
            for _ in range(TILES_PER_MASK):
                q0 = int(rng.integers(0, Lq - qo))
                q1 = int(rng.integers(q0, Lq - qo))
                k0 = int(rng.integers(0, Lk - ko))
                k1 = int(rng.integers(k0, Lk - ko))
                ts.append((int(rng.integers(0, B_)), int(rng.integers(0, H_)), q0, q1, k0, k1))
            tiles.append(ts)
        _check(masks, Lq, Lk, sizes, data, tiles, tmp_path_factory.mktemp("classify"), seen, (qo, ko))

    run()
    assert all(seen.values()), f"classes seen {seen}: the test should exercise skipped, partial and full tiles"


def test_float_literals_are_the_fp32_constants_the_kernel_holds(tmp_path) -> None:
    """Regression (the property test above, Lk=11 seed=67108863): the kernel writes a float literal
    as an fp32 constant, so `1e-300` is 0 there and `h * 0.5 < 1e-300` is false at h == 0, where
    the reference took the fp64 value and said true. Literals that fp32 rounds, but not to 0,
    moved comparisons at a tie the same way."""
    masks = [
        cmp("<", mul(h, cf(0.5)), cf(2.6125845789406425e-159)),  # 0 < 0 at h == 0
        cmp("==", load("ftab", add(q, ci(8)), t=ScalarType.FLOAT), cf(2.7254795887379156e-230)),  # 0 == 0
        cmp(">", mul(sub(kv, q), cf(0.5)), cf(-5.2701726716173127e-188)),  # kv > q, not kv >= q
        cmp("<", mul(q, cf(0.5)), cf(2.5000000000000004)),  # 2.5f: q < 5, not q <= 5
    ]
    Lq, Lk = 11, 11
    sizes, data = make_data(np.random.default_rng(67108863), Lq, Lk)
    tiles = [[(bb, hh, 0, Lq - 1, 0, Lk - 1) for bb in range(B_) for hh in range(H_)] for _ in masks]
    _check(masks, Lq, Lk, sizes, data, tiles, tmp_path, {0: 0, 1: 0, 2: 0})
    v = the_variant(masks[3])
    assert brute(masks[3], v, sizes, data, 0, 0, 0, Lq - 1, 0, 0).ravel().tolist() == [q_ < 5 for q_ in range(Lq)]
