"""What this machine can run: the public questions a template's ``requires`` asks.

Templates declare with the public API only; these answers come from TVM (LLVM's view of this
CPU, the CUDA driver), whose spelling lives in `tirbyoc._tvm`.
"""

from __future__ import annotations

from tirbyoc._tvm import cuda_available, host_cpu_features, host_target

__all__ = ["cuda_available", "host_cpu_features", "host_target"]
