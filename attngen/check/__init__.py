"""What kernels are held against: the NumPy reference, tolerances, workloads, FlexAttention, fuzzing."""
