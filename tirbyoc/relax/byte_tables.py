"""`ByteTables`: a quantized model's elementwise chains from one 8-bit tensor to another as
256-entry tables, computed once by TVM's own build of the same chain.

ONNX Runtime's QDQ flow leaves a quantized BERT's GELU as fourteen elementwise steps over
``[tokens, 3072]`` - dequantize, ``/ sqrt(2)``, quantize, dequantize, ``erf`` (a scalar libm
call per element), quantize, ... - that TVM runs one loop nest each, reading and writing the
whole tensor every time: 0.8 ms a layer on one Zen 4 core, more than the FFN1 core's own
write-back. Each output byte of such a chain is a function of the input byte at the same
position (`tirbyoc.relax.byte_chains` proves it), so the chain is the table

    table[t] = chain(t)  for the 256 values t of the input's dtype

and the model computes ``table[q]``: one load per element, in a lookup PrimFunc that TVM's
fusion puts in the producer's function (an integer core's write-back takes it). The table is computed at build time by
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

from tirbyoc._tvm import is_host_target
from tirbyoc.errors import last_line
from tirbyoc.relax.byte_chains import ByteChain, byte_chains
from tirbyoc.relax.byte_softmax import byte_softmaxes, pair_function, pair_inputs, softmax_of_bytes
from tirbyoc.relax.lookups import all_bytes, as_lookup, bits, run_with_tvm
from tirbyoc.relax.mutation import mutate_functions, reporting_pass


@dataclass
class ByteTableReport:
    """The chains `ByteTables` replaced, each as ``"source -> root: op, op, ..."``, the
    softmaxes whose exponentials became pair tables (``"source -> root"``), and why it
    replaced none where it did not run."""

    chains: list = field(default_factory=list)
    softmaxes: list = field(default_factory=list)
    skipped: str | None = None  # why it did not look (a target this machine does not run)
    failed: str | None = None  # why it found chains but replaced none (their tables did not build)

    @property
    def replaced(self) -> bool:
        return bool(self.chains or self.softmaxes)

    def add(self, other: "ByteTableReport") -> None:
        self.chains += other.chains
        self.softmaxes += other.softmaxes
        self.skipped = self.skipped or other.skipped
        self.failed = self.failed or other.failed

    def describe(self) -> str:
        """One line: how many chains and softmaxes became tables, the longest chain's operators."""
        if self.skipped or self.failed:
            return f"byte tables: none ({self.skipped or self.failed})"
        longest = max(self.chains, key=len).split(": ", 1)[-1] if self.chains else ""
        return (f"byte tables, computed once by TVM's build of the same operators: {len(self.chains)} "
                f"elementwise chain(s) from one 8-bit tensor to another as 256 entries"
                + (f" (the longest: {longest})" if longest else "")
                + f"; {len(self.softmaxes)} softmax(es) of dequantized bytes with exp as 256 x 256 entries")

    def to_json(self) -> dict:
        return {"chains": list(self.chains), "softmaxes": list(self.softmaxes), "skipped": self.skipped,
                "failed": self.failed}


def table_inputs(dtype: str, ndim: int) -> np.ndarray:
    """The 256 values of 8-bit ``dtype`` in the order the lookup indexes the table (by their
    bits: an int8 -1 is entry 255), shaped ``[1, ..., 1, 256]`` to keep the chain's ``axis``
    attributes valid."""
    return all_bytes(dtype).reshape((1,) * (ndim - 1) + (256,))


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


def compute_tables(chains: list[ByteChain], softmaxes: list, target) -> tuple[list, list]:
    """(each chain's 256 outputs, each softmax's 256 x 256 exponentials), computed together by
    TVM's default build for ``target`` of the model's own operators."""
    funcs, inputs = {}, {}
    for i, c in enumerate(chains):
        n = len(c.source.ty.shape)
        funcs[f"table{i}"], inputs[f"table{i}"] = _table_function(c, n), [table_inputs(str(c.source.ty.dtype), n)]
    for i, sm in enumerate(softmaxes):
        funcs[f"pairs{i}"], inputs[f"pairs{i}"] = pair_function(sm), pair_inputs(sm)
    out = run_with_tvm(funcs, inputs, target) if funcs else {}
    return [out[f"table{i}"] for i in range(len(chains))], [out[f"pairs{i}"] for i in range(len(softmaxes))]


def _lookup_compute(table, q):
    """``out[i...] = table[q[i...]]``, ``q`` read by its bits (`table_inputs`)."""
    return te.compute(q.shape, lambda *i: table(bits(q(*i))), name="byte_lookup")


def lookup(builder, table: np.ndarray, source) -> relax.Expr:
    """A call of a lookup PrimFunc (added to ``builder``'s module) computing
    ``table[source]``: its own function, not Relax's ``take`` (a gather, opaque to TVM's
    fusion), marked elementwise in ``source`` so that it joins its producer's function."""
    call = builder.call_te(_lookup_compute, relax.const(table), source, primfunc_name_hint="byte_lookup")
    return as_lookup(builder, call, 0)


@mutator
class _Lookups(PyExprMutator):
    """Rebinds each chain's root to a table lookup of its source, each softmax's to its pair
    table's lookups."""

    def __init__(self, mod, roots: dict, softmaxes: dict):
        super().__init__(mod)
        self.roots = roots  # root var -> (table, source var)
        self.softmaxes = softmaxes  # root var -> (table, _Softmax)

    def visit_var_binding_(self, binding):
        if binding.var in self.roots:
            table, source = self.roots[binding.var]
            value = lookup(self.builder_, table, self.visit_expr(source))
        elif binding.var in self.softmaxes:
            table, sm = self.softmaxes[binding.var]
            value = softmax_of_bytes(self.builder_, sm, table, self.visit_expr(sm.source))
        else:
            return super().visit_var_binding_(binding)
        self.builder_.emit_normalized(relax.VarBinding(binding.var, self.builder_.normalize(value)))


def byte_tables(mod, target) -> tuple[object, ByteTableReport]:
    """(``mod`` with every chain `byte_chains` finds as a table lookup, what it replaced).
    ``target``: the model's build target; a target this machine does not run leaves ``mod``
    as it is (its chain's arithmetic is that target's, not this CPU's)."""
    report = ByteTableReport()
    if not is_host_target(target):
        report.skipped = "the target is not this machine's: its tables cannot be computed here"
        return mod, report
    funcs = [f for _, f in mod.functions_items() if isinstance(f, relax.Function)]
    chains = [c for f in funcs for c in byte_chains(f)]
    softmaxes = [sm for f in funcs for sm in byte_softmaxes(f)]
    if not chains and not softmaxes:
        return mod, report
    try:
        tables, pairs = compute_tables(chains, softmaxes, target)
    except Exception as err:  # noqa: BLE001 - the chains stay as TVM builds them, with the reason
        report.failed = f"TVM could not build the tables here ({last_line(err)}): the chains stay as they are"
        return mod, report
    report.chains = [f"{c.source.name} -> {c.root.name}: {', '.join(c.ops)}" for c in chains]
    report.softmaxes = [f"{sm.source.name} -> {sm.root.name}" for sm in softmaxes]
    new = mutate_functions(mod, _Lookups(mod, {c.root: (t, c.source) for c, t in zip(chains, tables)},
                                         {sm.root: (t, sm) for sm, t in zip(softmaxes, pairs)}))
    return relax.transform.DeadCodeElimination()(new), report


def ByteTables(target, report: ByteTableReport | None = None):  # noqa: N802 - a pass
    """`byte_tables` as an IRModule pass for ``target``; ``report`` collects what it did."""
    return reporting_pass(lambda mod: byte_tables(mod, target), report, "tirbyoc.ByteTables")


__all__ = ["ByteTableReport", "ByteTables", "byte_tables", "compute_tables", "lookup", "table_inputs"]
