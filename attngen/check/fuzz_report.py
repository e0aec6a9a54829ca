"""`attngen fuzz`'s reporting: what a fuzz target ended with (`Outcome`), progress on the terminal,
the first failure reported before shrinking, and reproducers (spec, inputs, a ready-to-run pytest
file) for the minimal failure."""

from __future__ import annotations

import hashlib
import json
import os
import sys
import textwrap
import time
import traceback
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from attngen.check.fuzz_cases import Case
from attngen.ir.dtypes import by_numpy_name
from attngen.ir.nodes import Variant


REPRO_TEST = '''\
"""Reproducer written by `attngen fuzz` ({when}).

{message}

Run: pytest -q {test_path}
Case: {case}
"""

import json
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent


def _arrays():
    import ml_dtypes

    data = np.load(HERE / "inputs.npz")
    meta = json.loads(str(data["__meta__"]))
    out = {{}}
    for name in meta["names"]:
        a = data[name]
        if a.dtype.name != meta["dtypes"][name]:  # stored as its bit patterns (NumPy lacks the type)
            a = a.view(getattr(ml_dtypes, meta["dtypes"][name]))
        out[name] = a
    return meta, out


@pytest.mark.gpu
def test_kernel_matches_reference():
    import attngen
    from attngen.check import fuzz, reference, tolerance

    meta, arrays = _arrays()
    v = attngen.load(HERE / "spec.attn").get(meta["variant"])
    kernel = attngen.compile(v)
    out, lse = fuzz.run_kernel(kernel, v, arrays)
    reports = fuzz.compare(v, arrays, out, lse)
    bad = [r.summary() for r in reports if not r.ok]
    assert not bad, "\\n".join(bad)


def test_reference_is_sane():
    # Runs without a GPU: the reference itself must not produce NaN on this case.
    import attngen
    from attngen.check import fuzz

    meta, arrays = _arrays()
    v = attngen.load(HERE / "spec.attn").get(meta["variant"])
    assert fuzz.reference_invariants(v, arrays) == []
'''


def write_reproducer(out_dir: str | os.PathLike, spec_text: str, v: Variant, arrays: Mapping[str, np.ndarray] | None,
                     case: Case | None, message: str) -> Path:
    """Write spec.attn, inputs.npz, test_repro.py and FAILURE.txt into a fresh directory; return it."""
    key = hashlib.sha1((spec_text + v.name + (case.describe() if case else "") + message).encode()).hexdigest()[:10]
    d = Path(out_dir) / f"{v.name}-{key}"
    d.mkdir(parents=True, exist_ok=True)
    (d / "spec.attn").write_text(spec_text, encoding="utf-8")
    (d / "FAILURE.txt").write_text(message + "\n", encoding="utf-8")
    if arrays is not None:
        store: dict[str, np.ndarray] = {}
        dtypes: dict[str, str] = {}
        for n, a in arrays.items():
            a = np.ascontiguousarray(a)
            dtypes[n] = a.dtype.name
            row = by_numpy_name(a.dtype.name)
            store[n] = a.view(row.storage) if row is not None and row.foreign else a
        meta = {"variant": v.name, "names": list(arrays), "dtypes": dtypes, "case": case.describe() if case else None}
        np.savez(d / "inputs.npz", __meta__=np.array(json.dumps(meta)), **store)
        test = REPRO_TEST.format(when=time.strftime("%Y-%m-%d %H:%M"), message=textwrap.indent(message, "    ").strip(),
                                 test_path=d / "test_repro.py", case=case.describe() if case else "-")
        (d / "test_repro.py").write_text(test, encoding="utf-8")
    return d


class Progress:
    """examples run / failures / elapsed on the terminal: tqdm when importable, else plain lines."""

    def __init__(self, total: int | None, label: str, quiet: bool = False):
        self.total, self.label, self.quiet = total, label, quiet
        self.n = 0
        self.failures = 0
        self.t0 = time.monotonic()
        self._last = 0.0
        self._bar = None
        if not quiet:
            try:
                from tqdm import tqdm

                self._bar = tqdm(total=total, desc=label, unit="ex", file=sys.stderr, dynamic_ncols=True)
            except Exception:
                self._bar = None

    def step(self, failed: bool = False) -> None:
        self.n += 1
        self.failures += int(failed)
        if self.quiet:
            return
        if self._bar is not None:
            self._bar.update(1)
            self._bar.set_postfix(failures=self.failures)
            return
        now = time.monotonic()
        if now - self._last > 2.0 or (self.total and self.n == self.total):
            self._last = now
            tot = f"/{self.total}" if self.total else ""
            print(f"  {self.label}: {self.n}{tot} examples, {self.failures} failing, {now - self.t0:.0f}s",
                  file=sys.stderr, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.t0


@dataclass
class Outcome:
    """What one fuzz target ended with."""

    label: str
    examples: int = 0
    kernel_runs: int = 0  # examples that launched a kernel (on the GPU or the CPU backend)
    failure: str | None = None
    reproducer: Path | None = None
    notes: list[str] = field(default_factory=list)


def report_first_failure(e: BaseException, out_dir: str | None) -> None:
    text = fmt_exc(e)
    print(f"\nattngen fuzz: first failure (before shrinking):\n{text[:4000]}\n", file=sys.stderr, flush=True)
    if out_dir:
        try:
            Path(out_dir).mkdir(parents=True, exist_ok=True)
            with open(Path(out_dir) / "FIRST_FAILURE.txt", "a", encoding="utf-8") as f:
                f.write(text + "\n\n")
        except OSError:
            pass


def fmt_exc(e: BaseException) -> str:
    if isinstance(e, AssertionError):
        return str(e)
    return "".join(traceback.format_exception(type(e), e, e.__traceback__)).rstrip()
