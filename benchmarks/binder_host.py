"""Host cost of the binder's call paths with only the CUDA driver stubbed (no GPU needed).

    python benchmarks/binder_host.py [--calls 2000] [--repeats 5] [--profile decode|op_decode|step]

Where `benchmarks/torch_op_host.py` stops at the kernel's `_run`, this script runs everything down
to `cuLaunchKernel`: the product's `Kernel`, `DecodeKernel`, `Dispatch` and backward kernels are
built from the real plans (rendered for sm_90a, never compiled), with stand-in function handles,
and the binder, the decode family, the backward and the torch op run on CPU tensors as they run on
CUDA tensors. The stand-ins (this script only): the driver (a launch, the capture query, the TMA
encode and the memset return success at once), `view` taking a CPU tensor as a cuda:0 one, torch's
current stream 0, the SM count, the status words and decode counters as fixed addresses. What a
stand-in leaves out is the driver's own time and the CUDA caching allocator's (CPU `torch.empty`
stands for it); `benchmarks/host_bench.py` times the whole on a GPU.

Rows, in microseconds of CPU time a call (the best of `--repeats` loops of `--calls` calls):
  decode     a decode step (bf16 D128 H32/8, Lq 1, B1 Lk 8k: the spec of decode_bench.py) through
             the `Dispatch` `attngen.compile` returns
  op_decode  the same step through the torch op under torch.no_grad()
  step       forward + backward through the torch op: torch.autograd.grad(op(q, k, v), (q, k, v), g),
             bf16 D128 H16 causal (B1 L128: small, so that CPU allocations cost what CUDA's do)
  floor      the step's floor: a bare torch.autograd.Function that allocates what the step allocates
             (O, the LSE, dq, dk, dv) and launches nothing: torch's own share of a step
and the stubbed cuLaunchKernel calls each makes.
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
sys.path.insert(0, str(Path(__file__).resolve().parent))

from decode_bench import D, H, HKV, SPEC  # noqa: E402  (the decode rows' spec)
from torch_op_host import loop_us  # noqa: E402

TRAIN_SPEC = "attention train_d128 { dtype bf16; head_dim 128; heads 16; mask causal }"
DECODE_SHAPE = (1, 8192)  # B, Lk
TRAIN_SHAPE = (1, 16, 128, 128)  # B, H, L, D


class FakeFunction:
    """A loaded entry point as the binder reads it (`cu_function`: `.ptr`)."""

    def __init__(self, ptr: int) -> None:
        self.ptr = ptr


class FakeWords:
    """Device words (status, counters) at a fixed address, as `.data.ptr` and `.size`."""

    class _Data:
        def __init__(self, ptr: int) -> None:
            self.ptr = ptr

    def __init__(self, ptr: int, size: int = 1 << 20) -> None:
        self.data, self.size = self._Data(ptr), size


class FakeDriver:
    """The driver entry points the call paths use, each answering success at once."""

    def __init__(self) -> None:
        self.launches = 0

    def launch_raw(self, *args):
        self.launches += 1
        return 0

    def launch(self, *args):
        self.launches += 1
        return 0

    def capturing(self, stream: int) -> bool:
        return False

    def memset32(self, *args) -> int:
        return 0

    def encode_tmap(self):
        return lambda *args: 0

    def dtoh(self, *args) -> int:
        return 0

    def sync(self, *args) -> int:
        return 0


def install_stubs(arch_name: str = "sm_90a"):
    """Stubs the driver and loading; returns (compile, driver): `compile(spec)` builds what
    `attngen.compile` would return, from the plans, with stand-in entry points."""
    import itertools

    import torch

    from attngen.cuda.render import render_plan, render_with_plan
    from attngen.cuda.render_bwd import render_with_plan as render_bwd
    from attngen.cuda.render_decode import render_decode
    from attngen.plan import decode as plan_decode
    from attngen.plan.bwd import choose_engine
    from attngen.plan.schedule import Arch
    from attngen.runtime import arrays, binder, bwd, decode, kernel, torch_op

    arch = Arch(arch_name)
    addr = itertools.count(0x7F0000000000, 0x1000)
    drv = FakeDriver()
    binder._DRIVER = drv
    arrays._TORCH_STREAM = lambda device: 0
    arrays._SM_COUNTS[0] = 132
    real_view = arrays.view

    def view(x, name):
        if isinstance(x, torch.Tensor) and x.device.type == "cpu":
            # (a CPU tensor stands for a cuda:0 one)
            dt = arrays._TORCH_NAMES.get(str(x.dtype), str(x.dtype))
            return arrays.ArrayView(x, x.data_ptr(), tuple(x.shape), tuple(x.stride()), dt, x.element_size(), 0, True)
        return real_view(x, name)

    for mod in (binder, bwd, decode):
        mod.view = view
    torch_op._cpu_backend = lambda q: False

    def fwd_kernel(v, kp=None, src=""):
        if kp is None:
            src, kp = render_with_plan(v, arch)
        k = kernel.Kernel(v, src, kp, 0.0, "stub", True, None, FakeFunction(next(addr)),
                          tuple(FakeFunction(next(addr)) for _ in kp.preps), device=0)
        k._counters[0] = next(addr)
        if v.nan_check or kp.problem.sorted_inputs:
            k._status = FakeWords(next(addr))
            k._check_fns = tuple(FakeFunction(next(addr)) for _ in kp.problem.sorted_inputs)
        if kp.short is not None:
            k.short = fwd_kernel(v, kp.short, render_plan(v, kp.short))
            k.short_max_lk = kp.short_max_lk
        return k

    def decode_kernel(v):
        src, op = render_decode(v, arch)
        k = decode.DecodeKernel(v, src, op, 0.0, "stub", True, None, tuple(FakeFunction(next(addr)) for _ in op.kernels), device=0)
        k._status = FakeWords(next(addr))
        k._counters[(0, 0)] = FakeWords(next(addr))
        return k

    made: dict = {}
    globals_arch = arch

    def compile(spec, variant=None, *, arch=None, family="auto", **kw):
        v = kernel._resolve(spec, variant)
        key = (v, family)
        if key not in made:
            if family == "decode":
                made[key] = decode_kernel(v)
            elif family == "auto" and plan_decode.decode_unsupported(v, globals_arch) is None:
                d = decode.Dispatch(compile(v, family="forward"), globals_arch)
                d._decode = decode_kernel(v)
                made[key] = d
            else:
                made[key] = fwd_kernel(v)
        return made[key]

    def compile_backward(v, arch_, *, deterministic=False, engine=None):
        engine = choose_engine(v, arch, engine)[0]
        key = ("bwd", v, deterministic, engine)
        if key not in made:
            src, bp = render_bwd(v, arch, deterministic=deterministic, engine=engine)
            made[key] = bwd.BackwardKernels(v, src, bp, {k.func: FakeFunction(next(addr)) for k in bp.kernels},
                                            input_names=tuple(d.name for d in v.runtime_inputs()), device=0)
        return made[key]

    kernel.compile = compile
    bwd.compile_backward = compile_backward
    return compile, drv


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--arch", default="sm_90a")
    ap.add_argument("--profile", choices=("decode", "op_decode", "step", "floor"), default=None,
                    help="cProfile that row and print the top functions by own time")
    args = ap.parse_args()

    import torch

    import attngen.torch as at

    compile, drv = install_stubs(args.arch)
    B, Lk = DECODE_SHAPE
    kern = compile(SPEC % "")
    dop = at.register(SPEC % "")
    q1 = torch.randn(B, H, 1, D, dtype=torch.bfloat16)
    kc, vc = (torch.randn(B, HKV, Lk, D, dtype=torch.bfloat16) for _ in range(2))
    top = at.register(TRAIN_SPEC)
    q, k, v = (torch.randn(*TRAIN_SHAPE, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    g = torch.randn(*TRAIN_SHAPE, dtype=torch.bfloat16)

    def decode_step():
        return kern(q1, kc, vc)

    def op_decode():
        with torch.no_grad():
            return dop(q1, kc, vc)

    def step():
        return torch.autograd.grad(top(q, k, v), (q, k, v), g)

    class Floor(torch.autograd.Function):  # torch's own share of a step: the same allocations, nothing else
        @staticmethod
        def forward(ctx, q, k, v):
            o, lse = torch.empty_like(q), torch.empty(q.shape[:3], dtype=torch.float32)
            ctx.save_for_backward(q, k, v, o, lse)
            return o

        @staticmethod
        def backward(ctx, do):
            q, k, v, o, lse = ctx.saved_tensors
            return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)

    def floor():
        return torch.autograd.grad(Floor.apply(q, k, v), (q, k, v), g)

    rows = {"decode": decode_step, "op_decode": op_decode, "step": step, "floor": floor}
    if args.profile:
        f = rows[args.profile]
        loop_us(f, 200, 1)
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(args.calls):
            f()
        pr.disable()
        pstats.Stats(pr).sort_stats("tottime").print_stats(30)
        return 0
    print(f"torch {torch.__version__}; driver stubbed, plans for {args.arch}; decode B{B} Lk{Lk} H{H}/{HKV} D{D}, "
          f"train {TRAIN_SHAPE} causal; best of {args.repeats} x {args.calls} calls, CPU us a call")
    for name, f in rows.items():
        n0 = drv.launches
        f()
        n = drv.launches - n0
        print(f"{name:10s} {loop_us(f, args.calls, args.repeats):8.1f} us   {n} launches", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
