"""Run the generated forward kernels of the tensor-core engines on the CPU (sm_90a's wgmma engine, and
the mma.sync engine of sm_80-89 and other head dims): the rendered CUDA compiled
with g++ against the backward's execution-model shim (`tests/backward/_host_emu.py`: one
std::thread per CUDA thread, warp barriers, warp shuffles), with its PTX primitives replaced by
emulations: mbarriers as 64-bit atomics in the emulated shared memory (pending count, expected
count, phase; waits spin), named barriers with their thread counts and the AND reduction, cp.async
as synchronous copies that arrive on their mbarrier at once, and wgmma as a synchronous product at
issue that reads its shared operands through the descriptors with the 128-byte swizzle (the
backward emulation's `ag_wg_ss` / `ag_wg_rs`); ldmatrix and mma.sync by the backward emulation's
fragment-layout gathers through the warp barrier. CTAs run one after another on one shared-memory
array; the persistent schedule's counter is an atomic. A variant's prep kernels (norm statistics,
normalised rows) run first, into workspaces poisoned with NaN bytes.

What this checks without a GPU: the producer/consumer protocol (a lost arrival or a wrong parity
hangs, which the caller's timeout reports), the ring and Q-buffer bookkeeping across work tiles,
the tile walk and masking, the softmax and epilogue, and the descriptors' addressing. Not the
asynchrony of wgmma (a kernel that reads an accumulator before waiting for it still passes) nor
speed."""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from attngen.cuda.render import GridRule

import sys

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "backward"))
from _host_emu import CUDA_INCLUDE, MBAR_CORE, SHIM, TC_EMU, WG_EMU, available  # noqa: E402

__all__ = ["available", "run", "example_params", "example_kernel"]


# Intrinsics the forward uses beyond the backward's shim.
FWD_SHIM = r"""
#include <chrono>
#define __align__(n)  // (the harness defines ag_smem with its alignment)
#define __grid_constant__
inline void __syncwarp(unsigned = 0xffffffffu) { ag_warp_bar[threadIdx.x / 32]->arrive_and_wait(); }
inline bool __any_sync(unsigned m, int pred) { return __ballot_sync(m, pred) != 0; }
inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
inline int __float_as_int(float f) { int i; std::memcpy(&i, &f, 4); return i; }
inline float __log2f(float x) { return std::log2(x); }
inline float __expf(float x) { return std::exp(x); }
inline int atomicAdd(int* a, int v) { return std::atomic_ref<int>(*a).fetch_add(v); }
inline int atomicExch(int* a, int v) { return std::atomic_ref<int>(*a).exchange(v); }
inline int atomicOr(int* a, int v) { return std::atomic_ref<int>(*a).fetch_or(v); }
// IEEE round-to-nearest intrinsics (the INT8 prep's quantizer): what the host's float ops do.
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline int __float2int_rn(float x) { return (int)std::nearbyint(x); }
"""

# The PTX primitives of backends/cuda/fwd/_wgmma.cu.j2 (and the common helpers it includes),
# replaced by name. An mbarrier word: bits 0-15 pending arrivals, 16-31 the expected count, 32-63
# the number of completed phases.
PRIMS = {
    "ag_smem_addr": "inline unsigned ag_smem_addr(const void* ptr) { return (unsigned)((const unsigned char*)ptr - ag_smem); }",
    "ag_ex2": "inline float ag_ex2(float x) { return std::exp2(x); }",
    "ag_tanh_fast": "inline float ag_tanh_fast(float x) { return std::tanh(x); }",
    "ag_cp_async16": "inline void ag_cp_async16(unsigned dst, const void* src, bool pred) {\n"
                     "  if (pred) std::memcpy(ag_smem + dst, src, 16); else std::memset(ag_smem + dst, 0, 16);\n}",
    "ag_cp_async_commit": "inline void ag_cp_async_commit() {}",
    "ag_cp_async_wait": "template <int N> inline void ag_cp_async_wait() {}",
    "ag_cp_async4": "inline void ag_cp_async4(unsigned dst, const void* src) { std::memcpy(ag_smem + dst, src, 4); }",
    "ag_cp_async8": "inline void ag_cp_async8(unsigned dst, const void* src) { std::memcpy(ag_smem + dst, src, 8); }",
    "ag_cp_async_wait_all": "inline void ag_cp_async_wait_all() {}",
    "ag_fence_proxy_async": "inline void ag_fence_proxy_async() { std::atomic_thread_fence(std::memory_order_seq_cst); }",
    "ag_bar_init": "inline void ag_bar_init(unsigned bar, int count) {\n"
                   "  std::atomic_ref<unsigned long long>(*(unsigned long long*)(ag_smem + bar)).store((unsigned long long)count | ((unsigned long long)count << 16));\n}",
    "ag_bar_arrive": "inline void ag_bar_arrive(unsigned bar) { ag_mbar_arrive(bar); }",
    "ag_cp_async_arrive": "inline void ag_cp_async_arrive(unsigned bar) { ag_mbar_arrive(bar); }",
    # TMA (WgmmaLoads.TMA): an arrival that expects bytes is held back until copies of that many
    # bytes have landed on the barrier; a copy lands at issue, reading the descriptor the harness
    # wrote (words: 0 the tensor's address, 1-4 its extents, innermost first, 5-7 the byte strides
    # of rows, heads and batch), through the 128-byte swizzle, zero past the rows' extent.
    "ag_bar_arrive_expect": "inline void ag_bar_arrive_expect(unsigned bar, unsigned bytes) { ag_tx[bar / 8] += bytes; }",
    "ag_tma_load": "template <int ROWS, int COLS>\n"
                   "inline void ag_tma_load(unsigned dst, const ag_tmap* map, int row0, int hh, int b, unsigned bar) {\n"
                   "  const unsigned long long* w = map->opaque;\n"
                   "  if (hh < 0 || (unsigned long long)hh >= w[3] || b < 0 || (unsigned long long)b >= w[4] || COLS > (int)w[1]) {\n"
                   "    std::fprintf(stderr, \"TMA box outside the tensor: head %d, batch %d\\n\", hh, b); std::abort();\n  }\n"
                   "  const unsigned char* base = (const unsigned char*)w[0] + (unsigned long long)b * w[7] + (unsigned long long)hh * w[6];\n"
                   "  for (int c = 0; c < COLS / 64; ++c)\n"
                   "    for (int r = 0; r < ROWS; ++r)\n"
                   "      for (int j = 0; j < 8; ++j) {\n"
                   "        unsigned char* d = ag_smem + dst + c * ROWS * 128 + r * 128 + ((j ^ (r & 7)) << 4);\n"
                   "        const long long row = (long long)row0 + r;\n"
                   "        if (row >= 0 && (unsigned long long)row < w[2]) std::memcpy(d, base + row * w[5] + (c * 64 + j * 8) * 2, 16);\n"
                   "        else std::memset(d, 0, 16);\n      }\n"
                   "  const long long n = (long long)(COLS / 64) * ROWS * 128;\n"
                   "  const long long left = (ag_tx[bar / 8] -= n);\n"
                   "  if (left < 0) { std::fprintf(stderr, \"mbarrier at %u: TMA bytes past the expected count\\n\", bar); std::abort(); }\n"
                   "  if (left == 0) ag_mbar_arrive(bar);\n}",
    # A bulk copy (cp.async.bulk, no descriptor): lands at issue, its bytes counted as TMA's.
    "ag_bulk_copy": "inline void ag_bulk_copy(unsigned dst, const void* src, unsigned bytes, unsigned bar) {\n"
                    "  if ((dst | bytes | (unsigned)(uintptr_t)src) % 16u) { std::fprintf(stderr, \"cp.async.bulk: 16-byte alignment\\n\"); std::abort(); }\n"
                    "  std::memcpy(ag_smem + dst, src, bytes);\n"
                    "  const long long left = (ag_tx[bar / 8] -= bytes);\n"
                    "  if (left < 0) { std::fprintf(stderr, \"mbarrier at %u: bulk bytes past the expected count\\n\", bar); std::abort(); }\n"
                    "  if (left == 0) ag_mbar_arrive(bar);\n}",
    "ag_bar_wait": "inline void ag_bar_wait(unsigned bar, int parity) {\n"
                   "  auto t0 = std::chrono::steady_clock::now();\n"
                   "  unsigned long long seen = ag_arrivals.load();\n"
                   "  while (!ag_mbar_done(bar, parity)) {\n"
                   "    if (ag_stalled(&t0, &seen)) {\n"
                   "      std::fprintf(stderr, \"mbarrier at %u: thread %u waited %d s for parity %d (a lost arrival?)\\n\", bar, threadIdx.x, AG_WAIT_SECONDS, parity);\n"
                   "      std::abort();\n    }\n"
                   "    std::this_thread::yield();\n  }\n}",
    "ag_warpgroup_sync": "inline void ag_warpgroup_sync(int g) { ag_named_bar(2 + g, 128, true); }",
    "ag_producer_sync": "inline void ag_producer_sync() { ag_named_bar(1, PRODUCER_THREADS, true); }",
    "ag_wgmma_fence": "inline void ag_wgmma_fence() {}",
    "ag_wgmma_commit": "inline void ag_wgmma_commit() {}",
    "ag_wgmma_wait": "template <int N> inline void ag_wgmma_wait() {}",
    "ag_reg_fence": "template <class T> inline void ag_reg_fence(T&) {}",
}
# The mma.sync engine's primitives (backends/cuda/fwd/_mma.cu.j2), by the backward emulation's
# definitions (TC_EMU: ldmatrix and mma.sync gathered through the warp barrier by the PTX fragment
# layouts), inserted once where the first of them was.
MMA_PRIMS = ("ag_ldmatrix_x4", "ag_ldmatrix_x4_trans", "ag_mma")
MMA_CORE = "static unsigned ag_xb[64][32][2];\n" + TC_EMU[TC_EMU.index("// ldmatrix.m8n8.x4"):]
# The quantized kernel's 8-bit primitives (backends/cuda/fwd/_mma_q8.cu.j2): mma.sync m16n8k32 with
# the operand types its PTX names, gathered by the PTX ISA's 8-bit fragment layouts (a[i] holds
# A(g + 8 (i & 1), 4t + 16 (i >> 1) + byte); b_j holds B(4t + 16 j + byte, g)); every product is
# exact in fp32 and the sum runs in fp32 in k order. The fp8 conversion is cuda_fp8.h's host one
# (saturating, to nearest even), as cvt.rn.satfinite.
Q8_CORE = r"""
template <class T> inline float ag_q8(unsigned word, int byte) {
  const unsigned char u = (unsigned char)(word >> (8 * byte));
  if constexpr (std::is_same_v<T, signed char>) return (float)(signed char)u;
  else { T x; x.__x = u; return (float)x; }
}
template <class TA, class TB, class ACC>
inline void ag_mma8(ACC (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
  const int w = threadIdx.x / 32, l = threadIdx.x % 32, g = l >> 2, t = l & 3;
  ag_warp_bar[w]->arrive_and_wait();
  for (int i = 0; i < 4; ++i) ag_xa[w][l][i] = a[i];
  ag_xb[w][l][0] = b0; ag_xb[w][l][1] = b1;
  ag_warp_bar[w]->arrive_and_wait();
  for (int e = 0; e < 4; ++e) {
    const int row = g + 8 * (e >> 1), col = 2 * t + (e & 1);
    ACC acc = d[e];
    for (int k = 0; k < 32; ++k) {
      const unsigned ar = ag_xa[w][(row % 8) * 4 + (k % 16) / 4][row / 8 + 2 * (k / 16)];
      const unsigned br = ag_xb[w][col * 4 + (k % 16) / 4][k / 16];
      acc += (ACC)(ag_q8<TA>(ar, k % 4) * ag_q8<TB>(br, k % 4));
    }
    d[e] = acc;
  }
}
"""
Q8_TYPES = {"e4m3": "__nv_fp8_e4m3", "e5m2": "__nv_fp8_e5m2", "s8": "signed char"}


def _q8_prim(name: str, text: str) -> str:
    """The host version of one of the quantized kernel's 8-bit primitives, from its PTX text."""
    if name == "ag_cvt_p4":
        t = Q8_TYPES[re.search(r"satfinite\.(\w+)x2", text).group(1)]
        return ("inline unsigned ag_cvt_p4(float x0, float x1, float x2, float x3) {\n"
                f"  const float x[4] = {{x0, x1, x2, x3}}; unsigned r = 0;\n"
                f"  for (int i = 0; i < 4; ++i) r |= (unsigned){t}(x[i]).__x << (8 * i);\n  return r;\n}}")
    acc, ta, tb = re.search(r"m16n8k32\.row\.col\.(f32|s32)\.(\w+)\.(\w+)\.(?:f32|s32)", text).groups()
    if acc == "s32":  # s8 products and their sums are exact in int32, held as bits in the float array
        return (f"inline void {name}(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {{\n"
                f"  int t[4]; std::memcpy(t, d, 16); ag_mma8<{Q8_TYPES[ta]}, {Q8_TYPES[tb]}, int>(t, a, b0, b1); std::memcpy(d, t, 16);\n}}")
    return (f"inline void {name}(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) "
            f"{{ ag_mma8<{Q8_TYPES[ta]}, {Q8_TYPES[tb]}, float>(d, a, b0, b1); }}")


Q8_PRIMS = ("ag_mma_qk", "ag_mma_pv", "ag_cvt_p4")
# The FP8 wgmma engine's k32 wrappers (backends/cuda/fwd/_wgmma_q8.cu.j2), by the PTX ISA's layouts,
# not the kernel's: a K-major 8-bit operand in shared memory is rows of 128 bytes (8-row groups
# SBO apart) through the 128-byte swizzle, byte k of row mn; the register A fragment of
# m64nNk32 (8-bit) gives register i of lane 4 g + t of warp w (of the warpgroup) row 16 w + g +
# 8 (i & 1), columns 4 t + 16 (i >> 1) + byte (CUTLASS's ALayout_64x32, the PTX ISA's "register
# fragment of matrix A" figure for .e4m3/.e5m2/.s8); the accumulator is the 16-bit engine's.
WG8_CORE = r"""
template <class T> inline float ag_f8(unsigned u) { T x; x.__x = (unsigned char)(u & 0xFFu); return (float)x; }
// Layout type 1: the 128-byte swizzle (rows of 128 bytes, address bits 4-6 XOR bits 7-9); 2: the
// 64-byte one (rows of 64 bytes, bits 4-5 XOR bits 7-8): CUTLASS's Swizzle<3,4,3> / <2,4,3> atoms
// of 8 rows, SBO apart.
inline unsigned ag_wg8_byte(unsigned long long desc, int mn, int k) {
  const unsigned long long type = desc >> 62;
  if ((type != 1ull && type != 2ull) || ((desc >> 49) & 7ull) != 0ull) { std::fprintf(stderr, "wgmma descriptor: not a 128- or 64-byte swizzle at base offset 0\n"); std::abort(); }
  const unsigned row = type == 1ull ? 128u : 64u, bits = type == 1ull ? 7u : 3u;
  const unsigned start = (unsigned)(desc & 0x3FFFull) << 4, sbo = (unsigned)((desc >> 32) & 0x3FFFull) << 4;
  if ((start >> 7) & bits) { std::fprintf(stderr, "wgmma descriptor: start 0x%x is not on a swizzle period\n", start); std::abort(); }
  if (k < 0 || (start % row) + (unsigned)k >= row) { std::fprintf(stderr, "wgmma k32 (8-bit, K-major): k past the swizzle row\n"); std::abort(); }
  unsigned a = start + (unsigned)(mn / 8) * sbo + (unsigned)(mn % 8) * row + (unsigned)k;
  a ^= ((a >> 7) & bits) << 4;
  return ag_smem[a];
}
template <int N, class TA, class TB>
inline void ag_wg_ss8(float* d, unsigned long long da, unsigned long long db, int acc) {
  const int w = (threadIdx.x / 32) % 4, l = threadIdx.x % 32, g = l >> 2, t = l & 3;
  for (int j = 0; j < N / 8; ++j)
    for (int e = 0; e < 4; ++e) {
      const int row = 16 * w + g + 8 * (e >> 1), col = 8 * j + 2 * t + (e & 1);
      float s = 0.f;
      for (int k = 0; k < 32; ++k) s += ag_f8<TA>(ag_wg8_byte(da, row, k)) * ag_f8<TB>(ag_wg8_byte(db, col, k));
      d[4 * j + e] = (acc ? d[4 * j + e] : 0.f) + s;
    }
}
template <int N, class TA, class TB>
inline void ag_wg_rs8(float* d, const unsigned (&a)[4], unsigned long long db, int acc) {
  const int w = threadIdx.x / 32, l = threadIdx.x % 32, g = l >> 2, t = l & 3;
  ag_warp_bar[w]->arrive_and_wait();
  for (int i = 0; i < 4; ++i) ag_xa[w][l][i] = a[i];
  ag_warp_bar[w]->arrive_and_wait();
  for (int j = 0; j < N / 8; ++j)
    for (int e = 0; e < 4; ++e) {
      const int row = g + 8 * (e >> 1), col = 8 * j + 2 * t + (e & 1);
      float s = 0.f;
      for (int k = 0; k < 32; ++k) {
        const unsigned ar = ag_xa[w][4 * (row % 8) + (k % 16) / 4][(row / 8) + 2 * (k / 16)];
        s += ag_f8<TA>(ar >> (8 * (k % 4))) * ag_f8<TB>(ag_wg8_byte(db, col, k));
      }
      d[4 * j + e] = (acc ? d[4 * j + e] : 0.f) + s;
    }
}
"""


def _wg8_prim(name: str, text: str) -> str:
    """The host version of one k32 (8-bit) wgmma wrapper, from its PTX text."""
    n, ta, tb = re.search(r"m64n(\d+)k32\.f32\.(\w+)\.(\w+) ", text).groups()
    types = f"{n}, {Q8_TYPES[ta]}, {Q8_TYPES[tb]}"
    if "_ss_" in name:
        return (f"inline void {name}(float (&d)[{int(n) // 2}], unsigned long long da, unsigned long long db, int acc) "
                f"{{ ag_wg_ss8<{types}>(d, da, db, acc); }}")
    return (f"inline void {name}(float (&d)[{int(n) // 2}], const unsigned (&a)[4], unsigned long long db, int acc) "
            f"{{ ag_wg_rs8<{types}>(d, a, db, acc); }}")
# wgmma shapes: ss reads both operands K-major, rs reads B (V) MN-major.
WG_SHAPE = ("inline void ag_wgmma_ss_n{n}(float (&d)[{h}], unsigned long long da, unsigned long long db, int acc) {{ ag_wg_ss<{n}>(d, da, db, acc, 0, 0); }}\n"
            "inline void ag_wgmma_rs_n{n}(float (&d)[{h}], const unsigned (&a)[4], unsigned long long db, int acc) {{ ag_wg_rs<{n}>(d, a, db, acc); }}")
# The backward's wgmma emulation, without its cp.async / bulk-reduction parts (the forward has its own).
WG_CORE = WG_EMU[WG_EMU.index("inline float ag_wg_desc_elem"):WG_EMU.index("#define AG_WG_SHAPE")]
# Placed before the first primitive: what the replacements share.
MBAR = "\nextern unsigned char ag_smem[];" + MBAR_CORE + r"""// Whether the phase of this parity has completed: the phase in progress has the other parity.
inline bool ag_mbar_done(unsigned bar, int parity) {
  const unsigned long long w = std::atomic_ref<unsigned long long>(*(unsigned long long*)(ag_smem + bar)).load();
  return (int)((w >> 32) & 1ull) != parity;
}
"""
LD_HELPERS = r"""
static unsigned ag_xa[64][32][4];
inline unsigned ag_bits(elem_t e) { unsigned short u; std::memcpy(&u, &e, 2); return u; }
inline float ag_elem(unsigned bits16) { unsigned short u = (unsigned short)bits16; elem_t e; std::memcpy(&e, &u, 2); return ag_to_float(e); }
inline unsigned ag_ld16(unsigned addr) { unsigned short u; std::memcpy(&u, ag_smem + addr, 2); return u; }
"""


def _functions(src: str):
    """(name, start, end) of every `__device__ __forceinline__` function definition (with a
    preceding `template <...>` line), in order."""
    out = []
    for m in re.finditer(r"(?:template <[^>\n]*>\s*)?__device__ __forceinline__ [^\n(]*?\b(\w+)\(", src):
        i = src.index("{", m.end())
        depth = 0
        for j in range(i, len(src)):
            depth += {"{": 1, "}": -1}.get(src[j], 0)
            if depth == 0:
                break
        out.append((m.group(1), m.start(), j + 1))
    return out


def emulated_source(src: str) -> str:
    """The kernel source (no host launcher) with its PTX primitives replaced by emulations."""
    body = src.split("#ifndef __CUDACC_RTC__\n#include <atomic>")[0]
    body = body.replace("#include <cuda_runtime.h>\n", "")
    fns = [f for f in _functions(body) if f[0] in PRIMS or f[0] in MMA_PRIMS or f[0] in Q8_PRIMS
           or re.fullmatch(r"ag_wgmma_(ss|rs)_n\d+", f[0])]
    first = min(s for _, s, _ in fns)
    wrapper = re.compile(r"ag_wgmma_(ss|rs)_n(\d+)")
    wide8 = {n for n, s, e in fns if wrapper.fullmatch(n) and re.search(r"m64n\d+k32\.", body[s:e])}
    shapes = sorted({int(wrapper.fullmatch(n).group(2)) for n, _, _ in fns if wrapper.fullmatch(n) and n not in wide8})
    out, pos, done = [], 0, set()
    for name, s, e in sorted(fns, key=lambda f: f[1]):
        out.append(body[pos:s])
        if s == first:
            out.append(MBAR)
        if name in wide8:
            out.append(("" if "ld" in done else LD_HELPERS) + ("" if "wg8" in done else WG8_CORE) + _wg8_prim(name, body[s:e]))
            done |= {"wg8", "ld"}
        elif wrapper.fullmatch(name):
            if "wgmma" not in done:  # every shape's wrappers where the first one was
                out.append(("" if "ld" in done else LD_HELPERS) + WG_CORE + "\n" + "\n".join(WG_SHAPE.format(n=n, h=n // 2) for n in shapes))
                done |= {"wgmma", "ld"}
        elif name in MMA_PRIMS:
            if "mma" not in done:
                out.append(("" if "ld" in done else LD_HELPERS) + MMA_CORE)
                done |= {"mma", "ld"}
        elif name in Q8_PRIMS:  # after ag_mma (the same include), whose gather arrays they use
            # (ag_cvt_p4 alone, in the FP8 wgmma kernel, needs none of the mma.sync gathers)
            core = "" if "q8" in done or name == "ag_cvt_p4" else Q8_CORE
            out.append(core + _q8_prim(name, body[s:e]))
            done.add("q8" if core else "cvt")
        elif name not in done:
            out.append(PRIMS[name])
            done.add(name)
        pos = e
    out.append(body[pos:])
    text = "".join(out)
    # The register split and the mbarrier-init fence are no-ops here.
    text = re.sub(r'\n\s*asm volatile\("(setmaxnreg|fence\.mbarrier_init)[^\n]*\);', "\n", text)
    if re.search(r"\basm(\s+volatile)?\s*\(", text):
        left = sorted(set(re.findall(r'asm(?: volatile)?\(\s*"([a-z.]+)', text)))
        raise ValueError(f"PTX left after emulation: {left}")
    assert shapes or wide8 or "mma" in done, "neither wgmma wrappers nor mma.sync primitives found"
    return text


def _harness(ns: str, launches, fields, smem: int, n_out: int, maps=()) -> str:
    lines = [f"namespace {ns} {{ alignas(1024) unsigned char ag_smem[{smem + 1024}]; }}",
             "static std::vector<std::vector<char>> blobs;",
             "int main(int argc, char** argv) {",
             "  blobs.reserve(64);  // references into it stay valid",
             "  FILE* f = std::fopen(argv[1], \"rb\");"]
    args = []
    for fl in fields:
        if "*" in fl.ctype:
            lines += [f"  std::vector<char>& b_{fl.name} = blobs.emplace_back();",
                      f"  {{ long long n; std::fread(&n, 8, 1, f); b_{fl.name}.resize(n > 0 ? n : 0); if (n > 0) std::fread(b_{fl.name}.data(), 1, n, f); }}"]
            ctype = fl.qctype.replace("__restrict__", "").strip()
            args.append(f"b_{fl.name}.empty() ? nullptr : ({ctype})b_{fl.name}.data()")
        elif fl.ctype == "int":
            lines.append(f"  int a_{fl.name}; std::fread(&a_{fl.name}, 4, 1, f);")
            args.append(f"a_{fl.name}")
        else:
            lines.append(f"  long long a_{fl.name}; std::fread(&a_{fl.name}, 8, 1, f);")
            args.append(f"a_{fl.name}")
    for m in maps:  # TMA descriptors: eight words each, the first replaced by the tensor's address
        lines += [f"  {ns}::ag_tmap a_{m.name}{{}};", f"  std::fread(a_{m.name}.opaque, 8, 8, f);",
                  f"  a_{m.name}.opaque[0] = (unsigned long long)b_{m.tensor}.data();"]
    lines.append("  std::fclose(f);")
    map_args = [f"a_{m.name}" for m in maps]
    for kernel, (gx, gy, gz), threads, ys in launches:  # the prep kernels, then the attention kernel, in order
        kargs = args + (map_args if kernel == launches[-1][0] else [])
        only = f", {{{', '.join(map(str, ys))}}}" if ys else ""
        lines.append(f"  ag_launch({gx}, {gy}, {gz}, {threads}, [&] {{ {kernel}({', '.join(kargs)}); }}{only});")
    lines.append("  FILE* o = std::fopen(argv[2], \"wb\");")
    for i in range(n_out):
        lines.append(f"  std::fwrite(blobs[{i}].data(), 1, blobs[{i}].size(), o);")
    lines += ["  std::fclose(o);",
              "  return 0;", "}"]
    return "\n".join(lines) + "\n"


def _grid(k, v, B: int, Lq: int, persistent: int) -> tuple[int, int, int]:
    """A kernel's launch grid: prep kernels loop over rows (two CTAs), the persistent wgmma kernel
    takes `persistent` CTAs, the others a CTA per (query tile, head, batch) as their launcher."""
    if k.prep is not None:
        return (2, 1, 1)
    if k.grid_rule == GridRule.PERSISTENT:
        return (persistent, 1, 1)
    if k.grid_rule == GridRule.TILES:
        return (-(-Lq // k.tile.block_m), v.heads, B)
    raise ValueError(f"the emulation harness has no grid for {k.name} ({k.grid_rule})")


def run(src: str, kp, v, arrays: dict[str, np.ndarray], *, grid: int = 2, workdir: str | None = None,
        timeout: float = 600.0, wait_seconds: int = 120,
        heads: tuple[int, ...] | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """Compile the rendered forward `src` (plan `kp`, variant `v`, bhsd or bshd) for the host and run
    it on `arrays` (numpy q, k, v and runtime inputs in the variant's layout and dtypes); returns O
    (float64) and the LSE (or None). `grid` persistent CTAs (any grid is correct). A thread that
    waits on an mbarrier phase while no thread arrives on any mbarrier for `wait_seconds` aborts the
    run (a lost arrival: RuntimeError); a loaded machine, where hundreds of emulated threads share
    two cores, slows the arrivals but does not stop them.
    `heads`: the query heads the attention kernel runs (one with a CTA
    a (query tile, head, batch) only; prep kernels run whole); the others' outputs stay NaN."""
    from attngen.check.reference import dtype_of

    layout = v.layout.value
    if layout not in ("bhsd", "bshd"):
        raise ValueError("the emulation harness takes bhsd or bshd batches")
    q, k, vv = (np.ascontiguousarray(arrays[n]) for n in ("q", "k", "v"))
    B = q.shape[0]
    Lq, Lk = (q.shape[2], k.shape[2]) if layout == "bhsd" else (q.shape[1], k.shape[1])
    et = dtype_of(v.dtype)
    o_shape = (B, v.heads, Lq, v.value_head_dim) if layout == "bhsd" else (B, Lq, v.heads, v.value_head_dim)
    # NaN poison: the kernel must write every output element.
    out = np.zeros(o_shape, dtype=et) + np.array(np.nan, et)
    lse = np.full((B, v.heads, Lq), np.nan, np.float32) if v.lse else None
    bufs = {"q": q, "k": k, "v": vv, "o": out, "lse": lse, "nan_flag": np.zeros(1, np.int32) if v.nan_check else None,
            "work_counter": np.zeros(1, np.int32)}
    for pr in kp.preps:  # workspaces the prep kernels fill: 0xFF bytes (NaN as floats) until written
        n = int(eval(pr.bytes_expr.replace("(size_t)", "").replace("/", "//"), {"__builtins__": {}}, {"B": B, "Lq": Lq, "Lk": Lk}))
        bufs[pr.field.name] = np.full(n, 0xFF, np.uint8)

    def strides(a):
        s = [x // a.itemsize for x in a.strides]
        return (s[0], s[1], s[2]) if layout == "bhsd" else (s[0], s[2], s[1])

    blob = bytearray()
    ptrs = []
    for fl in kp.fields:
        n = fl.name
        if "*" in fl.ctype:
            if n.startswith("in_"):
                decl = next(d for d in v.runtime_inputs() if d.name == n[3:])
                a = np.ascontiguousarray(arrays[n[3:]]).astype(dtype_of(decl.dtype))
            else:
                if n not in bufs:
                    raise ValueError(f"the emulation harness has no buffer for parameter {n}")
                a = bufs[n]
            ptrs.append(n)
            raw = b"" if a is None else np.ascontiguousarray(a).tobytes()
            blob += np.int64(len(raw)).tobytes() + raw
        elif n in ("B", "Lq", "Lk", "q_offset", "kv_offset", "Lq_total", "Lk_total"):
            blob += np.int32({"B": B, "Lq": Lq, "Lk": Lk, "q_offset": 0, "kv_offset": 0, "Lq_total": Lq, "Lk_total": Lk}[n]).tobytes()
        elif n.startswith("in_"):
            base, kind, i = n[3:].rsplit("_", 1)[0], n.rsplit("_", 1)[1][0], int(n.rsplit("_", 1)[1][1:])
            a = np.ascontiguousarray(arrays[base])
            blob += (np.int32(a.shape[i]) if kind == "n" else np.int64(a.strides[i] // a.itemsize)).tobytes()
        else:
            t, s = n.rsplit("_", 1)
            blob += np.int64(strides(bufs[t])[("sb", "sh", "ss").index(s)]).tobytes()
    from attngen.cuda.render import tma_maps

    maps = tma_maps(kp)
    for m in maps:
        a = bufs[m.tensor]
        sb, sh, ss = (x * a.itemsize for x in strides(a))
        blob += np.array([0, m.cols, Lq if m.length == "Lq" else Lk, m.heads, B, ss, sh, sb], np.int64).tobytes()
    ns = f"{kp.kernel_name}_impl"
    tmp = workdir or tempfile.mkdtemp(prefix="attngen-fwd-emu-")
    cpp, exe = os.path.join(tmp, "k.cpp"), os.path.join(tmp, "k")
    fields = [type("F", (), dict(name=f.name, ctype=f.ctype, qctype=f.ctype.replace("elem_t", f"{ns}::elem_t")))() for f in kp.fields]
    n_out = ptrs.index("lse") + 1 if v.lse else ptrs.index("o") + 1
    if heads is not None and kp.attention.grid_rule != GridRule.TILES:
        raise ValueError("a subset of heads needs a CTA a (query tile, head, batch), not a persistent grid")
    launches = [(k.name, _grid(k, v, B, Lq, grid), k.threads, heads if k.grid_rule == GridRule.TILES else None)
                for k in kp.kernels]
    Path(cpp).write_text(SHIM + FWD_SHIM + emulated_source(src) + _harness(ns, launches, fields, kp.smem_bytes, n_out, maps))
    r = subprocess.run(["g++", "-std=c++20", "-O1", "-w", "-pthread", f"-DAG_WAIT_SECONDS={int(wait_seconds)}",
                        f"-I{CUDA_INCLUDE}",
                        cpp, "-o", exe], capture_output=True, text=True, check=False)
    if r.returncode != 0:
        raise RuntimeError("g++ rejected the emulated kernel:\n" + r.stderr[-6000:])
    Path(tmp, "in.bin").write_bytes(bytes(blob))
    r = subprocess.run([exe, os.path.join(tmp, "in.bin"), os.path.join(tmp, "out.bin")], capture_output=True, text=True,
                       check=False, timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"emulated kernel failed ({r.returncode}):\n{r.stderr[-4000:]}")
    raw = Path(tmp, "out.bin").read_bytes()
    res, off = {}, 0
    for n in ptrs[:n_out]:
        a = bufs[n]
        if a is None:
            continue
        res[n] = np.frombuffer(raw[off:off + a.nbytes], dtype=a.dtype).reshape(a.shape)
        off += a.nbytes
    return res["o"].astype(np.float64), (res["lse"].astype(np.float64) if v.lse else None)


def example_params() -> list:
    """Every variant of every example, as pytest params named file:variant."""
    import pytest

    from attngen.lang import frontend

    out = []
    for f in sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.attn")):
        for v in frontend.loads(f.read_text(), str(f)).variants:
            out.append(pytest.param(v, id=f"{f.stem}:{v.name}"))
    return out


def example_kernel(v, arch, engine):
    """(source, plan) of `v`'s forward kernel on `arch`; skips the test where that is not a kernel
    of `engine` this harness runs (decode-family variants, other engines, varlen batches)."""
    import pytest

    from attngen.cuda.render import render_with_plan

    try:
        src, kp = render_with_plan(v, arch)
    except ValueError as e:
        pytest.skip(f"not a forward-kernel variant: {e}")
    if kp.engine != engine:
        pytest.skip(f"runs on the {kp.engine.value} engine on {arch.value}")
    if v.layout.value == "varlen":
        pytest.skip("varlen batches are outside the emulation harness")
    return src, kp
