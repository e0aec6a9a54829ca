"""Runtime inputs of a call, matched by name: the one place that turns a call's keyword
arguments into the ABI's order (stage: argument matching, before binding).

Two runtime inputs often share a shape and dtype (`padding`'s `q_lens` and `kv_lens` are both
i32[B]), so passing them by position would let a swap go unnoticed; every front end (the
Kernel call, the torch op's callable, `attngen.torch.Attention`) takes them by keyword only.
Pure Python (no torch, no CuPy), so it is tested on any machine.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TypeVar

__all__ = ["InputNameError", "match_inputs", "positional_inputs_message"]

T = TypeVar("T")


class InputNameError(TypeError, ValueError):
    """Runtime inputs given by position, missing, or under a name the variant does not declare (a
    TypeError, as Python's own for a wrong call; a ValueError, as every other refused argument)."""


def _example(names: Sequence[str]) -> str:
    return ", ".join(f"{n}={n}" for n in names) if names else "no runtime inputs"


def positional_inputs_message(what: str, names: Sequence[str], n_positional: int) -> str:
    """The message for `n_positional` runtime inputs passed by position to `what`."""
    return (f"{what}: runtime inputs go by name, not by position (got {n_positional} positional after q, k, v); "
            f"call it as (q, k, v, {_example(names)}): two inputs of one shape and dtype would otherwise swap "
            f"without an error")


def match_inputs(what: str, names: Sequence[str], positional: Sequence[object], named: Mapping[str, T]) -> tuple[T, ...]:
    """The runtime inputs `names` (ABI order) from a call's keyword arguments `named`; an
    InputNameError for positional ones, a missing one or an unexpected name."""
    if not positional and len(named) == len(names):
        try:  # every name given, so none unexpected: the common call, without building the messages' lists
            return tuple(named[n] for n in names)
        except KeyError:
            pass
    if positional:
        raise InputNameError(positional_inputs_message(what, names, len(positional)))
    missing = [n for n in names if n not in named]
    extra = sorted(n for n in named if n not in names)
    if missing or extra:
        got = ([f"missing {', '.join(missing)}"] if missing else []) + ([f"unexpected {', '.join(extra)}"] if extra else [])
        raise InputNameError(f"{what}: runtime inputs are {', '.join(names) or 'none'}; {'; '.join(got)} "
                             f"(call it as (q, k, v, {_example(names)}))")
    return tuple(named[n] for n in names)
