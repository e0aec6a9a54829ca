"""Validated IR → the CPU backward pass as one self-contained C++17 source (stage: render).

The same IR, tile classification, expression emitters and score derivative
(`attngen.analysis.derivative`) as the CUDA backward (`attngen.cuda.render_bwd`); the kernel
around them is `backends/cpu/backward.cpp.j2`, FlashAttention-2's backward on the CPU (see its
header). Same variant, same bytes.

The C ABI: `{prefix}_{variant}_cpu_bwd_launch(const {prefix}_{variant}_cpu_bwd_params*)` returns 0
on success, 1 for invalid sizes or a missing pointer, 2 when memory cannot be allocated. The
params struct is plain C, written once here for the source, the header comment and the ctypes
mirror the runtime builds.
"""

from __future__ import annotations

from attngen import __version__
from attngen.analysis import derivative
from attngen.cpu.render import DEFAULT_PREFIX, Field, _CONVERT, _LOAD, _environment, _layout_text, _norms, _spec_lines, symbol
from attngen.cuda.emit import CPU, INT_UNKNOWN, ElementEmitter, IntervalEmitter, float_literal, tensor_ctype
from attngen.ir import names
from attngen.ir.nodes import TRUE, Layout, NormKind, NormScope, NormTarget, SizeSym, Variant, norm_bias_name, norm_weight_name
from attngen.plan import bwd as plan_bwd
from attngen.lang.printer import print_expr

# Tiles of the three passes: query rows x keys. Square and small: a masked tile is skipped or
# masked whole, and a thread's tiles (about 300 KiB at D128) stay in its L2.
BLOCK_M, BLOCK_N = 64, 64


def bwd_symbol(v: Variant, prefix: str = DEFAULT_PREFIX) -> str:
    """`{prefix}_{variant}_cpu_bwd`: the stem of the backward's exported names."""
    return symbol(v, prefix) + "_bwd"


def unsupported(v: Variant) -> str | None:
    """Why the CPU backward cannot differentiate `v`, or None: the CUDA backward's refusals
    (`plan.bwd.unsupported`, the same messages), then the CPU forward's."""
    from attngen.cpu import render as render_cpu

    bad = plan_bwd.unsupported(v)
    if bad:
        return "; ".join(d.message for d in bad)
    return render_cpu.unsupported(v)


def fields(v: Variant) -> tuple[Field, ...]:
    """The backward params struct's fields, in order (also the ctypes Structure the runtime builds)."""
    lse_doc = ("[H, total_q], head stride lse_sh" if v.layout == Layout.VARLEN else "[B, H, Lq], contiguous")
    f = [
        Field("const void*", "q", f"query [{_layout_text(v, 'q')}] ({v.dtype.value}; the hidden state x with a token-scope q norm)"),
        Field("const void*", "k", f"keys [{_layout_text(v, 'k')}] ({v.dtype.value})"),
        Field("const void*", "v", f"values [{_layout_text(v, 'v')}] ({v.dtype.value})"),
        Field("const void*", "o", f"the forward's output [{_layout_text(v, 'o')}] ({v.dtype.value}; with `norm o`, O' before the "
                                  "norm and the residual)"),
        Field("const void*", "dO", f"the gradient at the output, in o's layout ({v.dtype.value})"),
        Field("const float*", "lse", f"the forward's log-sum-exp {lse_doc}"),
        Field("const float*", "dlse", "a gradient at the LSE, in its shape (may be null)"),
        Field("void*", "dq", f"out: dL/dq in q's layout ({v.dtype.value})"),
        Field("void*", "dk", f"out: dL/dk in k's layout ({v.dtype.value})"),
        Field("void*", "dv", f"out: dL/dv in v's layout ({v.dtype.value})"),
        Field("int", "B", "batch (varlen: sequences)"),
        Field("int", "Lq", "query length (varlen: total_q)"),
        Field("int", "Lk", "key length (varlen: total_k)"),
        Field("int", "q_offset", "global position of query row 0 (0 for a whole sequence)"),
        Field("int", "kv_offset", "global position of key row 0 (0 for a whole sequence)"),
        Field("int", "Lq_total", "global query length the mask sees (q_offset + Lq for a whole sequence)"),
        Field("int", "Lk_total", "global key length the mask sees (kv_offset + Lk for a whole sequence)"),
        Field("int", "num_threads", "OpenMP threads (0: the OpenMP default; ignored in a build without OpenMP)"),
        Field("int", "two_pass", "1: dQ in a pass of its own even where the fused pass would run (0: choose by the threads)"),
    ]
    for t in ("q", "k", "v", "o", "dO", "dq", "dk", "dv"):
        for s, what in (("sb", "batch"), ("sh", "head"), ("ss", "sequence")):
            f.append(Field("long long", f"{t}_{s}", f"{t} {what} stride, elements"))
    if v.layout == Layout.VARLEN:
        f.append(Field("long long", "lse_sh", "lse (and dlse) head stride, elements (total_q for a contiguous [H, total_q])"))
    for d in v.runtime_inputs():
        f.append(Field(f"const {tensor_ctype(d.dtype, CPU)}*", names.input_field(d.name), f"runtime input {d.name}: {d.dtype.value}"))
        for i in range(len(d.shape)):
            f.append(Field("int", names.input_size_field(d.name, i), f"{d.name} size of dim {i}"))
        for i in range(len(d.shape)):
            f.append(Field("long long", names.input_stride_field(d.name, i), f"{d.name} stride of dim {i}, elements"))
    for t in (*derivative.learnable_tensors(v.scores), *plan_bwd.norm_params(v)):
        f.append(Field("float*", f"grad_{t}", f"out: dL/d{t}, fp32 dense in its shape, added into (zero it first; may be null)"))
    return tuple(f)


def params_struct(v: Variant, prefix: str = DEFAULT_PREFIX) -> str:
    """The C typedef of the backward params struct."""
    st = bwd_symbol(v, prefix) + "_params"
    fs = fields(v)
    width = max(len(f.ctype) for f in fs)
    nwidth = max(len(f.name) for f in fs) + 1
    lines = [f"typedef struct {st} {{"]
    lines += [f"  {f.ctype.ljust(width)} {(f.name + ';').ljust(nwidth)}  // {f.doc}" for f in fs]
    lines.append(f"}} {st};")
    return "\n".join(lines)


def _banner(v: Variant, prefix: str) -> list[str]:
    name = bwd_symbol(v, prefix)
    return [
        f"Generated by attngen {__version__} for variant {v.name}, target cpu, backward pass. Do not edit: regenerate.",
        f"dtype {v.dtype.value} (fp32 products and accumulation), D={v.head_dim}, Dv={v.value_head_dim}, H={v.heads}, "
        f"Hkv={v.kv_heads}, layout {v.layout.value}, {v.kind.value} attention, scale {v.effective_scale!r}",
        "Gradients of sum(dO * O) (+ sum(dlse * LSE)): dq, dk, dv in the layouts of q, k, v, from the forward's O and LSE",
        "(the forward of this variant with `output lse`); P is recomputed from the LSE.",
        f"int {name}_launch(const {name}_params* p): 0 ok, 1 invalid sizes or a null pointer, 2 out of memory.",
        "Every row's last dimension is contiguous; strides are in elements.",
        "Build: c++ -std=c++17 -O3 -march=native -fno-math-errno -fopenmp (without -fopenmp: one thread).",
    ]


def _param_grads(v: Variant, elem: ElementEmitter) -> list[dict]:
    """Per learnable score input: its dims, and per lookup of it the index and derivative code
    (the CUDA backward's sites, `attngen.cuda.render_bwd._param_grads`)."""
    decls = {d.name: d for d in v.runtime_inputs()}
    out: dict[str, dict] = {}
    for ld, de in derivative.param_derivatives(v.scores):
        t = out.setdefault(ld.tensor, dict(name=ld.tensor, dims=list(range(len(decls[ld.tensor].shape))), sites=[]))
        t["sites"].append(dict(text=print_expr(de).replace("\n", " "), indices=", ".join(elem.emit(i) for i in ld.indices),
                               code=elem.emit(de)))
    return list(out.values())


def _norm_ctx(v: Variant) -> dict:
    """The norms' flags, their functions' constants (`render._norms`), and per weight-gradient slot
    (q, k, o weight and bias) its width and output field (0 and nullptr where there is none)."""
    qn = v.norm(NormTarget.Q)
    widths, grads = [], []
    for t in (NormTarget.Q, NormTarget.K, NormTarget.O):
        n = v.norm(t)
        width = 0 if n is None else v.value_head_dim if t == NormTarget.O else v.heads * v.head_dim if n.scope == NormScope.TOKEN else v.head_dim
        for name, has in ((norm_weight_name(t), n is not None and n.affine),
                          (norm_bias_name(t), n is not None and n.affine and n.kind == NormKind.LAYERNORM)):
            widths.append(str(width if has else 0))
            grads.append(f"p.grad_{name}" if has else "nullptr")
    norms = []
    for t, d in _norms(v):  # the forward's constants, and the C expressions of weight i and bias i
        w, b = norm_weight_name(NormTarget(t)), norm_bias_name(NormTarget(t))
        weight = f"(double)p.{names.input_field(w)}[(long long)i * p.{names.input_stride_field(w, 0)}]" if d["affine"] else "1.0"
        bias = (f"(double)p.{names.input_field(b)}[(long long)i * p.{names.input_stride_field(b, 0)}]"
                if d["affine"] and d["layernorm"] else "")
        norms.append((t, dict(d, weight=weight, bias=bias)))
    return dict(norms=norms, q_norm=qn is not None, q_norm_token=qn is not None and qn.scope == NormScope.TOKEN,
                k_norm=v.norm(NormTarget.K) is not None, o_norm=v.norm(NormTarget.O) is not None, norm_widths=widths, norm_grads=grads)


def render(v: Variant, prefix: str = DEFAULT_PREFIX) -> str:
    """The complete backward `.cpp` for one variant (ValueError naming the construct it refuses)."""
    bad = unsupported(v)
    if bad:
        raise ValueError(f"variant {v.name}: the cpu backward cannot differentiate it: {bad.removeprefix('--pass backward: ')}")
    consts = {SizeSym.H: v.heads, SizeSym.HKV: v.kv_heads, SizeSym.D: v.head_dim, SizeSym.DV: v.value_head_dim}
    decls = {d.name: d for d in v.runtime_inputs()}
    elem = ElementEmitter(consts, fast_math=False, dialect=CPU)
    classify_lines, classify_result = IntervalEmitter(consts, decls).classify(v.mask)
    ds = derivative.score_derivative(v.scores)
    name = bwd_symbol(v, prefix)
    cu = v.cu_seqlens_names or ("", "")
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
        H=v.heads,
        HKV=v.kv_heads,
        block_m=BLOCK_M,
        block_n=BLOCK_N,
        scale=float_literal(v.effective_scale),
        int_unknown=INT_UNKNOWN,
        tensors=[dict(name=d.name, dims=list(range(len(d.shape))), value_ctype="float" if d.dtype.is_float else "int",
                      convert=_CONVERT[d.dtype]) for d in v.runtime_inputs()],
        mask_text=print_expr(v.mask).replace("\n", " "),
        mask_code=elem.emit(v.mask),
        has_mask=v.mask != TRUE,
        has_score=bool(v.scores),
        score_codes=[elem.emit(s) for s in v.scores],
        score_texts=[print_expr(s).replace("\n", " ") for s in v.scores],
        dscore_text=print_expr(ds).replace("\n", " "),
        dscore_code=elem.emit(ds),
        param_grads=_param_grads(v, elem),
        classify_lines=classify_lines,
        classify_result=classify_result,
        residual=v.residual,
        **_norm_ctx(v),
        varlen=v.layout == Layout.VARLEN,
        cu_q=names.input_field(cu[0]),
        cu_q_s0=names.input_stride_field(cu[0], 0),
        cu_k=names.input_field(cu[1]),
        cu_k_s0=names.input_stride_field(cu[1], 0),
    )
    return _environment().get_template("backward.cpp.j2").render(**ctx)


__all__ = ["render", "fields", "params_struct", "bwd_symbol", "unsupported", "BLOCK_M", "BLOCK_N"]
