"""attngen: a compiler for fused attention kernels."""

__version__ = "0.1.0"
