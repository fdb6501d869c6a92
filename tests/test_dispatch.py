"""Target dispatch before legalization, and the examples that use it."""

import numpy as np
import pytest
import tvm
from tvm import relax, te
from tvm.script import ir as I
from tvm.script import relax as R

from tirbyoc import ExternLibrary, ExternLibraryError, PackedFunction
from tirbyoc.relax.dispatch import (Dispatch, DispatchError, DispatchReport, Rule,
                              TIRKernel, dispatch_module)

LLVM = {"kind": "llvm"}


@I.ir_module
class TwoConcats:
    @R.function
    def forward(x: R.Tensor((4, 3), "float32"), y: R.Tensor((4, 5), "float32")):
        with R.dataflow():
            a = R.concat((x, y), axis=1)
            b = R.nn.relu(a)
            c = R.concat((b, b), axis=0)
            R.output(c)
        return c


def concat2(m, swap=False):
    """A 2-input concat along axis 1 or 0 in TE (``swap``: a wrong kernel)."""
    a, b = (te.placeholder([int(d) for d in i.ty.shape.values], "float32", f"in{n}")
            for n, i in enumerate(m.inputs))
    axis = int(m.attrs.axis)
    first, second = (b, a) if swap else (a, b)
    split = int(first.shape[axis])
    shape = [int(d) for d in m.call.ty.shape.values]

    def f(i, j):
        idx = (i, j)
        shifted = (i - split, j) if axis == 0 else (i, j - split)
        return tvm.tirx.if_then_else(idx[axis] < split, first(*idx), second(*shifted))

    return te.create_prim_func([a, b, te.compute(shape, f, name="cat")])


def run(mod, args):
    from tirbyoc._tvm import make_target, relax_vm

    exe = tvm.compile(relax.transform.LegalizeOps()(mod), target=make_target(LLVM))
    return relax_vm(exe, tvm.cpu())["forward"](*[tvm.runtime.tensor(a) for a in args]).numpy()


def test_op_rule_becomes_call_tir_verified_and_the_rest_legalizes():
    report = DispatchReport()
    new = Dispatch([Rule("relax.concat", TIRKernel(concat2, "cat"))], target=LLVM, report=report)(TwoConcats)
    assert str(new["forward"]).count("R.call_tir(") == 2 and "R.nn.relu" in str(new["forward"])
    assert [c.replaced and c.verified for c in report.calls] == [True, True]
    rng = np.random.default_rng(0)
    args = [rng.standard_normal((4, 3)).astype("float32"), rng.standard_normal((4, 5)).astype("float32")]
    np.testing.assert_array_equal(run(new, args), run(TwoConcats, args))


def test_a_wrong_kernel_is_caught_and_not_used():
    report = DispatchReport()
    new = dispatch_module(TwoConcats, [Rule("relax.concat", TIRKernel(lambda m: concat2(m, swap=True)))],
                          target=LLVM, report=report)[0]
    first, second = report.calls  # swapping (x, y) is wrong; swapping (b, b) happens to be right
    assert not first.replaced and first.verified is False and "disagrees" in first.reason
    assert second.replaced and second.verified
    assert "R.concat((x, y), axis=1)" in str(new["forward"])


def test_a_kernel_of_the_wrong_shape_falls_back_with_the_reason():
    fixed = concat2(type("M", (), {"inputs": TwoConcats["forward"].params,
                                   "attrs": type("A", (), {"axis": 1})(),
                                   "call": type("C", (), {"ty": relax.TensorType((4, 8), "float32")})()})())
    report = DispatchReport()
    new, _ = dispatch_module(TwoConcats, [Rule("relax.concat", TIRKernel(fixed, "fixed"))],
                             target=LLVM, report=report)
    replaced = [c for c in report.calls if c.replaced]
    kept = [c for c in report.calls if not c.replaced]
    assert len(replaced) == 1 and len(kept) == 1  # (x, y) fits; (b, b) -> 8x8 does not
    assert "input 0 is float32[4, 8], the kernel's in0 is float32[4, 3]" in kept[0].reason


def test_rules_follow_the_target_and_the_predicate():
    rule = Rule("relax.concat", TIRKernel(concat2), targets=("cuda",))
    report = DispatchReport()
    new, _ = dispatch_module(TwoConcats, [rule], target=LLVM, report=report)
    assert "call_tir" not in str(new["forward"]) and not report.calls
    with tvm.target.Target(LLVM):  # the current target is used when none is given
        new, _ = dispatch_module(TwoConcats, [Rule("relax.concat", TIRKernel(concat2), targets=("cpu",),
                                                   when=lambda m: int(m.attrs.axis) == 0)])
    assert str(new["forward"]).count("R.call_tir(") == 1


@pytest.mark.parametrize("kwargs,message", [
    (dict(op="relax.concatenate", action=TIRKernel(concat2)), "no operator"),
    (dict(action=TIRKernel(concat2)), "exactly one of op"),
    (dict(op="relax.concat", action=concat2), "TIRKernel or LibraryKernel"),
])
def test_malformed_rules_say_what_is_wrong(kwargs, message):
    with pytest.raises(DispatchError, match=message):
        Rule(**kwargs)


def test_pattern_rule_needs_inputs():
    from tvm.relax.dpl import is_op, wildcard

    with pytest.raises(DispatchError, match="inputs"):
        Rule(pattern=is_op("relax.nn.relu")(wildcard()), action=TIRKernel(concat2))


def test_packed_function_declarations_are_checked(tmp_path):
    src = tmp_path / "k.c"
    src.write_text("#include <tvm/ffi/c_api.h>\nint __tvm_ffi_present(void* s, const TVMFFIAny* a, "
                   "int32_t n, TVMFFIAny* r) { r->type_index = kTVMFFINone; return 0; }\n")
    lib = ExternLibrary("k_lib", [src], ["present", "absent"], ffi=True)
    with pytest.raises(ExternLibraryError, match=r"does not export the packed functions \['absent'\]"):
        lib.runtime_module()
    with pytest.raises(ExternLibraryError, match="not a C identifier"):
        PackedFunction("bad name", lib)
    with pytest.raises(ExternLibraryError, match="not among"):
        PackedFunction("other", lib)
    with pytest.raises(ExternLibraryError, match="ffi=True"):
        PackedFunction("present", ExternLibrary("plain", [src], ["present"]))
