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

from attngen.plan.bwd import BwdPlan

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
static float ag_warp_buf[64][32];
inline void __syncthreads() { ag_block_bar->arrive_and_wait(); }
inline float __shfl_xor_sync(unsigned, float x, int o) {
  const int w = threadIdx.x / 32, l = threadIdx.x % 32;
  ag_warp_bar[w]->arrive_and_wait();
  ag_warp_buf[w][l] = x;
  ag_warp_bar[w]->arrive_and_wait();
  return ag_warp_buf[w][l ^ o];
}
inline float __fdividef(float a, float b) { return a / b; }  // (declared for ag_tanh_fast, unused here)
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline float atomicAdd(float* a, float v) { return std::atomic_ref<float>(*a).fetch_add(v); }
template <class A, class B> inline std::common_type_t<A, B> min(A a, B b) { return a < b ? a : b; }
template <class A, class B> inline std::common_type_t<A, B> max(A a, B b) { return a < b ? b : a; }
static void ag_launch(unsigned gx, unsigned gy, unsigned gz, int threads, const std::function<void()>& body) {
  gridDim.x = gx; gridDim.y = gy; gridDim.z = gz;
  for (unsigned z = 0; z < gz; ++z)
    for (unsigned y = 0; y < gy; ++y)
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


def available() -> str | None:
    """None when the emulation can run here, else why not."""
    if shutil.which("g++") is None:
        return "g++ is not on the PATH"
    if not Path(CUDA_INCLUDE, "cuda_fp16.h").exists():
        return f"no CUDA headers at {CUDA_INCLUDE}"
    return None


def _harness(bp: BwdPlan, ns: str, grids: dict[str, tuple[int, int, int]], wanted: tuple[str, ...]) -> str:
    lines = [f"namespace {ns} {{ float smem[{max(k.smem for k in bp.kernels) // 4 + 1}]; }}",
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
    lines.append("  std::fclose(f);")
    args = ", ".join(f"p.{fl.name}" for fl in bp.fields)
    for k in bp.kernels:
        gx, gy, gz = grids[k.func]
        lines.append(f"  ag_launch({gx}, {gy}, {gz}, {k.threads}, [&] {{ {k.name}({args}); }});")
    lines += ["  FILE* o = std::fopen(argv[2], \"wb\");"]
    for name in wanted:
        idx = [i for i, fl in enumerate(bp.fields) if "*" in fl.ctype].index([i for i, fl in enumerate(bp.fields) if fl.name == name][0])
        lines.append(f"  std::fwrite(blobs[{idx}].data(), 1, blobs[{idx}].size(), o);")
    lines += ["  std::fclose(o);", "  return 0;", "}"]
    return "\n".join(lines) + "\n"


def run(src: str, bp: BwdPlan, v, arrays: dict[str, np.ndarray], lse: np.ndarray, dO: np.ndarray, o: np.ndarray,
        workdir: str | None = None, wrt: tuple[str, ...] = ()) -> dict[str, np.ndarray]:
    """Compile `src` for the host and run its kernels on the arrays (numpy, spec dtypes, the
    variant's layout, contiguous); returns dq, dk, dv (and the gradients of the score inputs named
    in `wrt`) as float64 in their inputs' shapes."""
    from attngen.check.reference import dtype_of

    ns = f"{bp.base_name}_impl"
    body = src.split("#ifndef __CUDACC_RTC__\n// Host launcher")[0]
    B = arrays["q"].shape[0]
    layout = v.layout.value
    Lq = arrays["q"].shape[2] if layout == "bhsd" else arrays["q"].shape[1]
    Lk = arrays["k"].shape[2] if layout == "bhsd" else arrays["k"].shape[1]
    et = dtype_of(v.dtype)
    outs = {n: np.zeros(arrays[src_].shape, dtype=et) for n, src_ in (("dq", "q"), ("dk", "k"), ("dv", "v"))}
    bufs = {
        "q": arrays["q"], "k": arrays["k"], "v": arrays["v"], "o": o, "dO": dO.astype(et), "lse": lse.astype(np.float32),
        "dq": outs["dq"], "dk": outs["dk"], "dv": outs["dv"],
        "ws_delta": np.zeros(B * v.heads * Lq, np.float32),
        # NaN poison: every element the kernels read must have been written first.
        "ws_dq": np.full(B * v.heads * Lq * v.head_dim, np.nan, np.float32),
        "ws_q": np.zeros(B * v.heads * Lq * v.head_dim, et) + np.array(np.nan, et),
        "ws_k": np.zeros(B * v.kv_heads * Lk * v.head_dim, et) + np.array(np.nan, et),
        "ws_dk": np.full(B * v.kv_heads * Lk * v.head_dim, np.nan, np.float32),
    }
    for n in wrt:
        outs[n] = bufs[f"grad_{n}"] = np.zeros(arrays[n].shape, np.float32)
    for fl in bp.fields:
        if fl.name.startswith("grad_") and fl.name not in bufs:
            bufs[fl.name] = None

    def strides(a):
        s = [x // a.itemsize for x in a.strides]
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
        elif n in ("B", "Lq", "Lk", "q_offset", "kv_offset", "Lq_total", "Lk_total"):
            blob += np.int32({"B": B, "Lq": Lq, "Lk": Lk, "q_offset": 0, "kv_offset": 0, "Lq_total": Lq, "Lk_total": Lk}[n]).tobytes()
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
    H, Hkv, D = v.heads, v.kv_heads, v.head_dim
    grids = {
        "ag_bwd_pre": (2, 1, 1),  # grid-stride kernels: any grid is correct; a small one tests the stride
        "ag_bwd_prep": (3, 1, 1),
        "ag_bwd_finish": (3, 1, 1),
        "ag_bwd_dkdv": bp.grid("ag_bwd_dkdv", B, Lq, Lk, H, Hkv, D),
        "ag_bwd_dq": bp.grid("ag_bwd_dq", B, Lq, Lk, H, Hkv, D),
    }
    wanted = ("dq", "dk", "dv", *(f"grad_{n}" for n in wrt))
    tmp = workdir or tempfile.mkdtemp(prefix="attngen-emu-")
    cpp = os.path.join(tmp, "k.cpp")
    exe = os.path.join(tmp, "k")
    Path(cpp).write_text(SHIM + body + _harness(bp, ns, grids, wanted))
    r = subprocess.run(["g++", "-std=c++20", "-O1", "-w", "-pthread", f"-I{CUDA_INCLUDE}", cpp, "-o", exe],
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
