"""`attngen.torch`, the path the documentation uses; the module is `attngen.runtime.torch`."""

# relayout: alias of attngen.runtime.torch
import sys

from attngen.runtime import torch as _module

sys.modules[__name__] = _module
