"""Unify an intrinsic's expression tree with a workload block's, modulo commutativity.

The result is a *binding*: each buffer of the intrinsic description mapped to the workload
access it stands for. Commutative operators (``a * b`` vs ``b * a``, ``c + x`` vs ``x + c``)
give several bindings; all are produced and the matcher keeps the best. When nothing
unifies, the mismatches are collected with a stage so the most specific reason can be
reported (an operation that differs is less specific than a dtype that differs).
"""

from __future__ import annotations

from typing import Iterator

from .pattern import COMMUTATIVE, Access, BlockPattern, describe

# How far a comparison got before failing; the report shows the reason that got furthest.
STAGE_STRUCTURE = 1
STAGE_OPERATION = 2
STAGE_DTYPE = 3
STAGE_ITERATORS = 4
STAGE_EXTENT = 5
STAGE_LAYOUT = 6


class Mismatch(Exception):
    """Why an intrinsic does not match a block, and how far the comparison got."""

    def __init__(self, stage: int, message: str):
        super().__init__(message)
        self.stage = stage
        self.message = message


Binding = dict  # intrinsic buffer name -> workload Access


class _Unifier:
    def __init__(self, ipat: BlockPattern, wpat: BlockPattern, failures: list[Mismatch],
                 dtypes: bool = True):
        self.ip, self.wp, self.failures, self.dtypes = ipat, wpat, failures, dtypes

    def fail(self, stage: int, message: str) -> None:
        self.failures.append(Mismatch(stage, f"block {self.wp.name!r}: {message}"))

    def bind(self, iacc: Access, wacc: Access, binding: Binding) -> Binding | None:
        prev = binding.get(iacc.buffer)
        if prev is not None:
            if prev.same_place(wacc):
                return binding
            self.fail(STAGE_OPERATION,
                      f"the intrinsic uses {iacc.buffer} at one place, the workload uses "
                      f"{prev.text} and {wacc.text}")
            return None
        if self.dtypes and iacc.dtype != wacc.dtype:
            self.fail(STAGE_DTYPE, f"operand {wacc.buffer} is {wacc.dtype}, intrinsic wants "
                                   f"{iacc.dtype} (intrinsic operand {iacc.buffer})")
            return None
        out = dict(binding)
        out[iacc.buffer] = wacc
        return out

    def unify(self, p: tuple, w: tuple, binding: Binding, top: bool = False) -> Iterator[Binding]:
        pop, wop = p[0], w[0]
        ip, wp = self.ip, self.wp
        if not self.dtypes and (pop == "cast") != (wop == "cast"):
            # Comparing operations only: a cast present on one side is a dtype question.
            if pop == "cast":
                yield from self.unify(p[2], w, binding, top)
            else:
                yield from self.unify(p, w[2], binding, top)
            return
        if pop == "load":
            if wop != "load":
                self.fail(STAGE_OPERATION, f"{describe(w, wp.loads)} where the intrinsic reads "
                                           f"operand {ip.loads[p[1]].buffer}")
                return
            out = self.bind(ip.loads[p[1]], wp.loads[w[1]], binding)
            if out is not None:
                yield out
            return
        if pop != wop:
            if top:
                self.fail(STAGE_OPERATION, f"body is {describe(w, wp.loads)}, intrinsic is "
                                           f"{describe(p, ip.loads)}")
            elif pop == "cast" and wop == "load" and self.dtypes:
                acc = wp.loads[w[1]]
                want = describe(p[2], ip.loads) if p[2][0] != "load" else ip.loads[p[2][1]].dtype
                self.fail(STAGE_DTYPE, f"operand {acc.buffer} is {acc.dtype}, used as is; intrinsic "
                                       f"wants {want} cast to {p[1]}")
            elif wop == "cast" and pop == "load" and self.dtypes:
                self.fail(STAGE_DTYPE, f"the workload casts {describe(w[2], wp.loads)} to {w[1]}; "
                                       f"the intrinsic reads operand {ip.loads[p[1]].buffer} as it is")
            else:
                self.fail(STAGE_OPERATION, f"{describe(w, wp.loads)} where the intrinsic has "
                                           f"{describe(p, ip.loads)}")
            return
        if self.dtypes and p[1] != w[1]:
            what = "the accumulation" if top else describe(w, wp.loads)
            self.fail(STAGE_DTYPE, f"{what} is {w[1]}, intrinsic computes in {p[1]}")
            return
        if pop == "const":
            if p[2] != w[2]:
                self.fail(STAGE_OPERATION, f"the constant is {w[2]}, intrinsic has {p[2]}")
            else:
                yield binding
            return
        if pop == "var":
            self.fail(STAGE_OPERATION, "the intrinsic uses a free variable; it cannot match")
            return
        if pop == "call" and p[2] != w[2]:
            self.fail(STAGE_OPERATION, f"calls {w[2]}, intrinsic calls {p[2]}")
            return
        start = 3 if pop == "call" else 2
        pkids, wkids = p[start:], w[start:]
        if len(pkids) != len(wkids):
            self.fail(STAGE_OPERATION, f"{describe(w)} has {len(wkids)} operands, intrinsic {len(pkids)}")
            return
        orders = [wkids]
        if pop in COMMUTATIVE and len(wkids) == 2 and wkids[0] != wkids[1]:
            orders.append((wkids[1], wkids[0]))
        for order in orders:
            yield from self._all(pkids, order, binding)

    def _all(self, pkids, wkids, binding) -> Iterator[Binding]:
        if not pkids:
            yield binding
            return
        for b in self.unify(pkids[0], wkids[0], binding):
            yield from self._all(pkids[1:], wkids[1:], b)


def bindings(ipat: BlockPattern, wpat: BlockPattern, failures: list[Mismatch]) -> Iterator[Binding]:
    """Every way the intrinsic's store and value unify with the block's.

    The operations are compared first with dtypes ignored, so a block that computes
    something else is reported as such (``body is max, intrinsic is multiply-add``) rather
    than by the first dtype that differs.
    """
    shape_only = _Unifier(ipat, wpat, failures, dtypes=False)
    if next(shape_only.unify(ipat.value, wpat.value, {ipat.store.buffer: wpat.store}, top=True), None) is None:
        return
    u = _Unifier(ipat, wpat, failures)
    start = u.bind(ipat.store, wpat.store, {})
    if start is None:
        failures[-1] = Mismatch(STAGE_DTYPE, f"block {wpat.name!r}: output {wpat.store.buffer} is "
                                              f"{wpat.store.dtype}, intrinsic writes {ipat.store.dtype}")
        return
    seen = set()
    for b in u.unify(ipat.value, wpat.value, start, top=True):
        key = tuple(sorted((k, v.text) for k, v in b.items()))
        if key not in seen:
            seen.add(key)
            yield b
