"""Odd shapes for compute-sanitizer (memcheck / racecheck): L = 1, 17, 1000, padding length 0.

    compute-sanitizer --tool memcheck python3 tools/sanitize_cases.py [NAME ...]
Names narrow the run to those specs (racecheck is slow).
Exits non-zero if any output disagrees with the reference; the sanitizer reports access errors."""

from __future__ import annotations

import sys

import numpy as np
import torch

import attngen
from attngen.check import reference, tolerance
from attngen.lang.frontend import loads
from attngen.check.workload import make_inputs

SPECS = [
    ("attention pad_bf16 { dtype bf16; head_dim 64; heads 4 kv 2; mask padding && causal; output lse }", "self"),
    ("attention cross_fp16 { dtype fp16; head_dim 128; heads 2; kind cross; layout bshd; mask causal }", "cross"),
    ("attention seed_fp32 { dtype fp32; head_dim 64; heads 2; mask padding }", "self"),
    ("attention qk_norm { dtype bf16; head_dim 128; heads 2; norm q rmsnorm(1e-6); norm k rmsnorm(1e-6); residual }", "self"),
    # Prep kernels: token-scope q statistics, k layernorm with GQA, head-scope q layernorm in fp32.
    ("attention preln { dtype bf16; head_dim 64; heads 4; kind cross; layout bshd; norm q layernorm(1e-5) scope token; residual }", "cross"),
    ("attention knorm_gqa { dtype fp16; head_dim 96; heads 4 kv 2; norm k layernorm(1e-5); mask causal }", "self"),
    ("attention qnorm_fp32 { dtype fp32; head_dim 64; heads 2; norm q layernorm(1e-5) }", "self"),
    # The fp32 path's token-scope q norm runs on Q in place while K/V copies are in flight.
    ("attention tok_fp32 { dtype fp32; head_dim 64; heads 2; layout bshd; norm q rmsnorm(1e-6) scope token; residual }", "self"),
    # FFMA warps that see only part of a row (causal over 1000 keys, GQA) combine through shared memory.
    ("attention causal_fp32_d128 { dtype fp32; head_dim 128; heads 4 kv 2; mask causal; output lse }", "self"),
    # The wgmma engine with three consumer warpgroups (pad_bf16, cross_fp16 and qk_norm use two).
    ("attention causal_w12 { dtype bf16; head_dim 64; heads 2; mask causal }", "self"),
    # Split K/V rings at two stages: unmasked D128's main tile (176 keys; hinted, since these short
    # lengths would otherwise run the short-loop kernel), its short-loop kernel (128 keys, two Q
    # buffers), and causal D256 (64 keys).
    ("attention dense_split_d128 { dtype bf16; head_dim 128; heads 2; tile block_m 128 block_n 176 warps 8 stages 2 }", "self"),
    ("attention dense_short_d128 { dtype bf16; head_dim 128; heads 2 kv 1 }", "self"),
    ("attention causal_split_d256 { dtype bf16; head_dim 256; heads 2; mask causal }", "self"),
    # A mask's lookups hoisted per row and per key (emit.split_by_axis), on the short-run tile
    # that document and window masks take at D128 (schedule._short_runs).
    ("attention doc_d128 { dtype bf16; head_dim 128; heads 2; input doc: i32[B, Lk] sorted; mask document(doc) && causal }", "self"),
    ("attention window_d128 { dtype bf16; head_dim 128; heads 2; mask causal && window(300, 0) }", "self"),
    # The mma.sync engine (this tile selects it on sm_90a too) with the lookups split by axis into
    # pre-mask words, which it does up to head dim 64 (render.MMA_SPLIT_MAX_HEAD_DIM).
    ("attention doc_mma_d64 { dtype bf16; head_dim 64; heads 2; input doc: i32[B, Lk] sorted; mask document(doc) && causal;"
     " tile block_m 128 block_n 64 warps 4 stages 2 }", "self"),
]


def dev(x: np.ndarray) -> torch.Tensor:
    if x.dtype.name == "bfloat16":
        return torch.from_numpy(x.view(np.uint16).copy()).view(torch.bfloat16).cuda()
    return torch.from_numpy(np.ascontiguousarray(x)).cuda()


def host(t: torch.Tensor, like) -> np.ndarray:
    return t.view(torch.uint16).cpu().numpy().view(like) if t.dtype == torch.bfloat16 else t.cpu().numpy()


def main() -> int:
    bad = n = 0
    rng = np.random.default_rng(7)
    only = set(sys.argv[1:])
    unknown = only - {loads(t).variants[0].name for t, _ in SPECS}
    if unknown:  # a typo would otherwise run nothing and pass
        print(f"sanitize cases: no spec named {', '.join(sorted(unknown))}", file=sys.stderr)
        return 2
    for text, kind in SPECS:
        v = loads(text).variants[0]
        if only and v.name not in only:
            continue
        n += 3
        k = attngen.compile(v)
        for L in (1, 17, 1000):
            Lk = L if kind == "self" else max(1, L // 3 + 5)
            inp = make_inputs(v, 3, L, Lk, rng)
            if "q_lens" in inp:
                inp["q_lens"][0] = 0
                inp["kv_lens"][0] = 0
            rt = {n: a for n, a in inp.items() if n not in ("q", "k", "v")}
            ref_o, _ = reference.attention(v, inp["q"], inp["k"], inp["v"], rt)
            res = k(dev(inp["q"]), dev(inp["k"]), dev(inp["v"]), **{n: dev(a) for n, a in rt.items()})
            o = res[0] if v.lse else res
            torch.cuda.synchronize()
            rep = tolerance.check(host(o, ref_o.dtype), ref_o, v.dtype)
            print(("ok  " if rep.ok else "BAD ") + f"{v.name} L={L} Lk={Lk}", flush=True)
            bad += not rep.ok
    print(f"sanitize cases: {n - bad} passed, {bad} failed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
