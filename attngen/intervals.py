"""`attngen.intervals`, the path the documentation uses; the module is `attngen.analysis.intervals`."""

# relayout: alias of attngen.analysis.intervals
import sys

from attngen.analysis import intervals as _module

sys.modules[__name__] = _module
