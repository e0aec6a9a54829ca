"""The CPU backend: render (IR -> C++17), compile (the host C++ compiler, cached), kernel (ctypes)."""
