"""Unify an intrinsic's expression tree with a workload block's, modulo commutativity.

The result is a *binding*: each buffer of the intrinsic description mapped to the workload
access it stands for. Commutative operators (``a * b`` vs ``b * a``, ``c + x`` vs ``x + c``)
give several bindings; all are produced and the matcher keeps the best. A pairing that does
not unify raises `Refused` with its stage, and the branch point that tried it (another operand
order, another sub-binding) records it in the `Refusals` and goes on, so the most specific
reason can be reported (an operation that differs is less specific than a dtype that differs).
"""

from __future__ import annotations

from typing import Iterator

from tirbyoc.ir.pattern import COMMUTATIVE, Access, BlockPattern, describe
from tirbyoc.matching.results import MatchStage, Refusals, Refused, refuse

Binding = dict  # intrinsic buffer name -> workload Access


class _Unifier:
    def __init__(self, ipat: BlockPattern, wpat: BlockPattern, refusals: Refusals, dtypes: bool = True):
        self.ip, self.wp, self.refusals, self.dtypes = ipat, wpat, refusals, dtypes

    def refused(self, stage: MatchStage, message: str, **fields) -> Refused:
        return refuse(stage, f"block {self.wp.name!r}: {message}", **fields)

    def bind(self, iacc: Access, wacc: Access, binding: Binding) -> Binding:
        prev = binding.get(iacc.buffer)
        if prev is not None:
            if prev.same_place(wacc):
                return binding
            raise self.refused(MatchStage.OPERATION, f"the intrinsic uses {iacc.buffer} at one place, the "
                                                     f"workload uses {prev.text} and {wacc.text}")
        if self.dtypes and iacc.dtype != wacc.dtype:
            raise self.refused(MatchStage.DTYPE, f"operand {wacc.buffer} is {wacc.dtype}, intrinsic wants "
                                                 f"{iacc.dtype} (intrinsic operand {iacc.buffer})",
                               operand=iacc.buffer, expected=iacc.dtype, found=wacc.dtype)
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
                raise self.refused(MatchStage.OPERATION, f"{describe(w, wp.loads)} where the intrinsic "
                                                         f"reads operand {ip.loads[p[1]].buffer}")
            yield self.bind(ip.loads[p[1]], wp.loads[w[1]], binding)
            return
        if pop != wop:
            raise self._operation_differs(p, w, top)
        if self.dtypes and p[1] != w[1]:
            what = "the accumulation" if top else describe(w, wp.loads)
            raise self.refused(MatchStage.DTYPE, f"{what} is {w[1]}, intrinsic computes in {p[1]}")
        if pop == "const":
            if p[2] != w[2]:
                raise self.refused(MatchStage.OPERATION, f"the constant is {w[2]}, intrinsic has {p[2]}")
            yield binding
            return
        if pop == "var":
            raise self.refused(MatchStage.OPERATION, "the intrinsic uses a free variable; it cannot match")
        if pop == "call" and p[2] != w[2]:
            raise self.refused(MatchStage.OPERATION, f"calls {w[2]}, intrinsic calls {p[2]}")
        start = 3 if pop == "call" else 2
        pkids, wkids = p[start:], w[start:]
        if len(pkids) != len(wkids):
            raise self.refused(MatchStage.OPERATION, f"{describe(w)} has {len(wkids)} operands, "
                                                     f"intrinsic {len(pkids)}")
        orders = [wkids]
        if pop in COMMUTATIVE and len(wkids) == 2 and wkids[0] != wkids[1]:
            orders.append((wkids[1], wkids[0]))
        for order in orders:  # a branch point: an order that does not unify is recorded
            try:
                yield from self._all(pkids, order, binding)
            except Refused as err:
                self.refusals.record(err)

    def _operation_differs(self, p: tuple, w: tuple, top: bool) -> Refused:
        """Why two nodes of different operations do not unify (a missing or extra cast is a
        dtype question)."""
        ip, wp = self.ip, self.wp
        pop, wop = p[0], w[0]
        if top:
            return self.refused(MatchStage.OPERATION, f"body is {describe(w, wp.loads)}, intrinsic is "
                                                      f"{describe(p, ip.loads)}")
        if pop == "cast" and wop == "load" and self.dtypes:
            acc = wp.loads[w[1]]
            want = describe(p[2], ip.loads) if p[2][0] != "load" else ip.loads[p[2][1]].dtype
            return self.refused(MatchStage.DTYPE, f"operand {acc.buffer} is {acc.dtype}, used as is; "
                                                  f"intrinsic wants {want} cast to {p[1]}",
                                expected=f"cast to {p[1]}", found=acc.dtype)
        if wop == "cast" and pop == "load" and self.dtypes:
            return self.refused(MatchStage.DTYPE, f"the workload casts {describe(w[2], wp.loads)} to "
                                                  f"{w[1]}; the intrinsic reads operand "
                                                  f"{ip.loads[p[1]].buffer} as it is",
                                operand=ip.loads[p[1]].buffer, found=f"cast to {w[1]}")
        return self.refused(MatchStage.OPERATION, f"{describe(w, wp.loads)} where the intrinsic has "
                                                  f"{describe(p, ip.loads)}", expected=p[0], found=w[0])

    def _all(self, pkids, wkids, binding) -> Iterator[Binding]:
        if not pkids:
            yield binding
            return
        for b in self.unify(pkids[0], wkids[0], binding):
            try:  # a branch point: the rest failing under one sub-binding leaves the others
                yield from self._all(pkids[1:], wkids[1:], b)
            except Refused as err:
                self.refusals.record(err)


def bindings(ipat: BlockPattern, wpat: BlockPattern, refusals: Refusals) -> Iterator[Binding]:
    """Every way the intrinsic's store and value unify with the block's; why the others do
    not goes to ``refusals``.

    The operations are compared first with dtypes ignored, so a block that computes
    something else is reported as such (``body is max, intrinsic is multiply-add``) rather
    than by the first dtype that differs.
    """
    try:
        shape_only = _Unifier(ipat, wpat, refusals, dtypes=False)
        if next(shape_only.unify(ipat.value, wpat.value, {ipat.store.buffer: wpat.store}, top=True), None) is None:
            return
        u = _Unifier(ipat, wpat, refusals)
        if ipat.store.dtype != wpat.store.dtype:
            raise refuse(MatchStage.DTYPE, f"block {wpat.name!r}: output {wpat.store.buffer} is "
                                           f"{wpat.store.dtype}, intrinsic writes {ipat.store.dtype}",
                         operand=ipat.store.buffer, expected=ipat.store.dtype, found=wpat.store.dtype)
        seen = set()
        for b in u.unify(ipat.value, wpat.value, u.bind(ipat.store, wpat.store, {}), top=True):
            key = tuple(sorted((k, v.text) for k, v in b.items()))
            if key not in seen:
                seen.add(key)
                yield b
    except Refused as err:
        refusals.record(err)
