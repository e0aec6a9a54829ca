"""`attngen.derivative`, the path the documentation uses; the module is `attngen.analysis.derivative`."""

# relayout: alias of attngen.analysis.derivative
import sys

from attngen.analysis import derivative as _module

sys.modules[__name__] = _module
