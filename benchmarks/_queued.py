"""Timing shared by the benchmarks that queue launches (decode, varlen, backward, training blocks): the GPU is held
busy by a spin kernel while every timed launch is queued behind it, so CUDA events measure
back-to-back GPU time, not Python launch overhead."""

from __future__ import annotations

import statistics


def queued_time(fn, sets, iters: int, repeats: int = 5) -> tuple[float, float]:
    """(median, min) microseconds per call over `repeats` rounds of `iters` queued calls of
    `fn(*sets[i % len(sets)])` (rotating input sets)."""
    import torch

    for s in sets[:2]:
        fn(*s)
    torch.cuda.synchronize()
    out = []
    for _ in range(repeats):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(20_000_000)  # ~10 ms of spin: the CPU queues every launch behind it
        e0.record()
        for i in range(iters):
            fn(*sets[i % len(sets)])
        e1.record()
        torch.cuda.synchronize()
        out.append(e0.elapsed_time(e1) * 1000.0 / iters)
    return statistics.median(out), min(out)


def queued_ms(fn, iters: int, repeats: int = 5) -> float:
    """Median milliseconds per call of `fn()` over `repeats` rounds of `iters` queued calls."""
    return queued_time(fn, [(), ()], iters, repeats)[0] / 1000.0
