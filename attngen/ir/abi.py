"""The runtime shape contract of a variant: what arrays a caller passes and how sizes bind.

The reference, the CUDA runtime and the fuzzer all validate through `bind_sizes` before they
compute anything, so a wrong array is reported once, in the same words, before any launch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from attngen.ir.nodes import (BLOCK_TABLE, CACHE_LENS, INT32_MAX, K_SCALE_BLOCKS, NUM_PAGES, Q_SCALE_BLOCKS, AttnKind, DType, Layout,
                              NormScope, NormTarget, QuantOperand, ScaleGranularity, ScaleSource, SizeSym, TensorDecl, Variant)

Shape = tuple[int, ...]

# numpy dtype names (as `np.dtype(x).name` and ml_dtypes spell them) for each IR element type.
DTYPE_NAMES: dict[DType, str] = {d: d.info.numpy for d in DType}


@dataclass(frozen=True, slots=True)
class Sizes:
    """The run-time sizes of one call: B, Lq, Lk and the free dims bound from runtime inputs."""

    B: int
    Lq: int
    Lk: int
    symbols: tuple[tuple[str, int], ...] = ()

    def symbol(self, name: str) -> int:
        """The value bound to free dim `name`; ValueError when it is not bound."""
        for k, val in self.symbols:
            if k == name:
                return val
        bound = ", ".join(k for k, _ in self.symbols) or "none"
        raise ValueError(f"free dim {name!r} is not bound (bound: {bound})")


@dataclass(frozen=True, slots=True)
class Positions:
    """Where one call's rows sit in a longer sequence: query row i is global position
    `q_offset + i`, key row j is `kv_offset + j`, and the whole sequence has `Lq_total` queries and
    `Lk_total` keys. Masks, scores and the runtime inputs they index (`doc_ids[b, q]`, `q_lens[b]`)
    see global positions and lengths, so a shard of a sequence (a ring's block, a prefill chunk)
    gives exactly the rows and columns of the whole problem. `resolve` fills the defaults: offsets
    0 and totals `offset + L` (the sequence ends with this call's rows, as in chunked prefill)."""

    q_offset: int = 0
    kv_offset: int = 0
    Lq_total: int | None = None
    Lk_total: int | None = None

    @property
    def is_plain(self) -> bool:
        """No offsets and no totals given: the call is the whole sequence."""
        return self.q_offset == 0 and self.kv_offset == 0 and self.Lq_total is None and self.Lk_total is None

    def resolve(self, Lq: int, Lk: int) -> "Positions":
        """The totals filled in and every value checked (ValueError) for a call of Lq x Lk rows."""
        vals = {"q_offset": self.q_offset, "kv_offset": self.kv_offset, "Lq_total": self.Lq_total, "Lk_total": self.Lk_total}
        for name, x in vals.items():
            if x is not None and (isinstance(x, bool) or not isinstance(x, int) and not hasattr(x, "__index__")):
                raise ValueError(f"{name}: expected an integer, got {type(x).__name__}")
        qo, ko = int(self.q_offset), int(self.kv_offset)
        if qo < 0 or ko < 0:
            raise ValueError(f"positions: expected q_offset >= 0 and kv_offset >= 0, got {qo} and {ko}")
        lqt = qo + Lq if self.Lq_total is None else int(self.Lq_total)
        lkt = ko + Lk if self.Lk_total is None else int(self.Lk_total)
        if lqt < qo + Lq:
            raise ValueError(f"Lq_total: expected >= q_offset + Lq = {qo + Lq}, got {lqt}")
        if lkt < ko + Lk:
            raise ValueError(f"Lk_total: expected >= kv_offset + Lk = {ko + Lk}, got {lkt}")
        if max(lqt, lkt) > INT32_MAX:
            raise ValueError(f"positions: expected global lengths below 2^31 (kernels index in 32 bits), got {lqt} and {lkt}")
        return Positions(qo, ko, lqt, lkt)


def size_value(v: Variant, sym: SizeSym, sizes: Sizes) -> int:
    """The value of a size symbol for this variant and call."""
    return {
        SizeSym.B: sizes.B,
        SizeSym.H: v.heads,
        SizeSym.HKV: v.kv_heads,
        SizeSym.LQ: sizes.Lq,
        SizeSym.LK: sizes.Lk,
        SizeSym.D: v.head_dim,
        SizeSym.DV: v.value_head_dim,
    }[sym]


def q_shape(v: Variant, B: int, Lq: int) -> Shape:
    """Shape of q (and of x for the residual) in the variant's layout (varlen: [total_q, H, D],
    with Lq the total)."""
    if v.layout == Layout.VARLEN:
        return (Lq, v.heads, v.head_dim)
    return (B, v.heads, Lq, v.head_dim) if v.layout == Layout.BHSD else (B, Lq, v.heads, v.head_dim)


def kv_shape(v: Variant, B: int, Lk: int, value: bool, num_pages: int | None = None) -> Shape:
    """Shape of k (value=False) or v (value=True): Hkv heads, D or Dv wide. With `kv_cache
    paged(N)`: [num_pages, N, Hkv, D] (by default just enough pages for B rows of Lk keys)."""
    d = v.value_head_dim if value else v.head_dim
    if v.page_size is not None:
        n = num_pages if num_pages is not None else B * -(-Lk // v.page_size)
        return (n, v.page_size, v.kv_heads, d)
    if v.layout == Layout.VARLEN:
        return (Lk, v.kv_heads, d)
    return (B, v.kv_heads, Lk, d) if v.layout == Layout.BHSD else (B, Lk, v.kv_heads, d)


def o_shape(v: Variant, B: int, Lq: int) -> Shape:
    """Shape of the output O: H heads, Dv wide, in the variant's layout."""
    d = v.value_head_dim
    if v.layout == Layout.VARLEN:
        return (Lq, v.heads, d)
    return (B, v.heads, Lq, d) if v.layout == Layout.BHSD else (B, Lq, v.heads, d)


def lse_shape(v: Variant, B: int, Lq: int) -> Shape:
    """Shape of the LSE output (fp32): [B, H, Lq]; varlen [H, total_q] (FlashAttention's unpadded
    LSE: the batch is one packed sequence of Lq = total_q rows)."""
    if v.layout == Layout.VARLEN:
        return (v.heads, Lq)
    return (B, v.heads, Lq)


def q_token_flat(v: Variant) -> bool:
    """Whether q may also be passed as a flat [B, Lq, H*D] hidden state (token-scope q norm)."""
    n = v.norm(NormTarget.Q)
    return n is not None and n.scope == NormScope.TOKEN and v.layout == Layout.BSHD


def input_shape(v: Variant, decl: TensorDecl, sizes: Sizes) -> Shape:
    """The concrete shape of a declared or implied runtime input for this call."""
    out = []
    for d in decl.shape:
        if isinstance(d, SizeSym):
            out.append(size_value(v, d, sizes))
        elif isinstance(d, int):
            out.append(d)
        elif isinstance(d, str):
            out.append(sizes.symbol(d))
        else:
            raise ValueError(f"{decl.name}: expected a dim of int, SizeSym or str, got {d!r}")
    return tuple(out)


def check_dtype(name: str, expected: DType, got: str) -> None:
    """Raise ValueError unless `got` (a numpy dtype name) is the element type `expected`."""
    want = DTYPE_NAMES[expected]
    if got != want:
        raise ValueError(f"{name}: expected dtype {want} ({expected.value}), got {got}")


def check_cache_lens(lo: int, hi: int, Lq: int, capacity: int) -> None:
    """Refuse a paged cache's lengths, given as their least and greatest value, outside
    [Lq, capacity]: each row's cache holds its Lq new tokens and at most max_pages * page_size
    tokens (ValueError saying so; the reference and the decode runtime ask the same)."""
    if lo < Lq or hi > capacity:
        raise ValueError(f"{CACHE_LENS}: expected each row's cached tokens, the Lq = {Lq} new ones included, in "
                         f"[{Lq}, {capacity}] (max_pages * page_size), got values from {lo} to {hi}")


def _fmt_shape(s: Sequence[int]) -> str:
    return "(" + ", ".join(str(x) for x in s) + ("," if len(s) == 1 else "") + ")"


def _check(name: str, layout: str, dims: list[tuple[str, int | None]], got: Sequence[int]) -> list[int]:
    """Match `got` against named dims (None = free); return got as ints or raise with a picture."""
    got = tuple(int(x) for x in got)
    ok = len(got) == len(dims) and all(val is None or val == g for (_, val), g in zip(dims, got))
    if not ok:
        names = ", ".join(n if val is None or n == str(val) else f"{n}={val}" for n, val in dims)
        vals = ", ".join("*" if val is None else str(val) for _, val in dims)
        if len(dims) == 1:
            vals += ","
        where = f" for layout {layout}" if layout else ""
        raise ValueError(f"{name}: expected shape ({names}) = ({vals}){where}, got {_fmt_shape(got)}")
    return list(got)


def bind_sizes(
    v: Variant,
    q_shape: Sequence[int],
    k_shape: Sequence[int],
    v_shape: Sequence[int],
    inputs: Mapping[str, tuple[Sequence[int], str]] | None = None,
    *,
    check_dtypes: bool = True,
    positions: Positions | None = None,
) -> Sizes:
    """Validate every array of one call and bind B, Lq, Lk and the free dims.

    `inputs` maps each runtime input name to (shape, numpy dtype name). With check_dtypes=False the
    element types of runtime inputs are not compared (the reference rounds whatever it is given).
    With `positions` (a shard of a longer sequence), runtime inputs sized Lq or Lk are sized by the
    global lengths, and `kind self` asks for equal global lengths instead of equal local ones."""
    if v.layout == Layout.VARLEN:
        return _bind_varlen(v, q_shape, k_shape, v_shape, inputs, check_dtypes=check_dtypes, positions=positions)
    lay = v.layout.value
    bhsd = v.layout == Layout.BHSD
    H, Hkv, D, Dv = v.heads, v.kv_heads, v.head_dim, v.value_head_dim

    q_shape = tuple(int(x) for x in q_shape)
    if q_token_flat(v) and len(q_shape) == 3:
        B, Lq, _ = _check("q", lay + " (flat hidden state)", [("B", None), ("Lq", None), ("H*D", H * D)], q_shape)
    elif bhsd:
        B, _, Lq, _ = _check("q", lay, [("B", None), ("H", H), ("Lq", None), ("D", D)], q_shape)
    else:
        B, Lq, _, _ = _check("q", lay, [("B", None), ("Lq", None), ("H", H), ("D", D)], q_shape)
    if B < 1:
        raise ValueError(f"q: expected a batch B >= 1, got B={B}")
    if Lq < 1:
        raise ValueError(f"q: expected a query length Lq >= 1, got Lq={Lq}")

    shard = positions is not None and not positions.is_plain
    lk_fixed = Lq if v.kind == AttnKind.SELF and not shard else None

    def kv_dims(width_name: str, width: int, lk: int | None) -> list[tuple[str, int | None]]:
        if bhsd:
            return [("B", B), ("Hkv", Hkv), ("Lk", lk), (width_name, width)]
        return [("B", B), ("Lk", lk), ("Hkv", Hkv), (width_name, width)]

    given = dict(inputs or {})
    if v.page_size is not None:
        # Paged K/V: [num_pages, page_size, Hkv, D]; Lk is the block table's pages times the page
        # size (a missing or misshapen block table is reported with the other inputs below).
        ps = v.page_size
        k = _check("k", "paged", [("num_pages", None), ("page_size", ps), ("Hkv", Hkv), ("D", D)], k_shape)
        if k[0] < 1:
            raise ValueError(f"k: expected at least one page, got num_pages={k[0]}")
        _check("v", "paged", [("num_pages", k[0]), ("page_size", ps), ("Hkv", Hkv), ("Dv", Dv)], v_shape)
        bt = given.get(BLOCK_TABLE)
        bt_shape = tuple(int(x) for x in bt[0]) if bt is not None else ()
        Lk = bt_shape[1] * ps if len(bt_shape) == 2 and bt_shape[1] >= 1 else ps
    else:
        k = _check("k", lay, kv_dims("D", D, lk_fixed), k_shape)
        Lk = k[2] if bhsd else k[1]
        if Lk < 1:
            raise ValueError(f"k: expected a key length Lk >= 1, got Lk={Lk}")
        _check("v", lay, kv_dims("Dv", Dv, Lk), v_shape)

    # The lengths runtime inputs and masks see: the whole sequence's when this call is a shard.
    seen = Sizes(B, Lq, Lk)
    if shard:
        pos = positions.resolve(Lq, Lk)  # type: ignore[union-attr]
        if v.kind == AttnKind.SELF and pos.Lq_total != pos.Lk_total:
            raise ValueError(f"positions: `kind self` expects Lq_total == Lk_total, got {pos.Lq_total} and {pos.Lk_total}")
        seen = Sizes(B, int(pos.Lq_total), int(pos.Lk_total))  # type: ignore[arg-type]

    return bind_sizes_inputs(v, seen, given, check_dtypes, Sizes(B, Lq, Lk),
                             fixed={NUM_PAGES: int(k[0])} if v.page_size is not None else None)


def _bind_varlen(
    v: Variant,
    q_shape: Sequence[int],
    k_shape: Sequence[int],
    v_shape: Sequence[int],
    inputs: Mapping[str, tuple[Sequence[int], str]] | None,
    *,
    check_dtypes: bool,
    positions: Positions | None,
) -> Sizes:
    """`bind_sizes` for `layout varlen`: q [total_q, H, D], k [total_k, Hkv, D], v [total_k, Hkv, Dv],
    the cu_seqlens inputs i32[B+1]; B is the number of sequences, Lq and Lk the totals."""
    H, Hkv, D, Dv = v.heads, v.kv_heads, v.head_dim, v.value_head_dim
    if positions is not None and not positions.is_plain:
        raise ValueError("positions: `layout varlen` takes no q_offset, kv_offset, Lq_total or Lk_total (each sequence starts at 0)")
    Lq, _, _ = _check("q", "varlen", [("total_q", None), ("H", H), ("D", D)], q_shape)
    if Lq < 1:
        raise ValueError(f"q: expected at least one query row (total_q >= 1), got total_q={Lq}")
    lk_fixed = Lq if v.kind == AttnKind.SELF else None
    Lk, _, _ = _check("k", "varlen", [("total_k", lk_fixed), ("Hkv", Hkv), ("D", D)], k_shape)
    if Lk < 1:
        raise ValueError(f"k: expected at least one key row (total_k >= 1), got total_k={Lk}")
    _check("v", "varlen", [("total_k", Lk), ("Hkv", Hkv), ("Dv", Dv)], v_shape)
    given = dict(inputs or {})
    cu_q, cu_k = v.cu_seqlens_names
    B = None
    for name in dict.fromkeys((cu_q, cu_k)):
        if name not in given:
            continue  # reported with the other inputs below
        shape = tuple(int(x) for x in given[name][0])
        if len(shape) != 1 or shape[0] < 2:
            raise ValueError(f"{name}: expected shape (B+1,) with B >= 1 sequences (prefix sums of the lengths, 0 first), got {_fmt_shape(shape)}")
        if B is not None and shape[0] != B + 1:
            raise ValueError(f"{name}: expected shape ({B + 1},) like {cu_q} (B+1 = {B + 1}), got {_fmt_shape(shape)}")
        B = shape[0] - 1
    sizes = bind_sizes_inputs(v, Sizes(B or 1, Lq, Lk), given, check_dtypes)
    return Sizes(B or 1, Lq, Lk, sizes.symbols)


def quant_symbols(v: Variant, seen: Sizes, fixed: Mapping[str, int] | None = None) -> dict[str, int]:
    """The free dims of the implied scale inputs that the call fixes: ceil(L / N) scale blocks
    (`per block(N)`), and a paged cache's page count (from k, in `fixed`)."""
    out: dict[str, int] = {}
    for qn in v.quants:
        if qn.block is not None and qn.source == ScaleSource.INPUT:
            L = seen.Lq if qn.operand == QuantOperand.Q else seen.Lk
            out[Q_SCALE_BLOCKS if qn.operand == QuantOperand.Q else K_SCALE_BLOCKS] = -(-L // qn.block)
    if fixed and NUM_PAGES in fixed and any(qn.granularity == ScaleGranularity.PAGE for qn in v.quants):
        out[NUM_PAGES] = fixed[NUM_PAGES]
    return out


def bind_sizes_inputs(v: Variant, seen: Sizes, given: Mapping[str, tuple[Sequence[int], str]], check_dtypes: bool,
                      result: Sizes | None = None, fixed: Mapping[str, int] | None = None) -> Sizes:
    """Check every runtime input against `seen` (the sizes inputs are measured in) and bind the
    free dims; returns `result` (default `seen`) with them. The scale inputs' free dims are fixed
    by the call (`quant_symbols`; `fixed` holds a paged cache's page count)."""
    decls = v.runtime_inputs()
    expected_names = [d.name for d in decls]
    missing = [n for n in expected_names if n not in given]
    unexpected = sorted(n for n in given if n not in expected_names)
    if missing or unexpected:
        parts = []
        if missing:
            parts.append("missing " + ", ".join(missing))
        if unexpected:
            parts.append("unexpected " + ", ".join(unexpected))
        exp = ", ".join(expected_names) or "none"
        raise ValueError(f"runtime inputs: expected {exp}; got {'; '.join(parts)}")

    partial = seen
    symbols: dict[str, int] = dict(quant_symbols(v, seen, fixed))
    for decl in decls:
        shape, dtype_name = given[decl.name]
        if check_dtypes:
            check_dtype(decl.name, decl.dtype, str(dtype_name))
        dims: list[tuple[str, int | None]] = []
        for d in decl.shape:
            if isinstance(d, SizeSym):
                dims.append((d.value, size_value(v, d, partial)))
            elif isinstance(d, int):
                dims.append((str(d), d))
            else:
                dims.append((d, symbols.get(d)))
        got = _check(decl.name, "", dims, shape)
        for d, g in zip(decl.shape, got):
            if isinstance(d, str):
                if g < 1:
                    raise ValueError(f"{decl.name}: expected free dim {d} >= 1, got {g}")
                symbols.setdefault(d, g)
    out = result if result is not None else seen
    return Sizes(out.B, out.Lq, out.Lk, tuple(sorted(symbols.items())))
