"""Shared helpers of the GPU suite: spec text builders, a per-session kernel cache, comparisons.

Every distinct spec text is compiled once per session (`kernel_for`), so the suite's compile cost
is one NVRTC build per spec however many hypothesis examples use it; `COMPILES` counts builds per
spec so a test can prove a kernel object is reused across shapes.
"""

from __future__ import annotations

import functools
from collections import Counter

from hypothesis import settings

from attngen.lang import frontend
from attngen.check import fuzz
from attngen.ir.nodes import Variant

COMPILES: Counter[str] = Counter()


def examples(fraction: float, minimum: int = 3) -> int:
    """A share of the active hypothesis profile's max_examples (ci: 60, gpu: 150)."""
    return max(minimum, int(settings.default.max_examples * fraction))


def spec_text(name: str, *, dtype: str, D: int, H: int, Hkv: int | None = None, kind: str = "self",
              layout: str = "bhsd", mask: str | None = None, scores: tuple[str, ...] = (), lse: bool = False,
              extra: tuple[str, ...] = ()) -> str:
    """One variant as .attn text (the suite builds synthetic cases as text, through `loads`)."""
    lines = [f"dtype {dtype}", f"head_dim {D}", f"heads {H}" + (f" kv {Hkv}" if Hkv and Hkv != H else ""),
             f"kind {kind}", f"layout {layout}", *extra]
    if mask:
        lines.append(f"mask {mask}")
    lines += [f"score {s}" for s in scores]
    if lse:
        lines.append("output lse")
    body = "\n".join("  " + x for x in lines)
    return f"attention {name} {{\n{body}\n}}\n"


@functools.lru_cache(maxsize=None)
def variant_of(text: str, name: str | None = None) -> Variant:
    return frontend.loads(text, "<gpu-suite>").get(name)


@functools.lru_cache(maxsize=None)
def _compile(v: Variant):
    from attngen.runtime import kernel as runtime

    COMPILES[v.name] += 1
    return runtime.compile(v)


def kernel_for(v: Variant):
    """The session's compiled kernel for a variant (compiled on first use only)."""
    return _compile(v)


def check_case(v: Variant, case: fuzz.Case) -> None:
    """Run the kernel on one case (outputs poisoned with NaN) and assert the tolerance policy."""
    arrays = fuzz.case_inputs(v, case)
    out, lse = fuzz.run_kernel(kernel_for(v), v, arrays)
    reports = fuzz.compare(v, arrays, out, lse)
    bad = [r.summary() for r in reports if not r.ok]
    assert not bad, f"{v.name} at {case.describe()}:\n" + "\n".join(bad)
    assert len(reports) == (2 if v.lse else 1)


# Odd backward shapes (B, Lq, Lk): Lq != Lk, one row, tile multiples and remainders; self-attention
# specs take Lk = Lq (backward_case).
BACKWARD_SHAPES = [(2, 333, 333), (1, 1000, 517), (1, 1, 1), (3, 64, 64), (1, 257, 129), (1, 128, 1024)]


def backward_case(spec: str, B: int, Lq: int, Lk: int, seed: int) -> "fuzz.Case":
    """A backward test case for the variant of `spec` (its .attn body): Lk = Lq unless `kind cross`;
    with a padding mask, batch 0 has no queries and batch 1 no keys (every row fully masked), the
    rest partial."""
    if "cross" not in spec:
        Lk = Lq
    q_lens = kv_lens = None
    if "padding" in spec:
        q_lens = tuple(0 if b == 0 else max(1, Lq - 3 * b) for b in range(B))
        kv_lens = tuple(0 if b == 1 else max(1, Lk - 5 * b) for b in range(B))
    return fuzz.Case(B=B, Lq=Lq, Lk=Lk, dist="normal", seed=seed, q_lens=q_lens, kv_lens=kv_lens)
