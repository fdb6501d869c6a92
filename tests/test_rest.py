"""The functions no template took: fused, in parallel rows and vectors, bit for bit as TVM's
build computes them (a float model's sums in vector lanes and its exp as vector arithmetic,
within float rounding); and whole library matmuls on TVM's thread pool."""

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import relax
from vnni import NAME

import tirbyoc
from tirbyoc._tvm import make_target, relax_vm, tirx
from tirbyoc.offloading.lowering import PIPELINE
from tirbyoc.offloading.verification import specialize_symbolic
from tirbyoc.relax.bridge import OFFLOADED_ATTR, offload_module
from tirbyoc.relax.rest import RestSchedule, ScheduleRest, schedule_rest_of
from tirbyoc.rewrite.rest_schedule.nests import ROW_LANES_NOTE, SCHEDULED_ATTR, schedule_rest

TARGET = make_target({"kind": "llvm"})
AVX2 = 32  # bytes per vector: 8 float32 lanes


def legalized(build, shape, dtype="float32"):
    """The PrimFunc LegalizeOps makes of ``build(x)`` on one input of ``shape``."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, dtype))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(build(x))
        bb.emit_func_output(out)
    mod = relax.transform.LegalizeOps()(bb.get())
    return next(f for f in mod.functions.values() if isinstance(f, tirx.PrimFunc))


def loops(func):
    found = []
    tvm_ffi.structural_walk(func, (tirx.For, found.append), order="pre")
    return [(int(l.kind), int(l.extent)) for l in found]


PARALLEL, VECTORIZED, SERIAL = 1, 2, 0


def run(func, *arrays):
    exe = tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target=TARGET)
    out = tvm.runtime.empty([int(d) for d in func.params[-1].shape], str(func.params[-1].dtype))
    exe(*[tvm.runtime.tensor(a) for a in arrays], out)
    return out.numpy()


def same_values(func, new, shape, low=-4.0, high=4.0, rtol=0.0):
    """Both functions on one input of ``shape`` (and random values for any other parameter):
    the same bits, or within ``rtol`` of the largest output."""
    rng = np.random.default_rng(0)
    x = [rng.uniform(low, high, shape).astype("float32")]
    x += [rng.uniform(0.5, 1.5, [int(d) for d in p.shape]).astype("float32") for p in func.params[1:-1]]
    a, b = run(func, *x), run(new, *x)
    if rtol:
        np.testing.assert_allclose(b, a, rtol=0, atol=rtol * np.abs(a).max())
    else:
        assert np.array_equal(a, b), np.abs(a - b).max()


def test_an_elementwise_nest_runs_parallel_rows_of_vectors_with_the_same_bits():
    func = legalized(lambda x: relax.op.erf(x), (1, 128, 64))
    new, nests = schedule_rest(func, AVX2)
    assert [(n.parallel, n.lanes) for n in nests] == [(128, 8)]  # rows of 8 vectors each
    assert loops(new) == [(PARALLEL, 128), (SERIAL, 8), (VECTORIZED, 8)]
    same_values(func, new, (1, 128, 64))


def _quantized_image(x):
    """A QDQ model's input: quantize (divide, round, add the zero point, clip, cast), then
    NCHW -> NHWC; and beside it a dequantize-like product feeding a sum."""
    q = relax.op.clip(relax.op.add(relax.op.round(relax.op.divide(x, relax.const(0.0078431, "float32"))),
                                   relax.const(127.0, "float32")), 0, 255)
    return relax.op.permute_dims(relax.op.astype(q, "uint8"), [0, 2, 3, 1])


def fused(build, shape):
    """The one PrimFunc TVM's operator fusion makes of ``build(x)``'s elementwise chain."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(build(x))
        bb.emit_func_output(out)
    mod = relax.transform.LegalizeOps()(bb.get())
    mod = relax.transform.FuseTIR()(relax.transform.FuseOps()(relax.transform.AnnotateTIROpPattern()(mod)))
    (func,) = [f for f in mod.functions.values() if isinstance(f, tirx.PrimFunc)]
    return func


def blocks_of(func) -> list:
    from tirbyoc._tvm import iter_blocks

    return [b.name_hint for b in iter_blocks(func.body) if b.name_hint != "root"]


def test_an_elementwise_chain_is_one_pass_a_product_feeding_a_sum_stays_apart():
    func = fused(_quantized_image, (1, 3, 32, 32))
    new, nests = schedule_rest(func, AVX2)
    assert [n.inlined for n in nests if n.inlined] == [4], nests
    # divide, round, add, clip, cast: one nest; the transpose reads it in its own
    assert len(blocks_of(func)) == 6 and len(blocks_of(new)) == 2, blocks_of(new)
    rng = np.random.default_rng(3)
    x = rng.uniform(-1.2, 1.2, (1, 3, 32, 32)).astype("float32")
    x.flat[:64] = (np.arange(64) - 32 + 0.5).astype("float32") * np.float32(0.0078431)  # near ties
    assert np.array_equal(run(func, x), run(new, x))

    scaled = fused(lambda x: relax.op.add(relax.op.multiply(x, relax.const(0.37, "float32")),
                                              relax.const(1.5, "float32")), (64, 64))
    kept, _ = schedule_rest(scaled, AVX2)
    assert len(blocks_of(kept)) == 2  # an FMA would round once where TVM's build rounds twice
    same_values(scaled, kept, (64, 64))


def test_a_reduction_runs_its_rows_in_parallel_its_max_in_lanes_and_its_float_sum_in_order():
    func = legalized(lambda x: relax.op.nn.softmax(x), (2, 4, 32, 48))
    new, nests = schedule_rest(func, AVX2)
    by_block = {n.block: n for n in nests}
    assert len(nests) == 4 and all(n.parallel == 2 * 4 * 32 for b, n in by_block.items() if b != "T_softmax_expsum")
    # the float sum: each row in order, a vector of 8 rows at a time (256 rows: 32 vectors in parallel)
    assert by_block["T_softmax_expsum"].parallel == 2 * 4 * 32 // 8
    assert by_block["T_softmax_expsum"].note == ROW_LANES_NOTE
    assert loops(new).count((SERIAL, 48)) == 1  # the sum's steps along the rows: in order
    assert {n.block: n.lanes for n in nests} == {"T_softmax_maxelem": 8, "T_softmax_exp": 8,
                                                 "T_softmax_expsum": 8, "T_softmax_norm": 8}
    assert "T.exp(" in new.script()  # libm's, as TVM's build
    same_values(func, new, (2, 4, 32, 48))


@pytest.mark.parametrize("reduce", ["max", "min"])
def test_a_whole_tensors_max_and_min_run_in_lanes_bit_for_bit(reduce):
    """A run-time quantizer's range (``DynamicQuantizeLinear``: the max and min of a whole
    activation, its rows known only at run time) in lanes along its last axis, across every
    other; the same bits as TVM's build."""
    seq = tirx.Var("seq", "int64")
    func = legalized(lambda x: getattr(relax.op, reduce)(x), (1, seq, 64))
    new, nests = schedule_rest(func, AVX2)
    assert [(n.lanes, n.parallel) for n in nests] == [(8, 0)]
    assert (VECTORIZED, 8) in loops(specialize_symbolic([new], {"seq": 1})[0])
    for rows in (1, 3, 20):
        f, g = specialize_symbolic([func, new], {"seq": rows})
        same_values(f, g, (1, rows, 64))


@pytest.mark.parametrize("layer", ["softmax", "layer_norm"])
def test_inexact_sums_in_lanes_and_exp_as_vector_arithmetic_within_rounding(layer):
    """``exact=False`` (a float model): every row reduction in lanes, no row summed element by
    element, no libm exp; the values TVM's within float rounding."""
    shape = (2, 4, 32, 48)
    build = {"softmax": lambda x: relax.op.nn.softmax(x),
             "layer_norm": lambda x: relax.op.nn.layer_norm(x, relax.const(np.ones(48, "float32")),
                                                            relax.const(np.zeros(48, "float32")), axes=[-1])}[layer]
    func = legalized(build, shape)
    new, nests = schedule_rest(func, AVX2, exact=False)
    reductions = [n for n in nests if n.block in ("T_softmax_maxelem", "T_softmax_expsum", "x_sum", "x_var_sum")]
    assert len(reductions) == 2 and all(n.lanes == 8 and n.parallel == 2 * 4 * 32 for n in reductions)
    assert (SERIAL, 48) not in loops(new) and "T.exp(" not in new.script()
    same_values(func, new, shape, rtol=1e-6)


def test_a_row_under_two_vectors_sums_a_vector_of_rows_at_a_time_and_across_rows_in_channel_vectors():
    """A row of 12 (under two vectors of 8) is not split into lanes: its rows are, 8 at a time,
    each summed in TVM's order (its max stays serial: a max's chain is short); a softmax along a
    non-innermost axis (a lane per row would gather across rows) takes the channel-wise
    reduction's schedule, vectors across the rows."""
    func = legalized(lambda x: relax.op.nn.softmax(x), (64, 12))
    new, nests = schedule_rest(func, AVX2, exact=False)
    assert [(n.block, n.lanes, n.parallel) for n in nests] == [("T_softmax_expsum", 8, 0)]
    # 8 vectors of rows, each an init vector and 12 steps in order over 8 lanes
    assert (SERIAL, 8) in loops(new) and loops(new).count((VECTORIZED, 8)) == 2
    same_values(func, new, (64, 12), rtol=1e-6)  # its exp as vector arithmetic
    exact, nests = schedule_rest(func, AVX2)
    assert [n.block for n in nests] == ["T_softmax_expsum"]
    same_values(func, exact, (64, 12))  # libm's exp, each row's sum in order: TVM's bits
    func = legalized(lambda x: relax.op.nn.softmax(x, axis=1), (4, 32, 64))
    new, nests = schedule_rest(func, AVX2, exact=False)
    assert "channel vectors" in {n.block: n.note for n in nests}["T_softmax_maxelem"]
    same_values(func, new, (4, 32, 64), rtol=1e-6)


def model(m=64, k=96, n=128):
    """matmul (offloaded to blas) -> GELU -> softmax -> layer norm: the rest of a transformer."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((m, k), "float32"))
    w = relax.const(np.random.default_rng(3).standard_normal((k, n)).astype("float32") * 0.1)
    gamma = relax.const(np.ones(n, "float32"))
    beta = relax.const(np.zeros(n, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            h = bb.emit(relax.op.matmul(x, w))
            g = bb.emit(relax.op.nn.gelu(h))
            s = bb.emit(relax.op.nn.softmax(g))
            out = bb.emit_output(relax.op.nn.layer_norm(s, gamma, beta, axes=[-1]))
        bb.emit_func_output(out)
    return relax.transform.LegalizeOps()(bb.get())


def outputs(mod, x):
    vm = relax_vm(tvm.compile(mod, target=TARGET), tvm.cpu())
    return vm["main"](tvm.runtime.tensor(x)).numpy()


def test_the_module_pass_schedules_only_what_no_template_took_and_keeps_every_bit():
    offloaded, report = offload_module(model(), ["blas"])
    assert report.coverage == 1.0
    new, rest = schedule_rest_of(offloaded, TARGET, exact=True)
    assert isinstance(rest, RestSchedule) and rest.left >= 3 and rest.parallel == rest.left
    scheduled = {gv.name_hint for gv, f in new.functions.items()
                 if isinstance(f, tirx.PrimFunc) and SCHEDULED_ATTR in (f.attrs or {})}
    assert scheduled == set(rest.functions)
    assert not any(OFFLOADED_ATTR in (new[name].attrs or {}) for name in scheduled)
    assert 'R.call_dps_packed("tirbyoc_blas_matmul_nn"' in str(new["main"])  # the offload stays
    assert "with parallel loops" in rest.summary() and rest.to_json()["left"] == rest.left
    x = np.random.default_rng(0).standard_normal((64, 96)).astype("float32")
    assert np.array_equal(outputs(new, x), outputs(offloaded, x))


def test_a_float_model_by_default_sums_in_lanes_within_rounding():
    offloaded, _ = offload_module(model(), ["blas"])
    new, rest = schedule_rest_of(offloaded, TARGET)
    assert not rest.exact and "within float rounding" in rest.summary() and rest.to_json()["exact"] is False
    x = np.random.default_rng(0).standard_normal((64, 96)).astype("float32")
    np.testing.assert_allclose(outputs(new, x), outputs(offloaded, x), rtol=0, atol=2e-6)


def test_the_pass_form_fills_its_report_and_leaves_other_targets_alone():
    offloaded, _ = offload_module(model(), ["blas"])
    report = RestSchedule()
    ScheduleRest(TARGET, report)(offloaded)
    assert report.left >= 3 and report.vector_bytes in (16, 32, 64)
    same, none = schedule_rest_of(offloaded, {"kind": "cuda", "arch": "sm_80"})
    assert none is None and same.same_as(offloaded)


@pytest.mark.parametrize("shape_a, shape_b", [((200, 40), (40, 24)),  # more rows: split by rows
                                                ((24, 40), (40, 200)),  # more columns
                                                ((3, 33, 17), (3, 17, 50))])  # batched
@pytest.mark.parametrize("openblas_threads", [None, "2"])
def test_a_whole_library_matmul_shares_its_work_on_any_split(shape_a, shape_b, openblas_threads, monkeypatch):
    """The packed kernel cuts C into blocks on TVM's thread pool (or, with TIRBYOC_BLAS_THREADS,
    runs on OpenBLAS's own threads): every split gives numpy's product."""
    if openblas_threads:
        monkeypatch.setenv("TIRBYOC_BLAS_THREADS", openblas_threads)
    bb = relax.BlockBuilder()
    a = relax.Var("a", relax.TensorType(shape_a, "float32"))
    b = relax.Var("b", relax.TensorType(shape_b, "float32"))
    with bb.function("main", [a, b]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.matmul(a, b))
        bb.emit_func_output(out)
    offloaded, report = offload_module(relax.transform.LegalizeOps()(bb.get()), ["blas"])
    assert [f.extern for f in report.functions if f.macs] == ["tirbyoc_blas_matmul_nn"]
    rng = np.random.default_rng(5)
    xa, xb = rng.standard_normal(shape_a).astype("float32"), rng.standard_normal(shape_b).astype("float32")
    vm = relax_vm(tvm.compile(offloaded, target=TARGET), tvm.cpu())
    got = vm["main"](tvm.runtime.tensor(xa), tvm.runtime.tensor(xb)).numpy()
    np.testing.assert_allclose(got, xa @ xb, rtol=1e-5, atol=1e-4)


def test_the_loops_an_offloaded_function_left_serial_run_in_parallel_vectors():
    """An int8 matmul whose accumulator feeds two outputs of its function: the branches never
    join, so the chain after the core cannot go into its write-back and the offloaded function
    keeps serial elementwise loops; the pass gives those (and only those) parallel rows and
    vectors, and every value stays the same."""
    from tvm import te, topi

    target = make_target(dict(tirbyoc.get_template(NAME).target))
    rng = np.random.default_rng(6)
    w = rng.integers(-128, 128, (32, 48)).astype("int8")

    def core(x, weight):
        k = te.reduce_axis((0, 32), "k")
        acc = te.compute((128, 48), lambda i, j: te.sum(x[i, k].astype("int32") * weight[k, j].astype("int32"),
                                                         axis=k), name="matmul")
        real = topi.cast(acc, "float32")
        return [topi.multiply(real, tirx.const(0.01, "float32")), topi.sqrt(topi.abs(real))]

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((128, 32), "uint8"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(bb.emit_te(core, x, relax.const(w), primfunc_name_hint="matmul_two_outputs"))
        bb.emit_func_output(out)
    mod = bb.get()
    offloaded, report = offload_module(mod, [NAME])
    assert report.coverage == 1.0
    new, rest = schedule_rest_of(offloaded, target)
    assert rest.exact and len(rest.offloaded) == 1 and "offloaded function" in rest.summary()  # quantized
    (name,) = rest.offloaded
    assert OFFLOADED_ATTR in new[name].attrs and any(n.parallel for n in rest.offloaded[name])
    xs = rng.integers(0, 256, (128, 32)).astype("uint8")
    vm_new = relax_vm(tvm.compile(new, target=target, tir_pipeline=PIPELINE), tvm.cpu())
    vm_old = relax_vm(tvm.compile(offloaded, target=target, tir_pipeline=PIPELINE), tvm.cpu())
    a = [t.numpy() for t in vm_new["main"](tvm.runtime.tensor(xs))]
    b = [t.numpy() for t in vm_old["main"](tvm.runtime.tensor(xs))]
    assert len(a) == 2 and all(np.array_equal(p, q) for p, q in zip(a, b))


@pytest.mark.parametrize("rows", [1, 5, 70])
def test_rows_of_a_run_time_count_run_in_parallel_with_the_same_bits(rows):
    """A served model's layer norm and quantize (rows known only at run time): every nest's
    rows run in parallel whatever their count, each row's float sums in TVM's order, the
    elementwise nests in vectors along their static rows."""
    n = tirx.Var("n", "int64")

    def norm(x):
        y = relax.op.nn.layer_norm(x, relax.const(np.linspace(0.5, 1.5, 96, dtype="float32")),
                                   relax.const(np.linspace(-1, 1, 96, dtype="float32")), axes=[-1])
        return relax.op.multiply(y, relax.const(3.0, "float32"))

    func = legalized(norm, (n, 96))
    new, nests = schedule_rest(func, AVX2)
    assert nests and all(x.parallel for x in nests if not x.inlined), nests
    assert any(x.lanes == 8 for x in nests)  # the normalization's 96 columns in vectors
    kinds = []
    tvm_ffi.structural_walk(new, (tirx.For, lambda loop: kinds.append(int(loop.kind))), order="pre")
    assert kinds.count(PARALLEL) == len([x for x in nests if x.parallel])
    # both sums a vector of rows at a time, lanes along the run-time rows themselves
    assert [x.block for x in nests if x.note == ROW_LANES_NOTE] == ["x_sum", "x_var_sum"]
    np.testing.assert_array_equal(_run_sized(new, (rows, 96)), _run_sized(func, (rows, 96)))


@pytest.mark.parametrize("shape, lanes", [((16, 48), 8),  # known rows under run-time ones: lanes of them
                                          ((4, 48), 0)])  # too few known rows: no lanes (they would divide by n)
def test_row_sums_under_run_time_rows_take_their_lanes_from_the_known_ones(shape, lanes):
    """Rows ``[n, 16]`` (a served model's tokens by heads): the 16 known rows give the lanes,
    ``n`` the parallel loop; ``[n, 4]`` has no vector of known rows and keeps its sums whole
    rather than index every lane through a division by ``n``. The same bits either way."""
    n = tirx.Var("n", "int64")
    func = legalized(lambda x: relax.op.nn.softmax(x), (n, *shape))
    new, nests = schedule_rest(func, AVX2)
    summed = [x for x in nests if x.note == ROW_LANES_NOTE]
    assert [(x.block, x.lanes) for x in summed] == ([("T_softmax_expsum", lanes)] if lanes else [])
    for rows in (1, 3):
        np.testing.assert_array_equal(_run_sized(new, (rows, *shape)), _run_sized(func, (rows, *shape)))


def _run_sized(func, shape, seed=0):
    """``func`` (of symbolic extents) on inputs of ``shape`` (and random values for any other
    parameter), through TVM's default build."""
    rng = np.random.default_rng(seed)
    arrays = [rng.uniform(-4, 4, shape).astype("float32")]
    arrays += [rng.uniform(0.5, 1.5, [int(d) for d in p.shape]).astype("float32") for p in func.params[1:-1]]
    exe = tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target=TARGET)
    out = tvm.runtime.empty(list(shape), "float32")
    exe(*[tvm.runtime.tensor(a) for a in arrays], out)
    return out.numpy()
