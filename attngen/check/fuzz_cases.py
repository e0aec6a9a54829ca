"""`attngen fuzz`'s cases: a shape, an input distribution and runtime-input overrides for one
variant, drawn by hypothesis (tile-boundary lengths favoured, work capped) and turned into arrays.
A pinned shape (`attngen fuzz --shape`) fixes B, Lq and Lk and leaves the rest to hypothesis; for
self attention, Lq < Lk is a decode step (`decode_positions`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from attngen.ir.nodes import (
    PADDING_KV_LENS,
    PADDING_Q_LENS,
    AttnKind,
    Builtin,
    BuiltinName,
    Layout,
    TensorRef,
    Variant,
    walk,
)

# Lengths where tiles begin and end (block sizes are multiples of 16 up to 256): off-by-one bugs
# live here, so the strategies draw them far more often than uniform integers would.


BOUNDARY_LENGTHS = (1, 2, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129, 255, 256, 257, 1000, 2000)

# Work cap per example (B·H·Lq·Lk score elements): keeps the float64 reference well under a second.
MAX_SCORE_ELEMENTS = 1 << 22


@dataclass
class Case:
    """One fuzz example: sizes, distribution, seed, and how runtime inputs are overridden."""

    B: int
    Lq: int
    Lk: int
    dist: str = "normal"
    seed: int = 0
    q_lens: tuple[int, ...] | None = None
    kv_lens: tuple[int, ...] | None = None
    docs: str = "default"  # default | single | per_token
    blocks: str = "default"  # default | empty | full
    # `layout varlen`: each sequence's query and key lengths (B of each; Lq and Lk are the totals).
    seq_q: tuple[int, ...] | None = None
    seq_k: tuple[int, ...] | None = None

    def describe(self) -> str:
        extra = []
        if self.seq_q is not None:
            extra.append(f"seq_q={list(self.seq_q)}")
        if self.seq_k is not None and self.seq_k != self.seq_q:
            extra.append(f"seq_k={list(self.seq_k)}")
        if self.q_lens is not None:
            extra.append(f"q_lens={list(self.q_lens)}")
        if self.kv_lens is not None:
            extra.append(f"kv_lens={list(self.kv_lens)}")
        if self.docs != "default":
            extra.append(f"docs={self.docs}")
        if self.blocks != "default":
            extra.append(f"blocks={self.blocks}")
        return f"B={self.B} Lq={self.Lq} Lk={self.Lk} dist={self.dist} seed={self.seed}" + (
            " " + " ".join(extra) if extra else ""
        )


def tensor_roles(v: Variant) -> dict[str, str]:
    """Which builtin each runtime tensor feeds ('document', 'block_sparse', ...)."""
    roles: dict[str, str] = {}
    for e in (v.mask, *v.scores):
        for n in walk(e):
            if isinstance(n, Builtin):
                for a in n.args:
                    if isinstance(a, TensorRef):
                        roles.setdefault(a.name, n.name.value)
    return roles


def decode_positions(v: Variant, Lq: int, Lk: int) -> dict[str, int]:
    """Call positions (`abi.Positions` keywords) of a self-attention call with Lq < Lk: a decode
    or extend step whose Lq queries are the last Lq positions of the Lk-long sequence, as
    `explain --shape` reads such a shape. Empty for any other call (a whole sequence)."""
    if v.kind != AttnKind.SELF or v.layout == Layout.VARLEN or v.page_size is not None or Lq >= Lk:
        return {}
    return {"q_offset": Lk - Lq, "Lq_total": Lk, "Lk_total": Lk}


def case_strategy(v: Variant, *, max_len: int = 2048, max_work: int = MAX_SCORE_ELEMENTS,
                  shape: tuple[int, int, int] | None = None):
    """A hypothesis strategy of `Case`s for a variant (shapes capped to `max_work` score elements).
    `shape` = (B, Lq, Lk) pins every case's sizes exactly (no cap: the user asked for them); for
    self attention it needs Lq <= Lk (Lq < Lk: a decode step), and `layout varlen` refuses it
    (ValueError), its lengths being per sequence."""
    from hypothesis import strategies as st

    if shape is not None:
        if v.layout == Layout.VARLEN:
            raise ValueError(f"{v.name}: a pinned shape does not apply to `layout varlen` (its lengths are per sequence)")
        if v.kind == AttnKind.SELF and shape[1] > shape[2]:
            raise ValueError(f"{v.name}: self attention takes Lq <= Lk, got Lq={shape[1]}, Lk={shape[2]}")

    bounds = [x for x in BOUNDARY_LENGTHS if x <= max_len]

    @st.composite
    def lengths(draw) -> int:
        # A flag picks a boundary value or any integer; it shrinks to False, so a failure shrinks
        # to the smallest failing integer rather than the smallest failing boundary value.
        if draw(st.booleans()):
            return draw(st.sampled_from(bounds))
        return draw(st.integers(1, max_len))

    names = {d.name for d in v.runtime_inputs()}
    roles = tensor_roles(v)
    has_docs = any(r == BuiltinName.DOCUMENT.value for r in roles.values())
    has_blocks = any(r == BuiltinName.BLOCK_SPARSE.value for r in roles.values())

    @st.composite
    def seq_lengths(draw, B: int) -> tuple[int, ...]:
        # Empty sequences and sequences of one row are boundary cases of their own in a packed batch.
        return tuple(draw(st.one_of(st.sampled_from([0, 1]), lengths())) for _ in range(B))

    @st.composite
    def build_varlen(draw) -> Case:
        B = draw(st.integers(1, 6))
        seq_q = list(draw(seq_lengths(B)))
        seq_k = list(seq_q) if v.kind == AttnKind.SELF else list(draw(seq_lengths(B)))
        # Keep the reference cheap (sum over sequences of H * Lq_b * Lk_b score elements).
        while v.heads * sum(a * b for a, b in zip(seq_q, seq_k)) > max_work:
            i = max(range(B), key=lambda j: seq_q[j] * seq_k[j])
            seq_q[i] //= 2
            seq_k[i] = seq_q[i] if v.kind == AttnKind.SELF else seq_k[i] // 2
        seq_q[0] = max(seq_q[0], 1)  # at least one query and one key row in all
        if v.kind == AttnKind.SELF:
            seq_k = list(seq_q)
        elif sum(seq_k) == 0:
            seq_k[-1] = 1
        dist = draw(st.sampled_from(["normal", "normal", "large", "uniform"]))
        seed = draw(st.integers(0, 2**31 - 1))
        return Case(B, sum(seq_q), sum(seq_k), dist, seed, seq_q=tuple(seq_q), seq_k=tuple(seq_k))

    if v.layout == Layout.VARLEN:
        return build_varlen()

    def sizes(draw) -> tuple[int, int, int]:
        if shape is not None:
            return shape
        B = draw(st.integers(1, 4))
        Lq = draw(lengths())
        Lk = Lq if v.kind == AttnKind.SELF else draw(lengths())
        # Keep the reference cheap: shrink the batch first, then the key length (cross only).
        per = v.heads * Lq * Lk
        B = max(1, min(B, max_work // max(per, 1)))
        if B * per > max_work and v.kind == AttnKind.CROSS:
            Lk = max(1, max_work // (B * v.heads * Lq))
        if B * v.heads * Lq * Lk > max_work and v.kind == AttnKind.SELF:
            Lq = Lk = max(1, int(math.isqrt(max_work // (B * v.heads))))
        return B, Lq, Lk

    @st.composite
    def build(draw) -> Case:
        B, Lq, Lk = sizes(draw)
        # A decode step's q_lens are global lengths (of the Lk-long sequence), as the kernel sees them.
        Lq_seen = Lk if decode_positions(v, Lq, Lk) else Lq
        dist = draw(st.sampled_from(["normal", "normal", "large", "uniform"]))
        seed = draw(st.integers(0, 2**31 - 1))

        def lens(L: int):
            return st.lists(st.one_of(st.sampled_from([0, L, 1, L - 1 if L > 1 else L]), st.integers(0, L)),
                            min_size=B, max_size=B).map(tuple)

        q_lens = draw(st.one_of(st.none(), lens(Lq_seen))) if PADDING_Q_LENS in names else None
        kv_lens = draw(st.one_of(st.none(), lens(Lk))) if PADDING_KV_LENS in names else None
        docs = draw(st.sampled_from(["default", "single", "per_token"])) if has_docs else "default"
        blocks = draw(st.sampled_from(["default", "default", "empty", "full"])) if has_blocks else "default"
        return Case(B, Lq, Lk, dist, seed, q_lens, kv_lens, docs, blocks)

    return build()


def case_inputs(v: Variant, case: Case) -> dict[str, np.ndarray]:
    """q, k, v and every runtime input for a case: `workload.make_inputs`, then the overrides."""
    from attngen.check import workload

    rng = np.random.default_rng(case.seed)
    if v.quantized:
        # Drawn as the full-precision spec, then stored and scaled for the call it makes (a decode
        # step's q scales are those of its own rows).
        from attngen.check import quant, quant_accuracy

        arrays = case_inputs(quant_accuracy.full_precision(v), case)
        quant.store_inputs(v, arrays)
        return arrays
    if decode_positions(v, case.Lq, case.Lk):
        # A decode step: the whole Lk-long sequence's inputs (runtime inputs sized by Lq see it all),
        # then q's last Lq rows, the new tokens.
        arrays = workload.make_inputs(v, case.B, case.Lk, case.Lk, rng, dist=case.dist)
        q = arrays["q"]
        axis = 2 if (v.layout == Layout.BHSD and q.ndim == 4) else 1
        arrays["q"] = np.ascontiguousarray(np.take(q, np.arange(case.Lk - case.Lq, case.Lk), axis=axis))
    else:
        arrays = workload.make_inputs(v, case.B, case.Lq, case.Lk, rng, dist=case.dist)
    if case.seq_q is not None:
        cu_q, cu_k = v.cu_seqlens_names
        arrays[cu_q] = workload.cu_seqlens_of(case.seq_q)
        arrays[cu_k] = workload.cu_seqlens_of(case.seq_k if case.seq_k is not None else case.seq_q)
    if case.q_lens is not None and PADDING_Q_LENS in arrays:
        arrays[PADDING_Q_LENS] = np.asarray(case.q_lens, dtype=arrays[PADDING_Q_LENS].dtype)
    if case.kv_lens is not None and PADDING_KV_LENS in arrays:
        arrays[PADDING_KV_LENS] = np.asarray(case.kv_lens, dtype=arrays[PADDING_KV_LENS].dtype)
    for name, role in tensor_roles(v).items():
        if name not in arrays:
            continue
        a = arrays[name]
        if role == BuiltinName.DOCUMENT.value and case.docs != "default":
            if case.docs == "single":
                arrays[name] = np.zeros_like(a) + 3  # one document (any id; 3 is not 0)
            else:  # every token its own document: ids 0, 1, 2, ... along the sequence
                arrays[name] = np.broadcast_to(np.arange(a.shape[-1]), a.shape).astype(a.dtype).copy()
        elif role == BuiltinName.BLOCK_SPARSE.value and case.blocks != "default":
            arrays[name] = (np.zeros_like(a) if case.blocks == "empty" else np.ones_like(a))
    return arrays
