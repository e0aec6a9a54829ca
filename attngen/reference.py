"""`attngen.reference`: the NumPy float64 reference every kernel is checked against
(`attngen.reference.attention(variant, q, k, v, inputs)`); implemented in `attngen.check.reference`,
whose public names this module carries."""

from attngen.check import reference as _impl
from attngen.check.reference import *  # noqa: F403 (the public names, listed once in _impl.__all__)

__all__ = list(_impl.__all__)
