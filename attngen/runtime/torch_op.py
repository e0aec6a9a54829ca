"""attngen variants as PyTorch operators (`attngen.torch`; needs the `attngen[torch]` extra).

    op = attngen.torch.register("examples/seed_padded_fp32.attn")   # torch.ops.attngen.seed_padded_fp32
    o = op(q, k, v, q_lens, kv_lens)                                   # runtime inputs in ABI order
    attn = attngen.torch.Attention("examples/seed_padded_fp32.attn")  # an nn.Module
    o = attn(q, k, v, q_lens=q_lens, kv_lens=kv_lens)

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

Autograd: no backward yet. An input that requires grad raises ValueError at the call (before any
device work through `Attention`/the callable; at the op's autograd setup for direct
`torch.ops.attngen.*` calls): the gradient is never silently dropped.
"""

from __future__ import annotations

import hashlib
import threading
from typing import Any

import torch

from attngen.ir import abi
from attngen.runtime import kernel as runtime
from attngen.ir.nodes import DType, Layout, Variant

_LOCK = threading.Lock()
_OPS: dict[tuple[Variant, str], "AttnOp"] = {}
_NAMES: dict[str, tuple[Variant, str]] = {}

_TORCH_DTYPES = {DType.FP32: torch.float32, DType.FP16: torch.float16, DType.BF16: torch.bfloat16}


def _grad_error(name: str, which: list[str]) -> ValueError:
    return ValueError(
        f"attngen::{name}: {', '.join(which)} require{'s' if len(which) == 1 else ''} grad, but attngen has no backward "
        f"kernels yet; pass tensors that do not require grad (detach() them, or call under torch.no_grad())")


def _op_name(v: Variant, arch: str) -> str:
    """A name unique to (variant, arch): the variant's own where it is free, else with a hash."""
    base = v.name if v.name.isidentifier() else "v_" + "".join(c if c.isalnum() else "_" for c in v.name)
    taken = _NAMES.get(base)
    if taken is None or taken == (v, arch):
        return base
    return f"{base}_{hashlib.sha256(repr((v, arch)).encode()).hexdigest()[:10]}"


class AttnOp:
    """One variant registered as `torch.ops.attngen.<name>`; call it like the op:
    `op(q, k, v, *runtime_inputs, check_inputs=True)` (runtime inputs in ABI order, `input_names`).
    Returns o, or (o, lse) when the spec asks for the LSE."""

    def __init__(self, v: Variant, arch: str | None) -> None:
        self.variant = v
        self.arch = arch
        self.input_names = tuple(d.name for d in v.runtime_inputs())
        self.name = _op_name(v, arch or "")
        self._kernel: runtime.Kernel | None = None
        ins = "".join(f", Tensor {n}" for n in self.input_names)
        ret = "(Tensor, Tensor)" if v.lse else "Tensor"
        schema = f"(Tensor q, Tensor k, Tensor v{ins}, bool check_inputs=True) -> {ret}"
        qualname = f"attngen::{self.name}"
        self.op_def = torch.library.custom_op(qualname, self._impl, mutates_args=(), schema=schema)
        self.op_def.register_fake(self._fake)
        self.op_def.register_autograd(self._no_backward, setup_context=self._refuse_grad)
        self.op = getattr(torch.ops.attngen, self.name).default

    # the real implementation: the compiled kernel, errors deferred under capture
    def kernel(self) -> runtime.Kernel:
        if self._kernel is None:
            self._kernel = runtime.compile(self.variant, arch=self.arch)
        return self._kernel

    def _impl(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *rest: Any) -> Any:
        *arrays, check_inputs = rest if rest and isinstance(rest[-1], bool) else (*rest, True)
        kern = self.kernel()
        inputs = dict(zip(self.input_names, arrays))
        # No host sync inside the op: nan_check is always deferred; input checks are read back at
        # the call except under CUDA-graph capture (where a sync is not allowed).
        defer = not (check_inputs and kern.plan.problem.sorted_inputs and not torch.cuda.is_current_stream_capturing())
        return kern._run(q, k, v, None, None, None, check_inputs, inputs, defer)

    def _fake(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *rest: Any) -> Any:
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
        if var.lse:
            return o, q.new_empty(abi.lse_shape(var, B, Lq), dtype=torch.float32)
        return o

    def _refuse_grad(self, ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        which = [n for n, x in zip(("q", "k", "v", *self.input_names), inputs)
                 if isinstance(x, torch.Tensor) and x.requires_grad]
        raise _grad_error(self.name, which or ["an input"])

    def _no_backward(self, ctx: Any, *grads: Any) -> Any:  # pragma: no cover - setup_context refuses first
        raise _grad_error(self.name, ["an input"])

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *inputs: torch.Tensor,
                 check_inputs: bool = True) -> Any:
        if torch.is_grad_enabled():
            which = [n for n, x in zip(("q", "k", "v", *self.input_names), (q, k, v, *inputs)) if x.requires_grad]
            if which:
                raise _grad_error(self.name, which)
        return self.op(q, k, v, *inputs, check_inputs=check_inputs)


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
            _NAMES[op.name] = key
        return op


class Attention(torch.nn.Module):
    """A module around one registered variant: `forward(q, k, v, **runtime_inputs)`."""

    def __init__(self, spec: Any, variant: str | None = None, *, arch: str | None = None, check_inputs: bool = True) -> None:
        super().__init__()
        self.op = register(spec, variant, arch=arch)
        self.check_inputs = check_inputs

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **inputs: torch.Tensor) -> Any:
        names = self.op.input_names
        if sorted(inputs) != sorted(names):
            missing = [n for n in names if n not in inputs]
            extra = sorted(n for n in inputs if n not in names)
            raise ValueError(f"runtime inputs: expected {', '.join(names) or 'none'}; got"
                             + (f" missing {', '.join(missing)}" if missing else "")
                             + (f" unexpected {', '.join(extra)}" if extra else ""))
        return self.op(q, k, v, *(inputs[n] for n in names), check_inputs=self.check_inputs)


def raise_pending(stream: Any = None) -> None:
    """Raises an error a deferred op call left on the device (nan_check, or an input check made
    under CUDA-graph capture); synchronises `stream` (default: torch's current stream)."""
    if stream is None and torch.cuda.is_available():
        stream = torch.cuda.current_stream().cuda_stream
    runtime.raise_pending(stream)


__all__ = ["register", "Attention", "AttnOp", "raise_pending"]
