"""Validated IR → one self-contained C++17 source for the CPU (stage: render).

The CPU backend reads the same frozen IR, tile classification and expression emitters as the CUDA
backend (`attngen.cuda.emit`, in its CPU dialect); only the kernel around them differs. Python
computes the template context; `backends/cpu/attention.cpp.j2` splices it in and branches on
flags. Same variant, same bytes.

The C ABI: `{prefix}_{variant}_cpu_launch(const {prefix}_{variant}_cpu_params*)` returns 0 on
success, 1 for invalid sizes or a missing pointer, 2 when a thread's scratch cannot be allocated.
The params struct is plain C (element pointers `void*`), written once here and spliced into both
the source and the header, so the two can never disagree.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import jinja2

from attngen import __version__
from attngen.cuda.emit import CPU, INT_UNKNOWN, ElementEmitter, IntervalEmitter, float_literal, tensor_ctype
from attngen.ir import names
from attngen.ir.nodes import TRUE, DType, Layout, NormKind, NormScope, NormTarget, SizeSym, Variant
from attngen.lang.printer import print_expr
from attngen.resources import cpu_template_dir

DEFAULT_PREFIX = "attngen"
# Tiles: query rows (packed rows of the G heads of a kv head) x keys a block. Without a mask every
# block is computed, and large tiles amortise the K^T packing and the per-row softmax over more
# work (one thread, D128 L2k: 188 ms at 64 x 64, 144 at 192 x 128, 133-135 at 384 x 128 against
# 139 at 192 in the same runs; about 0.7 MiB of scratch at D128, within a core's 2 MiB L2). A
# mask skips NEVER blocks and evaluates MAYBE blocks per element, both at tile granularity:
# smaller tiles skip more and mask fewer elements (causal D64 L2k: 48 ms at 48 x 64, 42 at
# 96 x 64; window and padding lose up to 15% at 192 x 128).
# Multiples of every register block's rows (12, 6, 4) and columns (32, 64).
BLOCK_M, BLOCK_N = 384, 128  # no mask
MASKED_BLOCK_M, MASKED_BLOCK_N = 96, 64
VECTOR = 32  # DV is padded to it: every register block's columns divide it (P V takes 64 where DVP allows)


@dataclass(frozen=True, slots=True)
class Field:
    """One field of the C params struct, in ABI order: its C type, name and what it holds."""

    ctype: str
    name: str
    doc: str


def symbol(v: Variant, prefix: str = DEFAULT_PREFIX) -> str:
    """`{prefix}_{variant}_cpu`: the stem of every exported name (`_launch`, `_params`)."""
    if not prefix.isidentifier() or not prefix.isascii():
        raise ValueError(f"prefix {prefix!r} is not a C identifier (letters, digits and _, not starting with a digit)")
    return f"{prefix}_{v.name}_cpu"


def unsupported(v: Variant) -> str | None:
    """Why the CPU backend cannot run `v`, or None. (Every construct of the language runs today;
    the reference's own refusals are repeated so that compile reports them before any build.)"""
    if v.quantized:
        from attngen.cpu import render_quant

        return render_quant.unsupported(v)
    if v.residual and v.head_dim != v.value_head_dim:
        return f"residual needs Dv == D, got D={v.head_dim}, Dv={v.value_head_dim}"
    for t in (NormTarget.K, NormTarget.O):
        n = v.norm(t)
        if n is not None and n.scope == NormScope.TOKEN:
            return f"norm {t.value}: token scope is for q only"
    return None


def fields(v: Variant) -> tuple[Field, ...]:
    """The params struct's fields, in order (also the ctypes Structure the runtime builds)."""
    f = [
        Field("const void*", "q", f"query [{_layout_text(v, 'q')}] ({v.q_dtype.value}; the hidden state x with a token-scope q norm)"),
        Field("const void*", "k", f"keys [{_layout_text(v, 'k')}] ({v.k_dtype.value})"),
        Field("const void*", "v", f"values [{_layout_text(v, 'v')}] ({v.v_dtype.value})"),
        Field("void*", "o", f"output [{_layout_text(v, 'o')}] ({v.dtype.value})"),
        Field("float*", "lse", ("log-sum-exp [H, total_q], head stride lse_sh" if v.layout == Layout.VARLEN
                                else "log-sum-exp [B, H, Lq], contiguous") + " (may be null unless `output lse`)"),
        Field("int*", "nan_flag", "set to 1 when the output holds NaN/Inf (`nan_check`; may be null)"),
        Field("int", "B", "batch (varlen: sequences)"),
        Field("int", "Lq", "query length (varlen: total_q)"),
        Field("int", "Lk", "key length (varlen: total_k; paged: max_pages * page_size)"),
        Field("int", "q_offset", "global position of query row 0 (0 for a whole sequence)"),
        Field("int", "kv_offset", "global position of key row 0 (0 for a whole sequence)"),
        Field("int", "Lq_total", "global query length the mask sees (q_offset + Lq for a whole sequence)"),
        Field("int", "Lk_total", "global key length the mask sees (kv_offset + Lk for a whole sequence)"),
        Field("int", "num_threads", "OpenMP threads (0: the OpenMP default; ignored in a build without OpenMP)"),
    ]
    if v.page_size is not None:
        f.append(Field("int", "num_pages", "pages in the cache (k and v are [num_pages, page_size, Hkv, D])"))
    for t in ("q", "k", "v", "o"):
        for s, what in (("sb", "batch (paged k/v: page)"), ("sh", "head"), ("ss", "sequence (paged k/v: slot)")):
            f.append(Field("long long", f"{t}_{s}", f"{t} {what} stride, elements"))
    if v.layout == Layout.VARLEN:
        f.append(Field("long long", "lse_sh", "lse head stride, elements (total_q for a contiguous [H, total_q])"))
    for d in v.runtime_inputs():
        f.append(Field(f"const {tensor_ctype(d.dtype, CPU)}*", names.input_field(d.name), f"runtime input {d.name}: {d.dtype.value}"))
        for i in range(len(d.shape)):
            f.append(Field("int", names.input_size_field(d.name, i), f"{d.name} size of dim {i}"))
        for i in range(len(d.shape)):
            f.append(Field("long long", names.input_stride_field(d.name, i), f"{d.name} stride of dim {i}, elements"))
    return tuple(f)


def _layout_text(v: Variant, t: str) -> str:
    d = "Dv" if t in ("v", "o") else "D"
    heads = "Hkv" if t in ("k", "v") else "H"
    if v.page_size is not None and t in ("k", "v"):
        return f"num_pages, {v.page_size}, Hkv, {d}"
    if v.layout == Layout.VARLEN:
        return f"total, {heads}, {d}"
    return f"B, {heads}, L, {d}" if v.layout == Layout.BHSD else f"B, L, {heads}, {d}"


def params_struct(v: Variant, prefix: str = DEFAULT_PREFIX) -> str:
    """The C typedef of the params struct (shared by the source and the header)."""
    st = symbol(v, prefix) + "_params"
    fs = fields(v)
    width = max(len(f.ctype) for f in fs)
    nwidth = max(len(f.name) for f in fs) + 1
    lines = [f"typedef struct {st} {{"]
    lines += [f"  {f.ctype.ljust(width)} {(f.name + ';').ljust(nwidth)}  // {f.doc}" for f in fs]
    lines.append(f"}} {st};")
    return "\n".join(lines)


def _banner(v: Variant, prefix: str) -> list[str]:
    return [
        f"Generated by attngen {__version__} for variant {v.name}, target cpu. Do not edit: regenerate.",
        f"dtype {v.dtype.value} (fp32 accumulation), D={v.head_dim}, Dv={v.value_head_dim}, H={v.heads}, Hkv={v.kv_heads}, "
        f"layout {v.layout.value}, {v.kind.value} attention, scale {v.effective_scale!r}",
        f"int {symbol(v, prefix)}_launch(const {symbol(v, prefix)}_params* p): 0 ok, 1 invalid sizes or a null",
        "pointer, 2 out of memory. Every q/k/v/o row's last dimension is contiguous; strides are in elements.",
        "Build: c++ -std=c++17 -O3 -march=native -fno-math-errno -fopenmp (without -fopenmp: one thread).",
    ]


def render_header(v: Variant, prefix: str = DEFAULT_PREFIX) -> str:
    """A C header (C99/C++) declaring the params struct and the launcher, for a C++ engine."""
    name = symbol(v, prefix)
    guard = f"{name}_H"
    lines = [
        *("// " + ln for ln in _banner(v, prefix)),
        f"#ifndef {guard}",
        f"#define {guard}",
        "",
        "#include <stdint.h>",
        "",
        f"#define {name}_HEADS {v.heads}",
        f"#define {name}_KV_HEADS {v.kv_heads}",
        f"#define {name}_HEAD_DIM {v.head_dim}",
        f"#define {name}_VALUE_HEAD_DIM {v.value_head_dim}",
        *([f"#define {name}_PAGE_SIZE {v.page_size}"] if v.page_size is not None else []),
        "",
        "#ifdef __cplusplus",
        'extern "C" {',
        "#endif",
        "",
        params_struct(v, prefix),
        "",
        f"int {name}_launch(const {name}_params* params);",
        "",
        "#ifdef __cplusplus",
        '}  // extern "C"',
        "#endif",
        "",
        f"#endif  // {guard}",
    ]
    return "\n".join(lines) + "\n"


_CONVERT = {DType.FP16: "ag_h2f", DType.BF16: "ag_bf2f", DType.FP32: "", DType.I32: "(int)", DType.U8: "(int)"}
_LOAD = {DType.FP32: ("x", "x"), DType.FP16: ("ag_h2f(x)", "ag_f2h(x)"), DType.BF16: ("ag_bf2f(x)", "ag_f2bf(x)")}


def _norms(v: Variant) -> list[tuple[str, dict]]:
    out = []
    for n in v.norms:
        width = v.value_head_dim if n.target == NormTarget.O else v.head_dim
        if n.scope == NormScope.TOKEN:
            width = v.heads * v.head_dim
        out.append((n.target.value, dict(kind=n.kind.value, width=width, eps=float_literal(n.eps), affine=n.affine,
                                         layernorm=n.kind == NormKind.LAYERNORM)))
    return out


@functools.cache
def _environment() -> jinja2.Environment:
    return jinja2.Environment(loader=jinja2.FileSystemLoader(str(cpu_template_dir())), undefined=jinja2.StrictUndefined,
                              keep_trailing_newline=True, autoescape=False)


def render(v: Variant, prefix: str = DEFAULT_PREFIX) -> str:
    """The complete `.cpp` for one variant: helpers, the kernel, and the extern "C" launcher."""
    bad = unsupported(v)
    if bad:
        raise ValueError(f"variant {v.name}: the cpu target cannot run it: {bad}")
    name = symbol(v, prefix)
    if v.quantized:  # its own kernel, the numerics order of docs/QUANT.md (attngen.cpu.render_quant)
        from attngen.cpu import render_quant

        return _environment().get_template("quant.cpp.j2").render(
            header="\n".join("// " + ln for ln in _banner(v, prefix)) + "\n//\n" + "\n".join(
                "//   " + ln if ln else "//" for ln in _spec_lines(v)),
            params_struct=params_struct(v, prefix), struct=f"{name}_params", launch=f"{name}_launch", ns=f"{name}_impl",
            **render_quant.context(v))
    consts = {SizeSym.H: v.heads, SizeSym.HKV: v.kv_heads, SizeSym.D: v.head_dim, SizeSym.DV: v.value_head_dim}
    decls = {d.name: d for d in v.runtime_inputs()}
    elem = ElementEmitter(consts, fast_math=False, dialect=CPU)
    vis = v.visibility()  # the mask, and a paged cache's bound kv < cache_lens[b]
    classify_lines, classify_result = IntervalEmitter(consts, decls).classify(vis)
    name = symbol(v, prefix)
    cu = v.cu_seqlens_names or ("", "")
    qn = v.norm(NormTarget.Q)
    load, store = _LOAD[v.dtype]
    ctx = dict(
        header="\n".join("// " + ln for ln in _banner(v, prefix)) + "\n//\n" + "\n".join(
            "//   " + ln if ln else "//" for ln in _spec_lines(v)),
        params_struct=params_struct(v, prefix),
        struct=f"{name}_params",
        launch=f"{name}_launch",
        ns=f"{name}_impl",
        elem_ctype=tensor_ctype(v.dtype, CPU),
        load_elem=load,
        store_elem=store,
        D=v.head_dim,
        DV=v.value_head_dim,
        DVP=-(-v.value_head_dim // VECTOR) * VECTOR,
        # fp32 keys and values are read where they lie (no conversion, no k norm, no padding).
        kv_in_place=v.dtype == DType.FP32 and v.norm(NormTarget.K) is None and v.value_head_dim % VECTOR == 0,
        # bf16 keys (without a k norm) stay bf16 for Q K^T where the CPU has AVX512-BF16.
        bf16_keys=v.dtype == DType.BF16 and v.norm(NormTarget.K) is None,
        H=v.heads,
        HKV=v.kv_heads,
        block_m=MASKED_BLOCK_M if vis != TRUE else BLOCK_M,
        block_n=MASKED_BLOCK_N if vis != TRUE else BLOCK_N,
        scale=float_literal(v.effective_scale),
        paged=v.page_size is not None,
        page_size=v.page_size or 0,
        int_unknown=INT_UNKNOWN,
        tensors=[dict(name=d.name, dims=list(range(len(d.shape))), value_ctype="float" if d.dtype.is_float else "int",
                      convert=_CONVERT[d.dtype]) for d in v.runtime_inputs()],
        mask_text=print_expr(vis).replace("\n", " "),
        mask_code=elem.emit(vis),
        has_mask=vis != TRUE,
        has_score=bool(v.scores),
        score_codes=[elem.emit(s) for s in v.scores],
        score_texts=[print_expr(s).replace("\n", " ") for s in v.scores],
        classify_lines=classify_lines,
        classify_result=classify_result,
        norms=_norms(v),
        q_norm=qn is not None,
        q_norm_token=qn is not None and qn.scope == NormScope.TOKEN,
        k_norm=v.norm(NormTarget.K) is not None,
        o_norm=v.norm(NormTarget.O) is not None,
        sink=v.sink is not None,
        sink_tensor=v.sink or "",
        residual=v.residual,
        nan_check=v.nan_check,
        lse=v.lse,
        varlen=v.layout == Layout.VARLEN,
        cu_q=names.input_field(cu[0]),
        cu_q_s0=names.input_stride_field(cu[0], 0),
        cu_k=names.input_field(cu[1]),
        cu_k_s0=names.input_stride_field(cu[1], 0),
    )
    return _environment().get_template("attention.cpp.j2").render(**ctx)


def _spec_lines(v: Variant) -> list[str]:
    from attngen.lang.printer import print_program
    from attngen.ir.nodes import Program

    return print_program(Program((v,))).rstrip("\n").splitlines()


__all__ = ["render", "render_header", "fields", "params_struct", "symbol", "unsupported", "Field", "BLOCK_M", "BLOCK_N",
           "MASKED_BLOCK_M", "MASKED_BLOCK_N"]
