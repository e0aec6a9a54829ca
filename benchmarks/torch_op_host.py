"""Host cost of the torch op's own layers (no GPU needed): what a call costs above the kernel launch.

    python benchmarks/torch_op_host.py [--calls 2000] [--repeats 5] [--profile fwd|train|step]

Runs on CPU tensors with the launch stubbed in this script only: the op's CUDA path (`_cpu_backend`
answers False here) reaches a stand-in kernel whose `_run` allocates O and the LSE as the binder's
`call_outputs` does, and a stand-in `runtime.bwd.backward` that allocates dq, dk, dv. Everything
above them is the product's own code: the callable, input matching, the autograd route
(`_Train` for eager calls, or the registered custom ops `attngen::<name>`, `_fwd` and `_bwd` with
their `register_autograd` and `setup_context`), saving tensors, the gradient plumbing. What the
stand-ins leave out (the binder's packing and the driver launches) `benchmarks/host_bench.py` times
on a GPU, end to end.

Rows, in microseconds of CPU time a call (the best of `--repeats` loops of `--calls` calls;
`--wall` for wall-clock time):
  fwd     inference: a call under torch.no_grad()
  train   a forward whose inputs require grad (the LSE-saving forward and its autograd node)
  step    forward + backward: torch.autograd.grad(op(q, k, v), (q, k, v), dO)
for two routes: `eager` (the default for plain CUDA tensors) and `dispatch` (the custom ops, which
torch.compile, meta and fake tensors take; forced here by turning the eager route off), beside the
floor: a bare torch.autograd.Function around the same stand-ins.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SPEC = "attention host_train { dtype bf16; head_dim 64; heads 16; mask causal }"
SHAPE = (1, 16, 64, 64)  # B, H, L, D: small, so that allocations cost what they cost on a GPU (no memset)


class StubKernel:
    """Stands in for a compiled forward kernel: `_run` allocates the call's outputs, nothing else."""

    class plan:  # noqa: N801  (what `AttnOp._launch` reads)
        class problem:  # noqa: N801
            sorted_inputs = ()

    def __init__(self, variant) -> None:
        self.variant = variant

    def _run(self, q, k, v, out, lse, stream, check_inputs, inputs, defer, positions=None):
        import torch

        o = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        if self.variant.lse:
            return o, torch.empty(q.shape[:3], dtype=torch.float32, device=q.device)
        return o


def stub_backward(kernel, q, k, v, dO, **kw):
    import torch

    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def loop_us(fn, calls: int, repeats: int, clock=time.process_time_ns) -> float:
    """The best of `repeats` loops: microseconds a call. The default clock is this process's CPU
    time, which a busy shared machine inflates far less than wall time (`--wall` switches)."""
    for _ in range(min(calls, 200)):
        fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = clock()
        for _ in range(calls):
            fn()
        best = min(best, (clock() - t0) / calls / 1e3)
    return best


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--profile", choices=("fwd", "train", "step"), default=None,
                    help="cProfile that row on the eager route and print the top functions by own time")
    ap.add_argument("--route", choices=("eager", "dispatch"), default="eager", help="the route --profile runs")
    ap.add_argument("--wall", action="store_true", help="time wall-clock (perf_counter) instead of the process's CPU time")
    args = ap.parse_args()
    clock = time.perf_counter_ns if args.wall else time.process_time_ns

    import torch

    import attngen.torch as at
    from attngen.runtime import bwd as runtime_bwd
    from attngen.runtime import torch_op

    op = at.register(SPEC)
    # The stand-ins (this script only): the CUDA path on CPU tensors, stopping at the launch.
    torch_op._cpu_backend = lambda q: False
    op.kernel = lambda k=StubKernel(op.variant): k
    op.train_kernel = lambda k=StubKernel(op.train_variant): k
    runtime_bwd.backward = stub_backward
    # (a tree without the eager route: every call dispatches, and both columns time that)
    eager = getattr(torch_op, "_eager", lambda q: False)

    q, k, v = (torch.randn(*SHAPE, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    dO = torch.randn(*SHAPE, dtype=torch.bfloat16)

    def fwd():
        with torch.no_grad():
            return op(q, k, v)

    def train():
        return op(q, k, v)

    def step():
        return torch.autograd.grad(op(q, k, v), (q, k, v), dO)

    class Floor(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v):
            o, lse = op.train_kernel()._run(q, k, v, None, None, None, True, {}, True)
            ctx.save_for_backward(q, k, v, o, lse)
            return o

        @staticmethod
        def backward(ctx, do):
            q, k, v, o, lse = ctx.saved_tensors
            return runtime_bwd.backward(None, q, k, v, do, o=o, lse=lse)

    rows = {"fwd": fwd, "train": train, "step": step}
    if args.profile:
        torch_op._eager = eager if args.route == "eager" else (lambda q: False)
        f = rows[args.profile]
        loop_us(f, 200, 1)
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(args.calls):
            f()
        pr.disable()
        pstats.Stats(pr).sort_stats("tottime").print_stats(25)
        return 0

    print(f"torch {torch.__version__}; {SPEC}; q, k, v {SHAPE} bf16 on CPU, launch stubbed; "
          f"best of {args.repeats} x {args.calls} calls, {'wall' if args.wall else 'CPU'} us a call")
    print(f"{'row':6s} {'eager':>8s} {'dispatch':>9s} {'floor':>8s}")
    floors = {"fwd": None, "train": lambda: Floor.apply(q, k, v),
              "step": lambda: torch.autograd.grad(Floor.apply(q, k, v), (q, k, v), dO)}
    for name, f in rows.items():
        got = {}
        for route in ("eager", "dispatch"):
            torch_op._eager = eager if route == "eager" else (lambda q: False)
            got[route] = loop_us(f, args.calls, args.repeats, clock)
        torch_op._eager = eager
        fl = floors[name]
        if fl is None:
            with torch.no_grad():
                floor = loop_us(lambda: op.kernel()._run(q, k, v, None, None, None, True, {}, True), args.calls, args.repeats, clock)
        else:
            floor = loop_us(fl, args.calls, args.repeats, clock)
        print(f"{name:6s} {got['eager']:8.1f} {got['dispatch']:9.1f} {floor:8.1f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
