"""Plain-Python brute force: loops and scalars, no IR, written straight from docs/LANGUAGE.md."""

from __future__ import annotations

import math

import numpy as np


def floordiv(a: int, b: int) -> int:
    return 0 if b == 0 else a // b


def floormod(a: int, b: int) -> int:
    return 0 if b == 0 else a % b


def at(t: np.ndarray, *idx: int):
    """t[idx] with out-of-range reads giving 0 (negative indices do not wrap)."""
    for i, n in zip(idx, t.shape):
        if not 0 <= i < n:
            return 0
    return t[idx].item()


def attention(q, k, v, *, scale, visible, score=lambda s, b, h, i, j: s):
    """q [B,H,Lq,D], k [B,Hkv,Lk,D], v [B,Hkv,Lk,Dv] as float64, bhsd. Returns (O, LSE) float64."""
    B, H, Lq, _ = q.shape
    Hkv, Lk, Dv = k.shape[1], k.shape[2], v.shape[3]
    G = H // Hkv
    O = np.zeros((B, H, Lq, Dv))
    LSE = np.full((B, H, Lq), -math.inf)
    for b in range(B):
        for h in range(H):
            hk = h // G
            for i in range(Lq):
                ss, vs = [], []
                for j in range(Lk):
                    raw = scale * sum(float(q[b, h, i, d]) * float(k[b, hk, j, d]) for d in range(q.shape[3]))
                    x = score(raw, b, h, i, j)
                    if visible(b, h, i, j) and x != -math.inf:
                        ss.append(x)
                        vs.append(v[b, hk, j])
                if not ss:
                    continue
                m = max(ss)
                w = [math.exp(x - m) for x in ss]
                tot = sum(w)
                O[b, h, i] = sum(wi * vi for wi, vi in zip(w, vs)) / tot
                LSE[b, h, i] = m + math.log(tot)
    return O, LSE
