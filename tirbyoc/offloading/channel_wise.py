"""Channel-wise reductions left to the CPU's channel-vector schedule instead of a vector core.

A depthwise convolution has no dot product a GEMM core could share between outputs: each output
channel reduces its own window. A host CPU's fused multiply-add core (``x86_fp32_avx512``'s
``C[16] += A[0] * B[16]``) still matches it - 16 neighbouring output columns of one channel
as the lanes, the weight as the broadcast - but only after copying the input and the output
into a layout with the columns innermost, a pass over memory per few multiply-adds: MobileNetV2's
float depthwise layers ran 15-20x slower than TVM's own build of them (AMD Zen 4, one thread:
56 x 56 x 144 stride 2, 0.27 -> 5.3 ms). `tirbyoc.rewrite.rest_schedule.channel_reduction`
runs them in channel vectors in place, so a host-CPU template (LLVM intrinsics on the
machine that runs the rest) leaves them to it and says so. Accelerators, simulators and
libraries still take them: offloading is their point there.
"""

from __future__ import annotations

from tirbyoc._tvm import is_host_target, make_target, s_tir
from tirbyoc.decl.template import Runtime, Template
from tirbyoc.rewrite.rest_schedule.channel_reduction import is_channel_reduction


def left_to_channel_vectors(func, block: str, template, target) -> str | None:
    """Why ``block`` of ``func`` stays off ``template`` (a host CPU's vector core) for the
    channel-vector schedule; None where the template takes it."""
    if not isinstance(template, Template) or template.runtime is not Runtime.LLVM \
            or not is_host_target(make_target(target)):
        return None
    sch = s_tir.Schedule(func)
    try:
        sblock = sch.get_sblock(block)
    except (s_tir.schedule.ScheduleError, ValueError):
        return None
    if not is_channel_reduction(sch, sblock):
        return None
    return (f"a channel-wise reduction (each output channel reduces its own window: a depthwise convolution "
            f"or pooling): {template.name}'s core would copy it into a layout with its columns in vector lanes, "
            "slower than reading it in place; left to the CPU schedule's channel vectors "
            "(tirbyoc.rewrite.rest_schedule.channel_reduction)")


__all__ = ["left_to_channel_vectors"]
