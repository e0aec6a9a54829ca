"""`--shape`: the one way the command line names a problem size (`explain`, `bench`, `fuzz`).

    --shape B=2,Lq=1,Lk=4096          sizes by name, comma separated, in any order
    --shape B=8,L=4096,H=16,D=128     L sets Lq = Lk; H and D, when given, must be the spec's

Keys: B (batch, default 1), L (Lq = Lk), Lq and Lk (give both, or L), H (query heads) and D (head
dim). H and D are fixed by the spec (one compiled kernel serves every B and L, not other heads), so
they are only checked. For self attention, Lq < Lk is a decode or extend step: the Lq new queries
are the last Lq positions of the Lk-long sequence (a call placed with q_offset = Lk - Lq).
Standard library only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["SHAPE_HELP", "Shape", "ShapeError", "parse_shape"]

SHAPE_HELP = ("problem size by name: B=..,Lq=..,Lk=.. or B=..,L=.. (Lq = Lk = L); optional H=.. and D=.. are "
              "checked against the spec; e.g. B=2,Lq=1,Lk=4096")

_KEYS = ("B", "L", "Lq", "Lk", "H", "D")
_ITEM = re.compile(r"^\s*([A-Za-z]+)\s*=\s*([0-9]+)\s*$")


class ShapeError(ValueError):
    """A `--shape` value that does not follow the named form; the message shows the form."""


@dataclass(frozen=True, slots=True)
class Shape:
    """Sizes of one call: batch, query and key lengths; H and D as given (None: the spec's)."""

    B: int
    Lq: int
    Lk: int
    H: int | None = None
    D: int | None = None

    def check(self, name: str, kind_self: bool, heads: int, head_dim: int) -> None:
        """ShapeError when H or D differ from the variant's, or (self attention) Lq > Lk."""
        if self.H is not None and self.H != heads:
            raise ShapeError(f"--shape: H={self.H} but {name} has heads {heads} (H is fixed by the spec)")
        if self.D is not None and self.D != head_dim:
            raise ShapeError(f"--shape: D={self.D} but {name} has head_dim {head_dim} (D is fixed by the spec)")
        if kind_self and self.Lq > self.Lk:
            raise ShapeError(f"--shape: {name} is self attention, so Lq <= Lk (got Lq={self.Lq}, Lk={self.Lk}); Lq < Lk "
                             "is a decode step whose Lq queries end the Lk-long sequence")

    @property
    def text(self) -> str:
        """The canonical `--shape` text of these sizes."""
        extra = "".join(f",{k}={v}" for k, v in (("H", self.H), ("D", self.D)) if v is not None)
        return f"B={self.B},Lq={self.Lq},Lk={self.Lk}{extra}"


def _positional_hint(text: str) -> str:
    """For an old positional value, the named form it most likely meant."""
    parts = [p.strip() for p in text.split(",")]
    if not all(p.isdigit() for p in parts):
        return ""
    names = {2: ("B", "L"), 3: ("B", "Lq", "Lk"), 4: ("B", "H", "L", "D"), 5: ("B", "H", "Lq", "Lk", "D")}.get(len(parts))
    if names is None:
        return ""
    return f"; sizes go by name, e.g. {','.join(f'{k}={v}' for k, v in zip(names, parts))}"


def parse_shape(text: str) -> Shape:
    """The Shape a `--shape` value names; ShapeError (with the expected form) otherwise."""
    form = "expected sizes by name, e.g. B=2,Lq=1,Lk=4096 or B=8,L=4096 (keys B, L, Lq, Lk, H, D)"
    got: dict[str, int] = {}
    for item in text.split(","):
        m = _ITEM.match(item)
        if m is None:
            raise ShapeError(f"--shape {text!r}: {form}{_positional_hint(text)}")
        key, value = m.group(1), int(m.group(2))
        if key not in _KEYS:
            raise ShapeError(f"--shape {text!r}: unknown size {key!r}; the keys are {', '.join(_KEYS)}")
        if key in got:
            raise ShapeError(f"--shape {text!r}: {key} given twice")
        if value < 1:
            raise ShapeError(f"--shape {text!r}: {key}={value}, every size must be >= 1")
        got[key] = value
    if "L" in got and ("Lq" in got or "Lk" in got):
        raise ShapeError(f"--shape {text!r}: give L (Lq = Lk) or Lq and Lk, not both")
    if "L" in got:
        Lq = Lk = got["L"]
    elif "Lq" in got and "Lk" in got:
        Lq, Lk = got["Lq"], got["Lk"]
    else:
        raise ShapeError(f"--shape {text!r}: the lengths are missing: give L=.. (Lq = Lk) or both Lq=.. and Lk=..")
    return Shape(got.get("B", 1), Lq, Lk, got.get("H"), got.get("D"))
