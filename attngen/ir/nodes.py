"""The typed, validated intermediate representation of attention variants.

Everything downstream of `lower` (the reference, the interval classifier, the CUDA renderer, the
runtime) reads only these types; nothing downstream re-reads spec text. Nodes are frozen, slotted
dataclasses, so a `Variant` is hashable and its hash is its identity for caches. Source spans ride
along for diagnostics but take no part in equality or hashing.

Semantics of one variant (the numerics contract, implemented by `attngen.reference`):

    s[b,h,q,kv]  = scale * dot(Q'[b,h,q,:], K'[b,hk,kv,:])      hk = h // (H // Hkv)
    s            = scores[-1](... scores[0](s))                  each score expr reads `s`
    visible      = mask[b,h,q,kv]                                 boolean expression
    P            = softmax over kv of s where visible             fp32 or wider
    O[b,h,q,:]   = sum_kv P * V[b,hk,kv,:]                        0 for a row with nothing visible
    LSE[b,h,q]   = log(sum_kv exp(s) over visible kv)             -inf for a row with nothing visible
    with `sink t`: exp(t[h]) joins the sum of P's denominator and of LSE (t[h] for an empty row)
    O            = post_norm(O) if an `o` norm is given; O = x + O if residual (x = the q input)

Q' and K' are the q and k inputs after their pre-norms (if any), rounded to the spec dtype.
Accumulation is always at least fp32.
With `quant` statements (`Variant.quants`), the quantized operands and products follow the
numerics order of docs/QUANT.md, which also states this part of the contract.
"""

from __future__ import annotations

import enum
import math
import struct
from dataclasses import dataclass, field
from typing import Union

from attngen.ir.dtypes import ATTENTION_DTYPES, DType  # noqa: F401 (named here too, where the IR has always had them)


# --------------------------------------------------------------------------------------------
# Float literals


FP32_MAX = 3.4028234663852886e38
INT32_MAX = 2**31 - 1  # integer literals, sizes and element offsets are int32 (or checked against it)
FP32_MIN_NORMAL = 1.1754943508222875e-38


def fp32_literal(x: float) -> float:
    """A float literal's value in every backend: the nearest fp32, and 0 below fp32's normal range.

    Kernels compute masks and scores in fp32 and hold literals as fp32 constants (FlexAttention
    builds float32 tensors); the fast-math path flushes subnormals. Taking the fp64 value as
    written would make `x < 1e-50` true at x == 0 in the reference and false in every kernel.
    Beyond fp32's range the value is +-inf (the front end rejects such literals)."""
    try:
        v = struct.unpack("<f", struct.pack("<f", x))[0]
    except OverflowError:
        return math.copysign(math.inf, x)
    return 0.0 if abs(v) < FP32_MIN_NORMAL else v


# --------------------------------------------------------------------------------------------
# Source locations


@dataclass(frozen=True, slots=True)
class Span:
    """A half-open region of a source file, 1-based line/column (columns count characters)."""

    path: str
    line: int
    col: int
    end_line: int
    end_col: int


def _span() -> Span | None:
    # Spans never take part in equality or hashing: two specs that differ only in layout or
    # comments lower to equal IR.
    return field(default=None, compare=False, hash=False, repr=False)  # type: ignore[return-value]


# --------------------------------------------------------------------------------------------
# Closed sets (element types: attngen.ir.dtypes, their one table)


class Layout(enum.Enum):
    """Memory layout of Q/K/V/O. `bshd` is the natural view of a [B, L, H*D] hidden state."""

    BHSD = "bhsd"
    BSHD = "bshd"
    # Packed variable-length batch (FlashAttention varlen): q [total_q, H, D], k/v [total_k, Hkv, D],
    # o [total_q, H, Dv]; sequence b owns rows cu_seqlens_q[b] .. cu_seqlens_q[b+1] - 1 (the
    # implied i32[B+1] inputs, `cu_seqlens` for `kind self`), and positions restart at 0 in each.
    VARLEN = "varlen"


class AttnKind(enum.Enum):
    SELF = "self"  # Lq == Lk is required at run time
    CROSS = "cross"  # Lq and Lk are independent


class NormKind(enum.Enum):
    LAYERNORM = "layernorm"
    RMSNORM = "rmsnorm"


class NormScope(enum.Enum):
    HEAD = "head"  # statistics over head_dim (QK-norm)
    TOKEN = "token"  # statistics over the whole H*D hidden row (pre-LN block); q only, layout bshd


class NormTarget(enum.Enum):
    Q = "q"  # pre-norm on the q input
    K = "k"  # pre-norm on the k input
    O = "o"  # post-norm on the attention output (head scope only)


class ScalarType(enum.Enum):
    """Types of expression values. TENSOR is only the type of a tensor-name argument to a builtin."""

    BOOL = "bool"
    INT = "int"
    FLOAT = "float"
    TENSOR = "tensor"


class IndexVar(enum.Enum):
    """The free index variables of mask and score expressions."""

    B = "b"
    H = "h"
    Q = "q"
    KV = "kv"


class SizeSym(enum.Enum):
    """Sizes usable in expressions and in declared tensor shapes. B, Lq, Lk are run-time values;
    the others are fixed by the spec."""

    B = "B"
    H = "H"
    HKV = "Hkv"
    LQ = "Lq"
    LK = "Lk"
    D = "D"
    DV = "Dv"


class UnOp(enum.Enum):
    NEG = "-"
    NOT = "!"


class BinOp(enum.Enum):
    # Integer `/` and `%` are floor division and floor modulo (Python's), and x / 0 == x % 0 == 0.
    ADD = "+"
    SUB = "-"
    MUL = "*"
    DIV = "/"
    MOD = "%"
    LT = "<"
    LE = "<="
    GT = ">"
    GE = ">="
    EQ = "=="
    NE = "!="
    AND = "&&"
    OR = "||"


ARITH_OPS = frozenset({BinOp.ADD, BinOp.SUB, BinOp.MUL, BinOp.DIV, BinOp.MOD})
COMPARE_OPS = frozenset({BinOp.LT, BinOp.LE, BinOp.GT, BinOp.GE, BinOp.EQ, BinOp.NE})
LOGIC_OPS = frozenset({BinOp.AND, BinOp.OR})


class Func(enum.Enum):
    """Elementwise functions. `where(c, a, b)` selects; min/max take two arguments."""

    TANH = "tanh"
    EXP = "exp"
    LOG = "log"
    SQRT = "sqrt"
    ABS = "abs"
    MIN = "min"
    MAX = "max"
    WHERE = "where"


class BuiltinName(enum.Enum):
    """Sugar kept in the IR (see `Builtin`): masks first, then score modifications."""

    CAUSAL = "causal"
    WINDOW = "window"
    PADDING = "padding"
    DOCUMENT = "document"
    PREFIX = "prefix"
    BLOCK_SPARSE = "block_sparse"
    SOFTCAP = "softcap"
    ALIBI = "alibi"
    BIAS = "bias"
    REL_BIAS = "rel_bias"


MASK_BUILTINS = frozenset(
    {
        BuiltinName.CAUSAL,
        BuiltinName.WINDOW,
        BuiltinName.PADDING,
        BuiltinName.DOCUMENT,
        BuiltinName.PREFIX,
        BuiltinName.BLOCK_SPARSE,
    }
)
SCORE_BUILTINS = frozenset({BuiltinName.SOFTCAP, BuiltinName.ALIBI, BuiltinName.BIAS, BuiltinName.REL_BIAS})

# Names of runtime inputs that builtins and norms imply (they are part of the kernel ABI, listed by
# `Variant.runtime_inputs()`, and may not be declared again by the user).
PADDING_Q_LENS = "q_lens"
PADDING_KV_LENS = "kv_lens"
BLOCK_TABLE = "block_table"  # implied by `kv_cache paged(N)`: i32[B, BLOCK_TABLE_PAGES]
BLOCK_TABLE_PAGES = "max_pages"
# Implied by `kv_cache paged(N)` too: i32[B], each row's valid cached tokens, the Lq new ones
# included (the last Lq of them). Keys at or past cache_lens[b] are invisible, and the builtins'
# aligned query position is q + (cache_lens[b] - Lq) (see `Variant.visibility`). A spec may also
# declare it, as `input cache_lens: i32[B]`: the same input.
CACHE_LENS = "cache_lens"
# Implied by `layout varlen`: prefix sums of the sequence lengths, i32[B+1] (sorted; 0 first, the
# total last). `kind self` has one (q and k/v share the lengths), `kind cross` one each.
CU_SEQLENS = "cu_seqlens"
CU_SEQLENS_Q = "cu_seqlens_q"
CU_SEQLENS_K = "cu_seqlens_k"
CU_SEQLENS_DIM = "B_plus_1"  # their free dim (bind_sizes checks it is B + 1)
PAGE_SIZES = (8, 256)  # smallest and largest page, tokens (multiples of 8)
ALIBI_SLOPES = "alibi_slopes"  # only when `alibi(slopes)` is not given a tensor: standard slopes are
# computed at compile time and are not an input.


# --------------------------------------------------------------------------------------------
# Quantization (docs/QUANT.md: the language, the numerics order, this contract)


class QuantOperand(enum.Enum):
    """What a `quant` statement quantizes: an input, or P (the softmax probabilities before P·V).
    Q·Kᵀ runs quantized when q and k are; P·V when p and v are."""

    Q = "q"
    K = "k"
    V = "v"
    P = "p"


class ScaleSource(enum.Enum):
    """Where an operand's scale comes from."""

    INPUT = "input"  # a runtime input, `<operand>_scale` (f32, shape by granularity: `Variant.scale_inputs`)
    AMAX = "amax"  # computed in the kernel: amax over each group / qmax
    STATIC = "static"  # a constant of the spec (p only): `static(c)`


class ScaleGranularity(enum.Enum):
    """The group of elements one scale covers (docs/QUANT.md lists the shapes of the inputs)."""

    TENSOR = "tensor"  # one scale for the whole tensor
    HEAD = "head"  # one per (batch, kv head), FA3's descales; one per kv head for a paged cache
    TOKEN = "token"  # one per (batch, head, position): a row of D (p: a row of the score matrix)
    BLOCK = "block"  # one per (batch, head, block of N positions)
    CHANNEL = "channel"  # v only: one per (batch, kv head, value channel)
    PAGE = "page"  # paged k/v only: one per (page, kv head)


class Smooth(enum.Enum):
    """Smoothing before quantization (k only)."""

    MEAN = "mean"  # subtract K's per-channel mean over tokens; every score of a row shifts by the same amount


@dataclass(frozen=True, slots=True)
class Quant:
    """One `quant` statement: `operand` is quantized to `dtype` (a QUANT_DTYPES member) with scales
    from `source` at `granularity` (None for STATIC); `block` is N of `per block(N)`, `static` the c
    of `static(c)` (the value the quantizer multiplies by), `smooth` k's smoothing. The operand's
    value in the products is dequantized as stored * scale (docs/QUANT.md, "Numerics")."""

    operand: QuantOperand
    dtype: DType
    source: ScaleSource
    granularity: ScaleGranularity | None = None
    block: int | None = None
    static: float | None = None
    smooth: Smooth | None = None
    span: Span | None = _span()

    @property
    def scale_input(self) -> str | None:
        """The name of its runtime scale input, None unless its source is INPUT."""
        return quant_scale_name(self.operand) if self.source == ScaleSource.INPUT else None


QUANT_OPERAND_ORDER = (QuantOperand.Q, QuantOperand.K, QuantOperand.V, QuantOperand.P)
# Free dims of the implied scale inputs: bound from the arrays, checked against ceil(L / N).
Q_SCALE_BLOCKS = "q_scale_blocks"
K_SCALE_BLOCKS = "k_scale_blocks"
NUM_PAGES = "num_pages"  # a paged cache's page count (dim 0 of its k and v), for per-page scales


def quant_scale_name(operand: QuantOperand) -> str:
    """The implied runtime input of an operand's INPUT scale: `q_scale`, `k_scale`, `v_scale`."""
    return f"{operand.value}_scale"


QUANT_SCALE_NAMES = tuple(quant_scale_name(o) for o in (QuantOperand.Q, QuantOperand.K, QuantOperand.V))


@dataclass(frozen=True, slots=True)
class InputDTypes:
    """The stored types of q, k and v where any differs from the variant's `dtype` (which is then
    the output's type): `dtype fp8_e4m3 out bf16` is InputDTypes(e4m3, e4m3, e4m3) with dtype bf16."""

    q: DType
    k: DType
    v: DType


def norm_weight_name(target: NormTarget) -> str:
    return f"{target.value}_norm_weight"


def norm_bias_name(target: NormTarget) -> str:
    return f"{target.value}_norm_bias"


# --------------------------------------------------------------------------------------------
# Expressions


@dataclass(frozen=True, slots=True)
class Const:
    value: Union[bool, int, float]
    type: ScalarType
    span: Span | None = _span()


@dataclass(frozen=True, slots=True)
class Index:
    """One of the index variables b, h, q, kv (type INT)."""

    var: IndexVar
    span: Span | None = _span()

    @property
    def type(self) -> ScalarType:
        return ScalarType.INT


@dataclass(frozen=True, slots=True)
class Size:
    """A size symbol: B, H, Hkv, Lq, Lk, D, Dv (type INT)."""

    sym: SizeSym
    span: Span | None = _span()

    @property
    def type(self) -> ScalarType:
        return ScalarType.INT


@dataclass(frozen=True, slots=True)
class Score:
    """The score `s`: scale * q.k after the previous score modifications (type FLOAT)."""

    span: Span | None = _span()

    @property
    def type(self) -> ScalarType:
        return ScalarType.FLOAT


@dataclass(frozen=True, slots=True)
class TensorRef:
    """A runtime tensor named as a builtin's argument (`document(ids)`); not a value on its own."""

    name: str
    span: Span | None = _span()

    @property
    def type(self) -> ScalarType:
        return ScalarType.TENSOR


@dataclass(frozen=True, slots=True)
class Load:
    """A lookup `t[i, j, ...]` into a runtime tensor. Out-of-range indices read as 0 (never memory
    outside the tensor); the type is INT for integer tensors and FLOAT for float ones."""

    tensor: str
    indices: tuple["Expr", ...]
    type: ScalarType
    span: Span | None = _span()


@dataclass(frozen=True, slots=True)
class Unary:
    op: UnOp
    operand: "Expr"
    type: ScalarType
    span: Span | None = _span()


@dataclass(frozen=True, slots=True)
class Binary:
    op: BinOp
    lhs: "Expr"
    rhs: "Expr"
    type: ScalarType
    span: Span | None = _span()


@dataclass(frozen=True, slots=True)
class Call:
    func: Func
    args: tuple["Expr", ...]
    type: ScalarType
    span: Span | None = _span()


@dataclass(frozen=True, slots=True)
class Builtin:
    """Sugar: `name(args)` as the user wrote it, and `body`, the plain expression it means.

    Everything that computes (reference, classifier, renderer) may simply evaluate `body`; `name`
    and `args` serve the printer, `explain`, and fast paths that recognise a builtin."""

    name: BuiltinName
    args: tuple["Expr", ...]
    body: "Expr"
    span: Span | None = _span()

    @property
    def type(self) -> ScalarType:
        return self.body.type


Expr = Union[Const, Index, Size, Score, TensorRef, Load, Unary, Binary, Call, Builtin]

TRUE = Const(True, ScalarType.BOOL)


# --------------------------------------------------------------------------------------------
# Declarations and the variant


# A dimension of a declared tensor: a fixed integer, a size symbol, or a free symbol (any other
# identifier) that is bound at run time from the array that is passed and must agree across inputs.
Dim = Union[int, SizeSym, str]


@dataclass(frozen=True, slots=True)
class TensorDecl:
    """A runtime input: `input ids: i32[B, Lk] sorted`. `sorted` promises that values never
    decrease along the last dimension, which lets tile classification read only a tile's ends."""

    name: str
    dtype: DType
    shape: tuple[Dim, ...]
    sorted: bool = False
    span: Span | None = _span()


@dataclass(frozen=True, slots=True)
class Norm:
    target: NormTarget
    kind: NormKind
    scope: NormScope
    eps: float
    affine: bool = True  # gamma (and beta for layernorm) are runtime inputs
    span: Span | None = _span()


@dataclass(frozen=True, slots=True)
class TileConfig:
    """Schedule only: never changes what is computed."""

    block_m: int
    block_n: int
    warps: int
    stages: int
    span: Span | None = _span()


@dataclass(frozen=True, slots=True)
class TileHint:
    """A spec's `tile` statement as written: the fields it gives (None: the plan picks). The plan
    stage (attngen.plan.validate) fills the rest for an arch and refuses a tile that arch cannot
    run, at this span; the IR itself knows no backend limit."""

    block_m: int | None = None
    block_n: int | None = None
    warps: int | None = None
    stages: int | None = None
    span: Span | None = _span()

    def given(self) -> tuple[tuple[str, int], ...]:
        """The fields the spec gives, in canonical order."""
        return tuple((k, getattr(self, k)) for k in TILE_FIELDS if getattr(self, k) is not None)


TILE_FIELDS = ("block_m", "block_n", "warps", "stages")


@dataclass(frozen=True, slots=True)
class Variant:
    name: str
    dtype: DType
    head_dim: int
    value_head_dim: int
    heads: int
    kv_heads: int
    kind: AttnKind
    layout: Layout
    scale: float | None  # None: 1/sqrt(head_dim)
    mask: Expr  # BOOL; TRUE when the spec has no mask
    scores: tuple[Expr, ...]  # FLOAT each, applied in order, each reading the previous as `s`
    norms: tuple[Norm, ...]  # at most one per target
    residual: bool
    nan_check: bool
    lse: bool
    inputs: tuple[TensorDecl, ...]  # declared by the user, in source order
    tile: TileHint | None  # None: `tile auto` (the plan picks every field)
    span: Span | None = _span()
    # `sink NAME`: a declared fp32[H] input of per-head logits that join every row's softmax
    # denominator (gpt-oss attention sinks); None without one.
    sink: str | None = None
    # `kv_cache paged(N)`: K/V are [num_pages, N, Hkv, D] pages; the implied input
    # block_table: i32[B, max_pages] maps each row's logical page t (keys t*N .. t*N + N - 1) to a
    # page, Lk = max_pages * N is the capacity, and the implied cache_lens: i32[B] holds each row's
    # length (vLLM / FlashInfer semantics). None: contiguous K/V.
    page_size: int | None = None
    # Per-tensor storage types (`dtype T q T1 k T2 v T3 out T4`): None when q, k and v are stored
    # in `dtype`, the output's type, as every unquantized spec is (the IR of those is unchanged).
    input_dtypes: InputDTypes | None = None
    # The `quant` statements, in QUANT_OPERAND_ORDER (at most one an operand); () for full precision.
    quants: tuple[Quant, ...] = ()

    @property
    def q_dtype(self) -> DType:
        """The stored type of the q input."""
        return self.input_dtypes.q if self.input_dtypes is not None else self.dtype

    @property
    def k_dtype(self) -> DType:
        """The stored type of the k input (a paged cache's pages)."""
        return self.input_dtypes.k if self.input_dtypes is not None else self.dtype

    @property
    def v_dtype(self) -> DType:
        """The stored type of the v input."""
        return self.input_dtypes.v if self.input_dtypes is not None else self.dtype

    @property
    def out_dtype(self) -> DType:
        """The output's type (`dtype` itself; named for symmetry with the inputs)."""
        return self.dtype

    @property
    def quantized(self) -> bool:
        """Whether any operand is quantized (stored quantized implies a `quant` statement)."""
        return bool(self.quants)

    def quant(self, operand: QuantOperand) -> Quant | None:
        """The `quant` statement of `operand`, or None."""
        for qn in self.quants:
            if qn.operand == operand:
                return qn
        return None

    @property
    def quantized_qk(self) -> bool:
        """Whether Q·Kᵀ runs on quantized operands (q and k both quantized)."""
        return self.quant(QuantOperand.Q) is not None and self.quant(QuantOperand.K) is not None

    @property
    def quantized_pv(self) -> bool:
        """Whether P·V runs on quantized operands (p and v both quantized)."""
        return self.quant(QuantOperand.P) is not None and self.quant(QuantOperand.V) is not None

    def scale_inputs(self) -> tuple[TensorDecl, ...]:
        """The implied f32 scale inputs of the INPUT-sourced `quant`s, q's then k's then v's."""
        out = []
        for qn in self.quants:
            if qn.source == ScaleSource.INPUT:
                out.append(TensorDecl(quant_scale_name(qn.operand), DType.FP32, self._scale_shape(qn)))
        return tuple(out)

    def _scale_shape(self, qn: Quant) -> tuple[Dim, ...]:
        g, is_q = qn.granularity, qn.operand == QuantOperand.Q
        heads: Dim = SizeSym.H if is_q else SizeSym.HKV
        if g == ScaleGranularity.TENSOR:
            return (1,)
        if g == ScaleGranularity.HEAD:
            return (SizeSym.HKV,) if self.page_size is not None and not is_q else (SizeSym.B, SizeSym.HKV)
        if g == ScaleGranularity.TOKEN:
            return (SizeSym.B, heads, SizeSym.LQ if is_q else SizeSym.LK)
        if g == ScaleGranularity.BLOCK:
            return (SizeSym.B, heads, Q_SCALE_BLOCKS if is_q else K_SCALE_BLOCKS)
        if g == ScaleGranularity.CHANNEL:
            return (SizeSym.B, SizeSym.HKV, SizeSym.DV)
        if g == ScaleGranularity.PAGE:
            return (NUM_PAGES, SizeSym.HKV)
        raise ValueError(f"no scale input for {qn.operand.value} at granularity {g}")

    @property
    def effective_scale(self) -> float:
        return self.scale if self.scale is not None else 1.0 / math.sqrt(self.head_dim)

    @property
    def group_size(self) -> int:
        return self.heads // self.kv_heads

    def norm(self, target: NormTarget) -> Norm | None:
        for n in self.norms:
            if n.target == target:
                return n
        return None

    @property
    def varlen(self) -> bool:
        return self.layout == Layout.VARLEN

    @property
    def cu_seqlens_names(self) -> tuple[str, ...]:
        """The implied cu_seqlens inputs, (for q, for k/v): one shared array for `kind self`,
        two for `kind cross`; () unless `layout varlen`."""
        if self.layout != Layout.VARLEN:
            return ()
        return (CU_SEQLENS, CU_SEQLENS) if self.kind == AttnKind.SELF else (CU_SEQLENS_Q, CU_SEQLENS_K)

    def runtime_inputs(self) -> tuple[TensorDecl, ...]:
        """Every runtime input beyond q, k, v, in ABI order: declared inputs first, then those
        implied by builtins and norms (sorted by name so the order is stable)."""
        implied: dict[str, TensorDecl] = {}
        for e in (self.mask, *self.scores):
            for node in walk(e):
                if isinstance(node, Builtin) and node.name == BuiltinName.PADDING:
                    implied[PADDING_Q_LENS] = TensorDecl(PADDING_Q_LENS, DType.I32, (SizeSym.B,))
                    implied[PADDING_KV_LENS] = TensorDecl(PADDING_KV_LENS, DType.I32, (SizeSym.B,))
        for n in self.norms:
            if not n.affine:
                continue
            width: Dim = SizeSym.D if n.target != NormTarget.O else SizeSym.DV
            if n.scope == NormScope.TOKEN:
                width = self.heads * self.head_dim
            implied[norm_weight_name(n.target)] = TensorDecl(norm_weight_name(n.target), DType.FP32, (width,))
            if n.kind == NormKind.LAYERNORM:
                implied[norm_bias_name(n.target)] = TensorDecl(norm_bias_name(n.target), DType.FP32, (width,))
        for name in self.cu_seqlens_names:
            implied[name] = TensorDecl(name, DType.I32, (CU_SEQLENS_DIM,), True)
        if self.page_size is not None:
            implied[BLOCK_TABLE] = TensorDecl(BLOCK_TABLE, DType.I32, (SizeSym.B, BLOCK_TABLE_PAGES))
            implied[CACHE_LENS] = cache_lens_decl()
        for d in self.scale_inputs():
            implied[d.name] = d
        declared = {d.name for d in self.inputs}
        extra = tuple(implied[k] for k in sorted(implied) if k not in declared)
        return self.inputs + extra

    def visibility(self) -> Expr:
        """The mask the kernels and the reference apply: the spec's mask, and for a paged cache
        also `kv < cache_lens[b]` (keys past a row's length are invisible, whatever the mask),
        unless the mask already has that conjunct (a second copy costs the kernel registers)."""
        if self.page_size is None:
            return self.mask
        within = Binary(BinOp.LT, Index(IndexVar.KV), cache_len(), ScalarType.BOOL)
        if self.mask == TRUE:
            return within
        stack, conjuncts = [self.mask], []
        while stack:
            e = stack.pop()
            if isinstance(e, Binary) and e.op == BinOp.AND:
                stack += (e.lhs, e.rhs)
            else:
                conjuncts.append(e)
        return self.mask if within in conjuncts else Binary(BinOp.AND, self.mask, within, ScalarType.BOOL)


def cache_lens_decl() -> TensorDecl:
    """The declaration `kv_cache paged` implies for its lengths: i32[B]."""
    return TensorDecl(CACHE_LENS, DType.I32, (SizeSym.B,))


def cache_len() -> Expr:
    """`cache_lens[b]`: the length of batch row b's paged cache."""
    return Load(CACHE_LENS, (Index(IndexVar.B),), ScalarType.INT)


@dataclass(frozen=True, slots=True)
class Program:
    """All variants of one .attn file, in source order."""

    variants: tuple[Variant, ...]
    path: str = field(default="<string>", compare=False, hash=False)

    def get(self, name: str | None = None) -> Variant:
        """The variant called `name`, or the only one when `name` is None."""
        if name is None:
            if len(self.variants) != 1:
                names = ", ".join(v.name for v in self.variants)
                raise KeyError(f"{self.path} defines {len(self.variants)} variants ({names}); pick one by name")
            return self.variants[0]
        for v in self.variants:
            if v.name == name:
                return v
        names = ", ".join(v.name for v in self.variants)
        raise KeyError(f"no variant {name!r} in {self.path}; it defines: {names}")

    def select(self, name: str | None = None) -> tuple[Variant, ...]:
        """The variant called `name`, or every variant when `name` is None (KeyError as `get`)."""
        return (self.get(name),) if name else self.variants


# --------------------------------------------------------------------------------------------
# Helpers


def children(e: Expr) -> tuple[Expr, ...]:
    if isinstance(e, Load):
        return e.indices
    if isinstance(e, Unary):
        return (e.operand,)
    if isinstance(e, Binary):
        return (e.lhs, e.rhs)
    if isinstance(e, Call):
        return e.args
    if isinstance(e, Builtin):
        return (*e.args, e.body)
    return ()


def walk(e: Expr):
    """Pre-order traversal, including builtin arguments and bodies."""
    yield e
    for c in children(e):
        yield from walk(c)


def strip_sugar(e: Expr) -> Expr:
    """The same expression with every `Builtin` replaced by its body."""
    if isinstance(e, Builtin):
        return strip_sugar(e.body)
    if isinstance(e, Load):
        return Load(e.tensor, tuple(strip_sugar(i) for i in e.indices), e.type)
    if isinstance(e, Unary):
        return Unary(e.op, strip_sugar(e.operand), e.type)
    if isinstance(e, Binary):
        return Binary(e.op, strip_sugar(e.lhs), strip_sugar(e.rhs), e.type)
    if isinstance(e, Call):
        return Call(e.func, tuple(strip_sugar(a) for a in e.args), e.type)
    return e


def uses_score(e: Expr) -> bool:
    return any(isinstance(n, Score) for n in walk(strip_sugar(e)))


def tensors_used(e: Expr) -> frozenset[str]:
    return frozenset(n.tensor for n in walk(strip_sugar(e)) if isinstance(n, Load))
