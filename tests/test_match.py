"""The matcher: each flexibility with a positive case and a near miss with its reason."""

from pathlib import Path

import pytest
from workloads import conv2d, matmul, parse, symbolic_matmul

import tirbyoc
from tirbyoc import explain, match, match_chains

VNNI = "x86_vnni"


def best(func, target):
    (result,) = [r for r in explain(func, target) if r.block in ("C", "conv")]
    return result


# ---------------------------------------------------------------- iterators and loops
@pytest.mark.parametrize("order", ["ijk", "kji", "jki"])
def test_any_loop_order_gives_the_same_mapping(order):
    m = best(matmul(64, 64, 64, order=order), "blas").best
    assert m.intrinsic.name == "blas.sgemm_64x64x64_nn"
    assert m.mapping == {"vi": ("vi",), "vj": ("vj",), "vk": ("vk",)}
    assert m.direct and not m.padding


def test_unit_extent_iterators_are_ignored():
    # M = 1: the GEMV row is a unit iterator; VNNI has no M axis, so nothing is padded.
    m = best(matmul(1, 64, 64, "uint8", "int8", "int32", trans_b=True), VNNI).best
    assert m.mapping == {"vi": ("vj",), "vk": ("vk",)}
    assert m.outer == () and not m.padding


def test_batch_axis_maps_to_batched_intrinsic_or_stays_outer():
    f = matmul(64, 64, 64, batch=3)
    r = best(f, "blas")
    names = [m.intrinsic.name for m in r.matches]
    assert "blas.sgemm_64x64x64_nn" in names
    plain = next(m for m in r.matches if m.intrinsic.name == "blas.sgemm_64x64x64_nn")
    assert plain.outer == ("vb",) and plain.direct


def test_reduction_axis_missing_is_a_reason():
    f = parse('''
@T.prim_func(s_tir=True)
def main(A: T.Buffer((64, 64), "float32"), B: T.Buffer((64, 64), "float32"), C: T.Buffer((64, 64), "float32")):
    for i, j in T.grid(64, 64):
        with T.sblock("C"):
            vi, vj = T.axis.remap("SS", [i, j])
            C[vi, vj] = C[vi, vj] + A[vi, vj] * B[vi, vj]
''')
    r = best(f, "blas")
    assert r.best is None and "is not a reduction" in r.reason


# ----------------------------------------------------------------- extents, padding
@pytest.mark.parametrize("n,padded", [(15, 16), (16, 16), (17, 32), (63, 64), (64, 64), (65, 80)])
def test_extents_around_the_width_record_padding(n, padded):
    m = best(matmul(8, n, 64, "uint8", "int8", "int32", trans_b=True), VNNI).best
    axis = next(a for a in m.axes if a.axis == "vi")
    assert (axis.extent, axis.padded) == (n, padded)
    assert m.operand("C").direct == (n == padded)
    assert ("pad" in m.operand("B").staging) == (n != padded)


@pytest.mark.parametrize("k", [3, 63, 65])
def test_template_that_forbids_padding_says_which_axis(k):
    vnni = tirbyoc.get_template(VNNI)
    strict = tirbyoc.Template(name="strict_vnni", target=dict(vnni.target), runtime=vnni.runtime,
                              groups=(), extra=(_renamed_dot(),), allow_padding=False)
    r = best(matmul(16, 16, k, "uint8", "int8", "int32", trans_b=True), strict)
    assert r.best is None
    assert f"reduction axis vk (vk) has extent {k}" in r.reason
    assert "template forbids padding" in r.reason


def _renamed_dot():
    from tirbyoc_intrinsics.x86_vnni import dot_product

    d = dot_product()
    return tirbyoc.Intrinsic("strict_vnni.dot", d.role, d.operands, d.axes, d._build)


# ------------------------------------------------------------------------ layouts
def test_transposed_weights_choose_the_nt_intrinsic_in_place():
    m = best(matmul(64, 64, 64, trans_b=True), "blas").best
    assert m.intrinsic.name == "blas.sgemm_64x64x64_nt" and m.direct


def test_transposed_input_matches_with_a_transpose_staging():
    m = best(matmul(64, 64, 64, trans_a=True), "blas").best
    a = m.operand("A")
    assert not a.direct and a.staging == ("transpose",) and "another order" in a.reason


def test_commutative_multiply_binds_operands_by_role():
    m = best(matmul(64, 64, 64, swap_mul=True), "blas").best
    assert m.operand("A").buffer == "A" and m.operand("B").buffer == "B" and m.direct


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_conv2d_is_an_implicit_gemm(layout):
    """Channels x pixels for NCHW (the weight [O, C*kh*kw] times the im2col [C*kh*kw, H*W]),
    pixels x channels for NHWC: the GEMM whose staging copies run along the buffers' rows
    (the output written back in its own order, not transposed)."""
    m = best(conv2d(1, 32, 16, 16, 64, 3, 3, layout=layout), "blas").best
    mapping = m.mapping
    channels, pixels = ("vi", "vj") if layout == "NCHW" else ("vj", "vi")
    assert mapping[channels] == ("vf",)
    assert set(mapping["vk"]) == {"vrc", "vry", "vrx"}
    assert set(mapping[pixels]) == {"vy", "vx"}
    assert "reindex" in m.operand("A").staging
    assert all(o.keeps_order for o in m.operands)


def test_strided_dilated_conv_reindexes_the_data_window():
    m = best(conv2d(1, 64, 17, 17, 64, 3, 3, layout="NHWC", stride=2, dilation=2), "blas").best
    assert m.mapping["vj"] == ("vf",)
    assert not m.operand("A").direct


def test_int8_nhwc_conv_on_vnni_keeps_kernel_loops_outside():
    m = best(conv2d(1, 32, 8, 8, 64, 3, 3, layout="NHWC", dtype="uint8", wdtype="int8",
                    acc="int32"), VNNI).best
    assert m.mapping == {"vi": ("vf",), "vk": ("vrc",)}
    assert {"vry", "vrx"} <= set(m.outer)


# ------------------------------------------------------------------------ soundness
def test_vnni_weight_window_of_unpacked_B_must_be_packed():
    # The 16x4 window of B[N, K=128] is strided; TVM's tensorize would read it as dense.
    m = best(matmul(16, 16, 128, "uint8", "int8", "int32", trans_b=True), VNNI).best
    b = m.operand("B")
    assert not b.direct and b.pack and "is strided; the implementation reads it dense" in b.reason
    packed = b.layout_map()
    assert [int(x) for x in packed.map_shape([16, 128])] == [1, 32, 16, 4]


def test_vnni_weight_with_k_equal_4_is_read_in_place():
    m = best(matmul(16, 16, 4, "uint8", "int8", "int32", trans_b=True), VNNI).best
    assert m.direct


def test_row_strided_layout_needs_contiguous_rows():
    m = best(matmul(64, 64, 64, trans_b=False), "blas").best  # nn variant reads rows in place
    assert m.direct
    f = parse('''
@T.prim_func(s_tir=True)
def main(A: T.Buffer((64, 64), "float32"), B: T.Buffer((64, 128), "float32"), C: T.Buffer((64, 64), "float32")):
    for i, j, k in T.grid(64, 64, 64):
        with T.sblock("C"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                C[vi, vj] = T.float32(0)
            C[vi, vj] = C[vi, vj] + A[vi, vk] * B[vk, vj * 2]
''')
    m = best(f, "blas").best
    assert not m.operand("B").direct and "steps by 2" in m.operand("B").reason


def test_cuda_compute_operands_are_staged_into_fragments():
    f = matmul(64, 64, 64, "float16", "float16", "float32")
    m = next(x for x in best(f, "cuda_mma").matches if x.intrinsic.role.value == "compute")
    assert m.mapping == {"vi": ("vi",), "vj": ("vj",), "vk": ("vk",)}
    assert all("copy to wmma" in " ".join(o.staging) for o in m.operands)


# ------------------------------------------------------------------------- reasons
def test_reason_names_the_dtype():
    r = best(matmul(64, 64, 64, "float32", "int8", "int32", trans_b=True), VNNI)
    assert r.best is None and "operand A is float32" in r.reason and "uint8" in r.reason


def test_reason_names_the_operation():
    f = parse('''
@T.prim_func(s_tir=True)
def main(A: T.Buffer((8, 64), "int32"), C: T.Buffer((8,), "int32")):
    for i, k in T.grid(8, 64):
        with T.sblock("C"):
            vi, vk = T.axis.remap("SR", [i, k])
            with T.init():
                C[vi] = T.int32(-2147483648)
            C[vi] = T.max(C[vi], A[vi, vk])
''')
    r = best(f, VNNI)
    assert r.reason.endswith("body is max, intrinsic is multiply-add")


def test_missing_cast_is_reported_as_such():
    r = best(matmul(64, 64, 64, "float32", "float32", "float32"), "cuda_mma")
    assert "used as is; intrinsic wants float16 cast to float32" in r.reason


# --------------------------------------------------------------------------- init
def test_init_inside_or_outside_the_block():
    inside = best(matmul(32, 32, 32), "blas").best
    assert inside.init == "in-block"
    outside = [m for m in match(matmul(32, 32, 32, init="outside"), "blas") if m.block == "C"]
    assert outside and outside[0].init == "C_init"


# ----------------------------------------------------------------------- chains
def chain_workload(relu_floor: int):
    """The example's GEMM + bias + ReLU PrimFunc, with the ReLU's floor changed."""
    import runpy
    from pathlib import Path

    example = Path(__file__).parent.parent / "examples" / "gemm_workloads.py"
    src = runpy.run_path(str(example))["Workloads"]["dense_bias_relu"].script()
    return parse(src.replace("T.max(D[vi, vj], 0)", f"T.max(D[vi, vj], {relu_floor})"))


def test_gemm_bias_relu_chain_matches_the_vta_epilogue():
    (chain,) = match_chains(chain_workload(0), "vta")
    assert chain.blocks == ("dense", "bias", "relu")
    assert [i.split(".")[1] for i in chain.intrinsics] == ["gemm_1x16x16", "alu_add_16", "alu_relu_16"]


def test_chain_stops_where_the_epilogue_differs():
    (chain,) = match_chains(chain_workload(5), "vta")
    assert chain.blocks == ("dense", "bias")  # max(x, 5) is no ReLU


# -------------------------------------------------------------------- bad input
def test_unschedulable_function_is_a_clear_error():
    lowered = parse('''
@T.prim_func
def main(A: T.Buffer((16,), "float32"), B: T.Buffer((16,), "float32")):
    for i in range(16):
        B[i] = A[i]
''')
    with pytest.raises(ValueError, match="not schedulable TensorIR"):
        explain(lowered, "blas")


def test_symbolic_extent_on_an_intrinsic_axis():
    """A library GEMM takes vi's size at run time; a GEMV leaves the symbolic vi as a loop; a
    fixed-size tile intrinsic pads it to its width when the function runs."""
    r = best(symbolic_matmul(), "blas")
    assert r.best.intrinsic.name.startswith("blas.sgemm_") and r.best.runtime_axes == ("vi",)
    assert any(m.intrinsic.name.startswith("blas.sgemv_") and m.outer == ("vi",) for m in r.matches)
    tile = best(symbolic_matmul("float16", "float32"), "cuda_mma").best
    vi = next(a for a in tile.axes if a.axis == "vi")
    assert (vi.extent, vi.kernel_sized, vi.pads) == (None, False, True) and not tile.runtime_axes
    assert tile.symbolic_axes == ("vi",) and tile.padding == {"vi": ("vi", "a multiple of 16")}
    assert tile.operand("A").staging[0] == "pad"
    assert "pad vi vi->a multiple of 16 at run time" in tile.operand("A").reason


def test_a_symbolic_intrinsic_axis_needs_a_template_that_pads():
    vnni = tirbyoc.get_template(VNNI)
    strict = tirbyoc.Template(name="strict_vnni", target=dict(vnni.target), runtime=vnni.runtime,
                              groups=(), extra=(_renamed_dot(),), allow_padding=False)
    r = best(matmul(16, 16, 64, "uint8", "int8", "int32", trans_b=True, symbolic="n"), strict)
    assert r.best is None and r.mismatch.iterator == "vj"
    assert "iterator vj (axis vi) has a symbolic extent; the template forbids padding" in r.reason


# ------------------------------------------------------------- relax, fused, index maps
def test_fused_relax_primfunc_matches_its_conv_block():
    from tvm import relax
    from tvm.relax.frontend import nn

    class ConvRelu(nn.Module):
        def __init__(self):
            self.conv = nn.Conv2D(16, 32, 3, padding=1, bias=True)

        def forward(self, x):
            return nn.op.relu(self.conv(x))

    mod, _ = ConvRelu().export_tvm({"forward": {"x": nn.spec.Tensor((1, 16, 8, 8), "float32")}})
    mod = relax.transform.LegalizeOps()(mod)
    mod = relax.transform.FuseTIR()(relax.transform.FuseOps()(relax.transform.AnnotateTIROpPattern()(mod)))
    results = [r for r in explain(mod, "blas") if r.function.startswith("fused_")]
    blocks = {r.block: r for r in results}
    assert {"pad_temp", "conv2d_nchw", "compute"} <= set(blocks)
    assert blocks["conv2d_nchw"].best.mapping["vi"] == ("v_ff",)  # NCHW: channels x pixels
    assert blocks["compute"].best is None


def test_block_index_map_fuses_implicit_gemm_axes():
    m = best(conv2d(1, 8, 6, 6, 16, 3, 3), "blas").best
    imap = m.block_index_map()
    # iterators (vn, vf, vy, vx, vrc, vry, vrx) -> (outer..., i = vf, j = vy*4 + vx, k = (vrc*3 + vry)*3 + vrx)
    out = [int(x) for x in imap.map_indices([0, 5, 2, 3, 7, 1, 2])]
    assert out[-3:] == [5, 2 * 4 + 3, (7 * 3 + 1) * 3 + 2]


def test_two_buffers_with_one_name_offload():
    """Relax's legalization can name two parameters alike (a QDQ attention's q.k^T): the
    rewrite finds regions by name, so buffers are named apart first, and the offload works."""
    from tirbyoc.ir.normalize import unique_buffer_names
    from tirbyoc.testing.workloads import matmul
    from tvm import tirx
    from tvm_ffi import structural_map

    f = matmul(64, 96, 64, "int8", "int8", "int32")
    a, b = list(f.params)[:2]
    alike = tirx.decl_buffer(b.shape, str(b.dtype), str(a.name), data=b.data)
    f = structural_map(f, [(tirx.Buffer, lambda x: alike if x.same_as(b) else x)])
    assert [str(p.name) for p in f.params] == ["A", "A", "C"]
    assert [str(p.name) for p in unique_buffer_names(f).params] == ["A", "A_1", "C"]
    out = tirbyoc.offload(f, "vta")
    assert out.blocks[0].offloaded, out.blocks[0].reason
    assert out.verification.passed is True


def test_the_matcher_has_one_failure_protocol():
    # a failed check raises Refused; only the loops over alternatives record it (Refusals)
    from tirbyoc.matching.results import MatchStage, Refusals, refuse

    refusals = Refusals()
    for stage in (MatchStage.OPERATION, MatchStage.DTYPE, MatchStage.DTYPE):
        refusals.record(refuse(stage, f"{stage.name} {len(refusals.reasons)}"))
    assert refusals.most_specific(None).message == "DTYPE 1"  # the latest stage, the first of equals
    source = "".join(p.read_text() for p in (Path(tirbyoc.__file__).parent / "matching").glob("*.py"))
    assert ".append(Mismatch(" not in source and "failures" not in source
