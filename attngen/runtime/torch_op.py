"""attngen variants as PyTorch operators (`attngen.torch`; needs the `attngen[torch]` extra).

    op = attngen.torch.register("examples/seed_padded_fp32.attn")   # torch.ops.attngen.seed_padded_fp32
    o = op(q, k, v, q_lens=q_lens, kv_lens=kv_lens)                   # runtime inputs by name
    attn = attngen.torch.Attention("examples/seed_padded_fp32.attn")  # an nn.Module
    o = attn(q, k, v, q_lens=q_lens, kv_lens=kv_lens)

The callable and the module take runtime inputs by keyword only (`attngen.runtime.inputs`): two
inputs of one shape and dtype (`q_lens`, `kv_lens`) cannot swap unnoticed. The registered op
itself, `torch.ops.attngen.<name>`, follows its schema (runtime inputs after v in ABI order,
`input_names`; the dispatcher also accepts them by their schema names).

Each variant registers once as `torch.library.custom_op("attngen::<name>")` with a fake (meta)
implementation computed from the plan, so `torch.compile(fullgraph=True)` traces it without a graph
break and `torch.library.opcheck` passes. The op never synchronises the host:

- `nan_check`: the kernel sets a device flag; the error (NaNCheckError) surfaces at the next
  `attngen.torch.raise_pending()` (or `attngen.runtime.kernel.raise_pending()`), or at the next eager
  call of the same kernel through `attngen.compile(...)(...)`, which reads the flag.
- input checks (`sorted` inputs; on by default, `check_inputs=False` opts out): outside CUDA-graph
  capture the op reads the check's result back and raises InputCheckError (a ValueError) at the
  call, which syncs the stream for variants that have sorted inputs; under capture the check kernel
  is captured too and its error surfaces like nan_check's, at `raise_pending()`.

Eager calls skip the dispatcher: the callable and `Attention` on plain CUDA tensors (outside
torch.compile and torch.jit tracing, functorch transforms and torch function or dispatch modes)
run the same kernels with the same checks, saved tensors and gradients as the custom ops, without
their per-call dispatch (`benchmarks/torch_op_host.py` times both routes): an inference call
launches the kernel directly, a training call runs `_Train`, a torch.autograd.Function around the
LSE-saving forward and the backward kernels. Meta and fake tensors, tensor subclasses and every
tracer take the registered ops, and `torch.ops.attngen.<name>` always dispatches. An inference
call with few query rows (a decode step against a KV cache) runs the variant's split-KV decode
family where it has one, as `attngen.compile`'s calls do (`route`).

Autograd: every op is trainable (`register_autograd`). Called through `op(...)` or `Attention`
with an input that requires grad, the forward runs `attngen::<name>_fwd` (on the eager route
`_Train`, which launches the same kernels), the same kernel built to also write the LSE (the user
still sees o, or (o, lse) when the spec declares `output lse`), and saves q, k, v, o, the LSE and
the runtime inputs; the backward, `attngen::<name>_bwd`, runs the
backward kernels on torch's current stream with no host sync (workspaces from torch's
allocator, so fwd + bwd can be captured in a CUDA graph). A direct `torch.ops.attngen.<name>`
call is trainable too; when the spec does not declare `output lse` its backward first reruns the
LSE-saving forward (one extra forward), so prefer the callable. Gradients: q, k, v; the score
inputs the backward differentiates (`bias`, `alibi` slopes, `rel_bias` tables, float lookups in
custom scores), the q/k pre-norms' weights and biases, and `sink` logits, each in its input's
dtype when that input requires grad. Other runtime inputs get None (integers; a float input read
only by the mask is piecewise constant: its gradient is zero). A loss that reads the declared LSE
output gets that path too. With `norm o`, the training forward is the variant without the
post-norm and the residual (`runtime.bwd.training_variant`): the op saves its output O' and
applies y = norm(O') w + b (+ x) itself (`apply_o_norm`), and the backward maps dY through the
norm. Constructs the backward kernels refuse (`plan.bwd.unsupported`: a paged cache, which is
inference state, and a sink under the o post-norm) raise ValueError at the forward call when an
input requires grad, never a silently wrong or missing gradient. `deterministic=True` (the callable,
`Attention`) gives a bitwise reproducible dQ. On CPU tensors the forward and the backward are the
CPU backend's (`attngen.cpu.kernel`, `attngen.cpu.backward`; its refusals are
`attngen.cpu.render_bwd.unsupported`, the GPU backward's).
"""

from __future__ import annotations

import dataclasses
import hashlib
import threading
from typing import Any

from attngen.runtime.extras import require_torch

require_torch("attngen.torch")  # a missing extra names its install line, not a bare "No module named 'torch'"

import torch  # noqa: E402

from attngen.ir import abi  # noqa: E402
from attngen.runtime import kernel as runtime
from attngen.ir.nodes import ATTENTION_DTYPES, Layout, NormTarget, Variant, norm_bias_name, norm_weight_name  # noqa: E402
from attngen.runtime.inputs import match_inputs  # noqa: E402
from attngen.runtime import bwd as runtime_bwd
from attngen.runtime.bwd import apply_o_norm, o_norm_inputs, training_variant
from attngen.runtime.decode import DecodeKernel, Dispatch
from attngen.plan.decode import Family

_LOCK = threading.Lock()
_OPS: dict[tuple[Variant, str], "AttnOp"] = {}
_NAMES: dict[str, tuple[Variant, str]] = {}

_TORCH_DTYPES = {d: getattr(torch, d.info.torch) for d in ATTENTION_DTYPES}


def _cpu_backend(q: torch.Tensor) -> bool:
    """Whether a call on `q` runs the CPU backend (CPU tensors) rather than the CUDA kernels."""
    return q.is_cpu


def _cpu_refusal(v: Variant) -> str | None:
    """Why the CPU backward cannot differentiate `v` (None when it can)."""
    from attngen.cpu import render_bwd

    why = render_bwd.unsupported(v)
    return None if why is None else why.removeprefix("--pass backward: ")


def _eager(q: Any) -> bool:
    """Whether a call of the callable may run its kernels without the dispatcher (`_Train`, or
    the kernel directly): a plain CUDA tensor, outside torch.compile and torch.jit tracing,
    functorch transforms and torch function or dispatch modes. Everywhere else (meta and fake
    tensors, tensor subclasses, tracers, the CPU backend) the registered custom ops run, which
    those need (a tracer records them; it would not see a launch)."""
    return (not torch.compiler.is_compiling() and type(q) is torch.Tensor and not q.is_meta and not _cpu_backend(q)
            and not torch._C._len_torch_dispatch_stack() and not torch._C._len_torch_function_stack()
            and torch._C._functorch.peek_interpreter_stack() is None and torch._C._get_tracing_state() is None)


def _forward_call(kern: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, inputs: dict[str, Any], check_inputs: bool) -> Any:
    """A forward kernel's call as the op makes it. No host sync inside the op: nan_check is always
    deferred; input checks are read back at the call except under CUDA-graph capture (where a sync
    is not allowed)."""
    defer = not (check_inputs and kern.plan.problem.sorted_inputs and not torch.cuda.is_current_stream_capturing())
    return kern._run(q, k, v, None, None, None, check_inputs, inputs, defer)


def _decode_call(kern: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, inputs: dict[str, Any], check_inputs: bool) -> Any:
    """A decode kernel's call as the op makes it: its promise check is the paged cache's page check,
    read back at the call (a sync) except under CUDA-graph capture, as the forward's input checks are."""
    check = bool(check_inputs) and kern.variant.page_size is not None
    defer = not (check and not torch.cuda.is_current_stream_capturing())
    return kern._run(q, k, v, None, None, None, (None, None, None, check), inputs, defer)


def route(kern: Any, q: Any) -> Any:
    """The kernel a call of `kern` (what `runtime.compile` returned for the op's variant) runs on q:
    a `Dispatch` sends calls with few query rows (an Lq 1 decode step with a KV cache) to its
    split-KV decode family, as `attngen.compile`'s own calls do (`plan_decode.choose_family`),
    others to its forward kernel; a forward or decode kernel runs itself."""
    if not isinstance(kern, Dispatch):
        return kern
    var = kern.forward.variant
    lq = (q.shape[2] if var.layout == Layout.BHSD else q.shape[1]) if q.dim() == 4 else -1
    return kern.decode if lq >= 1 and kern.family_for(lq) == Family.DECODE else kern.forward


def _op_name(v: Variant, arch: str) -> str:
    """A name unique to (variant, arch): the variant's own where it is free, else with a hash."""
    base = v.name if v.name.isidentifier() else "v_" + "".join(c if c.isalnum() else "_" for c in v.name)
    # Each variant takes three names: <name>, <name>_fwd and <name>_bwd.
    if all(_NAMES.get(n) in (None, (v, arch)) for n in (base, f"{base}_fwd", f"{base}_bwd")):
        return base
    return f"{base}_{hashlib.sha256(repr((v, arch)).encode()).hexdigest()[:10]}"


def grad_inputs(v: Variant) -> tuple[str, ...]:
    """The runtime inputs a call can return gradients for, in ABI order: what the backward kernels
    differentiate (`plan.bwd.learnable`, `plan.bwd.norm_params`) and the `sink` logits (from the
    saved LSE, in torch)."""
    from attngen.plan import bwd as plan_bwd

    names = set(plan_bwd.learnable(v)) | set(plan_bwd.norm_params(v)) | ({v.sink} if v.sink else set())
    return tuple(d.name for d in v.runtime_inputs() if d.name in names)


def backward_refusal(v: Variant) -> str | None:
    """Why the backward kernels cannot differentiate `v` (None when they can)."""
    from attngen.plan import bwd as plan_bwd

    bad = plan_bwd.unsupported(v)
    if not bad:
        return None
    return "; ".join(d.message.removeprefix("--pass backward: ") for d in bad)


def _trailing(rest: tuple[Any, ...], kw: dict[str, Any], n: int, defaults: dict[str, Any]) -> tuple[list[Any], list[Any]]:
    """(the n runtime inputs, the trailing scalars in `defaults`' order) of an op call: the
    dispatcher hands arguments left at their default value over as keywords, or not at all."""
    arrays, tail = list(rest[:n]), list(rest[n:])
    for i, (name, default) in enumerate(defaults.items()):
        if i >= len(tail):
            tail.append(kw.get(name, default))
    return arrays, tail


class AttnOp:
    """One variant registered as `torch.ops.attngen.<name>`; call it as
    `op(q, k, v, check_inputs=True, **runtime_inputs)` (runtime inputs by name, `input_names`).
    Returns o, or (o, lse) when the spec asks for the LSE; differentiable (see the module doc)."""

    def __init__(self, v: Variant, arch: str | None) -> None:
        self.variant = v
        self.arch = arch
        self.input_names = tuple(d.name for d in v.runtime_inputs())
        self.grad_names = grad_inputs(v)
        self.refusal = backward_refusal(v)
        # The forward that saves the LSE for the backward: the variant itself when it declares
        # `output lse`, else the same variant built to write it (the user's outputs unchanged).
        # With `norm o`: the forward without the post-norm and the residual, whose output O' the
        # backward reads; the op applies y = norm(O') (+ x) itself and saves O'.
        self.o_norm = v.norm(NormTarget.O) is not None
        self.train_variant = training_variant(v) if self.o_norm else (v if v.lse else dataclasses.replace(v, lse=True))
        self.train_input_names = tuple(n for n in self.input_names if n not in o_norm_inputs(v))
        self.name = _op_name(v, arch or "")
        self._bhsd = v.layout == Layout.BHSD
        self._kernel: Any = None
        self._train_kernel: Any = None
        self._wrt_cache: dict[tuple[bool, ...], tuple[list[str], list[str], int]] = {}
        self._wrt_names: dict[int, tuple[str, ...]] = {}
        ins = "".join(f", Tensor {n}" for n in self.input_names)
        ret = "(Tensor, Tensor)" if v.lse else "Tensor"
        qualname = self.qualname = f"attngen::{self.name}"
        self.op_def = torch.library.custom_op(
            qualname, self._impl, mutates_args=(), schema=f"(Tensor q, Tensor k, Tensor v{ins}, bool check_inputs=True) -> {ret}")
        self.op_def.register_fake(self._fake)
        self.op_def.register_autograd(self._backward_public, setup_context=self._setup_public)
        self.op = getattr(torch.ops.attngen, self.name).default
        # attngen::<name>_fwd: o and the LSE, always; `deterministic` only rides along to the backward.
        self.fwd_def = torch.library.custom_op(
            f"{qualname}_fwd", self._impl_fwd, mutates_args=(),
            schema=f"(Tensor q, Tensor k, Tensor v{ins}, bool check_inputs=True, bool deterministic=False) -> "
                   + ("(Tensor, Tensor, Tensor)" if self.o_norm else "(Tensor, Tensor)"))
        self.fwd_def.register_fake(self._fake_fwd)
        self.fwd_def.register_autograd(self._backward_fwd, setup_context=self._setup_fwd)
        self.fwd_op = getattr(torch.ops.attngen, f"{self.name}_fwd").default
        # attngen::<name>_bwd: [dq, dk, dv, then the gradient of each input whose bit is set in
        # `wrt` (bit i: grad_names[i]; fp32, the input's shape; the sink's is computed outside)].
        self.bwd_def = torch.library.custom_op(
            f"{qualname}_bwd", self._impl_bwd, mutates_args=(),
            schema=f"(Tensor q, Tensor k, Tensor v, Tensor o, Tensor lse, Tensor dO, Tensor? dlse{ins}, "
                   f"int wrt=0, bool deterministic=False) -> Tensor[]")
        self.bwd_def.register_fake(self._fake_bwd)
        self.bwd_op = getattr(torch.ops.attngen, f"{self.name}_bwd").default

    # ------------------------------------------------------------------------------------------
    # kernels

    def kernel(self) -> Any:
        if self._kernel is None:
            self._kernel = runtime.compile(self.variant, arch=self.arch)
        return self._kernel

    def train_kernel(self) -> runtime.Kernel:
        """The forward family's kernel of `train_variant` (the backward reads its LSE)."""
        if self._train_kernel is None:
            self._train_kernel = runtime.compile(self.train_variant, arch=self.arch, family="forward")
        return self._train_kernel

    @staticmethod
    def _launch(kern: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, arrays: Any, names: tuple[str, ...],
                check_inputs: bool) -> Any:
        inputs = dict(zip(names, arrays))
        kern = route(kern, q)
        if isinstance(kern, DecodeKernel):
            return _decode_call(kern, q, k, v, inputs, check_inputs)
        return _forward_call(kern, q, k, v, inputs, check_inputs)

    # ------------------------------------------------------------------------------------------
    # attngen::<name>

    def _impl(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *rest: Any, **kw: Any) -> Any:
        arrays, (check_inputs,) = _trailing(rest, kw, len(self.input_names), {"check_inputs": True})
        if _cpu_backend(q):  # the CPU backend (attngen.cpu), checks always on
            from attngen.cpu.kernel import compile_cpu

            return compile_cpu(self.variant)(q, k, v, **dict(zip(self.input_names, arrays)))
        return self._launch(self.kernel(), q, k, v, arrays, self.input_names, check_inputs)

    def _fake_outputs(self, q: torch.Tensor, with_lse: bool) -> Any:
        var = self.variant
        if var.layout == Layout.VARLEN:  # packed [total_q, H, D]: the shapes need only the total
            B, Lq = 1, q.shape[0]
        elif q.dim() == 3:  # a flat [B, L, H*D] hidden state (token-scope q norm)
            B, Lq = q.shape[0], q.shape[1]
        elif var.layout == Layout.BHSD:
            B, Lq = q.shape[0], q.shape[2]
        else:
            B, Lq = q.shape[0], q.shape[1]
        o = q.new_empty(abi.o_shape(var, B, Lq), dtype=_TORCH_DTYPES[var.dtype])
        if with_lse:
            return o, q.new_empty(abi.lse_shape(var, B, Lq), dtype=torch.float32)
        return o

    def _fake(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *rest: Any, **kw: Any) -> Any:
        return self._fake_outputs(q, self.variant.lse)

    def _refuse(self, tensors: tuple[Any, ...]) -> None:
        """ValueError when an input requires grad and the backward kernels refuse the variant (on
        CPU tensors: the CPU backward, `attngen.cpu.render_bwd.unsupported`)."""
        refusal, kernels = self.refusal, "backward kernels do"
        # (a quantized variant has no backward on any device: its own refusal says so)
        if isinstance(tensors[0], torch.Tensor) and _cpu_backend(tensors[0]) and not self.variant.quantized:
            refusal, kernels = _cpu_refusal(self.variant), "CPU backward does"
        if refusal is None:
            return
        which = [n for n, x in zip(("q", "k", "v", *self.input_names), tensors) if isinstance(x, torch.Tensor) and x.requires_grad]
        if which:
            raise ValueError(
                f"attngen::{self.name}: {', '.join(which)} require{'s' if len(which) == 1 else ''} grad, but the {kernels} "
                f"not support this variant: {refusal}; pass tensors that do not require grad (detach() "
                f"them, or call under torch.no_grad())")

    def _setup_public(self, ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        self._refuse(inputs)
        n = len(self.input_names)
        q, k, v, arrays = inputs[0], inputs[1], inputs[2], inputs[3:3 + n]
        if self.variant.lse and not self.o_norm:
            o, lse = output
            ctx.save_for_backward(q, k, v, o, lse, *arrays)
        else:  # no LSE (or no O' before the post-norm) to save: the backward reruns the training forward
            ctx.save_for_backward(q, k, v, *arrays)
        ctx.check_inputs = bool(inputs[3 + n]) if len(inputs) > 3 + n else True

    def _backward_public(self, ctx: Any, *grads: Any) -> tuple[Any, ...]:
        n = len(self.input_names)
        if self.variant.lse and not self.o_norm:
            q, k, v, o, lse, *arrays = ctx.saved_tensors
            do, dlse = grads
        else:
            q, k, v, *arrays = ctx.saved_tensors
            with torch.no_grad():
                out = self.fwd_op(q, k, v, *arrays, check_inputs=ctx.check_inputs)
            o, lse = (out[2], out[1]) if self.o_norm else out
            do, dlse = grads[0], (grads[1] if self.variant.lse else None)
        out = self._grads(ctx.needs_input_grad[:3 + n], q, k, v, o, lse, do, dlse, arrays, False)
        return (*out, None)

    # ------------------------------------------------------------------------------------------
    # attngen::<name>_fwd and its backward

    def _impl_fwd(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *rest: Any, **kw: Any) -> Any:
        arrays, (check_inputs, _deterministic) = _trailing(rest, kw, len(self.input_names),
                                                           {"check_inputs": True, "deterministic": False})
        return self._train_forward(q, k, v, arrays, check_inputs)

    def _train_forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, arrays: Any, check_inputs: bool) -> Any:
        """(o, lse), or with `norm o` (y, lse, O'): the training forward's outputs (`_impl_fwd`, `_Train`)."""
        if not self.o_norm:
            o, lse = self._train_launch(q, k, v, arrays, self.input_names, check_inputs)
            return o, lse
        # (o, lse, O'): O' from the forward without the post-norm, y = norm(O') (+ x) here.
        by_name = dict(zip(self.input_names, arrays))
        o_pre, lse = self._train_launch(q, k, v, [by_name[n] for n in self.train_input_names], self.train_input_names, check_inputs)
        w, b = (by_name.get(n) for n in (norm_weight_name(NormTarget.O), norm_bias_name(NormTarget.O)))
        return apply_o_norm(self.variant, o_pre, q, w, b), lse, o_pre

    def _train_launch(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, arrays: Any, names: tuple[str, ...],
                      check_inputs: bool) -> Any:
        """(o, lse) of `train_variant`: on CPU tensors the CPU backend's (checks always on), else the GPU's."""
        if _cpu_backend(q):
            from attngen.cpu.kernel import compile_cpu

            return compile_cpu(self.train_variant)(q, k, v, **dict(zip(names, arrays)))
        return self._launch(self.train_kernel(), q, k, v, arrays, names, check_inputs)

    def _fake_fwd(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *rest: Any, **kw: Any) -> Any:
        o, lse = self._fake_outputs(q, True)
        return (o, lse, torch.empty_like(o)) if self.o_norm else (o, lse)

    def _setup_fwd(self, ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        self._refuse(inputs)
        n = len(self.input_names)
        o, lse = (output[2], output[1]) if self.o_norm else output  # with `norm o` the backward reads O'
        ctx.save_for_backward(inputs[0], inputs[1], inputs[2], o, lse, *inputs[3:3 + n])
        ctx.deterministic = bool(inputs[4 + n]) if len(inputs) > 4 + n else False

    def _backward_fwd(self, ctx: Any, do: Any, dlse: Any, *_o_pre: Any) -> tuple[Any, ...]:
        n = len(self.input_names)
        q, k, v, o, lse, *arrays = ctx.saved_tensors
        # The LSE reaches the user only when the spec declares it; otherwise its gradient is zero.
        out = self._grads(ctx.needs_input_grad[:3 + n], q, k, v, o, lse, do, dlse if self.variant.lse else None,
                          arrays, ctx.deterministic)
        return (*out, None, None)

    def _wrt(self, needs: tuple[bool, ...]) -> tuple[list[str], list[str], int]:
        """(the runtime inputs whose gradient a call returns, those the kernels compute, their `wrt`
        bits) for the inputs' `needs_input_grad`, derived once per distinct `needs`."""
        got = self._wrt_cache.get(needs)
        if got is None:
            want = [nm for i, nm in enumerate(self.input_names) if needs[3 + i] and nm in self.grad_names]
            kernel_wrt = [nm for nm in want if nm != self.variant.sink]
            got = self._wrt_cache[needs] = (want, kernel_wrt, sum(1 << self.grad_names.index(nm) for nm in kernel_wrt))
        return got

    def _grads(self, needs: tuple[bool, ...], q: Any, k: Any, v: Any, o: Any, lse: Any, do: Any, dlse: Any,
               arrays: Any, deterministic: bool, direct: bool = False) -> list[Any]:
        """Gradients of (q, k, v, *runtime inputs), None where not needed or not defined; `direct`
        runs the backward kernels without dispatching `attngen::<name>_bwd` (`_Train`)."""
        if self.refusal is not None and not _cpu_backend(q):  # (setup refuses first; kept for a saved graph replayed later)
            raise ValueError(f"attngen::{self.name}: the backward kernels do not support this variant: {self.refusal}")
        n = len(self.input_names)
        if do is None:
            return [None] * (3 + n)
        want, kernel_wrt, mask = self._wrt(tuple(needs))
        dl = None if dlse is None else dlse.to(torch.float32).contiguous()
        if direct:
            res = self._run_bwd(q, k, v, o, lse, do.contiguous(), dl, arrays, mask, deterministic)
        else:
            res = self.bwd_op(q, k, v, o, lse, do.contiguous(), dl, *arrays, wrt=mask, deterministic=deterministic)
        dq, dk, dv, *pg = res
        by_name = dict(zip(kernel_wrt, pg))
        if self.variant.sink in want:
            by_name[self.variant.sink] = self._sink_grad(q, o, lse, do, dl, arrays[self.input_names.index(self.variant.sink)])
        out: list[Any] = [dq if needs[0] else None, dk if needs[1] else None, dv if needs[2] else None]
        for nm, x in zip(self.input_names, arrays):
            g = by_name.get(nm)
            out.append(None if g is None else g.to(x.dtype))
        return out

    def _sink_grad(self, q: Any, o: Any, lse: Any, do: Any, dlse: Any, sink: Any) -> Any:
        """d loss/d sink[h] = sum over rows of P_sink * (dlse - D): the sink's logit only joins the
        softmax denominator, so O moves by -P_sink * O and the LSE by P_sink (P_sink =
        exp(sink - LSE); D = rowsum(dO * O') with O' the attention output before the residual)."""
        var = self.variant
        oa = o.to(torch.float32)
        if var.residual:
            oa = oa - q.to(torch.float32)
        d = (do.to(torch.float32) * oa).sum(-1)
        if var.layout == Layout.VARLEN:
            d = d.transpose(0, 1)  # [H, total_q], as the LSE
        elif var.layout != Layout.BHSD:
            d = d.transpose(1, 2)  # [B, H, Lq], as the LSE
        heads_dim = 0 if var.layout == Layout.VARLEN else 1
        shape = [1] * lse.dim()
        shape[heads_dim] = -1
        p = torch.exp(sink.to(torch.float32).view(shape) - lse)
        p = torch.where(torch.isfinite(lse), p, torch.zeros_like(p))  # (a row the forward left at -inf)
        g = -d if dlse is None else dlse - d
        return (p * g).sum(dim=tuple(i for i in range(lse.dim()) if i != heads_dim))

    # ------------------------------------------------------------------------------------------
    # attngen::<name>_bwd

    def _impl_bwd(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
                  do: torch.Tensor, dlse: Any, *rest: Any, **kw: Any) -> list[torch.Tensor]:
        arrays, (wrt, deterministic) = _trailing(rest, kw, len(self.input_names), {"wrt": 0, "deterministic": False})
        return self._run_bwd(q, k, v, o, lse, do, dlse, arrays, wrt, deterministic)

    def _run_bwd(self, q: Any, k: Any, v: Any, o: Any, lse: Any, do: Any, dlse: Any, arrays: Any, wrt: int,
                 deterministic: bool) -> list[Any]:
        """[dq, dk, dv, the gradient of each input whose bit is set in `wrt`] from the backward kernels."""
        names = self._wrt_names.get(wrt)
        if names is None:
            names = self._wrt_names[wrt] = tuple(nm for i, nm in enumerate(self.grad_names) if wrt >> i & 1)
        inputs = dict(zip(self.input_names, arrays)) if arrays else {}
        if _cpu_backend(q):  # the CPU backend's training forward: backward() runs the CPU backward for it
            from attngen.cpu.kernel import compile_cpu

            kern = compile_cpu(self.train_variant)
        else:
            kern = self._train_kernel or self.train_kernel()
        res = runtime_bwd.backward(kern, q, k, v, do, o=o, lse=lse, dlse=dlse, deterministic=deterministic,
                                   wrt=names, variant=self.variant, **inputs)
        out = list(res[:3])
        if names:
            out += [res[3][nm] for nm in names]
        return out

    def _fake_bwd(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
                  do: torch.Tensor, dlse: Any, *rest: Any, **kw: Any) -> list[torch.Tensor]:
        arrays, (wrt, _deterministic) = _trailing(rest, kw, len(self.input_names), {"wrt": 0, "deterministic": False})
        inputs = dict(zip(self.input_names, arrays))
        out = [torch.empty(x.shape, dtype=x.dtype, device=x.device) for x in (q, k, v)]
        out += [torch.empty(inputs[nm].shape, dtype=torch.float32, device=q.device)
                for i, nm in enumerate(self.grad_names) if wrt >> i & 1]
        return out

    # ------------------------------------------------------------------------------------------

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *positional: torch.Tensor,
                 check_inputs: bool = True, deterministic: bool = False, **named: torch.Tensor) -> Any:
        """o (or (o, lse)); runtime inputs by name (positional ones are refused: InputNameError, a
        TypeError). With an input that requires grad (and grad mode on), through the LSE-saving
        forward, so that the backward reads the saved LSE."""
        inputs = match_inputs(self.qualname, self.input_names, positional, named) if positional or named or self.input_names else ()
        grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad
                                            or any(x.requires_grad for x in inputs))
        eager = _eager(q)
        if grad and (self.refusal is not None or not eager):  # (an eager call's refusal is `self.refusal`)
            self._refuse((q, k, v, *inputs))
        if eager:
            # Eager CUDA calls skip the dispatcher (the same kernels, checks and saved tensors as
            # the custom ops; torch.compile and the other tracers take the ops below).
            if grad:
                return _Train.apply(self, check_inputs, deterministic, q, k, v, *inputs)
            kern = self._kernel or self.kernel()
            if isinstance(kern, Dispatch) and q.dim() == 4:
                dec = kern.ready_decode(q.shape[2] if self._bhsd else q.shape[1])
                if dec is not None:  # a decode step whose length is planned: `_launch`'s call, without `route`
                    return _decode_call(dec, q, k, v, dict(zip(self.input_names, inputs)) if inputs else {}, check_inputs)
            return self._launch(kern, q, k, v, inputs, self.input_names, check_inputs)
        if grad:
            o, lse = self.fwd_op(q, k, v, *inputs, check_inputs=check_inputs, deterministic=deterministic)[:2]
            return (o, lse) if self.variant.lse else o
        return self.op(q, k, v, *inputs, check_inputs=check_inputs)


class _Train(torch.autograd.Function):
    """An eager training call (`AttnOp.__call__` on CUDA tensors, `_eager`): the training forward
    and the backward kernels as `attngen::<name>_fwd` and its backward run them, minus the
    dispatcher's work per call (custom-op dispatch, default filling, a nested `_bwd` op)."""

    @staticmethod
    def forward(ctx: Any, op: AttnOp, check_inputs: bool, deterministic: bool, q: torch.Tensor, k: torch.Tensor,
                v: torch.Tensor, *arrays: torch.Tensor) -> Any:
        if op.o_norm:
            out = op._train_forward(q, k, v, arrays, check_inputs)
        else:  # (`_train_launch` on CUDA tensors, without its CPU and routing steps: a forward kernel)
            out = _forward_call(op._train_kernel or op.train_kernel(), q, k, v, dict(zip(op.input_names, arrays)) if arrays else {},
                                check_inputs)
        o, lse = out[0], out[1]
        ctx.op, ctx.deterministic = op, deterministic
        # Unused outputs' gradients arrive as None (no zero tensors made); backward fills dO.
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(q, k, v, out[2] if op.o_norm else o, lse, *arrays)
        return (o, lse) if op.variant.lse else o

    @staticmethod
    def backward(ctx: Any, do: Any, dlse: Any = None) -> tuple[Any, ...]:
        op = ctx.op
        q, k, v, o, lse, *arrays = ctx.saved_tensors
        if not op.variant.lse:  # the LSE reaches the user only when the spec declares it
            dlse = None
        if do is None:
            if dlse is None:
                return (None,) * (6 + len(arrays))
            do = torch.zeros_like(o)  # a loss that reads only the LSE (the custom op's dO, materialised)
        grads = op._grads(ctx.needs_input_grad[3:], q, k, v, o, lse, do, dlse, arrays, ctx.deterministic, direct=True)
        return (None, None, None, *grads)


def register(spec: Any, variant: str | None = None, *, arch: str | None = None) -> AttnOp:
    """Registers one variant (a Variant, Program, path or `.attn` text) as `attngen::<name>` and
    returns its callable; registering the same variant again returns the same op. Compiling waits
    for the first real call (the fake implementation needs no GPU)."""
    v = runtime._resolve(spec, variant)
    key = (v, arch or "")
    with _LOCK:
        op = _OPS.get(key)
        if op is None:
            op = AttnOp(v, arch)
            _OPS[key] = op
            for n in (op.name, f"{op.name}_fwd", f"{op.name}_bwd"):
                _NAMES[n] = key
        return op


class Attention(torch.nn.Module):
    """A module around one registered variant: `forward(q, k, v, **runtime_inputs)`; trainable
    (`deterministic=True`: a bitwise reproducible dQ in the backward)."""

    def __init__(self, spec: Any, variant: str | None = None, *, arch: str | None = None, check_inputs: bool = True,
                 deterministic: bool = False) -> None:
        super().__init__()
        self.op = register(spec, variant, arch=arch)
        self.check_inputs = check_inputs
        self.deterministic = deterministic

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **inputs: torch.Tensor) -> Any:
        return self.op(q, k, v, check_inputs=self.check_inputs, deterministic=self.deterministic, **inputs)


def raise_pending(stream: Any = None) -> None:
    """Raises an error a deferred op call left on the device (nan_check, or an input check made
    under CUDA-graph capture); synchronises `stream` (default: torch's current stream)."""
    if stream is None and torch.cuda.is_available():
        stream = torch.cuda.current_stream().cuda_stream
    runtime.raise_pending(stream)


__all__ = ["register", "Attention", "AttnOp", "raise_pending", "route"]
