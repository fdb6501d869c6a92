"""The tests' workloads come from the library's generators."""

from tirbyoc.workloads import conv2d, matmul, parse  # noqa: F401
