"""`ScheduleRest`: the functions of an offloaded model no template took, fused as TVM's
pipeline fuses them and given parallel rows and vector lanes.

After `OffloadTIR` a model's cores are library calls or tensorized loops; what is left
(activations, softmax, layer norms, residual adds, reshapes) TVM builds as ``LegalizeOps``
wrote it, serial and scalar. This pass runs TVM's own fusion first (``FoldConstant``, then
`tirbyoc.relax.bridge.fuse`: what ``tvm.compile``'s CPU pipeline would run next;
offloaded functions are opaque, so nothing is fused into them), then schedules each function
that is neither offloaded nor scheduled already with `tirbyoc.rewrite.rest_schedule.nests.schedule_rest`:
a quantized model computes the same values, bit for bit, on every core; a float one the same
values within float rounding (its sums in vector lanes, its exp and erf vector arithmetic
within 2 units in the last place: libm's are one scalar call per element). In an offloaded function it
schedules only the loop nests the rewrite left serial (an epilogue its core's write-back could
not take: a residual read twice, say). Where it goes::

    LegalizeOps -> OffloadTIR -> PackConstantWeights -> ScheduleRest -> tvm.compile

A weight the schedule copies into another layout (a depthwise convolution's, channel-last) is
packed here, once, as `PackConstantWeights` packs an offloaded function's.

Only for a target this machine runs (an LLVM target for its CPU); any other target's module
comes back as it came.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tvm import relax

from tirbyoc._tvm import is_buffer, is_host_target, make_target, tirx, tvm, vector_bytes, vector_registers
from tirbyoc.relax.bridge import OFFLOADED_ATTR, fuse
from tirbyoc.relax.prepack import PackedWeights, pack_constant_weights
from tirbyoc.rewrite.rest_schedule.nests import SCHEDULED_ATTR, schedule_rest


@dataclass
class RestSchedule:
    """What `ScheduleRest` did: the functions left to TVM after fusion, and per function it
    scheduled, its nests (`tirbyoc.rewrite.rest_schedule.nests.NestSchedule`)."""

    left: int = 0  # PrimFuncs no template took, after fusion
    functions: dict = field(default_factory=dict)  # name -> tuple of NestSchedule
    vector_bytes: int = 0
    packed: PackedWeights = field(default_factory=PackedWeights)  # weight copies run at compile time
    offloaded: dict = field(default_factory=dict)  # offloaded function -> the nests its rewrite left serial
    exact: bool = True  # False: float sums in vector lanes, exp / erf as vector arithmetic

    @property
    def parallel(self) -> int:
        return sum(1 for nests in self.functions.values() if any(n.parallel for n in nests))

    @property
    def vectorized(self) -> int:
        return sum(1 for nests in self.functions.values() if any(n.lanes for n in nests))

    @property
    def channel_reductions(self) -> int:
        return sum(1 for nests in self.functions.values() if any(n.note for n in nests))

    @property
    def chains(self) -> int:
        """Functions whose elementwise chain runs as one pass (`tirbyoc.rewrite.rest_schedule.elementwise_chain`)."""
        return sum(1 for nests in self.functions.values() if any(n.inlined for n in nests))

    def summary(self) -> str:
        channel = (f", {self.channel_reductions} channel-wise reduction(s) (depthwise, pooling) in channel "
                   f"vectors with their epilogues" if self.channel_reductions else "")
        offloaded = (f"; in {len(self.offloaded)} offloaded function(s) the elementwise loops their cores' "
                     "write-back did not take" if self.offloaded else "")
        return (f"{self.left} function(s) no template took, fused as TVM fuses them: {self.parallel} "
                f"with parallel loops, {self.vectorized} with {self.vector_bytes * 8}-bit vectors{channel}"
                f"{f', {self.chains} with an elementwise chain in one pass' if self.chains else ''}"
                f"{offloaded} ({self.values()})")

    def values(self) -> str:
        """How the values compare with TVM's build."""
        if self.exact:
            return "the same values as TVM's build, bit for bit"
        return ("float sums in vector lanes and float32 exp / erf as vector arithmetic within 2 units in the "
                "last place: TVM's values within float rounding; every other value bit for bit")

    def to_json(self) -> dict:
        return {"left": self.left, "exact": self.exact, "parallel": self.parallel, "vectorized": self.vectorized,
                "channel_reductions": self.channel_reductions, "elementwise_chains": self.chains,
                "vector_bits": self.vector_bytes * 8,
                "packed_weights": self.packed.tensors, "offloaded_functions": len(self.offloaded),
                "functions": {name: [{"block": n.block, "parallel": n.parallel, "lanes": n.lanes,
                                      **({"schedule": n.note} if n.note else {}),
                                      **({"inlined": n.inlined} if n.inlined else {})}
                                     for n in nests] for name, nests in self.functions.items()}}


def _fused(mod):
    if not any(isinstance(f, relax.Function) for f in mod.functions.values()):
        return mod
    return fuse(relax.transform.FoldConstant()(mod))


NARROW_INTEGERS = ("int8", "uint8", "int16", "uint16")


def quantized(mod) -> bool:
    """Whether a PrimFunc of ``mod`` reads or writes 8- or 16-bit integers (a quantized model)."""
    return any(str(p.dtype) in NARROW_INTEGERS for f in mod.functions.values() if isinstance(f, tirx.PrimFunc)
               for p in f.params if is_buffer(p))


def schedule_rest_of(mod, target, exact: bool | None = None) -> tuple[object, RestSchedule | None]:
    """(``mod`` fused and its functions no template took scheduled, what was done); ``mod``
    and None for a target this machine does not run. ``exact``: every value bit for bit as
    TVM's build (True), or float sums in lanes and vector exp / erf too (False); by default
    True for a `quantized` model only."""
    tgt = make_target(target)
    if str(tgt.kind.name) != "llvm" or not is_host_target(tgt):
        return mod, None
    mod = _fused(mod)
    report = RestSchedule(vector_bytes=vector_bytes(tgt), exact=quantized(mod) if exact is None else exact)
    for gv, func in list(mod.functions.items()):
        attrs = func.attrs or {}
        if not isinstance(func, tirx.PrimFunc) or SCHEDULED_ATTR in attrs:
            continue
        offloaded = OFFLOADED_ATTR in attrs  # its cores are scheduled; what they left serial is not
        report.left += 0 if offloaded else 1
        new, nests = schedule_rest(func, report.vector_bytes, vector_registers(tgt), channel_reductions=not offloaded,
                                   exact=report.exact)
        if nests:
            mod[gv] = new.with_attr(SCHEDULED_ATTR, True)
            (report.offloaded if offloaded else report.functions)[gv.name_hint] = nests
    repacked = {name for name, nests in report.functions.items() if any(n.packed for n in nests)}
    if repacked:  # a depthwise weight laid out channel-last: once, where it is a constant
        mod, report.packed = pack_constant_weights(mod, functions=repacked, target=tgt)
    return mod, report


def ScheduleRest(target, report: RestSchedule | None = None, exact: bool | None = None):  # noqa: N802 - a pass
    """`schedule_rest_of` as an IRModule pass; ``report``, when given, is filled in."""

    @tvm.transform.module_pass(opt_level=0, name="tirbyoc.ScheduleRest")
    def _pass(mod, _ctx):
        new, done = schedule_rest_of(mod, target, exact)
        if report is not None and done is not None:
            report.__dict__.update(done.__dict__)
        return new

    return _pass


__all__ = ["RestSchedule", "ScheduleRest", "schedule_rest_of"]
