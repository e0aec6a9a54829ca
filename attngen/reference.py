"""`attngen.reference`, the path the documentation uses; the module is `attngen.check.reference`."""

# relayout: alias of attngen.check.reference
import sys

from attngen.check import reference as _module

sys.modules[__name__] = _module
