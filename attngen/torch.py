"""`attngen.torch`: attngen variants as PyTorch operators (needs the `attngen[torch]` extra).

    op = attngen.torch.register("examples/seed_padded_fp32.attn")   # torch.ops.attngen.seed_padded_fp32
    o = op(q, k, v, q_lens=q_lens, kv_lens=kv_lens)                   # runtime inputs by name

The implementation lives in `attngen.runtime.torch_op` (see its module doc); without torch,
importing this raises a ModuleNotFoundError naming `pip install 'attngen[torch]'`.
"""

from attngen.runtime.torch_op import Attention, AttnOp, raise_pending, register

__all__ = ["Attention", "AttnOp", "raise_pending", "register"]
