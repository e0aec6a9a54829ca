"""`attngen fuzz`'s hypothesis driver: examples in chunks (so --seconds can stop between them),
shrinking, the minimal failure and its example."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from attngen.check.fuzz_report import Progress, report_first_failure


def drive(test_body: Callable[[Any], None], strategy: Any, *, max_examples: int, seconds: float | None, seed: int,
           progress: Progress, first_failure_dir: str | None = None) -> tuple[int, BaseException | None, Any]:
    """Run `test_body(example)` under hypothesis in chunks until max_examples or the time budget.
    Returns (examples run, the exception of the minimal failure or None, that example).

    The first failure is reported at once, before hypothesis shrinks it (on stderr, and as
    FIRST_FAILURE.txt in `first_failure_dir`): shrinking recompiles kernels and can outlast a
    time-limited run, which must still leave evidence behind."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hseed

    state = {"n": 0, "last_fail": None}
    t0 = time.monotonic()
    chunk = 25 if seconds else max_examples
    done = 0
    i = 0
    while done < max_examples and (seconds is None or time.monotonic() - t0 < seconds):
        want = min(chunk, max_examples - done)
        before = state["n"]

        @hseed(seed + i)
        @settings(max_examples=want, deadline=None, database=None, derandomize=False, report_multiple_bugs=False,
                  phases=(Phase.explicit, Phase.generate, Phase.shrink), print_blob=False,
                  suppress_health_check=list(HealthCheck))
        @given(strategy)
        def run(example):
            state["n"] += 1
            try:
                test_body(example)
            except Exception as e:
                if type(e).__module__.startswith("hypothesis"):
                    raise  # hypothesis' own control flow (an assumption, an overrun), not a failure
                if state["last_fail"] is None:
                    report_first_failure(e, first_failure_dir)
                state["last_fail"] = example
                progress.step(failed=True)
                raise
            progress.step()

        try:
            run()
        except KeyboardInterrupt:
            raise
        except BaseException as e:  # the minimal failing example's exception, after shrinking
            return state["n"], e, state["last_fail"]
        done += state["n"] - before
        i += 1
        if state["n"] == before:
            break  # the strategy is exhausted
    return state["n"], None, None
