"""`ByteTables`: a quantized model's elementwise chains from one 8-bit tensor to another as
256-entry tables, computed once by TVM's own build of the same chain.

ONNX Runtime's QDQ flow leaves a quantized BERT's GELU as fourteen elementwise steps over
``[tokens, 3072]`` - dequantize, ``/ sqrt(2)``, quantize, dequantize, ``erf`` (a scalar libm
call per element), quantize, ... - that TVM runs one loop nest each, reading and writing the
whole tensor every time: 0.8 ms a layer on one Zen 4 core, more than the FFN1 core's own
write-back. Each output byte of such a chain is a function of the input byte at the same
position (`tirbyoc.relax.byte_chains` proves it), so the chain is the table

    table[t] = chain(t)  for the 256 values t of the input's dtype

and the model computes ``take(table, q)``: one load per element, fused by TVM into the
producer's function (an integer core's write-back). The table is computed at build time by
compiling the chain itself - the same Relax operators, legalized, fused and built by TVM for
the model's target - and running it over all 256 inputs, so every entry is what TVM's build of
the untouched model computes at that input, bit for bit (the model's verification checks it
again, end to end). Where it goes::

    QuantizedToInteger -> [FastMath] -> ByteTables(target) -> LegalizeOps -> ...

It runs for a target this machine runs (the table is computed here); for another (Hexagon,
CUDA: their erf is not this CPU's) the module is left as it is.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from tvm import relax, te
from tvm.relax.expr_functor import PyExprMutator, mutator

from tirbyoc._tvm import is_host_target, make_target, relax_vm, tirx, tvm
from tirbyoc.relax.byte_chains import ByteChain, byte_chains
from tirbyoc.relax.mutation import mutate_functions, reporting_pass


@dataclass
class ByteTableReport:
    """The chains `ByteTables` replaced, each as ``"source -> root: op, op, ..."``, and why
    it replaced none where it did not run."""

    chains: list = field(default_factory=list)
    skipped: str | None = None

    def add(self, other: "ByteTableReport") -> None:
        self.chains += other.chains
        self.skipped = self.skipped or other.skipped

    def describe(self) -> str:
        """One line: how many chains became tables, and the longest one's operators."""
        if self.skipped:
            return f"byte tables: none ({self.skipped})"
        longest = max(self.chains, key=len).split(": ", 1)[-1] if self.chains else ""
        return (f"byte tables: {len(self.chains)} elementwise chain(s) from one 8-bit tensor to another "
                f"computed once as 256-entry tables by TVM's build of the chain (the longest: {longest})")

    def to_json(self) -> dict:
        return {"chains": list(self.chains), "skipped": self.skipped}


def table_inputs(dtype: str, ndim: int) -> np.ndarray:
    """The 256 values of 8-bit ``dtype`` in the order `take` indexes the table: by the
    value's bits read as uint8 (so an int8 -1 is entry 255), shaped ``[1, ..., 1, 256]`` to
    keep the chain's ``axis`` attributes valid."""
    return np.arange(256, dtype=np.uint8).view(dtype).reshape((1,) * (ndim - 1) + (256,))


def _table_function(chain: ByteChain, ndim: int) -> relax.Function:
    """The chain as a Relax function of its source alone, over the 256 source values."""
    bb = relax.BlockBuilder()
    dtype = str(chain.source.ty.dtype)
    x = relax.Var("q", relax.TensorType((1,) * (ndim - 1) + (256,), dtype))
    with bb.function("table", [x]):
        with bb.dataflow():
            remap = {chain.source: x}
            for b in chain.bindings:
                args = [remap.get(a, a) if isinstance(a, relax.Var) else a for a in b.value.args]
                remap[b.var] = bb.emit(relax.Call(b.value.op, args, b.value.attrs))
            out = bb.emit_output(relax.op.reshape(remap[chain.root], (256,)))
        bb.emit_func_output(out)
    return bb.get()["table"]


def compute_tables(chains: list[ByteChain], target) -> list[np.ndarray]:
    """Each chain's 256 outputs, computed by TVM's default build for ``target`` of the chain's
    own operators (one build for all chains)."""
    if not chains:
        return []
    ndims = [len(chain.source.ty.shape) for chain in chains]
    mod = tvm.IRModule({f"table{i}": _table_function(c, n).with_attr("global_symbol", f"table{i}")
                        for i, (c, n) in enumerate(zip(chains, ndims))})
    vm = relax_vm(tvm.compile(mod, target=make_target(target)), tvm.cpu())
    return [vm[f"table{i}"](tvm.runtime.tensor(table_inputs(str(c.source.ty.dtype), n))).numpy()
            for i, (c, n) in enumerate(zip(chains, ndims))]


LOOKUP_ATTR = "tirbyoc.byte_lookup"  # a lookup PrimFunc's attribute: `fuse` takes it as elementwise


def _lookup_compute(table, q):
    """``out[i...] = table[q[i...]]``, an int8 ``q`` read by its bits as uint8 (`table_inputs`)."""
    def at(*i):
        v = q(*i)
        return table(v if q.dtype == "uint8" else v.astype("uint8"))
    return te.compute(q.shape, at, name="byte_lookup")


def lookup(builder, table: np.ndarray, source) -> relax.Expr:
    """A call of a `LOOKUP_ATTR` PrimFunc (added to ``builder``'s module) computing
    ``table[source]``. Its own function, not Relax's ``take``: TVM's fusion takes a gather for
    opaque, and the lookup is elementwise in ``source`` (the table is one constant, read whole),
    so `tirbyoc.relax.bridge.fuse` lets it join its producer's function."""
    call = builder.call_te(_lookup_compute, relax.const(table), source, primfunc_name_hint="byte_lookup")
    gv = call.args[0]
    builder.update_func(gv, builder.get()[gv].with_attr(LOOKUP_ATTR, True))
    return call


def elementwise_lookups(mod):
    """``mod`` (op patterns annotated) with each lookup PrimFunc's ``op_pattern`` elementwise
    (0): TVM's analysis takes its data-dependent index for opaque, which would keep it out of
    its producer's fused function."""
    for gv, func in list(mod.functions_items()):
        if isinstance(func, tirx.PrimFunc) and func.attrs is not None and LOOKUP_ATTR in func.attrs:
            mod[gv] = func.with_attr("op_pattern", 0)
    return mod


@mutator
class _Lookups(PyExprMutator):
    """Rebinds each chain's root to a table lookup of its source."""

    def __init__(self, mod, roots: dict):
        super().__init__(mod)
        self.roots = roots  # root var -> (table, source var)

    def visit_var_binding_(self, binding):
        if binding.var not in self.roots:
            return super().visit_var_binding_(binding)
        table, source = self.roots[binding.var]
        value = self.builder_.normalize(lookup(self.builder_, table, self.visit_expr(source)))
        self.builder_.emit_normalized(relax.VarBinding(binding.var, value))


def byte_tables(mod, target) -> tuple[object, ByteTableReport]:
    """(``mod`` with every chain `byte_chains` finds as a table lookup, what it replaced).
    ``target``: the model's build target; a target this machine does not run leaves ``mod``
    as it is (its chain's arithmetic is that target's, not this CPU's)."""
    report = ByteTableReport()
    if not is_host_target(target):
        report.skipped = "the target is not this machine's: its tables cannot be computed here"
        return mod, report
    chains = [c for _, f in mod.functions_items() if isinstance(f, relax.Function) for c in byte_chains(f)]
    if not chains:
        return mod, report
    tables = compute_tables(chains, target)
    roots = {c.root: (t, c.source) for c, t in zip(chains, tables)}
    report.chains = [f"{c.source.name} -> {c.root.name}: {', '.join(c.ops)}" for c in chains]
    new = mutate_functions(mod, _Lookups(mod, roots))
    return relax.transform.DeadCodeElimination()(new), report


def ByteTables(target, report: ByteTableReport | None = None):  # noqa: N802 - a pass
    """`byte_tables` as an IRModule pass for ``target``; ``report`` collects what it did."""
    return reporting_pass(lambda mod: byte_tables(mod, target), report, "tirbyoc.ByteTables")


__all__ = ["ByteTableReport", "LOOKUP_ATTR", "ByteTables", "elementwise_lookups", "byte_tables", "compute_tables", "lookup", "table_inputs"]
