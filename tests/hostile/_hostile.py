"""Running one spec through every command under a time and memory budget (shared by the tests)."""

from __future__ import annotations

import contextlib
import io
import re
import time
import tracemalloc
from dataclasses import dataclass
from pathlib import Path

from attngen.tools import cli

# Per command, on a loaded 2-core CI machine. Every hostile spec must end inside these.
TIME_BUDGET_S = 30.0
MEMORY_BUDGET_BYTES = 1 << 30
COMMANDS = ("check", "fmt", "explain", "compile")
LOCATED = re.compile(r"^\S.*?:\d+:\d+: error: ", re.M)


@dataclass
class Result:
    command: str
    rc: int
    out: str
    err: str
    seconds: float
    peak_bytes: int


def run(command: str, path: Path, tmp: Path) -> Result:
    """`attngen COMMAND path` in this process: exit code, output, wall time, peak Python memory."""
    argv = [command, str(path)]
    if command == "compile":
        argv += ["-o", str(tmp / (path.stem + ".cu"))]
    out, err = io.StringIO(), io.StringIO()
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = cli.main(argv)
    finally:
        seconds = time.perf_counter() - t0
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    return Result(command, rc, out.getvalue(), err.getvalue(), seconds, peak)


def check_outcome(r: Result, label: str) -> None:
    """Exit 0, or exit 1 with a located error; never an internal error; inside the budget."""
    assert r.rc in (0, 1), f"{label}: `{r.command}` exited {r.rc}:\n{r.err[-3000:]}"
    if r.rc == 1:
        assert LOCATED.search(r.err), f"{label}: `{r.command}` failed without a located error:\n{r.err[-3000:]}"
    assert "Traceback" not in r.err and "internal error" not in r.err, f"{label}: {r.err[-3000:]}"
    assert r.seconds < TIME_BUDGET_S, f"{label}: `{r.command}` took {r.seconds:.1f} s"
    assert r.peak_bytes < MEMORY_BUDGET_BYTES, f"{label}: `{r.command}` peaked at {r.peak_bytes / 2**20:.0f} MiB"


def expectation(text: str) -> tuple[str, int | None, str | None]:
    """A spec file's first line: `# expect: ok` or `# expect: error LINE SUBSTRING`."""
    first = text.split("\n", 1)[0]
    m = re.match(r"# expect: (ok|error) ?(\d+)? ?(.*)$", first)
    assert m, f"no `# expect:` line: {first!r}"
    return m.group(1), int(m.group(2)) if m.group(2) else None, m.group(3) or None
