"""Run the generated decode kernels (the split kernel, then the combine kernel) on the CPU: the
rendered CUDA compiled with g++ against the forward emulation's shim (`_fwd_emu`: one std::thread
per CUDA thread, warp barriers and shuffles, ldmatrix and mma.sync gathered by the PTX fragment
layouts, cp.async as synchronous copies). Beyond it, the FP8 cache's primitives: the fp8x2 -> f16x2
conversion by cuda_fp8.h's host conversion (exact, as cvt.rn.f16x2.e4m3x2 / e5m2x2), P·V's f16 or
bf16 mma.sync by the same gather with its operand type, the 4-byte cp.async of per-page scales.
CTAs run one after another; the combine merges the partials (no row-block counters).

What this checks without a GPU: the fragment layouts of the fp8 reads (which byte of which key
feeds which mma operand, Q's permuted tile, the epilogue's column order), the scales' placement,
the ring bookkeeping across chunks, segments and splits, the masking and the merge. Not timing,
bank conflicts or the asynchrony of cp.async."""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from _fwd_emu import FWD_SHIM, LD_HELPERS, MMA_CORE, PRIMS, _functions, _harness
from _host_emu import CUDA_INCLUDE, SHIM, available  # noqa: F401  (sys.path set by _fwd_emu)

__all__ = ["available", "run"]

DECODE_SHIM = r"""
#include <cuda_fp8.h>
template <class T> inline T __ldcg(const T* p) { return *p; }
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline unsigned __byte_perm(unsigned a, unsigned b, unsigned s) {
  const unsigned long long x = ((unsigned long long)b << 32) | a;
  unsigned r = 0;
  for (int i = 0; i < 4; ++i) r |= (unsigned)((x >> (8 * ((s >> (4 * i)) & 7))) & 0xffu) << (8 * i);
  return r;
}
"""

FP8_PRIMS = {
    "ag_cp_async4": "inline void ag_cp_async4(unsigned dst, const void* src, bool pred) {\n"
                    "  if (pred) std::memcpy(ag_smem + dst, src, 4); else std::memset(ag_smem + dst, 0, 4);\n}",
    "ag_fp8x2_f16x2": "template <bool E5M2> inline unsigned ag_fp8x2_f16x2(unsigned x) {\n"
                      "  unsigned r = 0;\n"
                      "  for (int i = 0; i < 2; ++i) {\n"
                      "    const unsigned char u = (unsigned char)(x >> (8 * i));\n"
                      "    float f;\n"
                      "    if (E5M2) { __nv_fp8_e5m2 e; e.__x = u; f = (float)e; } else { __nv_fp8_e4m3 e; e.__x = u; f = (float)e; }\n"
                      "    const __half h = __float2half_rn(f);\n"
                      "    unsigned short b; std::memcpy(&b, &h, 2);\n"
                      "    r |= (unsigned)b << (16 * i);\n  }\n  return r;\n}",
    # P·V's mma.sync, f16 or bf16 (AG_PV: the operand type its PTX names).
    "ag_mma_pv16": "inline float ag_pv(unsigned bits16) { unsigned short u = (unsigned short)bits16; AG_PV h; std::memcpy(&h, &u, 2); return (float)h; }\n"
                  "inline void ag_mma_pv16(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {\n"
                  "  const int w = threadIdx.x / 32, l = threadIdx.x % 32, g = l >> 2, t = l & 3;\n"
                  "  ag_warp_bar[w]->arrive_and_wait();\n"
                  "  for (int i = 0; i < 4; ++i) ag_xa[w][l][i] = a[i];\n"
                  "  ag_xb[w][l][0] = b0; ag_xb[w][l][1] = b1;\n"
                  "  ag_warp_bar[w]->arrive_and_wait();\n"
                  "  for (int e = 0; e < 4; ++e) {\n"
                  "    const int row = g + 8 * (e >> 1), col = 2 * t + (e & 1);\n"
                  "    float acc = d[e];\n"
                  "    for (int k = 0; k < 16; ++k) {\n"
                  "      const unsigned ar = ag_xa[w][(row % 8) * 4 + (k % 8) / 2][row / 8 + 2 * (k / 8)];\n"
                  "      const unsigned br = ag_xb[w][col * 4 + (k % 8) / 2][k / 8];\n"
                  "      acc += ag_pv(ar >> (16 * (k % 2))) * ag_pv(br >> (16 * (k % 2)));\n"
                  "    }\n    d[e] = acc;\n  }\n}",
}
MMA_NAMES = ("ag_ldmatrix_x4", "ag_ldmatrix_x4_trans", "ag_mma")
SIMPLE = ("ag_smem_addr", "ag_ex2", "ag_tanh_fast", "ag_cp_async16", "ag_cp_async_commit", "ag_cp_async_wait")


def emulated_source(src: str) -> str:
    """The decode kernels' source (no host launcher) with their PTX primitives replaced."""
    body = src.split("#ifndef __CUDACC_RTC__\n#include <atomic>")[0].replace("#include <cuda_runtime.h>\n", "")
    fns = [f for f in _functions(body) if f[0] in MMA_NAMES or f[0] in FP8_PRIMS or f[0] in SIMPLE]
    out, pos, done = [], 0, set()
    for name, s, e in sorted(fns, key=lambda f: f[1]):
        out.append(body[pos:s])
        if name in MMA_NAMES:
            if "mma" not in done:
                out.append(LD_HELPERS + MMA_CORE)
                done.add("mma")
        elif name == "ag_smem_addr":
            out.append("\nextern unsigned char ag_smem[];\n" + PRIMS[name])
        elif name == "ag_mma_pv16":
            pv = "__nv_bfloat16" if ".bf16.bf16." in body[s:e] else "__half"
            out.append(FP8_PRIMS[name].replace("AG_PV", pv))
        else:
            out.append(FP8_PRIMS[name] if name in FP8_PRIMS else PRIMS[name])
        pos = e
    out.append(body[pos:])
    text = "".join(out)
    if re.search(r"\basm(\s+volatile)?\s*\(", text):
        left = sorted(set(re.findall(r'asm(?: volatile)?\(\s*"([a-z.0-9]+)', text)))
        raise ValueError(f"PTX left after emulation: {left}")
    return text


def run(src: str, op, v, arrays: dict[str, np.ndarray], *, splits: int = 1, ctas: int | None = None,
        timeout: float = 600.0) -> tuple[np.ndarray, np.ndarray | None]:
    """Compile the rendered decode `src` (plan `op`, variant `v`) for the host and run it on
    `arrays` (fuzz.case_inputs' numpy arrays: q, k, v, the scales and other runtime inputs);
    `splits` equal key splits of every row block, or `ctas` equal shares (splits then the slots
    they need). Returns O (float64, q's layout) and the LSE (or None)."""
    from attngen.check.reference import dtype_of

    dp = op.split
    layout = v.layout.value
    q, k, vv = (np.ascontiguousarray(arrays[n]) for n in ("q", "k", "v"))
    B = q.shape[0]
    Lq = q.shape[2] if layout == "bhsd" else q.shape[1]
    if v.page_size is not None:
        Lk = arrays["block_table"].shape[1] * v.page_size
    else:
        Lk = k.shape[2] if layout == "bhsd" else k.shape[1]
    if ctas is None:
        ctas = dp.split_ctas(B, Lq, Lk, splits)
    else:
        splits = dp.slots(B, Lq, ctas)
    et = dtype_of(v.dtype)
    o_shape = (B, v.heads, Lq, v.value_head_dim) if layout == "bhsd" else (B, Lq, v.heads, v.value_head_dim)
    out = np.zeros(o_shape, dtype=et) + np.array(np.nan, et)
    lse = np.full((B, v.heads, Lq), np.nan, np.float32) if v.lse else None
    ws_o = np.full(B * v.heads * Lq * splits * v.value_head_dim, np.nan, np.float32)
    ws_lse = np.full(B * v.heads * Lq * splits, np.nan, np.float32)
    bufs = {"q": q, "k": k.view(np.uint8), "v": vv.view(np.uint8), "o": out, "lse": lse,
            "nan_flag": np.zeros(1, np.int32) if v.nan_check else None, "ws_o": ws_o, "ws_lse": ws_lse, "ws_count": None}
    ints = {"B": B, "Lq": Lq, "Lk": Lk, "q_offset": 0, "kv_offset": 0, "Lq_total": Lq, "Lk_total": Lk, "splits": splits,
            "ctas": ctas, "num_pages": k.shape[0]}

    def strides(name: str) -> tuple[int, int, int]:
        a = bufs[name]
        s = [x // a.itemsize for x in a.strides]
        if v.page_size is not None and name in ("k", "v"):
            return s[0], s[2], s[1]  # [num_pages, page, Hkv, D]: page, head, slot
        return (s[0], s[1], s[2]) if layout == "bhsd" else (s[0], s[2], s[1])

    blob, ptrs = bytearray(), []
    for fl in op.fields:
        n = fl.name
        if "*" in fl.ctype:
            if n.startswith("in_"):
                decl = next(d for d in v.runtime_inputs() if d.name == n[3:])
                a = np.ascontiguousarray(arrays[n[3:]]).astype(dtype_of(decl.dtype))
            else:
                a = bufs[n]
            ptrs.append(n)
            raw = b"" if a is None else np.ascontiguousarray(a).tobytes()
            blob += np.int64(len(raw)).tobytes() + raw
        elif n in ints:
            blob += np.int32(ints[n]).tobytes()
        elif n.startswith("in_"):
            base, tail = n[3:].rsplit("_", 1)
            a = np.ascontiguousarray(arrays[base])
            i = int(tail[1:])
            blob += (np.int32(a.shape[i]) if tail[0] == "n" else np.int64(a.strides[i] // a.itemsize)).tobytes()
        else:
            t, s = n.rsplit("_", 1)
            blob += np.int64(strides(t)[("sb", "sh", "ss").index(s)]).tobytes()
    ns = f"{op.kernel_name}_impl"
    fields = [type("F", (), dict(name=f.name, ctype=f.ctype, qctype=f.ctype.replace("elem_t", f"{ns}::elem_t")))() for f in op.fields]
    rows = B * v.heads * Lq
    launches = [(op.kernel_name, (ctas, 1, 1), dp.threads, None)]
    if splits > 1:
        launches.append((f"{op.kernel_name}_combine", (max(1, min(4, -(-rows // 8))), 1, 1), 256, None))
    n_out = ptrs.index("lse") + 1 if v.lse else ptrs.index("o") + 1
    tmp = tempfile.mkdtemp(prefix="attngen-decode-emu-")
    cpp, exe = os.path.join(tmp, "k.cpp"), os.path.join(tmp, "k")
    Path(cpp).write_text(SHIM + FWD_SHIM + DECODE_SHIM + emulated_source(src)
                         + _harness(ns, launches, fields, op.smem_bytes, n_out))
    r = subprocess.run(["g++", "-std=c++20", "-O1", "-w", "-pthread", "-DAG_WAIT_SECONDS=120", f"-I{CUDA_INCLUDE}", cpp, "-o", exe],
                       capture_output=True, text=True, check=False)
    if r.returncode != 0:
        raise RuntimeError("g++ rejected the emulated decode kernel:\n" + r.stderr[-6000:])
    Path(tmp, "in.bin").write_bytes(bytes(blob))
    r = subprocess.run([exe, os.path.join(tmp, "in.bin"), os.path.join(tmp, "out.bin")], capture_output=True, text=True,
                       check=False, timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"emulated decode kernel failed ({r.returncode}):\n{r.stderr[-4000:]}")
    raw = Path(tmp, "out.bin").read_bytes()
    res, off = {}, 0
    for n in ptrs[:n_out]:
        a = bufs[n]
        if a is None:
            continue
        res[n] = np.frombuffer(raw[off:off + a.nbytes], dtype=a.dtype).reshape(a.shape)
        off += a.nbytes
    return res["o"].astype(np.float64), (res["lse"].astype(np.float64) if v.lse else None)
