"""Pack constant weights once, at compile time, instead of on every call.

An offloaded PrimFunc often begins by copying a weight into the layout its intrinsic reads:
blas's GEMM wants a conv's OIHW weight as ``[O, C*kh*kw]``, x86_vnni's ``vpdpbusd`` wants B as
``[N/16, K/4, 16, 4]``, padding rounds a weight up to the intrinsic's tile. When every call site
passes that weight as a Relax constant (an ONNX or PyTorch model's initializers, a model whose
weights `tirbyoc build` / `tirbyoc run` bound), the copy computes the same array on every call.
`pack_constant_weights` runs it once: the copy becomes a PrimFunc of its own, built for this
CPU and run on each call site's constant; the call passes the packed constant and the PrimFunc
keeps its name, taking the packed array in place of the weight.

This is TVM's layout-free-buffer idea (MetaSchedule's ``layout_rewrite_preproc`` blocks,
split out by ``relax.transform.SplitLayoutRewritePreproc`` and folded by ``FoldConstant``),
done in one step on the copies a rewrite made: TVM's split renames every function it splits
and leaves the packing to a ``FoldConstant`` that folds every constant expression of the
module, while here only the weight copies of offloaded functions are evaluated and the
functions keep their names (the offload report, the emulator and the profiler name them).

A copy qualifies when it is a whole top-level statement of the function's root block whose
blocks read nothing but the weight and write nothing but one buffer the root block allocates
(in global memory), and nothing else in the function reads the weight.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from tvm import relax

from tirbyoc._tvm import const_value, iter_blocks, root_block, s_tir, tirx, tvm
from tirbyoc.decl.host import host_target
from tirbyoc.dtypes import dtype_bytes
from tirbyoc.ir.tir_walk import with_root_body
from tirbyoc.offloading.verification import compile_func, run_executable
from tirbyoc.relax.bridge import OFFLOADED_ATTR, constant_arguments, replace_call_tir


@dataclass
class PackedWeights:
    """What `pack_constant_weights` did: per function, the weights it packed (parameter
    names) and the bytes each call no longer copies."""

    functions: dict = field(default_factory=dict)  # function -> tuple of parameter names
    bytes_per_call: dict = field(default_factory=dict)  # function -> bytes one call stops copying

    @property
    def tensors(self) -> int:
        return sum(len(p) for p in self.functions.values())

    def to_json(self) -> dict:
        return {"functions": {k: list(v) for k, v in self.functions.items()},
                "bytes_per_call": dict(self.bytes_per_call)}


@dataclass(frozen=True)
class _Copy:
    """One weight copy in a function: the parameter index, the parameter (a Buffer), the
    buffer the copy writes, and the top-level statement that copies it."""

    index: int
    param: object
    packed: object
    stmt: object


def _top_statements(root) -> list:
    body = root.body
    return list(body.seq) if isinstance(body, tirx.SeqStmt) else [body]


def _readers(stmt, buffer) -> list:
    return [b for b in iter_blocks(stmt, include_self=False) if b.name_hint != "root"
            and any(r.source.same_as(buffer) for r in b.reads)]


def weight_copies(func, indices) -> list[_Copy]:
    """The copies of the parameters at ``indices`` that can run once (see the module's
    docstring for when a copy qualifies)."""
    root = root_block(func)
    if root is None:
        return []
    top = _top_statements(root)
    allocated = list(root.alloc_buffers)
    copies = []
    for i in sorted(indices):
        param = func.params[i]
        stmts = [s for s in top if _readers(s, param)]
        if len(stmts) != 1:
            continue
        blocks = list(iter_blocks(stmts[0], include_self=False))
        targets = {b.writes[0].source for b in blocks if len(b.writes) == 1}
        pure = all(len(b.reads) == 1 and b.reads[0].source.same_as(param) and len(b.writes) == 1
                   and b.init is None and not b.alloc_buffers and not b.match_buffers for b in blocks)
        if not pure or len(targets) != 1:
            continue
        packed = next(iter(targets))
        if not any(a.same_as(packed) for a in allocated) or str(packed.scope()) != "global":
            continue
        copies.append(_Copy(i, param, packed, stmts[0]))
    return copies


def packing_function(func, copy: _Copy):
    """The copy alone, as a PrimFunc ``(weight, packed)`` built for this CPU."""
    root = s_tir.SBlock([], [], [], "root", copy.stmt, None, [])
    return tirx.PrimFunc([copy.param, copy.packed], s_tir.SBlockRealize([], tirx.IntImm("bool", 1), root))


def packed_function(func, copies: list[_Copy]):
    """``func`` without the copies, taking each packed array in place of its weight."""
    root = root_block(func)
    dropped = [c.stmt for c in copies]
    body = [s for s in _top_statements(root) if not any(s.same_as(d) for d in dropped)]
    packed = [c.packed for c in copies]
    func = with_root_body(func, tirx.SeqStmt(body) if len(body) > 1 else body[0],
                          [a for a in root.alloc_buffers if not any(a.same_as(p) for p in packed)])
    by_index = {c.index: c.packed for c in copies}
    params = [by_index.get(i, p) for i, p in enumerate(func.params)]
    return tirx.PrimFunc(params, func.body, func.ret_type, func.attrs)


class _Packer:
    """Runs each copy on each constant it is given, once per distinct constant."""

    def __init__(self, target):
        self.target = target
        self.built: dict = {}
        self.done: dict = {}

    def pack(self, name: str, copy: _Copy, func, constant) -> np.ndarray:
        key = (name, copy.index, constant)  # a Relax constant hashes by identity
        if key not in self.done:
            if (name, copy.index) not in self.built:
                self.built[name, copy.index] = compile_func(packing_function(func, copy), self.target,
                                                            "weight packing")
            shape = tuple(int(d) for d in copy.packed.shape)
            out = np.zeros(shape, dtype=str(copy.packed.dtype))
            weight = const_value(constant)
            self.done[key] = run_executable(self.built[name, copy.index], [weight, out])[1]
        return self.done[key]


def pack_constant_weights(mod, functions=None, target=None):
    """``mod`` with the weight copies of its offloaded PrimFuncs run once, at compile time;
    returns (module, `PackedWeights`). ``functions``: the PrimFuncs to look at (default: those
    `OffloadTIR` rewrote). ``target``: where the copies run (default this CPU; a copy is a
    copy, whatever the model's target). A chain of copies (a bf16 weight widened to float32,
    then re-laid-out, then padded) is packed copy by copy until none is left: after the first
    is run, the second reads a constant."""
    report = PackedWeights()
    while True:
        mod, done = _pack_once(mod, functions, target)
        if not done.functions:
            return mod, report
        for name, params in done.functions.items():
            report.functions[name] = report.functions.get(name, ()) + params
            report.bytes_per_call[name] = report.bytes_per_call.get(name, 0) + done.bytes_per_call[name]


def _pack_once(mod, functions, target):
    """One round of `pack_constant_weights`: the first copy of each constant weight."""
    target = target or host_target()
    constants = constant_arguments(mod)
    report, plans = PackedWeights(), {}
    for gv, func in mod.functions.items():
        if not isinstance(func, tirx.PrimFunc):
            continue
        chosen = (OFFLOADED_ATTR in (func.attrs or {})) if functions is None else gv.name_hint in functions
        copies = weight_copies(func, constants.get(gv.name_hint, ())) if chosen else []
        if copies:
            plans[gv] = (func, copies)
            report.functions[gv.name_hint] = tuple(str(c.param.name) for c in copies)
            report.bytes_per_call[gv.name_hint] = sum(
                int(np.prod([int(d) for d in c.packed.shape])) * dtype_bytes(str(c.packed.dtype)) for c in copies)
    if not plans:
        return mod, report
    return _with_packed(mod, plans, _Packer(target)), report


def _with_packed(mod, plans: dict, packer: _Packer):
    """``mod`` with each planned PrimFunc replaced by its packed form under the same name (a
    new GlobalVar: a PrimFunc's GlobalVar carries its signature) and every call to it passing
    its constants packed."""
    builder = relax.BlockBuilder(tvm.IRModule({g: f for g, f in mod.functions.items() if g not in plans},
                                              attrs=mod.attrs))
    renamed = {old: builder.add_func(packed_function(*plan), old.name_hint) for old, plan in plans.items()}

    def rewrite(call):
        func, copies = plans[call.args[0]]
        args = list(call.args[1].fields)
        for c in copies:
            args[c.index] = relax.const(packer.pack(call.args[0].name_hint, c, func, args[c.index]))
        return relax.Call(call.op, [renamed[call.args[0]], relax.Tuple(args), *call.args[2:]],
                          call.attrs, call.ty_args)

    return replace_call_tir(builder.get(), set(plans), rewrite)


def PackConstantWeights(functions=None, target=None, report: PackedWeights | None = None):
    """The pass form of `pack_constant_weights`; run it after `OffloadTIR`. Pass a
    `PackedWeights` to collect what it packed."""
    report = report if report is not None else PackedWeights()

    @tvm.transform.module_pass(opt_level=0, name="tirbyoc.PackConstantWeights")
    def _pass(mod, _ctx):
        new, done = pack_constant_weights(mod, functions, target)
        report.functions.update(done.functions)
        report.bytes_per_call.update(done.bytes_per_call)
        return new

    _pass.report = report
    return _pass


__all__ = ["OFFLOADED_ATTR", "PackConstantWeights", "PackedWeights", "constant_arguments",
           "pack_constant_weights", "packed_function", "packing_function", "weight_copies"]
