"""`attngen.distributed`: context-parallel ring attention over torch.distributed
(`attngen.distributed.ring_attention`, `shard`, `unshard`); implemented in
`attngen.runtime.distributed`, whose public names this module carries."""

from attngen.runtime import distributed as _impl
from attngen.runtime.distributed import *  # noqa: F403 (the public names, listed once in _impl.__all__)

__all__ = list(_impl.__all__)
