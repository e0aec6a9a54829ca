"""`attngen.runtime_bwd`, the path the documentation uses; the module is `attngen.runtime.bwd`."""

# relayout: alias of attngen.runtime.bwd
import sys

from attngen.runtime import bwd as _module

sys.modules[__name__] = _module
