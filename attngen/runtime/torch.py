"""`attngen.torch`: attngen variants as PyTorch operators (see attngen/runtime/torch_op.py)."""

from attngen.runtime.torch_op import Attention, AttnOp, raise_pending, register

__all__ = ["register", "Attention", "AttnOp", "raise_pending"]
