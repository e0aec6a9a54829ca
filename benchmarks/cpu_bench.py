#!/usr/bin/env python3
"""The CPU backend against torch's CPU attention, same threads, same run: writes benchmarks/results/cpu.jsonl.

    python benchmarks/cpu_bench.py [--threads N] [--quick] [--repeats R] [--no-flex] [--only S] [--out PATH]

Rows:
- dense and causal fp32 at D64/D128 and L 128 .. 4k (2k with --quick), against SDPA (`is_causal`);
- custom masks at D64 L2k (sliding window 256, documents, ALiBi + causal, softcap + causal; documents
  twice: the workload's sorted ids, 2 documents of 1039 and 1009 tokens, half the scores visible, and
  16 documents of 128, a sixteenth visible): against SDPA given the equivalent boolean or float
  mask, except softcap, which no SDPA argument expresses: its torch row is eager attention (matmul,
  tanh, masked softmax, matmul). Beside it, FlexAttention (`torch.compile(flex_attention)` on CPU
  tensors) with the same mask and score; where it does not run, the row holds its error instead
  of a time (`flex_error`);
- decode, Lq 1, GQA 32/8, D128, fp32 and bf16 K/V, Lk 4k and 32k, contiguous and paged (pages of
  16, a scattered block table, as examples/paged_decode_llama3.attn), against SDPA on the same
  tensors (`enable_gqa`; paged: the pages gathered into a contiguous cache first, as torch needs,
  inside the timed call). Each decode row has the GB/s of K/V bytes read, beside this machine's copy
  bandwidth measured in the same run and the same way (the env row: a NumPy copy of a 256 MiB
  array, counted as the bytes read plus the bytes written, one thread);
- the seed case, examples/seed_padded_fp32.attn at fp32 B4 H8 L128 D64 with its padding mask.

Timing: one warm-up call, then `--repeats` calls of each implementation, alternated. Every row holds
the median and min wall time and the median thread CPU time (`time.thread_time`) of the calls. With
`--threads 1` (how the committed file is run: the development machine has 2 cores shared with other
work) the whole call runs on the calling thread, so its CPU time barely moves when other processes
load the machine; the `speedup` figures (`speedup`, `speedup_flex`) are then ratios of the median
thread CPU times, and `speedup_wall` the ratio of the median wall times. With more threads,
`speedup` is the wall-time ratio. The outputs are compared under the dtype's tolerance.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SPEC = """
attention {name} {{
  dtype {dtype}
  head_dim {D}
  heads {H} kv {HKV}
  kind {kind}
{extra}}}
"""
SOFTCAP = 50.0  # Gemma-2's attention logit softcap
WINDOW = 256
COPY_BYTES = 256 << 20


@dataclass(frozen=True)
class Case:
    """One row: the variant, its sizes, and what torch is given for the same problem."""

    name: str
    v: Any  # attngen Variant
    B: int
    Lq: int
    Lk: int
    kind: str  # dense, causal, window, document, alibi, softcap, decode, padding
    paged: bool = False
    flex: bool = False  # also time FlexAttention
    doc_len: int = 0  # documents of this many tokens (0: the workload's sorted ids, seed 0: 2 documents)


def _variant(name: str, D: int, H: int, HKV: int, kind: str = "self", extra: str = "", dtype: str = "fp32"):
    from attngen.lang.frontend import loads

    return loads(SPEC.format(name=name, D=D, H=H, HKV=HKV, kind=kind, extra=extra, dtype=dtype)).get()


def _cases(quick: bool):
    from attngen.lang.frontend import load

    Ls = (128, 512, 2048) if quick else (128, 512, 2048, 4096)
    for D in (64, 128):
        for L in Ls:
            H = 16 if L <= 512 else 8
            B = 4 if L <= 512 else 1
            yield Case(f"dense_d{D}_L{L}", _variant(f"dense_d{D}", D, H, H), B, L, L, "dense")
            yield Case(f"causal_d{D}_L{L}", _variant(f"causal_d{D}", D, H, H, extra="  mask causal\n"), B, L, L, "causal")
    L = 2048
    yield Case(f"window{WINDOW}_d64_L{L}", _variant("win", 64, 8, 8, extra=f"  mask causal && q - kv < {WINDOW}\n"),
               1, L, L, "window", flex=True)
    docs = _variant("docs", 64, 8, 8, extra="  input doc: i32[B, Lk] sorted\n  mask document(doc)\n")
    yield Case(f"documents2_d64_L{L}", docs, 1, L, L, "document", flex=True)  # 1039 + 1009 tokens: half the scores visible
    yield Case(f"documents16_d64_L{L}", docs, 1, L, L, "document", flex=True, doc_len=L // 16)  # 16 x 128: a sixteenth
    yield Case(f"alibi_causal_d64_L{L}", _variant("alibi", 64, 8, 8, extra="  mask causal\n  score alibi\n"), 1, L, L, "alibi",
               flex=True)
    yield Case(f"softcap_causal_d64_L{L}", _variant("softcap", 64, 8, 8, extra=f"  mask causal\n  score softcap({SOFTCAP})\n"),
               1, L, L, "softcap", flex=True)
    for dt in ("fp32", "bf16"):
        for Lk in (4096, 32768):
            yield Case(f"decode_{dt}_gqa32x8_d128_Lk{Lk // 1024}k", _variant(f"dec_{dt}", 128, 32, 8, kind="cross", dtype=dt),
                       1, 1, Lk, "decode")
            yield Case(f"decode_paged_{dt}_gqa32x8_d128_Lk{Lk // 1024}k",
                       _variant(f"decp_{dt}", 128, 32, 8, kind="cross", dtype=dt, extra="  kv_cache paged(16)\n  mask causal\n"),
                       1, 1, Lk, "decode", paged=True)
    yield Case("seed_padded_fp32_B4_H8_L128_d64", load(ROOT / "examples" / "seed_padded_fp32.attn").get(), 4, 128, 128, "padding")


def _tensor(a: np.ndarray, torch):
    """A torch view of a NumPy array (ml_dtypes bfloat16 through its bits)."""
    if a.dtype.name == "bfloat16":
        return torch.from_numpy(a.view(np.uint16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def _bias(c: Case, torch):
    """The score the spec adds, as flex's score_mod sees it and as a [H, Lq, Lk] float mask."""
    from attngen.check import reference

    slopes = torch.tensor(reference.standard_alibi_slopes(c.v.heads), dtype=torch.float32)
    pos = torch.arange(c.Lq)
    return slopes, (slopes[:, None, None] * (pos[None, None, :] - pos[None, :, None]).float())


def _torch_call(c: Case, arrays: dict, torch) -> tuple[Callable[[], Any], str]:
    """torch's call for the same problem and what it is (SDPA and its mask argument, or eager)."""
    from attngen.check import reference
    from attngen.ir.abi import Sizes
    from attngen.ir.nodes import BLOCK_TABLE

    F = torch.nn.functional
    q, k, v = (_tensor(arrays[n], torch) for n in ("q", "k", "v"))
    rest = {n: a for n, a in arrays.items() if n not in ("q", "k", "v")}
    if c.kind == "decode":
        gqa = c.v.group_size > 1
        if c.paged:
            # [num_pages, page, Hkv, D] -> this row's pages in table order -> [1, Hkv, Lk, D]
            table = torch.from_numpy(arrays[BLOCK_TABLE][0].astype(np.int64))

            def paged():
                kc = k.index_select(0, table).flatten(0, 1).transpose(0, 1)[None]
                vc = v.index_select(0, table).flatten(0, 1).transpose(0, 1)[None]
                return F.scaled_dot_product_attention(q, kc, vc, enable_gqa=gqa)
            return paged, "index_select of the pages + sdpa(enable_gqa)"
        return (lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=gqa)), "sdpa(enable_gqa)"
    if c.kind == "dense":
        return (lambda: F.scaled_dot_product_attention(q, k, v)), "sdpa"
    if c.kind == "causal":
        return (lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)), "sdpa(is_causal)"
    if c.kind in ("window", "document", "padding"):
        m = reference.mask_matrix(c.v, Sizes(c.B, c.Lq, c.Lk), rest, h=0)  # [B, Lq, Lk]
        mask = torch.from_numpy(np.ascontiguousarray(m))[:, None]
        return (lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask)), "sdpa(attn_mask: bool [B, 1, Lq, Lk])"
    causal = torch.ones(c.Lq, c.Lk, dtype=torch.bool).tril()
    if c.kind == "alibi":
        bias = _bias(c, torch)[1].masked_fill(~causal, float("-inf"))[None]
        return (lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=bias)), "sdpa(attn_mask: float [1, H, Lq, Lk])"
    assert c.kind == "softcap"
    scale = c.v.effective_scale

    def eager():
        s = torch.matmul(q, k.transpose(-1, -2)) * scale
        s = (torch.tanh(s / SOFTCAP) * SOFTCAP).masked_fill(~causal, float("-inf"))
        return torch.matmul(torch.softmax(s, dim=-1), v)
    return eager, "eager: matmul, tanh, masked softmax, matmul (no SDPA argument is a softcap)"


def _flex_call(c: Case, arrays: dict, torch) -> Callable[[], Any]:
    """torch.compile(flex_attention) on CPU tensors with the same mask and score (raises where it cannot)."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    q, k, v = (_tensor(arrays[n], torch) for n in ("q", "k", "v"))
    if c.kind == "window":
        def mask_mod(b, h, qi, ki):
            return (qi >= ki) & (qi - ki < WINDOW)
    elif c.kind == "document":
        doc = torch.from_numpy(arrays["doc"])

        def mask_mod(b, h, qi, ki):
            return doc[b, qi] == doc[b, ki]
    else:
        def mask_mod(b, h, qi, ki):
            return qi >= ki
    score_mod = None
    if c.kind == "alibi":
        slopes = _bias(c, torch)[0]

        def score_mod(score, b, h, qi, ki):
            return score + slopes[h] * (ki - qi)
    elif c.kind == "softcap":
        def score_mod(score, b, h, qi, ki):
            return torch.tanh(score / SOFTCAP) * SOFTCAP
    bm = create_block_mask(mask_mod, B=c.B if c.kind == "document" else None, H=None, Q_LEN=c.Lq, KV_LEN=c.Lk, device="cpu")
    fn = torch.compile(flex_attention)
    return lambda: fn(q, k, v, score_mod=score_mod, block_mask=bm)


def _time(fns: list[Callable[[], Any]], repeats: int) -> list[dict]:
    """Each callable's median and min wall ms and median thread CPU ms over `repeats` calls, the
    callables alternated call by call (so that a change in the machine's load hits them alike)."""
    for f in fns:
        f()
    ts: list[list[float]] = [[] for _ in fns]
    cs: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for i, f in enumerate(fns):
            c0, t0 = time.thread_time(), time.perf_counter()
            f()
            ts[i].append(time.perf_counter() - t0)
            cs[i].append(time.thread_time() - c0)
    return [dict(ms=float(np.median(t)) * 1e3, min_ms=float(np.min(t)) * 1e3, cpu_ms=float(np.median(cc)) * 1e3)
            for t, cc in zip(ts, cs)]


def copy_bandwidth(repeats: int = 7, cpu: bool = True) -> float:
    """This machine's copy bandwidth, GB/s: a NumPy copy of COPY_BYTES (one thread), read plus
    written bytes over the median thread CPU time (`cpu`, as the decode rows' GB/s are timed with
    one thread) or the median wall time."""
    src = np.ones(COPY_BYTES // 4, dtype=np.float32)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    ts = []
    for _ in range(repeats):
        t0 = time.thread_time() if cpu else time.perf_counter()
        np.copyto(dst, src)
        ts.append((time.thread_time() if cpu else time.perf_counter()) - t0)
    return 2 * COPY_BYTES / float(np.median(ts)) / 1e9


def _inputs(c: Case) -> dict:
    from attngen.check import workload
    from attngen.ir.nodes import CACHE_LENS

    arrays = workload.make_inputs(c.v, c.B, c.Lq, c.Lk, np.random.default_rng(0))
    if c.paged:
        arrays[CACHE_LENS][:] = c.Lk  # every row's cache full: the same keys as the contiguous row
    if c.doc_len:
        arrays["doc"][:] = np.arange(c.Lk, dtype=np.int32) // c.doc_len
    return arrays


def run_case(c: Case, args, torch, attngen) -> dict:
    """Time attngen, torch (and FlexAttention) on one case; the row."""
    from attngen.check import tolerance

    k = attngen.compile(c.v, device="cpu")
    arrays = _inputs(c)
    rest = {n: a for n, a in arrays.items() if n not in ("q", "k", "v")}

    def ours():
        return k(arrays["q"], arrays["k"], arrays["v"], num_threads=args.threads, **rest)

    peer, path = _torch_call(c, arrays, torch)
    fns, flex_error = [ours, peer], None
    if c.flex and not args.no_flex:
        try:
            fl = _flex_call(c, arrays, torch)
            with torch.no_grad():
                fl()
            fns.append(fl)
        except Exception as e:  # recorded in the row, never a time
            flex_error = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"[:400]
    with torch.no_grad():
        t = _time(fns, args.repeats)
        outs = [f().float().numpy() for f in fns[1:]]
    o = np.asarray(ours(), dtype=np.float32)
    rep = tolerance.check(o, outs[0].reshape(o.shape), c.v.dtype, "attngen vs torch")
    cpu = args.threads == 1
    key = "cpu_ms" if cpu else "ms"
    row = {"kind": "row", "workload": c.name, "B": c.B, "H": c.v.heads, "Hkv": c.v.kv_heads, "Lq": c.Lq, "Lk": c.Lk,
           "D": c.v.head_dim, "dtype": c.v.dtype.value, "paged": c.paged, "threads": args.threads,
           "attngen_ms": t[0]["ms"], "attngen_min_ms": t[0]["min_ms"], "attngen_cpu_ms": t[0]["cpu_ms"],
           "torch": path, "torch_ms": t[1]["ms"], "torch_min_ms": t[1]["min_ms"], "torch_cpu_ms": t[1]["cpu_ms"],
           "speedup": t[1][key] / t[0][key], "speedup_wall": t[1]["ms"] / t[0]["ms"],
           "agrees": bool(rep.ok), "check": rep.summary()}
    if c.flex:
        if len(t) > 2:
            frep = tolerance.check(o, outs[1].reshape(o.shape), c.v.dtype, "attngen vs flex")
            row.update(flex_ms=t[2]["ms"], flex_min_ms=t[2]["min_ms"], flex_cpu_ms=t[2]["cpu_ms"],
                       speedup_flex=t[2][key] / t[0][key], flex_agrees=bool(frep.ok))
        else:
            row["flex_error"] = flex_error or "not run (--no-flex)"
    if c.kind == "decode":
        item = np.dtype(arrays["k"].dtype).itemsize
        kv_bytes = 2 * c.v.kv_heads * c.Lk * c.v.head_dim * item  # every key and value read once
        row.update(kv_bytes=kv_bytes, attngen_GBps=kv_bytes / (t[0][key] * 1e-3) / 1e9,
                   torch_GBps=kv_bytes / (t[1][key] * 1e-3) / 1e9)
    return row


def _line(r: dict) -> str:
    unit = "cpu" if r["threads"] == 1 else "wall"
    s = (f"{r['workload']:34s} attngen {r['attngen_' + ('cpu_ms' if unit == 'cpu' else 'ms')]:9.2f} ms  torch "
         f"{r['torch_' + ('cpu_ms' if unit == 'cpu' else 'ms')]:9.2f} ms  x{r['speedup']:5.2f} ({unit})")
    if "speedup_flex" in r:
        s += f"  flex x{r['speedup_flex']:5.2f}"
    if "flex_error" in r:
        s += f"  flex: {r['flex_error'][:60]}"
    if "attngen_GBps" in r:
        s += f"  {r['attngen_GBps']:6.1f} GB/s"
    return s + ("  agrees" if r["agrees"] else "  DISAGREES")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=1, help="threads for every implementation (default 1)")
    ap.add_argument("--quick", action="store_true", help="skip the 4k dense and causal rows")
    ap.add_argument("--repeats", type=int, default=7, help="timed calls a row (the median is reported)")
    ap.add_argument("--no-flex", action="store_true", help="skip FlexAttention (its compile takes minutes)")
    ap.add_argument("--only", default=None, help="run the rows whose name contains this")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "cpu.jsonl"), help="the JSON-lines file to write")
    args = ap.parse_args()

    import torch

    import attngen

    torch.set_num_threads(args.threads)
    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else platform.processor()
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    bw = copy_bandwidth(cpu=args.threads == 1)
    timing = ("median thread CPU time (time.thread_time) of the repeats" if args.threads == 1 else "median wall time of the repeats")
    rows = [{"kind": "env", "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "cpu": cpu,
             "cpus": os.cpu_count(), "threads": args.threads, "repeats": args.repeats, "speedup_is": timing,
             "loadavg": os.getloadavg(), "torch": torch.__version__, "commit": commit,
             "copy_GBps": bw, "copy_GBps_is": f"np.copyto of {COPY_BYTES >> 20} MiB, read + written bytes over the median "
             + ("thread CPU time" if args.threads == 1 else "wall time")}]
    print(f"copy bandwidth {bw:.1f} GB/s; speedup: {timing}", flush=True)
    for c in _cases(args.quick):
        if args.only and args.only not in c.name:
            continue
        row = run_case(c, args, torch, attngen)
        if "attngen_GBps" in row:
            row["attngen_of_copy"] = row["attngen_GBps"] / bw
        rows.append(row)
        print(_line(row), flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
