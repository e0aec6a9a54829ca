"""IR expressions → CUDA C++ snippets (element values and tile intervals).

Two emitters over the same IR:
- `ElementEmitter` renders an expression as one C++ expression over scalars (b, h, q, kv, s), used
  per element in partial tiles and for scores.
- `IntervalEmitter` renders the three-valued tile classification of a boolean mask as straight-line
  C++ statements over inclusive integer intervals (q in [q0, q1], kv in [k0, k1]); the answer is
  NEVER (0), MAYBE (1) or ALWAYS (2). It may be conservative (MAYBE) but never wrong; its rules
  mirror `attngen.analysis.intervals`.

Both read global positions: the local row q of a launch is position `q + p.q_offset` of the whole
sequence (and kv is `kv + p.kv_offset`), and the sizes Lq, Lk are the whole sequence's
(`p.Lq_total`, `p.Lk_total`). Element code is called with global q and kv (`ag_mask`, `ag_score`);
classification with a tile's local bounds, to which it adds the offsets. Without offsets these
are the launch's own rows and lengths.

Only validated IR reaches here: identifiers are checked C identifiers and numbers are numbers, so
spec text cannot inject C++. Tensor names are still prefixed (`in_<name>`) so they cannot collide
with kernel locals.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from attngen.ir.nodes import (
    LOGIC_OPS,
    ARITH_OPS,
    BinOp,
    Binary,
    Builtin,
    Call,
    COMPARE_OPS,
    Const,
    DType,
    Expr,
    Func,
    Index,
    IndexVar,
    Load,
    ScalarType,
    Score,
    Size,
    SizeSym,
    TensorDecl,
    TensorRef,
    Unary,
    UnOp,
    children,
    fp32_literal,
    strip_sugar,
    walk,
)

NEVER, MAYBE, ALWAYS = 0, 1, 2
# Interval bounds for integers whose value is unknown. Far outside any index, well inside int64.
INT_UNKNOWN = 1 << 40

@dataclass(frozen=True, slots=True)
class Dialect:
    """What differs between the backends' C++ for one expression: the element types of runtime
    inputs (a column of the dtype table), and the functions the fast-math path calls (the
    accurate path is libm on both). The expressions themselves, their semantics and every helper
    name are shared."""

    name: str  # the dtype table's column: "cuda" or "cpp"
    fast_funcs: tuple[tuple[Func, str], ...]

    def ctype(self, d: DType) -> str:
        return getattr(d.info, self.name)


_ACCURATE = ((Func.TANH, "tanhf"), (Func.EXP, "expf"), (Func.LOG, "logf"), (Func.SQRT, "sqrtf"))
CUDA = Dialect("cuda", ((Func.TANH, "ag_tanh_fast"), (Func.EXP, "__expf"), (Func.LOG, "__logf"), (Func.SQRT, "sqrtf")))
# The CPU backend: half types are their bits (uint16_t, converted by name in the lookups), and
# there is no fast-math path (host libm is the one set of functions).
CPU = Dialect("cpp", _ACCURATE)


def tensor_ctype(d: DType, dialect: Dialect = CUDA) -> str:
    """The C++ element type of a runtime input on a backend (attngen.ir.dtypes)."""
    return dialect.ctype(d)


def float_literal(x: float) -> str:
    """The C++ literal of the fp32 constant a float literal stands for (`ir.fp32_literal`): the
    shortest decimal that reads back as that fp32 (`1e-05f`, `0.088388346f`; `1e-50` is `0.0f`)."""
    v = fp32_literal(x)
    if not math.isfinite(v):
        raise ValueError(f"constant {x!r} is not a finite fp32 value and reached code generation")
    r = repr(v)
    for digits in range(1, 10):
        shorter = repr(float(f"{v:.{digits}g}"))
        if fp32_literal(float(shorter)) == v:
            r = shorter
            break
    if "e" not in r and "." not in r:
        r += ".0"
    return r + "f"


def _size_code(sym: SizeSym, consts: dict[SizeSym, int]) -> str:
    # Masks and scores see the global lengths (`Lq_total`, `Lk_total`: equal to the launch's Lq and
    # Lk unless the caller places this launch inside a longer sequence, as a ring does).
    if sym in consts:
        return str(consts[sym])
    return {"B": "p.B", "Lq": "p.Lq_total", "Lk": "p.Lk_total"}[sym.value]


# Masks and scores see global positions: a launch's local row q is position q + q_offset of the
# whole sequence (context-parallel shards, chunked prefill); likewise kv + kv_offset. Element code
# receives global positions from its call sites (which add the offsets to the tile base once);
# classification receives the tile's local bounds and adds them here.
_INDEX_CODE = {"b": "b", "h": "h", "q": "q", "kv": "kv"}
_INDEX_RANGE = {"b": ("b", "b"), "h": ("h", "h"), "q": ("q0 + p.q_offset", "q1 + p.q_offset"),
                "kv": ("k0 + p.kv_offset", "k1 + p.kv_offset")}


@dataclass
class ElementEmitter:
    """Renders an expression as a single C++ expression.

    `fast_math` picks hardware approximations (tanh.approx, __expf) for the tensor-core path; the
    fp32 path keeps libm accuracy. `eager` renders `&&` and `||` as `&` and `|` on bools: every
    operand is evaluated. That is safe because element code has no side effects and no undefined
    operations (lookups are bounds-checked, integer division by zero gives 0), and it is what lets
    ptxas issue all of a thread's lookups together: under short circuits each element's loads sat
    behind a branch of their own and waited in turn (ncu, document masks: a third of the
    kernel's warp samples)."""

    consts: dict[SizeSym, int]
    fast_math: bool = True
    eager: bool = False
    dialect: Dialect = CUDA

    def emit(self, e: Expr) -> str:
        if isinstance(e, Builtin):
            return self.emit(e.body)
        if isinstance(e, Const):
            if e.type == ScalarType.BOOL:
                return "true" if e.value else "false"
            # Negative literals are parenthesised: `-` applied to `-1` must not become `--1`.
            text = str(int(e.value)) if e.type == ScalarType.INT else float_literal(float(e.value))
            return f"({text})" if text.startswith("-") else text
        if isinstance(e, Index):
            return _INDEX_CODE[e.var.value]
        if isinstance(e, Size):
            return _size_code(e.sym, self.consts)
        if isinstance(e, Score):
            return "s"
        if isinstance(e, Load):
            args = ", ".join(self.emit(i) for i in e.indices)
            return f"ag_ld_{e.tensor}(p, {args})"
        if isinstance(e, Unary):
            x = self.emit(e.operand)
            return f"(-{x})" if e.op == UnOp.NEG else f"(!{x})"
        if isinstance(e, Binary):
            return self._binary(e)
        if isinstance(e, Call):
            return self._call(e)
        if isinstance(e, TensorRef):
            raise ValueError(f"tensor {e.name!r} used as a value")
        raise TypeError(f"unknown IR node {type(e).__name__}")

    def _as_float(self, e: Expr) -> str:
        code = self.emit(e)
        return code if e.type == ScalarType.FLOAT else f"(float)({code})"

    def _binary(self, e: Binary) -> str:
        if e.op in LOGIC_OPS:
            op = {"&&": "&", "||": "|"}[e.op.value] if self.eager else e.op.value
            return f"({self.emit(e.lhs)} {op} {self.emit(e.rhs)})"
        floaty = e.lhs.type == ScalarType.FLOAT or e.rhs.type == ScalarType.FLOAT
        if floaty:
            a, b = self._as_float(e.lhs), self._as_float(e.rhs)
        else:
            a, b = self.emit(e.lhs), self.emit(e.rhs)
        if e.op in COMPARE_OPS:
            return f"({a} {e.op.value} {b})"
        if e.op == BinOp.DIV:
            return f"({a} / {b})" if floaty else f"ag_floordiv({a}, {b})"
        if e.op == BinOp.MOD:
            return f"ag_floormodf({a}, {b})" if floaty else f"ag_floormod({a}, {b})"
        return f"({a} {e.op.value} {b})"

    def _call(self, e: Call) -> str:
        f = e.func
        if f == Func.WHERE:
            c = self.emit(e.args[0])
            if e.type == ScalarType.FLOAT:
                return f"({c} ? {self._as_float(e.args[1])} : {self._as_float(e.args[2])})"
            return f"({c} ? {self.emit(e.args[1])} : {self.emit(e.args[2])})"
        if f in (Func.MIN, Func.MAX):
            if e.type == ScalarType.FLOAT:
                name = "fminf" if f == Func.MIN else "fmaxf"
                return f"{name}({self._as_float(e.args[0])}, {self._as_float(e.args[1])})"
            return f"{f.value}({self.emit(e.args[0])}, {self.emit(e.args[1])})"
        if f == Func.ABS:
            if e.type == ScalarType.FLOAT:
                return f"fabsf({self._as_float(e.args[0])})"
            return f"abs({self.emit(e.args[0])})"
        x = self._as_float(e.args[0])
        name = dict(self.dialect.fast_funcs if self.fast_math else _ACCURATE)[f]
        return f"{name}({x})"


@dataclass
class IntervalEmitter:
    """Emits C++ statements computing a tile's three-valued mask classification.

    Integer intervals are `long long` pairs; float intervals `float` pairs; booleans an int in
    {0, 1, 2}. Every node gets its own temporaries, so shared subtrees cost no blow-up."""

    consts: dict[SizeSym, int]
    decls: dict[str, TensorDecl]
    lines: list[str] = field(default_factory=list)
    _n: int = 0

    def _tmp(self) -> str:
        self._n += 1
        return f"t{self._n}"

    def classify(self, mask: Expr) -> tuple[list[str], str]:
        """Statements and the name of the int holding NEVER/MAYBE/ALWAYS."""
        result = self.tri(mask)
        return self.lines, result

    # -- booleans -----------------------------------------------------------------------------

    def tri(self, e: Expr) -> str:
        if isinstance(e, Builtin):
            return self.tri(e.body)
        t = self._tmp()
        if isinstance(e, Const):
            self.lines.append(f"const int {t} = {ALWAYS if e.value else NEVER};")
            return t
        if isinstance(e, Unary) and e.op == UnOp.NOT:
            x = self.tri(e.operand)
            self.lines.append(f"const int {t} = 2 - {x};")
            return t
        if isinstance(e, Binary) and e.op in LOGIC_OPS:
            a, b = self.tri(e.lhs), self.tri(e.rhs)
            fn = "min" if e.op == BinOp.AND else "max"
            self.lines.append(f"const int {t} = {fn}({a}, {b});")
            return t
        if isinstance(e, Binary) and e.op in COMPARE_OPS:
            floaty = e.lhs.type == ScalarType.FLOAT or e.rhs.type == ScalarType.FLOAT
            a, b = self.interval(e.lhs, floaty), self.interval(e.rhs, floaty)
            self.lines.append(f"const int {t} = ag_cmp_{_CMP[e.op]}({a}_lo, {a}_hi, {b}_lo, {b}_hi);")
            return t
        if isinstance(e, Call) and e.func == Func.WHERE:
            c, x, y = self.tri(e.args[0]), self.tri(e.args[1]), self.tri(e.args[2])
            self.lines.append(f"const int {t} = {c} == 2 ? {x} : ({c} == 0 ? {y} : ({x} == {y} && {x} != 1 ? {x} : 1));")
            return t
        # Boolean-valued lookups do not exist (tensors hold numbers); anything else is unknown.
        self.lines.append(f"const int {t} = 1;")
        return t

    # -- numbers ------------------------------------------------------------------------------

    def interval(self, e: Expr, as_float: bool) -> str:
        """Declares `<t>_lo`, `<t>_hi` for e; returns `<t>`."""
        if isinstance(e, Builtin):
            return self.interval(e.body, as_float)
        ty = "float" if as_float else "long long"
        t = self._tmp()

        def decl(lo: str, hi: str) -> str:
            self.lines.append(f"const {ty} {t}_lo = {lo}; const {ty} {t}_hi = {hi};")
            return t

        if isinstance(e, Const):
            v = float_literal(float(e.value)) if as_float else str(int(e.value))
            v = f"({v})" if v.startswith("-") else v
            return decl(v, v)
        if isinstance(e, Index):
            lo, hi = _INDEX_RANGE[e.var.value]
            return decl(f"({ty})({lo})", f"({ty})({hi})")
        if isinstance(e, Size):
            c = _size_code(e.sym, self.consts)
            return decl(f"({ty}){c}", f"({ty}){c}")
        if isinstance(e, Unary) and e.op == UnOp.NEG:
            x = self.interval(e.operand, as_float)
            return decl(f"-{x}_hi", f"-{x}_lo")
        if isinstance(e, Binary) and e.op in ARITH_OPS:
            return self._arith(e, as_float, t, decl)
        if isinstance(e, Call):
            return self._call(e, as_float, t, decl)
        if isinstance(e, Load):
            return self._load(e, as_float, t, decl)
        return self._unknown(as_float, decl)

    def _unknown(self, as_float: bool, decl) -> str:
        if as_float:
            return decl("-INFINITY", "INFINITY")
        return decl(f"-{INT_UNKNOWN}LL", f"{INT_UNKNOWN}LL")

    def _arith(self, e: Binary, as_float: bool, t: str, decl) -> str:
        if e.type == ScalarType.FLOAT and not as_float:
            # A float subexpression inside an int comparison cannot happen after typing; be safe.
            return self._unknown(as_float, decl)
        sub_float = as_float and e.type == ScalarType.FLOAT
        a = self.interval(e.lhs, sub_float)
        b = self.interval(e.rhs, sub_float)
        if e.op == BinOp.ADD:
            return decl(f"{a}_lo + {b}_lo", f"{a}_hi + {b}_hi")
        if e.op == BinOp.SUB:
            return decl(f"{a}_lo - {b}_hi", f"{a}_hi - {b}_lo")
        if e.op == BinOp.MUL:
            fn = "ag_mul_lo" if not sub_float else "ag_fmul_lo"
            fh = "ag_mul_hi" if not sub_float else "ag_fmul_hi"
            return decl(f"{fn}({a}_lo, {a}_hi, {b}_lo, {b}_hi)", f"{fh}({a}_lo, {a}_hi, {b}_lo, {b}_hi)")
        if not sub_float and e.op in (BinOp.DIV, BinOp.MOD):
            fn = "ag_idiv" if e.op == BinOp.DIV else "ag_imod"
            if not as_float:
                self.lines.append(f"long long {t}_lo, {t}_hi; {fn}({a}_lo, {a}_hi, {b}_lo, {b}_hi, {t}_lo, {t}_hi);")
                return t
            # An int quotient or remainder compared with a float (`(q - kv) % 3 == 0.0`): the
            # bounds come out as integers and are widened like every other int operand here.
            self.lines.append(f"long long {t}_ilo, {t}_ihi; {fn}({a}_lo, {a}_hi, {b}_lo, {b}_hi, {t}_ilo, {t}_ihi);")
            return decl(f"(float){t}_ilo", f"(float){t}_ihi")
        if sub_float and e.op == BinOp.DIV:
            self.lines.append(f"float {t}_lo, {t}_hi; ag_fdiv({a}_lo, {a}_hi, {b}_lo, {b}_hi, {t}_lo, {t}_hi);")
            return t
        return self._unknown(as_float, decl)

    def _call(self, e: Call, as_float: bool, t: str, decl) -> str:
        f = e.func
        sub_float = as_float and e.type == ScalarType.FLOAT
        if f in (Func.MIN, Func.MAX):
            a, b = self.interval(e.args[0], sub_float), self.interval(e.args[1], sub_float)
            fn = "min" if f == Func.MIN else "max"
            if sub_float:
                fn = "fminf" if f == Func.MIN else "fmaxf"
            return decl(f"{fn}({a}_lo, {b}_lo)", f"{fn}({a}_hi, {b}_hi)")
        if f == Func.ABS:
            a = self.interval(e.args[0], sub_float)
            z = "0.0f" if sub_float else "0LL"
            mx = "fmaxf" if sub_float else "max"
            return decl(
                f"({a}_lo >= {z} ? {a}_lo : ({a}_hi <= {z} ? -{a}_hi : {z}))",
                f"{mx}(-{a}_lo, {a}_hi)",
            )
        if f == Func.WHERE:
            c = self.tri(e.args[0])
            a, b = self.interval(e.args[1], sub_float), self.interval(e.args[2], sub_float)
            mn, mx = ("fminf", "fmaxf") if sub_float else ("min", "max")
            return decl(
                f"({c} == 2 ? {a}_lo : ({c} == 0 ? {b}_lo : {mn}({a}_lo, {b}_lo)))",
                f"({c} == 2 ? {a}_hi : ({c} == 0 ? {b}_hi : {mx}({a}_hi, {b}_hi)))",
            )
        if as_float and f in (Func.EXP, Func.TANH):
            a = self.interval(e.args[0], True)
            fn = "expf" if f == Func.EXP else "tanhf"
            return decl(f"{fn}({a}_lo)", f"{fn}({a}_hi)")
        return self._unknown(as_float, decl)

    def _load(self, e: Load, as_float: bool, t: str, decl) -> str:
        d = self.decls[e.tensor]
        idx = [self.interval(i, False) for i in e.indices]
        ty = "float" if as_float else "long long"
        conv = "(float)" if as_float else "(long long)"
        if e.type == ScalarType.FLOAT and not as_float:
            return self._unknown(as_float, decl)
        points = " && ".join(f"{i}_lo == {i}_hi" for i in idx) or "true"
        unknown_lo = "-INFINITY" if as_float else f"-{INT_UNKNOWN}LL"
        unknown_hi = "INFINITY" if as_float else f"{INT_UNKNOWN}LL"
        self.lines.append(f"{ty} {t}_lo = {unknown_lo}, {t}_hi = {unknown_hi};")
        args_lo = ", ".join(f"(int){i}_lo" for i in idx)
        self.lines.append(f"if ({points}) {{ {t}_lo = {t}_hi = {conv}ag_ld_{e.tensor}(p, {args_lo}); }}")
        if d.sorted and idx:
            # Values never decrease along the last dim: the ends of the index range bound the
            # values, except that out-of-range reads give 0, which joins the hull.
            head = idx[:-1]
            last = idx[-1]
            head_points = " && ".join(f"{i}_lo == {i}_hi" for i in head) or "true"
            n = f"p.in_{e.tensor}_n{len(idx) - 1}"
            head_args = "".join(f"(int){i}_lo, " for i in head)
            self.lines.append(
                f"else if ({head_points}) {{ ag_sorted_range(ag_ld_{e.tensor}(p, {head_args}(int)max({last}_lo, 0LL)), "
                f"ag_ld_{e.tensor}(p, {head_args}(int)min({last}_hi, (long long){n} - 1)), "
                f"{last}_lo < 0 || {last}_hi > (long long){n} - 1 || {last}_lo > (long long){n} - 1 || {last}_hi < 0, "
                f"{t}_lo, {t}_hi); }}"
            )
        return t


_CMP = {BinOp.LT: "lt", BinOp.LE: "le", BinOp.GT: "gt", BinOp.GE: "ge", BinOp.EQ: "eq", BinOp.NE: "ne"}


@dataclass(frozen=True, slots=True)
class AxisValue:
    """A lookup-reading piece of an element expression that depends on the row alone (or on the
    key alone), read once per row (per key)."""

    ctype: str
    name: str
    code: str
    expr: Expr  # the piece of the mask it computes (for explain)


@dataclass(frozen=True, slots=True)
class AxisSplit:
    """An element expression split by axis: `rows` over (b, h, q), `cols` over (b, h, kv), and
    `elem`, the expression with those pieces read back as `split_by_axis`'s `row_ref` / `col_ref`
    give: each template's own (the forward engines' in `render._SPLIT_REFS`, the wgmma one's
    `name[ri]` for the thread's row ri and `namek` for the element's key shuffled in; the backward,
    whose accumulators hold keys as rows: `namek` per query, `name[ki]` per key)."""

    rows: tuple[AxisValue, ...]
    cols: tuple[AxisValue, ...]
    elem: str
    elem_q: bool  # whether `elem` reads q itself (not only through a row value)
    elem_kv: bool  # ... kv itself


# The most lookups `split_by_axis` hoists; a mask reading more keeps the per-element form.
MAX_HOISTED_LOOKUPS = 4
_VALUE_CTYPE = {ScalarType.BOOL: "bool", ScalarType.INT: "int", ScalarType.FLOAT: "float"}


@dataclass
class _SubstEmitter(ElementEmitter):
    subst: dict[Expr, str] = field(default_factory=dict)

    def emit(self, e: Expr) -> str:
        got = self.subst.get(e)
        return got if got is not None else ElementEmitter.emit(self, e)


def split_by_axis(e: Expr, consts: dict[SizeSym, int], *, fast_math: bool = True, row_ref: str = "{}[ri]",
                  col_ref: str = "{}k") -> AxisSplit | None:
    """`e` (a mask) with every maximal lookup-reading subexpression that does not depend on kv
    hoisted to a per-row value and every one that does not depend on q to a per-key value, all
    rendered eagerly (`ElementEmitter.eager`); None when a lookup is left in the element part (it
    reads both q and kv, e.g. a block-sparse table) or nothing reads one.

    A thread's partial tile then reads 2 rows and 2 * N_TILES keys instead of evaluating every
    lookup per element: a document mask read doc[b, q] and doc[b, kv] 64 times a tile, and the
    hoisted form keeps its loads few enough to issue together without spills."""
    e = strip_sugar(e)
    rows: dict[Expr, AxisValue] = {}
    cols: dict[Expr, AxisValue] = {}
    base = ElementEmitter(consts, fast_math=fast_math, eager=True)
    leftover = False

    def info(n: Expr) -> tuple[frozenset[IndexVar], bool]:
        deps: set[IndexVar] = set()
        load = False
        for m in walk(n):
            if isinstance(m, Index):
                deps.add(m.var)
            load = load or isinstance(m, Load)
        return frozenset(deps), load

    def visit(n: Expr) -> None:
        nonlocal leftover
        deps, load = info(n)
        if not load:
            return
        if n.type in _VALUE_CTYPE and IndexVar.KV not in deps:
            if n not in rows:
                rows[n] = AxisValue(_VALUE_CTYPE[n.type], f"r{len(rows)}", base.emit(n), n)
            return
        if n.type in _VALUE_CTYPE and IndexVar.Q not in deps:
            if n not in cols:
                cols[n] = AxisValue(_VALUE_CTYPE[n.type], f"c{len(cols)}", base.emit(n), n)
            return
        if isinstance(n, Load):
            leftover = True
            return
        for c in children(n):
            visit(c)

    visit(e)
    if leftover or not (rows or cols):
        return None
    # Every hoisted lookup is live at once (a key one in each of BLOCK_N / 32 slots): past a few,
    # ptxas spills (a hostile spec summing eight lookups a key spilled 16 bytes at head dim 64).
    if sum(isinstance(m, Load) for x in (*rows, *cols) for m in walk(x)) > MAX_HOISTED_LOOKUPS:
        return None
    subst = {x: row_ref.format(v.name) for x, v in rows.items()} | {x: col_ref.format(v.name) for x, v in cols.items()}
    elem = _SubstEmitter(consts, fast_math=fast_math, eager=True, subst=subst).emit(e)

    def elem_vars(n: Expr) -> set[IndexVar]:
        if n in subst:
            return set()
        own = {n.var} if isinstance(n, Index) else set()
        return own.union(*(elem_vars(c) for c in children(n)))

    used = elem_vars(e)
    return AxisSplit(tuple(rows.values()), tuple(cols.values()), elem, IndexVar.Q in used, IndexVar.KV in used)
