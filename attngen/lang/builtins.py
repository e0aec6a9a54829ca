"""The builtins, each declared once: its signature (arities, parameter kinds, usage), its
desugaring (the plain expression it means, docs/LANGUAGE.md), its `explain` words, how its input
tensors are filled with valid contents (attngen.check.workload) and how `fuzz --specs` writes it
(attngen.check.fuzz_specs). Lowering, explain, the workload and the fuzzer read this table; none
keeps its own.

Imports nothing beyond the IR (the front end's layering); the fillers take NumPy's generator as an
argument and the fuzz forms hypothesis' `draw`, so neither library loads with the front end.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from attngen.ir.nodes import (
    COMPARE_OPS,
    LOGIC_OPS,
    PADDING_KV_LENS,
    PADDING_Q_LENS,
    SCORE_BUILTINS,
    AttnKind,
    BinOp,
    Binary,
    Builtin,
    BuiltinName,
    Call,
    Const,
    Expr,
    Func,
    Index,
    IndexVar,
    Load,
    ScalarType,
    Score,
    Size,
    SizeSym,
    Span,
    TensorDecl,
    TensorRef,
    Unary,
    UnOp,
    Variant,
    cache_len,
    walk,
)

# --------------------------------------------------------------------------------------------
# Expression helpers for the desugarings (public: the tests' IR generators build builtins with them)


def _int(v: int) -> Const:
    return Const(v, ScalarType.INT)


def _bin(op: BinOp, a: Expr, b: Expr) -> Binary:
    if op in COMPARE_OPS or op in LOGIC_OPS:
        t = ScalarType.BOOL
    else:
        t = ScalarType.FLOAT if ScalarType.FLOAT in (a.type, b.type) else ScalarType.INT
    return Binary(op, a, b, t)


def q_aligned(paged: bool = False) -> Expr:
    """`q' = q + (Lk - Lq)`: bottom-right alignment, so the last query sees the last key. In a
    paged cache the end is each row's own, `q' = q + (cache_lens[b] - Lq)`: the Lq new tokens are
    the last Lq entries of row b's cache (Lk there is the padded capacity, max_pages * N)."""
    end = cache_len() if paged else Size(SizeSym.LK)
    return _bin(BinOp.ADD, Index(IndexVar.Q), _bin(BinOp.SUB, end, Size(SizeSym.LQ)))


def alibi_standard_slope(heads: int) -> Expr:
    """BLOOM's ALiBi slope of head `h` for `heads` heads, as an expression of `h`.

    For n a power of two, slope(h) = 2^(-8 (h+1) / n). Otherwise, with c the largest power of two
    below n, heads h < c take the c-head slopes and the rest take every other slope of the 2c-head
    sequence: 2^(-8 (2 (h - c) + 1) / (2c))."""
    c = 1 << (heads.bit_length() - 1)
    h = Index(IndexVar.H)

    def pow2(k: float, e: Expr) -> Expr:  # 2^(-k * e) as exp(-(k ln 2) * e)
        return Call(Func.EXP, (Unary(UnOp.NEG, _bin(BinOp.MUL, Const(k * math.log(2.0), ScalarType.FLOAT), e), ScalarType.FLOAT),), ScalarType.FLOAT)

    first = pow2(8.0 / c, _bin(BinOp.ADD, h, _int(1)))
    if c == heads:
        return first
    rest = pow2(8.0 / (2 * c), _bin(BinOp.ADD, _bin(BinOp.MUL, _int(2), _bin(BinOp.SUB, h, _int(c))), _int(1)))
    return Call(Func.WHERE, (_bin(BinOp.LT, h, _int(c)), first, rest), ScalarType.FLOAT)


def _load(decl: TensorDecl, indices: tuple[Expr, ...]) -> Load:
    return Load(decl.name, indices, ScalarType.FLOAT if decl.dtype.is_float else ScalarType.INT)


def _leading(rank: int) -> tuple[Expr, ...]:
    """Leading indices of a tensor broadcast over [b, h, ...] by its rank: [b, h], [h] or []."""
    return (Index(IndexVar.B), Index(IndexVar.H))[max(0, 4 - rank) :]


# --------------------------------------------------------------------------------------------
# Parameters: what each argument of a builtin must be (lowering checks them, in order)


@dataclass(frozen=True)
class TensorParam:
    """A declared tensor's bare name, of one of these ranks; `types`: "int", "float" or "any"."""

    ranks: tuple[int, ...]
    types: str = "any"


@dataclass(frozen=True)
class IntLiteral:
    """An integer literal of at least `minimum`."""

    minimum: int


@dataclass(frozen=True)
class PositiveLiteral:
    """A number literal > 0 (also after rounding to fp32)."""


@dataclass(frozen=True)
class IntExpr:
    """Any int expression."""


Param = TensorParam | IntLiteral | PositiveLiteral | IntExpr


# --------------------------------------------------------------------------------------------
# The registry


@dataclass
class FuzzContext:
    """What a builtin's fuzz form may use: hypothesis' `draw` and strategies, fresh input names,
    the input declarations the spec collects, and the variant's kind ("self" or "cross")."""

    draw: Callable[[Any], Any]
    st: Any
    fresh: Callable[[str], str]
    inputs: list[str]
    kind: str
    lq_dim: str = "Lq"


@dataclass(frozen=True)
class BuiltinDef:
    """One builtin, declared once (see the module docstring)."""

    name: BuiltinName
    arities: tuple[int, ...]
    params: tuple[Param, ...]
    usage: str
    # (checked args, the variant's tensors, heads, the aligned query position `q_aligned`) -> the
    # plain expression
    desugar: Callable[[tuple[Expr, ...], Mapping[str, TensorDecl], int, Expr], Expr]
    # (args as text, the variant, the aligned query position as text) -> plain words
    words: Callable[[list[str], Variant, str], str]
    # (rng, shape, lengths {"q": Lq, "kv": Lk}) -> valid contents for a tensor this builtin reads
    # (None: the workload's generic fill); `fill_over_sorted`: even when the input is `sorted`
    fill: Callable[[Any, tuple[int, ...], Mapping[str, int]], Any] | None = None
    fill_over_sorted: bool = False
    # the names of the runtime tensors it reads (default: its tensor arguments)
    reads: Callable[[tuple[Expr, ...]], list[str]] | None = None
    # (form name, writer): how `fuzz --specs` writes it, each form drawn by name
    fuzz: tuple[tuple[str, Callable[[FuzzContext], str]], ...] = field(default=())

    @property
    def score_only(self) -> bool:
        """Whether it modifies the score (and so cannot appear in a mask)."""
        return self.name in SCORE_BUILTINS

    def tensors_read(self, args: tuple[Expr, ...]) -> list[str]:
        """The runtime tensors this use of the builtin reads."""
        if self.reads is not None:
            return self.reads(args)
        return [a.name for a in args if isinstance(a, TensorRef)]


def _arg(a: list[str], i: int, default: str) -> str:
    return a[i] if len(a) > i else default


# -- causal ------------------------------------------------------------------------------------

def _causal(args, tensors, heads, qa):
    return _bin(BinOp.LE, Index(IndexVar.KV), qa)


def _causal_words(a, v, aligned):
    if v.kind == AttnKind.SELF:
        return "causal: a query sees keys at or before its own position (kv <= q)"
    if v.page_size is not None:
        return (f"causal: kv <= {aligned}, aligned to the end of each row's cache (the Lq new tokens are the "
                "last Lq of its cache_lens[b] tokens)")
    return "causal: kv <= q + (Lk - Lq), aligned bottom-right (the last query sees the last key)"


# -- window ------------------------------------------------------------------------------------

def _window(args, tensors, heads, qa):
    kv = Index(IndexVar.KV)
    left, right = args
    return _bin(
        BinOp.AND,
        _bin(BinOp.GE, kv, _bin(BinOp.SUB, qa, left)),
        _bin(BinOp.LE, kv, _bin(BinOp.ADD, qa, right)),
    )


def _window_words(a, v, aligned):
    left, right = (a + ["?", "?"])[:2]
    return f"sliding window: keys from {left} before to {right} after the query ({aligned} - {left} <= kv <= {aligned} + {right})"


def _window_fuzz(c: FuzzContext) -> str:
    return f"window({c.draw(c.st.integers(0, 300))}, {c.draw(c.st.integers(0, 300))})"


# -- padding -----------------------------------------------------------------------------------

def _padding(args, tensors, heads, qa):
    b, q, kv = Index(IndexVar.B), Index(IndexVar.Q), Index(IndexVar.KV)
    ql = Load(PADDING_Q_LENS, (b,), ScalarType.INT)
    kl = Load(PADDING_KV_LENS, (b,), ScalarType.INT)
    return _bin(BinOp.AND, _bin(BinOp.LT, q, ql), _bin(BinOp.LT, kv, kl))


def _padding_words(a, v, aligned):
    return (
        "padding: only the first q_lens[b] queries and kv_lens[b] keys of each batch row take part; "
        "query rows past q_lens[b] see nothing and give O = 0"
    )


# -- document ----------------------------------------------------------------------------------

def _document(args, tensors, heads, qa):
    b, q, kv = Index(IndexVar.B), Index(IndexVar.Q), Index(IndexVar.KV)
    qt = tensors[args[0].name]  # type: ignore[union-attr]
    kt = tensors[args[-1].name]  # type: ignore[union-attr]
    return _bin(BinOp.EQ, _load(qt, (b, q)), _load(kt, (b, kv)))


def _document_words(a, v, aligned):
    if len(a) == 1:
        return f"document: a query sees only keys of its own document ({a[0]}[b, q] == {a[0]}[b, kv])"
    return f"document: a query sees only keys of its own document ({a[0]}[b, q] == {a[1]}[b, kv])"


def sorted_ids(rng: Any, shape: tuple[int, ...], lengths: Mapping[str, int]) -> Any:
    """Non-decreasing ids along the last axis from a few documents (1 to 4; values 0 .. n-1)."""
    import numpy as np

    ndocs = int(rng.integers(1, 5))
    return np.sort(rng.integers(0, ndocs, size=shape), axis=-1)


def _document_fuzz(c: FuzzContext) -> str:
    if c.kind == "self":
        n = c.fresh("doc")
        srt = " sorted" if c.draw(c.st.booleans()) else ""
        c.inputs.append(f"input {n}: i32[B, Lk]{srt}")
        return f"document({n})"
    a, b = c.fresh("qdoc"), c.fresh("kdoc")
    c.inputs.append(f"input {a}: i32[B, {c.lq_dim}] sorted")
    c.inputs.append(f"input {b}: i32[B, Lk] sorted")
    return f"document({a}, {b})"


# -- prefix ------------------------------------------------------------------------------------

def _prefix(args, tensors, heads, qa):
    return _bin(BinOp.LT, Index(IndexVar.KV), args[0])


def _prefix_words(a, v, aligned):
    return f"prefix: every query sees the first {a[0] if a else 'n'} keys (kv < {a[0] if a else 'n'})"


def _prefix_reads(args):
    # prefix(n): any tensor read in n holds lengths of the key sequence.
    return [sub.tensor for sub in (walk(args[0]) if args else ()) if isinstance(sub, Load)]


def _key_lengths(rng: Any, shape: tuple[int, ...], lengths: Mapping[str, int]) -> Any:
    return rng.integers(0, lengths["kv"] + 1, size=shape)


def _prefix_fuzz_const(c: FuzzContext) -> str:
    return f"prefix({c.draw(c.st.integers(0, 200))})"


def _prefix_fuzz_tensor(c: FuzzContext) -> str:
    n = c.fresh("plen")
    c.inputs.append(f"input {n}: i32[B]")
    return f"prefix({n}[b])"


# -- block_sparse ------------------------------------------------------------------------------

DEFAULT_BLOCK = 128  # block_sparse's default bq = bk


def block_sizes(args: tuple[Expr, ...]) -> tuple[int, int]:
    """block_sparse's (bq, bk): its literal arguments, or the default."""
    consts = [a.value for a in args[1:] if isinstance(a, Const)]
    if len(consts) == 2:
        return int(consts[0]), int(consts[1])
    return DEFAULT_BLOCK, DEFAULT_BLOCK


def _block_sparse(args, tensors, heads, qa):
    q, kv = Index(IndexVar.Q), Index(IndexVar.KV)
    t = tensors[args[0].name]  # type: ignore[union-attr]
    bq, bk = (args[1], args[2]) if len(args) == 3 else (_int(DEFAULT_BLOCK), _int(DEFAULT_BLOCK))
    idx = (*_leading(len(t.shape)), _bin(BinOp.DIV, q, bq), _bin(BinOp.DIV, kv, bk))
    return _bin(BinOp.NE, _load(t, idx), _int(0))


def _block_sparse_words(a, v, aligned):
    bq, bk = (a[1], a[2]) if len(a) >= 3 else (str(DEFAULT_BLOCK), str(DEFAULT_BLOCK))
    t = a[0] if a else "t"
    return f"block-sparse: the map {t} (one entry per {bq} x {bk} block of queries x keys) marks visible blocks (!= 0)"


def _half_full(rng: Any, shape: tuple[int, ...], lengths: Mapping[str, int]) -> Any:
    return rng.random(shape) < 0.5


def _block_sparse_fuzz(c: FuzzContext) -> str:
    draw, st = c.draw, c.st
    n = c.fresh("blk")
    rank = draw(st.sampled_from([2, 3, 4]))
    dims = {2: "QB, KB", 3: "H, QB, KB", 4: "B, H, QB, KB"}[rank]
    qb, kb = c.fresh("QB"), c.fresh("KB")
    dims = dims.replace("QB", qb).replace("KB", kb)
    dt = draw(st.sampled_from(["u8", "i32"]))
    c.inputs.append(f"input {n}: {dt}[{dims}]")
    if draw(st.booleans()):
        bq, bk = draw(st.sampled_from([64, 128, 256])), draw(st.sampled_from([64, 128, 256]))
        return f"block_sparse({n}, {bq}, {bk})"
    return f"block_sparse({n})"


# -- softcap -----------------------------------------------------------------------------------

def _softcap(args, tensors, heads, qa):
    (c,) = args
    return _bin(BinOp.MUL, c, Call(Func.TANH, (_bin(BinOp.DIV, Score(), c),), ScalarType.FLOAT))


def _softcap_words(a, v, aligned):
    c = a[0] if a else "c"
    return f"softcap: s -> {c} * tanh(s / {c}), which bounds scores to (-{c}, {c})"


def _softcap_fuzz(c: FuzzContext) -> str:
    return f"softcap({c.draw(c.st.sampled_from(['5.0', '20.0', '30.0', '50.0']))})"


# -- alibi -------------------------------------------------------------------------------------

def _alibi(args, tensors, heads, qa):
    if args:
        slope: Expr = _load(tensors[args[0].name], (Index(IndexVar.H),))  # type: ignore[union-attr]
    else:
        slope = alibi_standard_slope(heads)
    dist = Call(Func.ABS, (_bin(BinOp.SUB, qa, Index(IndexVar.KV)),), ScalarType.INT)
    return _bin(BinOp.SUB, Score(), _bin(BinOp.MUL, slope, dist))


def _alibi_words(a, v, aligned):
    if a:
        return f"ALiBi: s - {a[0]}[h] * |{aligned} - kv| (slopes given as an input)"
    return f"ALiBi: s - slope[h] * |{aligned} - kv| with the standard geometric slopes for {v.heads} heads (compile-time constants)"


def _positive_slopes(rng: Any, shape: tuple[int, ...], lengths: Mapping[str, int]) -> Any:
    return rng.uniform(0.01, 0.5, size=shape)


def _alibi_fuzz_tensor(c: FuzzContext) -> str:
    n = c.fresh("slopes")
    c.inputs.append(f"input {n}: fp32[H]")
    return f"alibi({n})"


# -- bias --------------------------------------------------------------------------------------

def _bias(args, tensors, heads, qa):
    t = tensors[args[0].name]  # type: ignore[union-attr]
    return _bin(BinOp.ADD, Score(), _load(t, (*_leading(len(t.shape)), Index(IndexVar.Q), Index(IndexVar.KV))))


def _bias_words(a, v, aligned):
    return f"bias: s + {a[0] if a else 't'}[...] (indexed by its rank: [q, kv], [h, q, kv] or [b, h, q, kv])"


def _bias_fuzz(c: FuzzContext) -> str:
    n = c.fresh("bias")
    dims = c.draw(c.st.sampled_from(["Lq, Lk", "H, Lq, Lk", "B, H, Lq, Lk"]))
    dt = c.draw(c.st.sampled_from(["fp32", "fp32", "fp16", "bf16"]))
    c.inputs.append(f"input {n}: {dt}[{dims}]")
    return f"bias({n})"


# -- rel_bias ----------------------------------------------------------------------------------

def _rel_bias(args, tensors, heads, qa):
    kv = Index(IndexVar.KV)
    t = tensors[args[0].name]  # type: ignore[union-attr]
    m = args[1]
    clipped = Call(
        Func.MIN,
        (Call(Func.MAX, (_bin(BinOp.SUB, kv, qa), Unary(UnOp.NEG, m, ScalarType.INT)), ScalarType.INT), m),
        ScalarType.INT,
    )
    return _bin(BinOp.ADD, Score(), _load(t, (Index(IndexVar.H), _bin(BinOp.ADD, clipped, m))))


def _rel_bias_words(a, v, aligned):
    t, m = (a + ["t", "m"])[:2]
    return f"relative-position bias: s + {t}[h, clamp(kv - ({aligned}), -{m}, {m}) + {m}]"


def _rel_bias_fuzz(c: FuzzContext) -> str:
    n = c.fresh("rel")
    m = c.draw(c.st.sampled_from([4, 16, 128]))
    c.inputs.append(f"input {n}: fp32[H, {2 * m + 1}]")
    return f"rel_bias({n}, {m})"


BUILTINS: dict[BuiltinName, BuiltinDef] = {d.name: d for d in (
    BuiltinDef(BuiltinName.CAUSAL, (0,), (), "causal", _causal, _causal_words,
               fuzz=(("causal", lambda c: "causal"),)),
    BuiltinDef(BuiltinName.WINDOW, (2,), (IntLiteral(0), IntLiteral(0)), "window(left, right)", _window, _window_words,
               fuzz=(("window", _window_fuzz),)),
    BuiltinDef(BuiltinName.PADDING, (0,), (), "padding", _padding, _padding_words,
               fuzz=(("padding", lambda c: "padding"),)),
    BuiltinDef(BuiltinName.DOCUMENT, (1, 2), (TensorParam((2,), "int"), TensorParam((2,), "int")),
               "document(ids)` or `document(q_ids, kv_ids)", _document, _document_words, fill=sorted_ids,
               fuzz=(("document", _document_fuzz),)),
    BuiltinDef(BuiltinName.PREFIX, (1,), (IntExpr(),), "prefix(n)", _prefix, _prefix_words, fill=_key_lengths,
               fill_over_sorted=True, reads=_prefix_reads,
               fuzz=(("prefix", _prefix_fuzz_const), ("prefix_t", _prefix_fuzz_tensor))),
    BuiltinDef(BuiltinName.BLOCK_SPARSE, (1, 3), (TensorParam((2, 3, 4)), IntLiteral(1), IntLiteral(1)),
               "block_sparse(t)` or `block_sparse(t, bq, bk)", _block_sparse, _block_sparse_words, fill=_half_full,
               fuzz=(("block_sparse", _block_sparse_fuzz),)),
    BuiltinDef(BuiltinName.SOFTCAP, (1,), (PositiveLiteral(),), "softcap(c)", _softcap, _softcap_words,
               fuzz=(("softcap", _softcap_fuzz),)),
    BuiltinDef(BuiltinName.ALIBI, (0, 1), (TensorParam((1,), "float"),), "alibi` or `alibi(slopes)", _alibi,
               _alibi_words, fill=_positive_slopes,
               fuzz=(("alibi", lambda c: "alibi"), ("alibi_t", _alibi_fuzz_tensor))),
    BuiltinDef(BuiltinName.BIAS, (1,), (TensorParam((2, 3, 4)),), "bias(t)", _bias, _bias_words,
               fuzz=(("bias", _bias_fuzz),)),
    BuiltinDef(BuiltinName.REL_BIAS, (2,), (TensorParam((2,), "float"), IntLiteral(0)), "rel_bias(t, m)", _rel_bias,
               _rel_bias_words, fuzz=(("rel_bias", _rel_bias_fuzz),)),
)}
assert set(BUILTINS) == set(BuiltinName), "every builtin is declared here"


def builtin_named(name: str) -> BuiltinDef | None:
    """The builtin called `name` in the language, or None."""
    try:
        return BUILTINS[BuiltinName(name)]
    except ValueError:
        return None


def fuzz_forms(score: bool) -> dict[str, Callable[[FuzzContext], str]]:
    """The fuzz forms of every mask (or score) builtin, by form name, in declaration order."""
    return {form: write for d in BUILTINS.values() if d.score_only == score for form, write in d.fuzz}


def desugar(name: BuiltinName, args: tuple[Expr, ...], tensors: Mapping[str, TensorDecl], heads: int, *,
            paged: bool = False) -> Expr:
    """The plain expression a builtin means (docs/LANGUAGE.md); `args` are already checked.
    `paged`: the variant reads a `kv_cache paged` cache, whose builtins align queries to each
    row's cache_lens[b] (`q_aligned`)."""
    return BUILTINS[name].desugar(args, tensors, heads, q_aligned(paged))


def make_builtin(
    name: BuiltinName, args: tuple[Expr, ...], tensors: Mapping[str, TensorDecl], heads: int, span: Span | None = None,
    *, paged: bool = False,
) -> Builtin:
    """The builtin `name` applied to `args`, with its desugared body (`desugar`)."""
    return Builtin(name, args, desugar(name, args, tensors, heads, paged=paged), span)
