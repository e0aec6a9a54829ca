"""`attngen.workload`, the path the documentation uses; the module is `attngen.check.workload`."""

# relayout: alias of attngen.check.workload
import sys

from attngen.check import workload as _module

sys.modules[__name__] = _module
