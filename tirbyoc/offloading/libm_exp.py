"""Whether this process's libm computes ``expf`` as `expf_as_glibc` does, bit for bit.

TVM lowers a float32 ``exp`` (and ``sigmoid``, ``1 / (1 + exp(-x))``) to one scalar libm
``expf`` call per element, which LLVM cannot vectorize: a quantized decoder's SiLU took 2.1 of
its prefill's 36.8 ms that way, a quantized model's softmax most of its time. Such a model is
verified bit for bit against TVM's build, so an exp within an ulp will not do; libm's own
arithmetic will. glibc's ``expf`` (2.28 on) is a short double-precision evaluation that
`tirbyoc.rewrite.rest_schedule.vector_math.expf_as_glibc` writes in TIR, so LLVM runs it in
vector lanes. It is used only where it gives this machine's libm's bits: on a CPU target with
fused multiply-adds (the FMA build glibc selects there, and ``llvm.fma`` as one instruction),
and after a probe - the form and TVM's own build of ``exp`` on every 4099th float32 bit pattern
(a million values across every exponent, signs, subnormals, infinities and NaNs) - found them
equal. Anything else (another libm, another algorithm, no FMA) keeps libm's calls. Every float32
of the form was compared with glibc 2.36's on the machine this was written on: all 2^32 agree.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from tirbyoc._tvm import is_host_target, isa_features, make_target, te, tirx, tvm
from tirbyoc.offloading.devices import compile_func
from tirbyoc.rewrite.rest_schedule.vector_math import expf_as_glibc

PROBE_STRIDE = 4099  # bit patterns between two probed floats: every exponent, both signs


def exp_matches_libm(target) -> bool:
    """Whether `expf_as_glibc` may stand for libm's ``expf`` in code for ``target`` (see the
    module docstring); cached per target."""
    tgt = make_target(target)
    if tgt.kind.name != "llvm" or not is_host_target(tgt) or not {"fma", "avx512f"} & isa_features(tgt):
        return False
    return _probe(str(tgt))


@lru_cache(maxsize=None)
def _probe(target: str) -> bool:
    bits = np.arange(0, 2 ** 32, PROBE_STRIDE, dtype=np.uint64).astype(np.uint32)
    x = bits.view(np.float32)
    outs = []
    for form in (expf_as_glibc, tirx.exp):
        data = te.placeholder((len(x),), "float32", name="x")
        func = te.create_prim_func([data, te.compute((len(x),), lambda i: form(data[i]), name="y")])
        exe = compile_func(func, make_target(target), "libm exp probe")
        out = tvm.runtime.tensor(np.empty_like(x))
        exe.mod["main"](tvm.runtime.tensor(x), out)
        outs.append(out.numpy().view(np.uint32))
    return bool(np.array_equal(*outs))


__all__ = ["PROBE_STRIDE", "exp_matches_libm"]
