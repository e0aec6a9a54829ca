"""The CUDA backend: IR -> C++ expressions, rendered kernels, NVRTC/nvcc compilation and cache."""
