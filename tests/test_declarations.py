"""Bad declarations fail at construction with an error that names the cause."""

import pytest
from tvm.script import tirx as T

import tirbyoc
from tirbyoc import (
    Intrinsic, IntrinsicError, IntrinsicGroup, Layout, Operand, RegistrationConflict, Role,
    Runtime, Scope, ScopeError, Template, TemplateError, UnknownTemplateError,
)


def _copy_funcs(n=8, impl_dtype="int8", impl_scope="global", impl_strided=False):
    @T.prim_func(s_tir=True)
    def desc(A: T.Buffer((n,), "int8", offset_factor=1), C: T.Buffer((n,), "int8", offset_factor=1)) -> None:
        with T.sblock("root"):
            T.reads(A[0:n])
            T.writes(C[0:n])
            for i in T.serial(n):
                with T.sblock("copy"):
                    vi = T.axis.remap("S", [i])
                    C[vi] = A[vi]

    @T.prim_func(s_tir=True)
    def impl(A: T.Buffer((n,), impl_dtype, offset_factor=1, scope=impl_scope),
             C: T.Buffer((n,), "int8", offset_factor=1)) -> None:
        with T.sblock("root"):
            T.reads(A[0:n])
            T.writes(C[0:n])
            C[T.ramp(0, 1, n)] = T.reinterpret(A[T.ramp(0, 1, n)], dtype="int8x8") if impl_dtype == "uint8" else A[T.ramp(0, 1, n)]

    return desc, impl


def test_from_prim_funcs_derives_signature():
    desc, impl = _copy_funcs()
    intrin = Intrinsic.from_prim_funcs("t.copy8", Role.LOAD, desc, impl)
    assert [o.name for o in intrin.operands] == ["A", "C"]
    assert intrin.shape == (8,) and intrin.iter_kinds == "S"


def test_desc_impl_dtype_mismatch_names_buffer_and_field():
    desc, impl = _copy_funcs(impl_dtype="uint8")
    with pytest.raises(IntrinsicError, match=r"implementation buffer 'A'.*dtype uint8 != declared int8"):
        Intrinsic.from_prim_funcs("t.bad_dtype", Role.LOAD, desc, impl)


def test_desc_impl_scope_mismatch():
    desc, impl = _copy_funcs(impl_scope="global.vtcm")
    with pytest.raises(IntrinsicError, match=r"buffer 'A'.*scope 'global.vtcm' != declared 'global'"):
        Intrinsic.from_prim_funcs("t.bad_scope", Role.LOAD, desc, impl)


def test_two_blocks_in_desc():
    @T.prim_func(s_tir=True)
    def desc(A: T.Buffer((4,), "int8", offset_factor=1), C: T.Buffer((4,), "int8", offset_factor=1)) -> None:
        with T.sblock("root"):
            T.reads(A[0:4])
            T.writes(C[0:4])
            for i in T.serial(4):
                with T.sblock("one"):
                    vi = T.axis.remap("S", [i])
                    C[vi] = A[vi]
            for i in T.serial(4):
                with T.sblock("two"):
                    vi = T.axis.remap("S", [i])
                    C[vi] = C[vi] + A[vi]

    with pytest.raises(IntrinsicError, match=r"exactly one leaf block, found 2 \['one', 'two'\]"):
        Intrinsic.from_prim_funcs("t.two_blocks", Role.COMPUTE, desc, desc)


def test_declared_shape_disagrees_with_desc():
    desc, impl = _copy_funcs()
    bad = Intrinsic("t.shape", Role.LOAD, [Operand("A", (16,), "int8"), Operand("C", (16,), "int8")],
                    [("i", 16, "S")], lambda: (desc, impl))
    with pytest.raises(IntrinsicError, match=r"description buffer 'A'.*shape \(8,\) != declared \(16,\)"):
        bad.validate()


def test_dense_impl_cannot_claim_strided_layout():
    desc, impl = _copy_funcs()
    with pytest.raises(IntrinsicError, match="declared row-strided but the implementation buffer has no strides"):
        Intrinsic.from_prim_funcs("t.strided", Role.LOAD, desc, impl, layouts={"A": Layout.row_strided()})


def test_builder_failure_is_reported_with_the_intrinsic_name():
    def broken():
        raise RuntimeError("boom")

    intrin = Intrinsic("t.broken", Role.LOAD, [Operand("A", (4,), "int8")], [("i", 4, "S")], broken)
    with pytest.raises(IntrinsicError, match=r"'t.broken': its builder failed: RuntimeError: boom"):
        intrin.validate()


@pytest.mark.parametrize("kwargs, message", [
    (dict(capacity=-1), "capacity is -1 bytes; it must be positive"),
    (dict(capacity=0), "capacity is 0 bytes"),
    (dict(alignment=3), "alignment 3 must be a positive power of two"),
])
def test_bad_scope(kwargs, message):
    with pytest.raises(ScopeError, match=message):
        Scope("local.scratch", **kwargs)


def test_bad_scope_name():
    with pytest.raises(ScopeError, match="not a TVM storage scope"):
        Scope("bad scope")


def _vnni():
    return tirbyoc.get_template("x86_vnni")


def test_template_unknown_scope():
    from tirbyoc_intrinsics import hexagon_hvx

    with pytest.raises(ScopeError, match=r"operand 'A' uses unknown scope 'global.vtcm'"):
        Template("hexagon_hvx", {"kind": "llvm"}, Runtime.LLVM,
                 groups=(IntrinsicGroup("g", compute=hexagon_hvx.vrmpy("uint8", "uint8", "global.vtcm")),))


def test_template_capacity_too_small():
    from tirbyoc_intrinsics import vta

    with pytest.raises(ScopeError, match=r"does not fit scope 'local.wgt_buffer' of 1024 bytes"):
        vta.make_template(block_in=64, block_out=64, wgt_kib=1)


def test_template_duplicate_scope_and_bad_target():
    with pytest.raises(TemplateError, match="duplicate scope names"):
        Template("d", {"kind": "llvm"}, Runtime.LLVM, scopes=(Scope("x"), Scope("x")))
    with pytest.raises(TemplateError, match="target must be a TVM target dict"):
        Template("d", "llvm -mcpu=cascadelake", Runtime.LLVM)
    with pytest.raises(TemplateError, match="emulates must name an instruction"):
        Template("d", {"kind": "llvm"}, Runtime.LLVM, emulates=True)


def test_group_role_checked():
    vnni = _vnni()
    with pytest.raises(IntrinsicError, match="compute slot holds 'x86_vnni.zero_16_int32' whose role is init"):
        IntrinsicGroup("g", compute=vnni.intrinsic("zero_16_int32"))


def test_intrinsic_names_must_carry_template_prefix():
    vnni = _vnni()
    with pytest.raises(TemplateError, match="must be named 'other.<short name>'"):
        Template("other", {"kind": "llvm"}, Runtime.LLVM, groups=vnni.groups)


def test_registration_is_idempotent_and_conflicts_are_errors():
    desc, impl = _copy_funcs()
    a = Intrinsic.from_prim_funcs("t.reg_copy", Role.LOAD, desc, impl)
    assert a.register() == a.register() == "t.reg_copy"
    desc2, impl2 = _copy_funcs(n=16)
    b = Intrinsic.from_prim_funcs("t.reg_copy", Role.LOAD, desc2, impl2)
    with pytest.raises(RegistrationConflict, match="'t.reg_copy' is already registered"):
        b.register()


def test_unknown_template_lists_known():
    with pytest.raises(UnknownTemplateError, match="known templates: blas, cuda_mma, hexagon_hvx, vta, x86_amx, x86_amx_bf16, x86_amx_bf16_emulated, x86_amx_emulated, x86_avx2, x86_avx2_gemm, x86_avx512_bf16, x86_avx512bw, x86_fp32_avx2, x86_fp32_avx512, x86_vnni"):
        tirbyoc.get_template("npu")


def test_register_template_conflict():
    vnni = _vnni()
    tirbyoc.register_template(vnni)  # same object: fine
    clone = Template("x86_vnni", dict(vnni.target), vnni.runtime, groups=vnni.groups)
    with pytest.raises(RegistrationConflict):
        tirbyoc.register_template(clone)


def test_vta_parameters_validated():
    from tirbyoc_intrinsics import vta

    with pytest.raises(ValueError, match="block_out must be a positive int"):
        vta.make_template(block_out=0)
    t = vta.make_template(batch=2, block_in=8, block_out=32, acc_kib=64)
    assert t.intrinsic("gemm_2x8x32").shape == (2, 32, 8)
    assert t.scope("local.acc_buffer").capacity == 64 * 1024


def test_a_simulator_configured_unlike_its_scopes_is_refused():
    """The scratchpad planner tiles for the scopes' capacities and the simulator enforces its
    own: a template where they differ would refuse its own programs at run time."""
    from dataclasses import replace

    from tirbyoc.errors import TemplateError
    from tirbyoc.sim import Simulator

    vta = tirbyoc.get_template("vta")
    caps = list(vta.simulator.config.capacities)
    caps[2] //= 2
    bad = Simulator(replace(vta.simulator.config, capacities=tuple(caps)))
    with pytest.raises(TemplateError, match="accumulator|acc_buffer"):
        replace(vta, simulator=bad)


def test_extern_symbols_are_read_from_the_ir_not_its_text():
    """A symbol named in a string (an attribute, a comment) is not a call."""
    from tvm.script import tirx as T

    from tirbyoc.decl.extern import extern_symbols, missing_symbols

    @T.prim_func(s_tir=True)
    def func(A: T.Buffer((4,), "float32")):
        T.func_attr({"note": "call_extern('int32', 'only_in_a_string')"})
        T.evaluate(T.call_extern("int32", "tirbyoc_absent_symbol", A.data))

    assert extern_symbols(func) == ["tirbyoc_absent_symbol"]
    assert missing_symbols(func) == ["tirbyoc_absent_symbol"]


def test_a_dot_product_family_is_declared_once_and_shared():
    """x86_vnni, x86_avx2 and hexagon_hvx take their dot products' and zero fills' signature
    and description from tirbyoc's families (only the implementation is theirs); the family's
    description is the TVMScript each of them wrote by hand before."""
    from tvm.script import tirx as T

    from tirbyoc import dot_product_desc, dot_product_signature, zero_fill_desc
    from tirbyoc._tvm import tvm_ffi

    @T.prim_func(s_tir=True)
    def desc(A: T.Buffer((4,), "uint8", offset_factor=1), B: T.Buffer((16, 4), "int8", offset_factor=1),
             C: T.Buffer((16,), "int32", offset_factor=1)) -> None:
        with T.sblock("root"):
            T.reads(C[0:16], A[0:4], B[0:16, 0:4])
            T.writes(C[0:16])
            for i, kk in T.grid(16, 4):
                with T.sblock("update"):
                    vi, vk = T.axis.remap("SR", [i, kk])
                    C[vi] = C[vi] + T.cast(A[vk], "int32") * T.cast(B[vi, vk], "int32")

    assert tvm_ffi.structural_equal(dot_product_desc(16, 4, "uint8", "int8", "int32"), desc)  # x86_vnni's
    operands, axes = dot_product_signature(16, 4, "uint8", "int8", "int32")
    assert [(o.name, o.shape, o.dtype) for o in operands] == [("A", (4,), "uint8"), ("B", (16, 4), "int8"),
                                                               ("C", (16,), "int32")]
    assert axes == [("i", 16, "S"), ("k", 4, "R")]
    for name in ("x86_vnni", "x86_avx2", "x86_avx512bw", "hexagon_hvx"):
        for group in tirbyoc.get_template(name).groups:
            dot, zero = group.compute, group.init
            (lanes,), (k,) = dot.operands[2].shape, dot.operands[0].shape
            a, b, acc = (o.dtype for o in dot.operands)
            scope = dot.operands[0].scope
            assert tvm_ffi.structural_equal(dot.desc, dot_product_desc(lanes, k, a, b, acc, scope)), dot.name
            assert tvm_ffi.structural_equal(zero.desc, zero_fill_desc(lanes, acc, scope)), zero.name
    for group in tirbyoc.get_template("vta").groups:  # VTA's accumulator reset: the zero fill, named reset
        if group.init is not None:
            (c,) = group.init.operands
            assert tvm_ffi.structural_equal(group.init.desc, zero_fill_desc(c.shape[0], c.dtype, c.scope, block="reset"))


def test_a_tile_copy_family_is_declared_once_and_shared():
    """VTA's DMA loads and stores, Hexagon's DMA into VTCM and cuda_mma's fragment loads and
    stores take their signature and description from the tile-copy family; the description is
    the TVMScript VTA wrote by hand (a narrowing store casts each element)."""
    from tvm.script import tirx as T

    from tirbyoc import tile_copy_desc, tile_copy_signature
    from tirbyoc._tvm import tvm_ffi

    @T.prim_func(s_tir=True)
    def desc(S: T.Buffer((16,), "int32", offset_factor=1, scope="local.acc_buffer"),
             D: T.Buffer((16,), "int8", offset_factor=1)) -> None:
        with T.sblock("root"):
            T.reads(S[0:16])
            T.writes(D[0:16])
            for j in T.serial(16):
                with T.sblock("copy"):
                    vj = T.axis.remap("S", [j])
                    D[vj] = T.cast(S[vj], "int8")

    assert tvm_ffi.structural_equal(tile_copy_desc((16,), "int32", "local.acc_buffer", "global", dst_dtype="int8"),
                                    desc)
    operands, axes = tile_copy_signature((8, 32), "int8", "global", "shared")
    assert [(o.name, o.shape, o.scope, o.layout.dense) for o in operands] == [("S", (8, 32), "global", False),
                                                                             ("D", (8, 32), "shared", False)]
    assert axes == [("i", 8, "S"), ("j", 32, "S")]
    copies = {i.name: i for name in ("vta", "hexagon_hvx", "cuda_mma") for g in tirbyoc.get_template(name).groups
              for i in (*g.loads, *((g.store,) if g.store is not None else ())) if len(i.operands) == 2}
    assert len(copies) >= 6, sorted(copies)
    for intrin in copies.values():
        src, dst = intrin.operands
        block = "copy" if intrin.name.startswith("vta.") else ("store" if "store" in intrin.name else "load")
        family = tile_copy_desc(src.shape, src.dtype, src.scope, dst.scope, dst_dtype=dst.dtype,
                                offset_factor=16 if intrin.name.startswith("cuda_mma.") else 1,
                                block=block)
        assert tvm_ffi.structural_equal(intrin.desc, family), intrin.name


def test_a_template_familys_variants_are_validated_records():
    from tirbyoc import DeclarationError, VectorVariant, variants

    ymm = VectorVariant("v_ymm", 8, "haswell", ["avx2", "fma"], "vfmadd231ps ymm")
    assert ymm.features == ("avx2", "fma") and ymm.target == {"kind": "llvm", "mcpu": "haswell", "num-cores": 2}
    assert ymm.requires().features == ("avx2", "fma")
    with pytest.raises(DeclarationError, match="lanes 12 must be a power of two"):
        VectorVariant("v", 12, "haswell", ("avx2",), "vpmaddwd ymm")
    with pytest.raises(DeclarationError, match="features must name the CPU features"):
        VectorVariant("v", 8, "haswell", (), "vpmaddwd ymm")
    with pytest.raises(DeclarationError, match="two variants are named 'v_ymm'"):
        variants(ymm, ymm)
    for name, lanes in (("x86_avx2", 8), ("x86_avx512bw", 16), ("x86_fp32_avx2", 8), ("x86_fp32_avx512", 16)):
        template = tirbyoc.get_template(name)
        assert template.groups[0].compute.operands[-1].shape == (lanes,), name
        assert template.target["mcpu"] in ("haswell", "skylake-avx512"), template.target


def test_a_cpu_template_declares_the_features_it_needs_as_data(monkeypatch):
    from tirbyoc import requires_cpu
    from tirbyoc.decl import host

    check = requires_cpu("avx512vnni", what="AVX-512 VNNI", instead="-t x86_vnni_emulated runs it emulated")
    assert check.features == ("avx512vnni",)
    monkeypatch.setattr(host, "host_cpu_features", lambda: {"avx2", "fma"})
    assert check() == "this CPU lacks AVX-512 VNNI (avx512vnni); -t x86_vnni_emulated runs it emulated"
    assert requires_cpu("avx2", "fma", instruction="vfmadd231ps ymm")() is None
    asked = []
    granted = requires_cpu("avx2", also=lambda: asked.append(1) or "Linux refused the tile state")
    assert granted() == "Linux refused the tile state" and asked == [1]  # asked once the features are there
    assert requires_cpu("amx-int8", instruction="tdpbusd", also=lambda: asked.append(2))() == \
        "this CPU lacks amx-int8 (tdpbusd)" and asked == [1]
    assert requires_cpu("avx512f", "fma", instruction="vfmadd231ps zmm")() == "this CPU lacks avx512f (vfmadd231ps zmm)"
    for name, features in [("x86_vnni", ("avx512vnni",)), ("x86_avx2", ("avx2",)), ("x86_avx512bw", ("avx512bw",)),
                           ("x86_fp32_avx2", ("avx2", "fma")), ("x86_fp32_avx512", ("avx512f",))]:
        assert tirbyoc.get_template(name).requires.features == features, name
    with pytest.raises(ValueError):
        requires_cpu()


def test_the_docs_walk_declares_offloads_and_verifies_a_template():
    """docs/templates.md's walk, run as it is: a dot-product instruction in a few lines, a CPU
    template around it, a matmul offloaded and verified."""
    import re
    from pathlib import Path

    text = (Path(__file__).parent.parent / "docs" / "templates.md").read_text()
    (block,) = re.findall(r"<!-- the walk: [^>]*-->\n```python\n(.*?)```", text, re.S)
    declared = block[:block.index("out = tirbyoc.offload")]
    dot = declared[declared.index("def dot_8x4"):declared.index("TEMPLATE =")]
    assert len([line for line in dot.splitlines() if line.strip()]) <= 15
    assert len([line for line in declared.splitlines() if line.strip()]) <= 40
    scope: dict = {}
    exec(compile(block, "docs/templates.md", "exec"), scope)
    out = scope["out"]
    assert out.coverage == 1.0 and out.verification.passed and out.verification.max_abs_err == 0


def test_an_implementation_is_written_from_the_instructions_vector_value():
    """`vector_impl` writes the TVMScript x86_vnni wrote by hand: the buffers and regions from
    the signature, one vector store of the instruction's value (or one lane at a time); an
    output that is no vector is refused with its shape."""
    from tvm.script import tirx as T

    from tirbyoc import IntrinsicError, Operand, dot_product_signature, vector_impl
    from tirbyoc_intrinsics.x86_vnni import vpdpbusd
    from tirbyoc._tvm import tvm_ffi

    @T.prim_func(s_tir=True)
    def impl(A: T.Buffer((4,), "uint8", offset_factor=1), B: T.Buffer((16, 4), "int8", offset_factor=1),
             C: T.Buffer((16,), "int32", offset_factor=1)) -> None:
        with T.sblock("root"):
            T.reads(C[0:16], A[0:4], B[0:16, 0:4])
            T.writes(C[0:16])
            C[T.ramp(T.int32(0), 1, 16)] = T.call_llvm_pure_intrin(
                T.llvm_lookup_intrinsic_id("llvm.x86.avx512.vpdpbusd.512"), C.vload([0], dtype="int32x16"),
                T.reinterpret(T.broadcast(T.reinterpret(A.vload([0], "uint8x4"), dtype="int32"), 16), dtype="int8x64"),
                B.vload([0, 0], dtype="int8x64"), dtype="int32x16")

    operands, _ = dot_product_signature(16, 4, "uint8", "int8", "int32")
    assert tvm_ffi.structural_equal(vector_impl(operands, vpdpbusd), impl)
    assert tvm_ffi.structural_equal(tirbyoc.get_template("x86_vnni").groups[0].compute.impl, impl)
    lanes = vector_impl(operands, lambda T, A, B, C, i: C[i] + T.cast(A[0], "int32"), per_lane=True)
    assert "T.vectorized(16)" in lanes.script()
    with pytest.raises(IntrinsicError, match=r"output C is \(4, 4\)"):
        vector_impl([Operand("A", (4,), "int8"), Operand("C", (4, 4), "int32")], lambda T, A, C: A[0])

