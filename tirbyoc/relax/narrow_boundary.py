"""A fused layer that ends in quantize -> dequantize stores the 8-bit value; its readers dequantize.

After TVM's fusion a QDQ model's projection shortcut (ResNet's downsampling 1x1 convolution)
is one PrimFunc ending in a quantize and a dequantize: it writes ``(m - z) * s`` in float32,
``m`` the quantized value (an integer in [0, 255] after its clip), and the residual block's
PrimFunc reads that float32 tensor. Fusion put the dequantize with its producer because the
quantized value had no other reader; an identity shortcut's dequantize sits in its reader
instead, since the value it reads has two. Here the projection's boundary is made the same:
the producer stores ``m`` as uint8 and each reader computes ``(float32(m) - z) * s`` itself, in
a block the CPU schedule inlines into its write-back. A quarter of the bytes are written and
read back, and the reader's residual sum becomes one of few values
(`tirbyoc.rewrite.cpu.finite_division` can then prove its division away).

Bit for bit the same: the reader computes the same two float32 operations on the same
integer (``float32`` of a byte is exact) that the producer did. Taken only where

* the producer's output is written by ``out = t * s`` from ``t = m - z`` (``s``, ``z`` float
  constants; ``t`` read by nothing else), ``m = clip(r, lo, hi)`` with integer bounds inside
  the 8-bit range, and ``r`` a rounded value (``round(...)``, or one plus an integer);
* the output is read by ``call_tir`` only, of PrimFuncs each called once, and the producer's
  PrimFunc is called once.

Anything else is left as TVM fused it.
"""

from __future__ import annotations

from tirbyoc._tvm import TensorLoad, expr_dtype, relax, root_block, s_tir, tirx, tvm, tvm_ffi
from tirbyoc.ir.tir_walk import at_iterators, perfect_nest, with_root_body
from tirbyoc.relax.bridge import call_counts, replace_call_tir
from tirbyoc.rewrite.cpu.exact_division import float_constant, is_round

_RANGES = {"uint8": (0, 255), "int8": (-128, 127)}
MARK = "tirbyoc.narrow_boundary"  # a changed PrimFunc's attribute: its "output" or an "input" is 8-bit


def _nests(func) -> list:
    """The root body's statements (each a loop nest around one block, in an unscheduled
    fused PrimFunc)."""
    body = root_block(func).body
    return list(body.seq) if isinstance(body, tirx.SeqStmt) else [body]


def _writers(func) -> dict:
    """buffer name -> (index in `_nests`, block) for each nest that is one block writing one
    buffer at its own iterators."""
    out = {}
    for i, stmt in enumerate(_nests(func)):
        nest = perfect_nest(stmt)
        if nest is None:
            continue
        block = nest[1].block
        store = block.body
        if len(block.writes) == 1 and isinstance(store, tirx.BufferStore) and at_iterators(store.indices, block):
            out[store.buffer.name] = (i, block)
    return out


def _load_at(expr, block):
    """The buffer ``expr`` loads at ``block``'s own iterators, else None."""
    if isinstance(expr, TensorLoad) and at_iterators(expr.indices, block):
        return expr.source
    return None


def _value(buffer, writers, depth: int = 4):
    """What ``buffer`` holds, its elementwise producers substituted for their loads (up to
    ``depth`` blocks back; each producer stores at its own iterators and is read at the
    reader's): an expression whose only loads are of what is not elementwise before it."""
    i_block = writers.get(buffer.name)
    if i_block is None or depth == 0:
        return None
    block = i_block[1]

    def inline(expr):
        source = _load_at(expr, block)
        inlined = _value(source, writers, depth - 1) if source is not None else None
        return expr if inlined is None else inlined

    return tvm_ffi.structural_map(block.body.value, [(TensorLoad, inline)])


def _rounded(expr) -> bool:
    """Whether ``expr`` is ``round(...)`` or a rounded value plus an integer constant."""
    shift = float_constant(expr.b) if isinstance(expr, tirx.Add) else None
    if shift is not None and shift.is_integer():
        expr = expr.a
    return is_round(expr)


def _clip_dtype(value) -> str | None:
    """The 8-bit dtype whose range holds ``clip(r, lo, hi)`` (``value``, either order of min and
    max) with ``r`` rounded and integer bounds; else None."""
    if not isinstance(value, (tirx.Max, tirx.Min)) or not isinstance(value.a, (tirx.Max, tirx.Min)):
        return None
    if type(value) is type(value.a) or not _rounded(value.a.a):
        return None
    bounds = [float_constant(value.b), float_constant(value.a.b)]
    if None in bounds or not all(b.is_integer() for b in bounds):
        return None
    lo, hi = min(bounds), max(bounds)
    return next((d for d, (a, b) in _RANGES.items() if a <= lo and hi <= b), None)


def _step(block, kind):
    """(the buffer loaded, the constant) of a block storing ``kind(load, constant)`` with the load
    at its own iterators; else None."""
    value = block.body.value
    constant = float_constant(value.b) if isinstance(value, kind) else None
    source = _load_at(value.a, block) if constant is not None else None
    return None if source is None else (source, constant)


def dequantized_output(func):
    """How ``func`` (a fused PrimFunc) dequantizes its output, where it is ``(m - z) * s`` of an
    8-bit value ``m`` (the module's docstring): (dtype of ``m``, its buffer, ``z``, ``s``, the
    nest writing the output, the nest of ``t = m - z``); else None."""
    out = func.params[-1]  # TVM 0.27: the parameters are the buffers
    writers = _writers(func)
    if str(out.dtype) != "float32" or out.name not in writers:
        return None
    w_index, w = writers[out.name]
    scaled = _step(w, tirx.Mul)
    if scaled is None or scaled[0].name not in writers or _read_elsewhere(func, scaled[0], w_index):
        return None
    t_index, t_block = writers[scaled[0].name]
    shifted = _step(t_block, tirx.Sub)
    if shifted is None or shifted[0].name not in writers:
        return None
    m = shifted[0]
    dtype = _clip_dtype(_value(m, writers))
    if dtype is None:
        return None
    return dtype, m, shifted[1], scaled[1], w_index, t_index


def _read_elsewhere(func, buffer, except_index: int) -> bool:
    """Whether a nest other than ``except_index`` reads ``buffer``."""
    for i, stmt in enumerate(_nests(func)):
        if i == except_index:
            continue
        found = []
        tvm_ffi.structural_walk(stmt, (TensorLoad, lambda n: found.append(n) if n.source.same_as(buffer) else None))
        if found:
            return True
    return False


def _point(indices) -> list:
    return [tvm.ir.Range.from_min_extent(i, tirx.IntImm(str(expr_dtype(i)), 1)) for i in indices]


def narrowed_producer(func, plan):
    """``func`` storing ``m`` (its 8-bit value) as its output instead of ``(m - z) * s``."""
    dtype, m, _z, _s, w_index, t_index = plan
    out = func.params[-1]
    narrow = tirx.decl_buffer(out.shape, dtype, out.name)
    nests = _nests(func)
    loops, realize = perfect_nest(nests[w_index])
    block = realize.block
    its = [iv.var for iv in block.iter_vars]
    store = tirx.BufferStore(narrow, tirx.Cast(dtype, tirx.BufferLoad(m, its)), its)
    new_block = s_tir.SBlock(block.iter_vars, [tirx.BufferRegion(m, _point(its))],
                             [tirx.BufferRegion(narrow, _point(its))], block.name_hint, store)
    stmt = s_tir.SBlockRealize(realize.iter_values, realize.predicate, new_block)
    for loop in reversed(loops):
        stmt = tirx.For(loop.loop_var, loop.min, loop.extent, loop.kind, stmt)
    t_buffer = perfect_nest(nests[t_index])[1].block.body.buffer
    kept = [stmt if i == w_index else s for i, s in enumerate(nests) if i != t_index]
    allocs = [b for b in root_block(func).alloc_buffers if not b.same_as(t_buffer)]
    func = with_root_body(func, tirx.SeqStmt(kept), allocs)
    params = list(func.params[:-1]) + [narrow]
    return tirx.PrimFunc(params, func.body, func.ret_type, func.attrs)


def dequantizing_reader(func, index: int, plan):
    """``func`` taking its parameter ``index`` as the 8-bit value, dequantized in a block of its
    own ahead of everything (into the float32 buffer the rest of ``func`` reads)."""
    dtype, _m, z, s, _w, _t = plan
    wide = func.params[index]
    narrow = tirx.decl_buffer(wide.shape, dtype, wide.name + "_q")
    loop_vars = [tirx.Var(f"ax{i}", str(expr_dtype(e))) for i, e in enumerate(wide.shape)]
    iter_vars = [tirx.IterVar(tvm.ir.Range.from_min_extent(tirx.IntImm(str(expr_dtype(e)), 0), e),
                              tirx.Var(f"v_ax{i}", str(expr_dtype(e))), tirx.IterVar.DataPar)
                 for i, e in enumerate(wide.shape)]
    its = [iv.var for iv in iter_vars]
    value = (tirx.Cast("float32", tirx.BufferLoad(narrow, its)) - tirx.FloatImm("float32", z)) \
        * tirx.FloatImm("float32", s)
    block = s_tir.SBlock(iter_vars, [tirx.BufferRegion(narrow, _point(its))], [tirx.BufferRegion(wide, _point(its))],
                         f"dequantize_{wide.name}", tirx.BufferStore(wide, value, its))
    stmt = s_tir.SBlockRealize(loop_vars, tirx.IntImm("bool", 1), block)
    for var, extent in reversed(list(zip(loop_vars, wide.shape))):
        stmt = tirx.For(var, tirx.IntImm(str(expr_dtype(extent)), 0), extent, tirx.ForKind.SERIAL, stmt)
    root = root_block(func)
    func = with_root_body(func, tirx.SeqStmt([stmt] + _nests(func)), list(root.alloc_buffers) + [wide])
    params = [narrow if i == index else p for i, p in enumerate(func.params)]
    return tirx.PrimFunc(params, func.body, func.ret_type, func.attrs)


def _bindings(mod):
    """(producer var -> (PrimFunc gv, call), var -> [(reader gv, parameter index)], var -> uses
    that are not a ``call_tir`` argument) over every Relax function of ``mod``."""
    call_tir = tvm.ir.Op.get("relax.call_tir")
    producers, readers, other = {}, {}, {}
    for func in mod.functions.values():
        if not isinstance(func, relax.Function):
            continue
        for block in func.body.blocks:
            for binding in block.bindings:
                value = binding.value
                is_call = isinstance(value, relax.Call) and value.op.same_as(call_tir)
                if is_call and len(value.args) == 2:
                    producers[binding.var] = (value.args[0], value)
                    for i, arg in enumerate(value.args[1].fields):
                        if isinstance(arg, relax.Var):
                            readers.setdefault(arg, []).append((value.args[0], i))
                    continue
                for var in relax.analysis.free_vars(value):
                    other[var] = True
        for var in relax.analysis.free_vars(func.body.body):
            other[var] = True
    return producers, readers, other


def narrow_boundaries(mod) -> tuple[object, list[str]]:
    """``mod`` (fused) with each dequantized output of the module's docstring stored as its
    8-bit value and dequantized by its readers; and the producers' names."""
    counts = call_counts(mod)
    producers, readers, other = _bindings(mod)
    new_funcs, narrowed = {}, {}
    for var, (gv, call) in producers.items():
        uses = readers.get(var, [])
        if not uses or var in other or counts.get(gv.name_hint, 0) != 1 or gv in new_funcs:
            continue
        if any(counts.get(g.name_hint, 0) != 1 or g in new_funcs or g.same_as(gv) for g, _ in uses):
            continue
        func = mod[gv]
        plan = dequantized_output(func) if isinstance(func, tirx.PrimFunc) else None
        if plan is None:
            continue
        new_funcs[gv] = narrowed_producer(func, plan)
        for g, index in uses:
            new_funcs[g] = dequantizing_reader(new_funcs.get(g, mod[g]), index, plan)
        out = call.ty_args[0]
        narrowed[gv] = relax.TensorType(out.shape, plan[0])
    if not narrowed:
        return mod, []
    # a GlobalVar carries its function's signature: the changed PrimFuncs move to new ones,
    # under a temporary name first (names are unique), then under their own, marked (the
    # builder reuses a function it already holds: the mark makes the second one new)
    calls = {gv: (new_funcs[gv], narrowed.get(gv)) for gv in new_funcs}
    names = {gv: gv.name_hint for gv in calls}
    mod, fresh = _moved_calls(mod, calls, {gv: names[gv] + "_narrowed" for gv in calls})
    marked = {fresh[gv]: (func.with_attr(MARK, "output" if out is not None else "input"), out)
              for gv, (func, out) in calls.items()}
    mod, _ = _moved_calls(mod, marked, {fresh[gv]: names[gv] for gv in calls})
    return mod, [gv.name_hint for gv in narrowed]


def _moved_calls(mod, calls: dict, names: dict):
    """(``mod`` with each PrimFunc of ``calls`` (gv -> (new PrimFunc, new output type or None))
    added under ``names[gv]``, its calls moved there (with the new output type where given) and
    the old GlobalVar dropped; old gv -> new gv)."""
    builder = relax.BlockBuilder(mod)
    fresh = {gv: builder.add_func(func, names[gv]) for gv, (func, _) in calls.items()}

    def moved(call):
        gv = call.args[0]
        return relax.call_tir(fresh[gv], call.args[1], calls[gv][1] or call.ty_args[0])

    return replace_call_tir(builder.get(), list(calls), moved), fresh


__all__ = ["dequantized_output", "dequantizing_reader", "narrow_boundaries", "narrowed_producer"]
