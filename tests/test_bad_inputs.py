"""Bad input of every kind gets a clear error naming what and where, or a clean fallback -
never a segfault, a hang, or a TVM-internal traceback as the only message.

(Malformed intrinsic declarations and templates are also covered in test_declarations.py,
bad Dispatch rules in test_dispatch.py.)
"""

import json

import pytest
from tvm.script import tirx as T

import tirbyoc
from tirbyoc import (ExternLibrary, ExternLibraryError, Intrinsic, IntrinsicError, IntrinsicGroup,
                     Operand, Role, Runtime, Template, TemplateError, UnknownTemplateError,
                     VerificationError)
from tirbyoc.app.commands.cli import main
from tirbyoc.testing.workloads import matmul
from workloads import symbolic_matmul


def run_cli(args, capsys):
    code = main(args)
    return code, capsys.readouterr().err


# ----------------------------------------------------------------- declarations
def _gemm():
    return tirbyoc.get_template("blas").groups[0].compute


@pytest.mark.parametrize("make, error, message", [
    (lambda: Template("my accel", {"kind": "llvm"}, Runtime.LLVM), TemplateError, "must be an identifier"),
    (lambda: Template("acc", {"kind": "llvm"}, "quantum"), TemplateError, "runtime 'quantum' is not one of"),
    (lambda: Template("acc", "llvm -mcpu=x", Runtime.LLVM), TemplateError, "must be a TVM target dict"),
    (lambda: Template("acc", {"kind": "llvm"}, Runtime.LLVM, libraries=("libfoo.so",)), TemplateError,
     "libraries must be ExternLibrary"),
    (lambda: Template("blas", {"kind": "llvm"}, Runtime.EXTERN_C,
                      groups=(IntrinsicGroup("g", compute=_gemm()), IntrinsicGroup("g", compute=_gemm()))),
     TemplateError, "duplicate group names"),
    (lambda: Template("other", {"kind": "llvm"}, Runtime.EXTERN_C, groups=(IntrinsicGroup("g", compute=_gemm()),)),
     TemplateError, "must be named 'other.<short name>'"),
    (lambda: IntrinsicGroup("g", compute=_gemm(), resize="any"), IntrinsicError, "resize must be callable"),
    (lambda: IntrinsicGroup("g", compute=_gemm(), packed="tirbyoc_blas_matmul_nn"), IntrinsicError,
     "packed must be a PackedFunction"),
    (lambda: Operand("A", (0, 4), "int8"), IntrinsicError, "must be a non-empty tuple of positive ints"),
    (lambda: Operand("A", (4, 4), "int9"), IntrinsicError, "int9"),
], ids=["template-name", "runtime", "target-string", "library-type", "duplicate-groups",
        "intrinsic-prefix", "resize", "packed", "zero-extent", "bad-dtype"])
def test_bad_declarations(make, error, message):
    with pytest.raises(error, match=message):
        make()


def test_impl_reading_beyond_the_description_is_refused():
    @T.prim_func(s_tir=True)
    def desc(A: T.Buffer((8,), "int8", offset_factor=1), C: T.Buffer((8,), "int8", offset_factor=1)) -> None:
        with T.sblock("root"):
            T.reads(A[0:8])
            T.writes(C[0:8])
            for i in T.serial(8):
                with T.sblock("copy"):
                    vi = T.axis.remap("S", [i])
                    C[vi] = A[vi]

    @T.prim_func(s_tir=True)
    def impl(A: T.Buffer((16,), "int8", offset_factor=1), C: T.Buffer((8,), "int8", offset_factor=1)) -> None:
        with T.sblock("root"):
            T.reads(A[0:16])
            T.writes(C[0:8])
            C[T.ramp(0, 1, 8)] = A[T.ramp(8, 1, 8)]

    with pytest.raises(IntrinsicError, match=r"'A'.*shape"):
        Intrinsic.from_prim_funcs("t.over_read", Role.LOAD, desc, impl)


# ----------------------------------------------------------------- extern code
SRC = "int present(int x) { return x; }\n"


@pytest.fixture
def c_source(tmp_path):
    path = tmp_path / "lib.c"
    path.write_text(SRC)
    return path


@pytest.mark.parametrize("kwargs, message", [
    (dict(name="../evil"), "use letters, digits"),
    (dict(symbols=["present", "rm -rf"]), "not a C identifier"),
    (dict(defines=["X=1;rm"]), "unsafe define"),
    (dict(defines=["X=$(id)"]), "unsafe define"),
], ids=["path-name", "symbol", "define-semicolon", "define-subshell"])
def test_unsafe_library_declarations(c_source, kwargs, message):
    args = dict(name="lib", sources=[c_source], symbols=["present"])
    args.update(kwargs)
    with pytest.raises(ExternLibraryError, match=message):
        ExternLibrary(**args)


def test_unsafe_link_name_is_refused_before_compiling(c_source):
    lib = ExternLibrary("lib_link", [c_source], ["present"], libraries=lambda: ["m -Wl,--evil"])
    with pytest.raises(ExternLibraryError, match="unsafe link name"):
        lib.build()


def test_missing_source_and_compile_error(tmp_path):
    with pytest.raises(ExternLibraryError, match="does not exist"):
        ExternLibrary("lib_missing", [tmp_path / "nope.c"], ["f"]).build()
    bad = tmp_path / "bad.c"
    bad.write_text("int f( {\n")
    with pytest.raises(ExternLibraryError, match="compilation failed"):
        ExternLibrary("lib_bad", [bad], ["f"]).build()


def test_declared_symbol_missing_at_load(c_source):
    lib = ExternLibrary("lib_absent", [c_source], ["present", "absent"])
    with pytest.raises(ExternLibraryError, match=r"does not export \['absent'\]"):
        lib.load()


def test_no_usable_compiler(c_source, monkeypatch):
    monkeypatch.setenv("CC", "/nonexistent/cc")
    with pytest.raises(ExternLibraryError, match="no usable C compiler"):
        ExternLibrary("lib_nocc", [c_source], ["present"], defines=["UNIQUE_NOCC"]).build()


def test_call_to_an_unloaded_extern_symbol_is_caught_before_it_crashes():
    """TVM compiles a call_extern to a symbol nobody loaded, then segfaults at the first call."""
    @T.prim_func(s_tir=True)
    def calls_missing(A: T.Buffer((4,), "float32"), B: T.Buffer((4,), "float32")):
        with T.sblock("root"):
            T.reads(A[0:4])
            T.writes(B[0:4])
            T.evaluate(T.call_extern("int32", "tirbyoc_no_such_symbol", A.access_ptr("r"), B.access_ptr("w")))

    @T.prim_func(s_tir=True)
    def plain(A: T.Buffer((4,), "float32"), B: T.Buffer((4,), "float32")):
        for i in range(4):
            with T.sblock("B"):
                vi = T.axis.remap("S", [i])
                B[vi] = A[vi]

    with pytest.raises(VerificationError, match=r"calls extern symbol\(s\) \['tirbyoc_no_such_symbol'\]"):
        tirbyoc.verify(plain, calls_missing)


# --------------------------------------------------------------- workloads
def test_symbolic_shapes_are_checked_at_several_sizes_or_fall_back_with_the_iterator_named():
    sym = symbolic_matmul()
    out = tirbyoc.offload(sym, "blas")  # n stays a loop around a GEMV: checked at every size
    assert out.offloaded and out.verification.passed
    assert out.verification.reason == "checked with n = 1, 7, 16, 17, 131"
    vnni = tirbyoc.offload(symbolic_matmul(), "x86_vnni")  # float32 under an int8 intrinsic
    assert not vnni.offloaded and vnni.blocks[0].reason


def test_a_library_kernels_run_time_axis_inside_a_primfunc_is_a_reason():
    from tirbyoc_intrinsics.blas import _gemm_group

    gemm_only = Template("blas", {"kind": "llvm"}, Runtime.EXTERN_C, groups=(_gemm_group(False),))
    out = tirbyoc.offload(symbolic_matmul(), gemm_only)  # a GEMM of n rows: a whole call, not a tile
    assert not out.offloaded
    assert out.blocks[0].reason == ("main/C: axis vi has a size known only at run time; sgemm_nn takes it "
                                    "only as a whole-function library call")


def test_lowered_primfunc_is_refused_with_how_to_fix():
    @T.prim_func
    def lowered(A: T.Buffer((16,), "float32"), B: T.Buffer((16,), "float32")):
        for i in range(16):
            B[i] = A[i] * T.float32(2)

    with pytest.raises(ValueError, match=r"not schedulable TensorIR.*@T.prim_func\(s_tir=True\)"):
        tirbyoc.offload(lowered, "blas")


def test_unknown_template_and_policy():
    with pytest.raises(UnknownTemplateError, match="known"):
        tirbyoc.offload(matmul(16, 16, 16), "tpu_v9")
    with pytest.raises(Exception, match="policy"):
        tirbyoc.offload(matmul(16, 16, 16), "blas", policy="fastest")


# ------------------------------------------------------------------- files

@pytest.mark.parametrize("content, message", [
    (b"\x08\x07\x12\x04tirb", "is not a valid ONNX model"),  # a truncated protobuf
    (b"this is not a model\n", "is not a valid ONNX model"),
    (b"", "is not a valid ONNX model"),
], ids=["truncated", "text", "empty"])
def test_run_rejects_bad_onnx(tmp_path, capsys, content, message):
    pytest.importorskip("onnx")
    path = tmp_path / "model.onnx"
    path.write_bytes(content)
    code, err = run_cli(["run", "-q", "--model", str(path)], capsys)
    assert code == 2 and message in err and "Traceback" not in err


def test_onnx_import_executes_nothing_from_the_file(tmp_path, capsys):
    """A node of an unknown op whose attribute holds Python: import refuses the op, runs nothing."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    marker = tmp_path / "pwned"
    payload = f"__import__('pathlib').Path({str(marker)!r}).write_text('x')"
    node = helper.make_node("Evil", ["x"], ["y"], domain="com.evil", code=payload)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.evil", 1)])
    path = tmp_path / "evil.onnx"
    onnx.save(model, str(path))
    code, err = run_cli(["run", "-q", "--model", str(path)], capsys)
    # TVM's importer refuses the model: exit 3 (TVM could not import it), not a usage error
    assert code == 3 and str(path) in err and not marker.exists()


@pytest.mark.parametrize("source, message", [
    ("def f(:\n", "Python syntax error"),
    ("from tvm.script import ir as I, relax as R\n"
     "@I.ir_module\nclass A:\n    @R.function\n    def main(x: R.Tensor((2,), 'float32')):\n        return x\n"
     "@I.ir_module\nclass B:\n    @R.function\n    def main(x: R.Tensor((2,), 'float32')):\n        return x\n",
     "several candidates: A (Relax module), B (Relax module); choose one with --object"),
    ("from tvm.script import ir as I, relax as R\n"
     "@I.ir_module\nclass A:\n    @R.function\n    def main(x: R.Tensor(('n', 8), 'float32'), w: R.Tensor((8, 8), 'float32')):\n"
     "        return R.matmul(x, w)\n", "has no static shape"),
    ("import sys\nsys.exit(3)\n", "raised SystemExit"),
], ids=["syntax", "two-modules", "dynamic-shape", "sys-exit"])
def test_run_rejects_bad_python_models(tmp_path, capsys, source, message):
    path = tmp_path / "model.py"
    path.write_text(source)
    code, err = run_cli(["run", "-q", "-t", "blas", "--model", str(path)], capsys)
    assert code == 2 and message in err and "Traceback" not in err


def test_run_unknown_template_and_target(capsys):
    code, err = run_cli(["run", "-q", "-t", "tpu_v9"], capsys)
    assert code == 2 and "tpu_v9" in err
    code, err = run_cli(["run", "-q", "-t", "blas", "--target", "nosuchkind"], capsys)
    assert code == 2 and 'Target kind "nosuchkind" is not defined' in err and "Traceback" not in err


def test_run_on_a_template_that_cannot_run_here_says_so(capsys, monkeypatch):
    from tirbyoc.decl import host

    monkeypatch.setattr(host.shutil, "which", lambda prog: None)  # no qemu-hexagon
    code = main(["run", "-q", "--json", "-t", "hexagon_hvx", "-m", "builtin:cnn_int8"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["verified"] is None and "cannot run here" in out["not_run"]


def test_x86_vnni_without_vnni_names_its_emulation(capsys, monkeypatch):
    from tirbyoc.decl import host

    monkeypatch.setattr(host, "host_cpu_features", lambda: {"avx2"})  # a CPU without VNNI
    code = main(["run", "-q", "--json", "-t", "x86_vnni"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["verified"] is None and out["latency_ms"] == {}
    assert "lacks AVX-512 VNNI" in out["not_run"] and "-t x86_vnni_emulated" in out["not_run"]


def test_compiling_never_goes_through_a_shell(tmp_path, monkeypatch):
    """A source path full of shell syntax is one argument to the compiler, never a command."""
    monkeypatch.chdir(tmp_path)
    marker = tmp_path / "PWNED"
    weird = tmp_path / "lib;touch PWNED;$(touch PWNED)`touch PWNED`.c"
    weird.write_text(SRC)
    lib = ExternLibrary("lib_weird", [weird], ["present"])
    path = lib.build()
    assert path.exists() and not marker.exists()
    assert lib.load().present(41) == 41


def test_description_without_root_regions_is_refused():
    """A description whose root block does not declare what it reads and writes."""
    @T.prim_func(s_tir=True)
    def desc(A: T.Buffer((4,), "int8", offset_factor=1), C: T.Buffer((4,), "int8", offset_factor=1)) -> None:
        for i in T.serial(4):
            with T.sblock("copy"):
                vi = T.axis.remap("S", [i])
                C[vi] = A[vi]

    with pytest.raises(IntrinsicError, match="'t.noregions': description root block declares no T.writes"):
        Intrinsic.from_prim_funcs("t.noregions", Role.LOAD, desc, desc)
