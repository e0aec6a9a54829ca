"""Run the generated backward kernels on the CPU: the rendered CUDA compiled with g++ against a shim
that emulates the CUDA execution model (one std::thread per CUDA thread, __syncthreads as a block
barrier, warp shuffles through a per-warp barrier, float atomics as std::atomic_ref). Blocks run
one after another, so this checks the kernels' index math, tile walking, masking and barriers
exactly as written, without a GPU (not their speed, nor races between blocks beyond atomics)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from attngen.plan.op_plan import GridRule, OpPlan

CUDA_INCLUDE = "/usr/local/cuda/include"

SHIM = r"""
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cstdint>
#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <functional>
#include <thread>
#include <type_traits>
#include <vector>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#undef __global__
#undef __device__
#undef __host__
#undef __forceinline__
#undef __shared__
#undef __launch_bounds__
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__
#define __launch_bounds__(...)
struct ag_dim3_t { unsigned x = 1, y = 1, z = 1; };
thread_local ag_dim3_t threadIdx, blockIdx;
ag_dim3_t gridDim;
static std::barrier<>* ag_block_bar = nullptr;
static std::barrier<>* ag_warp_bar[64];
static unsigned ag_warp_buf[64][32];
inline void __syncthreads() { ag_block_bar->arrive_and_wait(); }
// Lane l of the warp gets lane src(l)'s value (4-byte types: float, int, unsigned), every lane taking part.
template <class T, class F>
inline T ag_warp_exchange(T x, F src) {
  static_assert(sizeof(T) == 4, "4-byte shuffles");
  const int w = threadIdx.x / 32, l = threadIdx.x % 32;
  ag_warp_bar[w]->arrive_and_wait();
  std::memcpy(&ag_warp_buf[w][l], &x, 4);
  ag_warp_bar[w]->arrive_and_wait();
  T r;
  std::memcpy(&r, &ag_warp_buf[w][src(l)], 4);  // (read before this lane's next exchange, whose first barrier waits for every lane)
  return r;
}
template <class T> inline T __shfl_xor_sync(unsigned, T x, int o) { return ag_warp_exchange(x, [o](int l) { return l ^ o; }); }
template <class T> inline T __shfl_sync(unsigned, T x, int src) { return ag_warp_exchange(x, [src](int) { return src; }); }
inline unsigned __ballot_sync(unsigned, int pred) {
  const int w = threadIdx.x / 32, l = threadIdx.x % 32;
  ag_warp_bar[w]->arrive_and_wait();
  ag_warp_buf[w][l] = pred != 0;
  ag_warp_bar[w]->arrive_and_wait();
  unsigned r = 0;
  for (int i = 0; i < 32; ++i) r |= ag_warp_buf[w][i] << i;
  return r;
}
inline int __ffs(unsigned x) { return x ? __builtin_ctz(x) + 1 : 0; }
// Named barriers (bar.sync / bar.arrive / bar.red.and with a thread count): a generation counter a
// barrier id; they reset themselves at each completion, so one set serves every block.
struct ag_named_t {
  std::mutex mu;
  std::condition_variable cv;
  int arrived = 0;
  unsigned gen = 0;
  bool all = true, result = true;
};
static ag_named_t ag_named[16];
inline bool ag_named_bar(int id, int count, bool wait, bool v = true) {
  ag_named_t& b = ag_named[id];
  std::unique_lock<std::mutex> lk(b.mu);
  const unsigned gen = b.gen;
  b.all = b.all && v;
  if (++b.arrived == count) {
    b.result = b.all;
    b.arrived = 0;
    b.all = true;
    ++b.gen;
    b.cv.notify_all();
    return b.result;
  }
  if (!wait) return true;
  b.cv.wait(lk, [&] { return b.gen != gen; });
  return b.result;
}
inline float __fdividef(float a, float b) { return a / b; }  // (declared for ag_tanh_fast, unused here)
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
template <class T> inline T __ldg(const T* p) { return *p; }
inline float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, sizeof f); return f; }
template <class T> inline void __stwb(T* p, T v) { *p = v; }
inline float atomicAdd(float* a, float v) { return std::atomic_ref<float>(*a).fetch_add(v); }
template <class A, class B> inline std::common_type_t<A, B> min(A a, B b) { return a < b ? a : b; }
template <class A, class B> inline std::common_type_t<A, B> max(A a, B b) { return a < b ? b : a; }
// `ys`: run only these rows of the grid's y dimension (all when empty).
static void ag_launch(unsigned gx, unsigned gy, unsigned gz, int threads, const std::function<void()>& body,
                      std::vector<unsigned> ys = {}) {
  gridDim.x = gx; gridDim.y = gy; gridDim.z = gz;
  if (ys.empty())
    for (unsigned y = 0; y < gy; ++y) ys.push_back(y);
  for (unsigned z = 0; z < gz; ++z)
    for (unsigned y : ys)
      for (unsigned x = 0; x < gx; ++x) {
        std::barrier<> bar(threads);
        ag_block_bar = &bar;
        std::vector<std::barrier<>*> wb;
        for (int w = 0; w < threads / 32; ++w) ag_warp_bar[w] = new std::barrier<>(32);
        std::vector<std::thread> ts;
        for (int t = 0; t < threads; ++t)
          ts.emplace_back([&, t] { threadIdx.x = t; blockIdx.x = x; blockIdx.y = y; blockIdx.z = z; body(); });
        for (auto& th : ts) th.join();
        for (int w = 0; w < threads / 32; ++w) delete ag_warp_bar[w];
      }
}
"""


# The tensor-core primitives of the backward's mma.sync engine (the block between the markers in
# backends/cuda/bwd/_mma_bwd.cu.j2), emulated: shared memory is the array ag_smem and a shared
# address is an offset into it; ldmatrix and mma.sync gather the warp's fragments through the
# per-warp barrier (every lane hands in its part, then each computes its own, by the PTX ISA's
# fragment layouts); cp.async copies synchronously (zero-filling as src-size 0 does); ex2 is exp2.
TC_BEGIN = "// ---- tensor-core primitives (PTX;"
TC_END = "// ---- end of the tensor-core primitives ----"
TC_EMU = r"""
extern unsigned char ag_smem[];
inline unsigned ag_smem_addr(const void* ptr) { return (unsigned)((const unsigned char*)ptr - ag_smem); }
inline float ag_ex2(float x) { return std::exp2(x); }
inline unsigned ag_bits(elem_t e) { unsigned short u; std::memcpy(&u, &e, 2); return u; }
inline float ag_elem(unsigned bits16) { unsigned short u = (unsigned short)bits16; elem_t e; std::memcpy(&e, &u, 2); return ag_to_float(e); }
inline unsigned ag_pack2(float lo, float hi) { return ag_bits(ag_from_float<elem_t>(lo)) | (ag_bits(ag_from_float<elem_t>(hi)) << 16); }
inline void ag_cp_async16(unsigned dst, const void* src, bool pred) {
  if (pred) std::memcpy(ag_smem + dst, src, 16); else std::memset(ag_smem + dst, 0, 16);
}
inline void ag_cp_async_commit() {}
template <int N> inline void ag_cp_async_wait() {}
static unsigned ag_xa[64][32][4], ag_xb[64][32][2];
inline unsigned ag_ld16(unsigned addr) { unsigned short u; std::memcpy(&u, ag_smem + addr, 2); return u; }
// ldmatrix.m8n8.x4: lanes 8i..8i+7 give the row addresses of matrix i; lane l receives row l/4,
// columns 2(l%4), 2(l%4)+1 of each matrix (of its transpose with .trans).
inline void ag_ldmatrix(unsigned (&r)[4], unsigned addr, bool trans) {
  const int w = threadIdx.x / 32, l = threadIdx.x % 32, g = l >> 2, t = l & 3;
  ag_warp_bar[w]->arrive_and_wait();
  ag_xa[w][l][0] = addr;
  ag_warp_bar[w]->arrive_and_wait();
  for (int i = 0; i < 4; ++i) {
    if (!trans) r[i] = ag_ld16(ag_xa[w][8 * i + g][0] + 4 * t) | (ag_ld16(ag_xa[w][8 * i + g][0] + 4 * t + 2) << 16);
    else r[i] = ag_ld16(ag_xa[w][8 * i + 2 * t][0] + 2 * g) | (ag_ld16(ag_xa[w][8 * i + 2 * t + 1][0] + 2 * g) << 16);
  }
}
inline void ag_ldmatrix_x4(unsigned (&r)[4], unsigned addr) { ag_ldmatrix(r, addr, false); }
inline void ag_ldmatrix_x4_trans(unsigned (&r)[4], unsigned addr) { ag_ldmatrix(r, addr, true); }
// mma.m16n8k16.row.col: a[0..3] = A(g, 2t..), A(g+8, 2t..), A(g, 2t+8..), A(g+8, 2t+8..);
// b0, b1 = B(2t.., g), B(2t+8.., g); d[0..3] = D(g, 2t), D(g, 2t+1), D(g+8, 2t), D(g+8, 2t+1).
inline void ag_mma(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
  const int w = threadIdx.x / 32, l = threadIdx.x % 32, g = l >> 2, t = l & 3;
  ag_warp_bar[w]->arrive_and_wait();
  for (int i = 0; i < 4; ++i) ag_xa[w][l][i] = a[i];
  ag_xb[w][l][0] = b0; ag_xb[w][l][1] = b1;
  ag_warp_bar[w]->arrive_and_wait();
  for (int e = 0; e < 4; ++e) {
    const int row = g + 8 * (e >> 1), col = 2 * t + (e & 1);
    float acc = d[e];
    for (int k = 0; k < 16; ++k) {
      const unsigned ar = ag_xa[w][(row % 8) * 4 + (k % 8) / 2][row / 8 + 2 * (k / 8)];
      const unsigned br = ag_xb[w][col * 4 + (k % 8) / 2][k / 8];
      acc += ag_elem(ar >> (16 * (k % 2))) * ag_elem(br >> (16 * (k % 2)));
    }
    d[e] = acc;
  }
}
"""


# The warpgroup-MMA primitives of the wgmma engine (backends/cuda/bwd/_wgmma_bwd.cu.j2), emulated
# on top of the above: a wgmma runs synchronously at issue (fences, commits and waits do nothing),
# each thread computing its own accumulator elements (m64nN layout: warp w of the warpgroup holds
# rows 16 w + lane / 4 (+ 8), columns 8 j + 2 (lane % 4) (+ 1) at [4 j + e]). Shared-memory operands
# are read through their descriptors as the hardware reads them: start address, LBO and SBO
# decoded from the bits, K-major or MN-major per the transpose flag, and the 128-byte swizzle
# applied to the computed address (bits 4-6 XOR bits 7-9). The register A operand is gathered
# through the warp barrier (the mma.sync fragment layout, per warp). A bulk reduction
# (cp.reduce.async.bulk) reads its source at the issuer's next wait and adds by atomics; __syncwarp
# is the warp barrier.
WG_EMU = r"""
inline void ag_fence_proxy_async() {}
inline void ag_cp_async4(unsigned dst, const void* src, bool pred) {
  if (pred) std::memcpy(ag_smem + dst, src, 4); else std::memset(ag_smem + dst, 0, 4);
}
inline void ag_wgmma_fence() {}
inline void ag_wgmma_commit() {}
template <int N> inline void ag_wgmma_wait() {}
template <class T> inline void ag_reg_fence(T&) {}
inline void ag_red_add2(float* d, float a, float b) { atomicAdd(d, a); atomicAdd(d + 1, b); }
inline void ag_red_add4(float* d, float a, float b, float c, float e) {
  if ((uintptr_t)d % 16u) { std::fprintf(stderr, "red.global.add.v4.f32: 16-byte alignment\n"); std::abort(); }
  atomicAdd(d, a); atomicAdd(d + 1, b); atomicAdd(d + 2, c); atomicAdd(d + 3, e);
}
inline void ag_warp_sync() { ag_warp_bar[threadIdx.x / 32]->arrive_and_wait(); }
// WgDq.WG's named barriers (the harness's generation counters) and register moves (nothing to do).
inline void ag_nbar_sync(int id, int count) { ag_named_bar(id, count, true); }
inline void ag_nbar_arrive(int id, int count) { ag_named_bar(id, count, false); }
template <int N> inline void ag_setmaxnreg_dec() {}
template <int N> inline void ag_setmaxnreg_inc() {}
// A bulk reduction: the PTX's preconditions (16-byte aligned addresses and sizes) checked at
// issue; the reads of the shared source happen at the issuing thread's next wait, as late as the
// hardware may read them, so a kernel that rewrites the source before waiting (or never waits)
// reduces the wrong values (or none). The source is also copied at issue, as early as the hardware
// may read it, and a source that changed in between aborts the run: it was not all written before
// the issue, or was rewritten before the wait.
// A tensor reduction (ag_tma_reduce_add) is one too, `words` its descriptor's (else null).
// `group`: the bulk group the op belongs to (the thread's commits before its issue).
struct ag_bulk_op { float* d; unsigned src, bytes; std::vector<unsigned char> at_issue; const unsigned long long* words = nullptr; int rows = 0, row0 = 0, hh = 0, b = 0; int group = 0; };
thread_local std::vector<ag_bulk_op> ag_bulk_pending;
thread_local int ag_bulk_groups = 0;
inline void ag_bulk_reduce_add(float* d, unsigned src, unsigned bytes) {
  if (((uintptr_t)d | src | bytes) % 16u) { std::fprintf(stderr, "cp.reduce.async.bulk: 16-byte alignment\n"); std::abort(); }
  ag_bulk_pending.push_back({d, src, bytes, std::vector<unsigned char>(ag_smem + src, ag_smem + src + bytes)});
  ag_bulk_pending.back().group = ag_bulk_groups;
}
inline void ag_bulk_commit() { ++ag_bulk_groups; }
// atom.acq_rel.cta.shared::cta.add.u32: the old count.
inline unsigned ag_smem_count(unsigned addr) { return std::atomic_ref<unsigned>(*reinterpret_cast<unsigned*>(ag_smem + addr)).fetch_add(1u); }
// cp.async.bulk.wait_group.read N: the ops of every group but the newest N (0: every op issued).
inline void ag_bulk_wait_read_n(int n) {
  std::vector<ag_bulk_op> keep;
  for (const ag_bulk_op& o : ag_bulk_pending) {
    if (n > 0 && o.group >= ag_bulk_groups - n) { keep.push_back(o); continue; }
    if (std::memcmp(o.at_issue.data(), ag_smem + o.src, o.bytes) != 0) {
      std::fprintf(stderr, "cp.reduce.async.bulk: the shared source changed between the issue and the wait\n");
      std::abort();
    }
    if (o.words == nullptr) {
      for (unsigned i = 0; i < o.bytes / 4; ++i) { float x; std::memcpy(&x, ag_smem + o.src + 4 * i, 4); atomicAdd(o.d + i, x); }
      continue;
    }
    // The boxes of 32 fp32 columns x rows, through the 128-byte swizzle; rows at or past the
    // descriptor's extent are not written.
    const unsigned long long* w = o.words;
    unsigned char* g = (unsigned char*)w[0] + (unsigned long long)o.b * w[7] + (unsigned long long)o.hh * w[6];
    for (unsigned c = 0; c < o.bytes / (unsigned)(o.rows * 128); ++c)
      for (int r = 0; r < o.rows; ++r) {
        const long long row = (long long)o.row0 + r;
        if (row < 0 || (unsigned long long)row >= w[2]) continue;
        for (int j = 0; j < 8; ++j)
          for (int e = 0; e < 4; ++e) {
            float x;
            std::memcpy(&x, ag_smem + o.src + c * o.rows * 128 + r * 128 + ((j ^ (r & 7)) << 4) + 4 * e, 4);
            atomicAdd((float*)(g + row * w[5]) + c * 32 + j * 4 + e, x);
          }
      }
  }
  ag_bulk_pending.swap(keep);
}
inline void ag_bulk_wait_read() { ag_bulk_wait_read_n(0); }
inline void ag_bulk_wait_read1() { ag_bulk_wait_read_n(1); }
inline void ag_bulk_wait() { ag_bulk_wait_read(); }
inline float ag_wg_desc_elem(unsigned long long desc, int mn, int k, bool mn_major) {
  if ((desc >> 62) != 1ull || ((desc >> 49) & 7ull) != 0ull) { std::fprintf(stderr, "wgmma descriptor: not a 128-byte swizzle at base offset 0\n"); std::abort(); }
  const unsigned start = (unsigned)(desc & 0x3FFFull) << 4, lbo = (unsigned)((desc >> 16) & 0x3FFFull) << 4;
  const unsigned sbo = (unsigned)((desc >> 32) & 0x3FFFull) << 4;
  // The swizzle XORs address bits 4-6 with bits 7-9; with base offset 0 the hardware takes the
  // operand's rows to start at a pattern row 0, which the emulation's address model assumes too.
  if ((start >> 7) & 7u) { std::fprintf(stderr, "wgmma descriptor: start address 0x%x is not on a 1024-byte swizzle period\n", start); std::abort(); }
  unsigned a = mn_major ? start + (unsigned)(mn / 64) * lbo + (unsigned)(k / 8) * sbo + (unsigned)(k % 8) * 128u + (unsigned)(mn % 64) * 2u
                        : start + (unsigned)(mn / 8) * sbo + (unsigned)(mn % 8) * 128u + (unsigned)k * 2u;
  a ^= ((a >> 7) & 7u) << 4;
  return ag_elem(ag_ld16(a));
}
template <int N>
inline void ag_wg_ss(float* d, unsigned long long da, unsigned long long db, int acc, int ta, int tb) {
  const int w = (threadIdx.x / 32) % 4, l = threadIdx.x % 32, g = l >> 2, t = l & 3;
  for (int j = 0; j < N / 8; ++j)
    for (int e = 0; e < 4; ++e) {
      const int row = 16 * w + g + 8 * (e >> 1), col = 8 * j + 2 * t + (e & 1);
      float s = 0.f;
      for (int k = 0; k < 16; ++k) s += ag_wg_desc_elem(da, row, k, ta) * ag_wg_desc_elem(db, col, k, tb);
      d[4 * j + e] = (acc ? d[4 * j + e] : 0.f) + s;
    }
}
template <int N>
inline void ag_wg_rs(float* d, const unsigned (&a)[4], unsigned long long db, int acc) {
  const int w = threadIdx.x / 32, l = threadIdx.x % 32, g = l >> 2, t = l & 3;
  ag_warp_bar[w]->arrive_and_wait();
  for (int i = 0; i < 4; ++i) ag_xa[w][l][i] = a[i];
  ag_warp_bar[w]->arrive_and_wait();
  for (int j = 0; j < N / 8; ++j)
    for (int e = 0; e < 4; ++e) {
      const int row = g + 8 * (e >> 1), col = 8 * j + 2 * t + (e & 1);
      float s = 0.f;
      for (int k = 0; k < 16; ++k) {
        const unsigned ar = ag_xa[w][(row % 8) * 4 + (k % 8) / 2][row / 8 + 2 * (k / 8)];
        s += ag_elem(ar >> (16 * (k % 2))) * ag_wg_desc_elem(db, col, k, true);
      }
      d[4 * j + e] = (acc ? d[4 * j + e] : 0.f) + s;
    }
}
#define AG_WG_SHAPE(N) \
  template <int TA, int TB> inline void ag_wgmma_ss_n##N(float (&d)[N / 2], unsigned long long da, unsigned long long db, int acc) { ag_wg_ss<N>(d, da, db, acc, TA, TB); } \
  inline void ag_wgmma_rs_n##N(float (&d)[N / 2], const unsigned (&a)[4], unsigned long long db, int acc) { ag_wg_rs<N>(d, a, db, acc); }
AG_WG_SHAPE(32)
AG_WG_SHAPE(64)
AG_WG_SHAPE(128)
"""


# The wgmma kernel's TMA copies (plan_bwd.WG_LOADS = TMA), emulated as the forward's emulation
# does (tests/codegen/_fwd_emu.py): an mbarrier word in the emulated shared memory holds its
# pending arrivals (bits 0-15), expected count (16-31) and completed phases (32-63); an arrival that
# expects bytes is held back until copies of that many bytes have landed on the barrier; a copy
# lands at issue, reading the descriptor the harness wrote (words: 0 the tensor's address, 1-4 its
# extents, innermost first, 5-7 the byte strides of rows, heads and batch) through the 128-byte
# swizzle, zero past the rows' extent; a wait spins (and aborts once no thread has arrived anywhere
# for AG_WAIT_SECONDS: a lost arrival or a wrong parity).
# The mbarrier word and one arrival (the forward's emulation, tests/codegen/_fwd_emu.py, shares it).
MBAR_CORE = r"""
// TMA bytes still expected, per mbarrier (by its offset / 8)
static std::atomic<long long> ag_tx[1 << 15];
// Arrivals on any mbarrier so far: a waiter gives up only after AG_WAIT_SECONDS in which no thread
// arrived anywhere (a lost arrival stalls every thread), never because a loaded host ran it slowly.
static std::atomic<unsigned long long> ag_arrivals{0};
// Whether a waiter that started at *t0 having seen *seen arrivals has waited AG_WAIT_SECONDS with none.
inline bool ag_stalled(std::chrono::steady_clock::time_point* t0, unsigned long long* seen) {
  const unsigned long long now_seen = ag_arrivals.load(std::memory_order_relaxed);
  const auto now = std::chrono::steady_clock::now();
  if (now_seen != *seen) { *seen = now_seen; *t0 = now; return false; }
  return now - *t0 > std::chrono::seconds(AG_WAIT_SECONDS);
}
inline void ag_mbar_arrive(unsigned bar) {
  ag_arrivals.fetch_add(1, std::memory_order_relaxed);
  std::atomic_ref<unsigned long long> w(*(unsigned long long*)(ag_smem + bar));
  unsigned long long old = w.load(), nw;
  do {
    const unsigned long long pending = old & 0xFFFFull, expected = (old >> 16) & 0xFFFFull;
    if (pending == 0) { std::fprintf(stderr, "mbarrier at %u: arrival past its count\n", bar); std::abort(); }
    nw = pending > 1 ? old - 1 : ((old >> 32) + 1) << 32 | expected << 16 | expected;
  } while (!w.compare_exchange_weak(old, nw));
}
"""
TMA_EMU = MBAR_CORE + r"""inline void ag_bar_init(unsigned bar, int count) {
  std::atomic_ref<unsigned long long>(*(unsigned long long*)(ag_smem + bar)).store((unsigned long long)count | ((unsigned long long)count << 16));
  ag_tx[bar / 8] = 0;
}
inline void ag_bar_init_fence() {}
inline void ag_bar_arrive_expect(unsigned bar, unsigned bytes) { ag_tx[bar / 8] += bytes; }
inline void ag_bar_wait(unsigned bar, int parity) {
  auto t0 = std::chrono::steady_clock::now();
  unsigned long long seen = ag_arrivals.load();
  while ((int)((std::atomic_ref<unsigned long long>(*(unsigned long long*)(ag_smem + bar)).load() >> 32) & 1ull) == parity) {
    if (ag_stalled(&t0, &seen)) {
      std::fprintf(stderr, "mbarrier at %u: thread %u waited %d s for parity %d (a lost arrival?)\n", bar, threadIdx.x, AG_WAIT_SECONDS, parity);
      std::abort();
    }
    std::this_thread::yield();
  }
}
template <int ROWS, int COLS>
inline void ag_tma_load(unsigned dst, const ag_tmap* map, int row0, int hh, int b, unsigned bar) {
  const unsigned long long* w = map->opaque;
  if (hh < 0 || (unsigned long long)hh >= w[3] || b < 0 || (unsigned long long)b >= w[4] || COLS > (int)w[1] || dst % 1024u) {
    std::fprintf(stderr, "TMA box outside the tensor (head %d, batch %d) or a tile off its 1024-byte swizzle period\n", hh, b); std::abort();
  }
  const unsigned char* base = (const unsigned char*)w[0] + (unsigned long long)b * w[7] + (unsigned long long)hh * w[6];
  for (int c = 0; c < COLS / 64; ++c)
    for (int r = 0; r < ROWS; ++r)
      for (int j = 0; j < 8; ++j) {
        unsigned char* d = ag_smem + dst + c * ROWS * 128 + r * 128 + ((j ^ (r & 7)) << 4);
        const long long row = (long long)row0 + r;
        if (row >= 0 && (unsigned long long)row < w[2]) std::memcpy(d, base + row * w[5] + (c * 64 + j * 8) * 2, 16);
        else std::memset(d, 0, 16);
      }
  const long long n = (long long)(COLS / 64) * ROWS * 128;
  const long long left = (ag_tx[bar / 8] -= n);
  if (left < 0) { std::fprintf(stderr, "mbarrier at %u: TMA bytes past the expected count\n", bar); std::abort(); }
  if (left == 0) ag_mbar_arrive(bar);
}
// cp.reduce.async.bulk.tensor (WgDq.WG_TMA): the boxes of one call are one bulk group of the
// issuing thread, its source read at a wait that covers the group, as above.
template <int ROWS, int COLS>
inline void ag_tma_reduce_add(unsigned src, const ag_tmap* map, int row0, int hh, int b) {
  const unsigned long long* w = map->opaque;
  if (hh < 0 || (unsigned long long)hh >= w[3] || b < 0 || (unsigned long long)b >= w[4] || COLS > (int)w[1] || COLS % 32 || src % 1024u || w[0] % 16u) {
    std::fprintf(stderr, "TMA reduction box outside the tensor (head %d, batch %d), a tile off its 1024-byte swizzle period or a misaligned tensor\n", hh, b);
    std::abort();
  }
  const unsigned bytes = (unsigned)(COLS / 32) * ROWS * 128;
  ag_bulk_pending.push_back({nullptr, src, bytes, std::vector<unsigned char>(ag_smem + src, ag_smem + src + bytes), w, ROWS, row0, hh, b, ag_bulk_groups});
  ag_bulk_commit();  // (the kernel's ag_tma_reduce_add commits its boxes as one group)
}
"""


def _emulate_tc(body: str) -> str:
    """The source with its tensor-core primitive block (if any) replaced by the emulation."""
    if TC_BEGIN not in body:
        return body
    head, rest = body.split(TC_BEGIN, 1)
    block, tail = rest.split(TC_END, 1)
    return head + TC_EMU + (WG_EMU if "wgmma" in block else "") + (TMA_EMU if "ag_tma_load" in block else "") + tail


def available() -> str | None:
    """None when the emulation can run here, else why not."""
    if shutil.which("g++") is None:
        return "g++ is not on the PATH"
    if not Path(CUDA_INCLUDE, "cuda_fp16.h").exists():
        return f"no CUDA headers at {CUDA_INCLUDE}"
    return None


def _harness(bp: OpPlan, ns: str, grids: dict[str, tuple[int, int, int]], wanted: tuple[str, ...], maps=()) -> str:
    lines = [f"namespace {ns} {{ float smem[{max(k.smem.bytes for k in bp.kernels) // 4 + 1}]; "
             f"alignas(1024) unsigned char ag_smem[{max(k.smem.bytes for k in bp.kernels) + 16}]; }}",
             "static std::vector<std::vector<char>> blobs;",
             "int main(int argc, char** argv) {",
             "  FILE* f = std::fopen(argv[1], \"rb\");",
             f"  {ns}::Params p;"]
    for fl in bp.fields:
        if fl.ctype.endswith("*") or "*" in fl.ctype:
            lines += [
                "  { long long n; std::fread(&n, 8, 1, f); blobs.emplace_back(n > 0 ? n : 0);",
                "    if (n > 0) std::fread(blobs.back().data(), 1, n, f);",
                f"    p.{fl.name} = n > 0 ? (decltype(p.{fl.name}))blobs.back().data() : nullptr; }}",
            ]
        elif fl.ctype == "int":
            lines.append(f"  {{ int x; std::fread(&x, 4, 1, f); p.{fl.name} = x; }}")
        else:
            lines.append(f"  {{ long long x; std::fread(&x, 8, 1, f); p.{fl.name} = x; }}")
    for m in maps:  # TMA descriptors: eight words each, the first replaced by the tensor's address
        lines += [f"  {ns}::ag_tmap a_{m.name}{{}};", f"  std::fread(a_{m.name}.opaque, 8, 8, f);",
                  f"  a_{m.name}.opaque[0] = (unsigned long long)p.{m.tensor};"]
    lines.append("  std::fclose(f);")
    args = ", ".join(f"p.{fl.name}" for fl in bp.fields)
    for k in bp.kernels:
        gx, gy, gz = grids[k.func]
        kargs = args + "".join(f", a_{m.name}" for m in maps) if k.func == "ag_bwd_dkdv" else args
        lines.append(f"  ag_launch({gx}, {gy}, {gz}, {k.threads}, [&] {{ {k.name}({kargs}); }});")
    lines += ["  FILE* o = std::fopen(argv[2], \"wb\");"]
    for name in wanted:
        idx = [i for i, fl in enumerate(bp.fields) if "*" in fl.ctype].index([i for i, fl in enumerate(bp.fields) if fl.name == name][0])
        lines.append(f"  std::fwrite(blobs[{idx}].data(), 1, blobs[{idx}].size(), o);")
    lines += ["  std::fclose(o);", "  return 0;", "}"]
    return "\n".join(lines) + "\n"


def run(src: str, bp: OpPlan, v, arrays: dict[str, np.ndarray], lse: np.ndarray, dO: np.ndarray, o: np.ndarray,
        workdir: str | None = None, wrt: tuple[str, ...] = (), wait_seconds: int = 60) -> dict[str, np.ndarray]:
    """Compile `src` for the host and run its kernels on the arrays (numpy, spec dtypes, the
    variant's layout, contiguous; with `norm o`, `o` is the output before the post-norm and the
    residual, as the training forward saves it); returns dq, dk, dv (and the gradients of the score inputs named
    in `wrt`) as float64 in their inputs' shapes."""
    from attngen.check.reference import dtype_of

    ns = f"{bp.base_name}_impl"
    body = src.rsplit("\n#ifndef __CUDACC_RTC__\n", 1)[0]  # up to the host-only block (the launcher) at the end
    layout = v.layout.value
    if layout == "varlen":  # packed [total, heads, D]; B from cu_seqlens; the per-row kernels see one sequence
        B = int(np.shape(arrays[v.cu_seqlens_names[0]])[0]) - 1
        Lq, Lk, nb = arrays["q"].shape[0], arrays["k"].shape[0], 1
    else:
        B = nb = arrays["q"].shape[0]
        Lq = arrays["q"].shape[2] if layout == "bhsd" else arrays["q"].shape[1]
        Lk = arrays["k"].shape[2] if layout == "bhsd" else arrays["k"].shape[1]
    et = dtype_of(v.dtype)
    # NaN poison: the kernels must write every element of dq, dk and dv.
    outs = {n: np.zeros(arrays[src_].shape, dtype=et) + np.array(np.nan, et) for n, src_ in (("dq", "q"), ("dk", "k"), ("dv", "v"))}
    bufs = {
        "q": arrays["q"], "k": arrays["k"], "v": arrays["v"], "o": o, "dO": dO.astype(et), "lse": lse.astype(np.float32),
        "dq": outs["dq"], "dk": outs["dk"], "dv": outs["dv"],
        "ws_delta": np.zeros(nb * v.heads * Lq, np.float32),
        # NaN poison: every element the kernels read must have been written first.
        "ws_dq": np.full(nb * v.heads * Lq * v.head_dim, np.nan, np.float32),
        "ws_q": np.zeros(nb * v.heads * Lq * v.head_dim, et) + np.array(np.nan, et),
        "ws_k": np.zeros(nb * v.kv_heads * Lk * v.head_dim, et) + np.array(np.nan, et),
        "ws_dk": np.full(nb * v.kv_heads * Lk * v.head_dim, np.nan, np.float32),
        "ws_do": np.zeros(nb * v.heads * Lq * v.value_head_dim, et) + np.array(np.nan, et),
    }
    for n in wrt:
        outs[n] = bufs[f"grad_{n}"] = np.zeros(arrays[n].shape, np.float32)
    for fl in bp.fields:
        if fl.name.startswith("grad_") and fl.name not in bufs:
            bufs[fl.name] = None

    def strides(a):
        s = [x // a.itemsize for x in a.strides]
        if layout == "varlen":
            return (0, s[1], s[0])
        return (s[0], s[1], s[2]) if layout == "bhsd" else (s[0], s[2], s[1])

    blob = bytearray()
    for fl in bp.fields:
        n = fl.name
        if "*" in fl.ctype:
            a = bufs[n] if not n.startswith("in_") else arrays[n[3:]]
            if a is None:
                blob += np.int64(0).tobytes()
                continue
            a = np.ascontiguousarray(a)
            if n.startswith("in_"):
                decl = next(d for d in v.runtime_inputs() if d.name == n[3:])
                a = a.astype(dtype_of(decl.dtype))
            raw = a.tobytes()
            blob += np.int64(len(raw)).tobytes() + raw
        elif n in ("B", "Lq", "Lk", "q_offset", "kv_offset", "Lq_total", "Lk_total", "total_q", "total_k"):
            blob += np.int32({"B": B, "Lq": Lq, "Lk": Lk, "q_offset": 0, "kv_offset": 0, "Lq_total": Lq, "Lk_total": Lk,
                              "total_q": Lq, "total_k": Lk}[n]).tobytes()
        elif n.startswith("in_"):
            base, kind, i = n[3:].rsplit("_", 1)[0], n.rsplit("_", 1)[1][0], int(n.rsplit("_", 1)[1][1:])
            a = np.ascontiguousarray(arrays[base])
            if kind == "n":
                blob += np.int32(a.shape[i]).tobytes()
            else:
                blob += np.int64(a.strides[i] // a.itemsize).tobytes()
        else:
            t, s = n.rsplit("_", 1)
            a = bufs[t]
            blob += np.int64(strides(a)[("sb", "sh", "ss").index(s)]).tobytes()
    from attngen.plan.bwd import wg_tma_maps

    maps = wg_tma_maps(bp, v)
    for m in maps:  # the descriptors' words but the address (the harness fills it in)
        L = Lq if m.length == "Lq" else Lk
        if m.tensor.startswith("ws_"):
            ss, sh, sb = m.dense_strides(L)
        else:
            sb, sh, ss = strides(bufs[m.tensor])
        it = 4 if m.fp32 else np.dtype(et).itemsize
        blob += np.array([0, m.cols, L, m.heads, B, ss * it, sh * it, sb * it], np.int64).tobytes()
    H, Hkv, D = v.heads, v.kv_heads, v.head_dim
    grids = {
        "ag_bwd_pre": (2, 1, 1),  # grid-stride kernels: any grid is correct; a small one tests the stride
        "ag_bwd_prep": (3, 1, 1),
        "ag_bwd_finish": (3, 1, 1),
        **{k.func: bp.launch_grid(k, B, Lq, Lk) for k in bp.kernels if k.grid_rule == GridRule.TILES},
    }
    wanted = ("dq", "dk", "dv", *(f"grad_{n}" for n in wrt))
    tmp = workdir or tempfile.mkdtemp(prefix="attngen-emu-")
    cpp = os.path.join(tmp, "k.cpp")
    exe = os.path.join(tmp, "k")
    Path(cpp).write_text(SHIM + "#define __grid_constant__\n" + _emulate_tc(body) + _harness(bp, ns, grids, wanted, maps))
    r = subprocess.run(["g++", "-std=c++20", "-O1", "-w", "-pthread", f"-DAG_WAIT_SECONDS={int(wait_seconds)}", f"-I{CUDA_INCLUDE}", cpp, "-o", exe],
                       capture_output=True, text=True, check=False)
    if r.returncode != 0:
        raise RuntimeError("g++ rejected the emulated kernels:\n" + r.stderr[-6000:])
    Path(tmp, "in.bin").write_bytes(bytes(blob))
    r = subprocess.run([exe, os.path.join(tmp, "in.bin"), os.path.join(tmp, "out.bin")], capture_output=True, text=True, check=False)
    if r.returncode != 0:
        raise RuntimeError(f"emulated kernels failed ({r.returncode}):\n{r.stderr[-4000:]}")
    raw = Path(tmp, "out.bin").read_bytes()
    res, off = {}, 0
    for n in ("dq", "dk", "dv", *wrt):
        a = outs[n]
        res[n] = np.frombuffer(raw[off:off + a.nbytes], dtype=a.dtype).reshape(a.shape).astype(np.float64)
        off += a.nbytes
    return res


def pre_norm_forward(v, arrays):
    """The training forward of a variant with an o post-norm: the same variant without the post-norm
    and the residual, which saves O' and the LSE that the backward reads; returns (O', LSE)."""
    import dataclasses

    from attngen.check import reference
    from attngen.ir.nodes import NormTarget, norm_bias_name, norm_weight_name

    pre = dataclasses.replace(v, norms=tuple(n for n in v.norms if n.target != NormTarget.O), residual=False)
    rest = {n: a for n, a in arrays.items() if n not in ("q", "k", "v", norm_weight_name(NormTarget.O), norm_bias_name(NormTarget.O))}
    return reference.attention(pre, arrays["q"], arrays["k"], arrays["v"], rest)
