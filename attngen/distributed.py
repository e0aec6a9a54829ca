"""`attngen.distributed`, the path the documentation uses; the module is `attngen.runtime.distributed`."""

# relayout: alias of attngen.runtime.distributed
import sys

from attngen.runtime import distributed as _module

sys.modules[__name__] = _module
