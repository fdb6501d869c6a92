"""The one place that spells TVM 0.27's API.

TVM renamed its TIR namespaces (``tvm.tir`` -> ``tvm.tirx`` / ``tvm.s_tir``), its target
syntax and its runtime tensors within a year; everything else in tirbyoc imports TVM names
from here so that the next rename is a one-file change.

Never import ``tvm.s_tir.tensor_intrin`` whole: it parses every built-in TVMScript intrinsic
(~40 s); `cuda_intrinsics` imports its CUDA module alone, quickly.
"""

from __future__ import annotations


import contextlib
import inspect
import linecache
import os
import platform
import shutil
import sys
from typing import Iterator

import tvm  # noqa: E402
import tvm_ffi  # noqa: E402
import tvm_ffi.libinfo  # noqa: E402
from tvm import sym  # noqa: E402  (arith: detect_iter_map, IterMapLevel)
from tvm import relax, s_tir, te, tirx  # noqa: E402
from tvm.ir.prim import expr as prim_expr  # noqa: E402
from tvm.s_tir import pipeline as s_tir_pipeline  # noqa: E402
from tvm.script import tirx as T  # noqa: E402
from tvm.support import cc, nvcc  # noqa: E402
from tvm.target import codegen  # noqa: E402

# The TVM runtime uses one thread on a 2-vCPU machine unless told otherwise; set before TVM
# is imported.
os.environ.setdefault("TVM_NUM_THREADS", str(os.cpu_count() or 1))



PrimFunc = tirx.PrimFunc
# TVM 0.27 moved TIR's expression classes under tvm.ir: a buffer load is a ``TensorLoad``
# (its buffer is ``.source``), a call is ``tvm.ir.expr.Call``, and the arithmetic nodes
# (Add, RShift, FloorDiv, ...) live in ``tvm.ir.prim.expr``; ``tirx.BufferLoad`` is a
# constructor function, not a class.
PrimExpr = tvm.ir.expr.Expr
TensorLoad = tvm.ir.expr.TensorLoad
PrimCall = tvm.ir.expr.Call
StringImm = tvm.ir.expr.StringImm

# A block iterator's kind (``IterVar.iter_type``), by TVM's enum, and as TVMScript's
# ``T.axis.remap`` letters: "S" spatial, "R" reduction ("O": any other kind).
SPATIAL = int(tirx.IterVar.DataPar)
REDUCE = int(tirx.IterVar.CommReduce)


def iter_kind(iv) -> str:
    """"S", "R" or "O" for the block iterator ``iv``."""
    return {SPATIAL: "S", REDUCE: "R"}.get(int(iv.iter_type), "O")


def is_buffer(var) -> bool:
    """Whether ``var`` is a buffer: TVM 0.27 makes buffers Vars of ``BufferType`` (``tirx.Buffer``
    is ``Var`` itself, so ``isinstance`` also holds for a scalar parameter, a size passed in)."""
    return isinstance(getattr(var, "ty", None), tirx.BufferType)


def expr_dtype(node) -> str:
    """The dtype of a TIR expression (0.27 keeps it in ``.ty``; a load has no ``.dtype``)."""
    ty = getattr(node, "ty", None)
    dtype = getattr(ty, "dtype", None)
    return str(dtype) if dtype is not None else str(ty)
Buffer = tirx.Buffer
Schedule = s_tir.Schedule
TensorIntrin = s_tir.TensorIntrin
IRModule = tvm.IRModule
Target = tvm.target.Target


def const_value(expr):
    """A Relax constant's value as a numpy array, or None for any other expression (TVM 0.27:
    a constant is an ``ir.expr.GenericConst`` holding its tensor in ``.value``)."""
    if isinstance(expr, tvm.ir.expr.GenericConst):
        return expr.value.numpy()
    return None


def structural_equal(a, b, map_free_vars: bool = True) -> bool:
    """``tvm.ir.structural_equal`` under its 0.27 name."""
    return bool(tvm_ffi.structural_equal(a, b, map_free_vars))


def make_target(spec) -> "tvm.target.Target":
    """A ``Target`` from a dict, a plain kind string or a Target.

    The string form with options (``"llvm -mcpu=cascadelake"``) is rejected by TVM 0.27;
    templates therefore declare targets as dicts.
    """
    if isinstance(spec, tvm.target.Target):
        return spec
    if not isinstance(spec, str):  # templates hold read-only mappings
        spec = dict(spec)
    return tvm.target.Target(spec)


# LLVM feature names of instruction sets (what code may use), as against tuning flags
ISA_PREFIXES = ("avx", "sse", "ssse", "fma", "f16c", "amx", "bmi", "gfni", "vaes", "vpclmul", "sha")


def isa_features(target) -> set[str]:
    """The instruction-set features (AVX-512, AMX, FMA, ...) an LLVM ``target`` lets code use."""

    return {str(f) for f in codegen.llvm_get_cpu_features(make_target(target)) if str(f).startswith(ISA_PREFIXES)}


def vector_bytes(target) -> int:
    """Bytes in one vector register of an LLVM CPU ``target``: 64 with AVX-512, 32 with AVX,
    else 16 (SSE, NEON)."""

    features = isa_features(target)
    return 64 if "avx512f" in features else 32 if "avx" in features else 16


def vector_registers(target) -> int:
    """Vector registers an LLVM CPU ``target``'s code can name: 32 with AVX-512 (zmm0-31, and
    ymm16-31 through AVX-512 VL) or on AArch64, else 16 (AVX2, SSE)."""

    tgt = make_target(target)
    if "aarch64" in str(tgt.attrs.get("mtriple", "")) or "aarch64" in str(tgt.attrs.get("mcpu", "")):
        return 32
    return 32 if "avx512f" in isa_features(tgt) else 16


def to_tensor(array, device=None):
    """A ``tvm.runtime.Tensor`` holding a copy of a numpy array."""
    return tvm.runtime.tensor(array, device=device or tvm.cpu())


# software_pipeline_async_stages becomes cp.async only with the first option (the tensor-core
# kernel's pipeline, `tirbyoc.rewrite.block.tensor_core`); it changes nothing in other kernels. The
# second captures a model's kernel launches once as a CUDA graph and replays it (TVM's
# RewriteCUDAGraph, static-shape regions only): BERT-base fp16 on an H100 1.17 -> 0.84 ms at
# batch 1, 2.19 -> 1.92 ms at batch 8 (bench/results/gpu_models_h100_graph.json). A caller's
# PassContext overrides either (config {"relax.backend.use_cuda_graph": False}).
CUDA_PASS_CONFIG = {"tirx.use_async_copy": True, "relax.backend.use_cuda_graph": True}


def build(func_or_mod, target, pipeline: str = "default"):
    """Compile a PrimFunc or IRModule of PrimFuncs for ``target`` (a Target or dict) with the
    TIR ``pipeline`` (a registered name).

    For a CUDA target on a machine without a GPU the result holds the generated CUDA source
    only; `tirbyoc.offloading.cuda_toolchain.compile_cubin` compiles it to machine code.
    """
    target = make_target(target)
    if str(target.kind.name) != "cuda":
        return tvm.compile(func_or_mod, target=target, tir_pipeline=pipeline)
    with tvm.transform.PassContext(opt_level=tvm.transform.PassContext.current().opt_level,
                                   config={**CUDA_PASS_CONFIG, **dict(tvm.transform.PassContext.current().config)}):
        return tvm.compile(func_or_mod, target=target, tir_pipeline=pipeline)


def gpu_default_schedule(func, target):
    """``func`` as TVM's default CUDA pipeline schedules it (dlight's rules: the functions no
    template took, and TVM's own build of a model), unless it is scheduled already (an
    offloaded function is). Unscheduled, a function does not build for a GPU."""
    from tvm.s_tir import dlight as dl  # deferred: only GPU builds need it

    if func.attrs is not None and func.attrs.get("tirx.is_scheduled"):
        return func
    mod = tvm.IRModule({"main": func.with_attr("global_symbol", "main")})
    with make_target(target):
        mod = dl.ApplyDefaultSchedule(dl.gpu.Matmul(), dl.gpu.GEMV(), dl.gpu.Reduction(),
                                      dl.gpu.GeneralReduction(), dl.gpu.Fallback())(mod)
    return mod["main"]


@contextlib.contextmanager
def cheap_frames():
    """``inspect.stack`` without its module lookups, while TVMScript functions are parsed in
    bulk: each ``@T.prim_func`` takes the stack to read its callers' source lines, and
    ``inspect`` looks each frame's module up among all loaded ones (importing TVM's CUDA
    intrinsics: 21 s in a plain process, 80 s under pytest). Same file, line, function and
    source line (``linecache``) per frame."""
    real = inspect.stack

    def stack(context: int = 1):
        frames, frame = [], sys._getframe(1)
        while frame is not None:
            code = frame.f_code
            line = linecache.getline(code.co_filename, frame.f_lineno) if context else ""
            frames.append(inspect.FrameInfo(frame, code.co_filename, frame.f_lineno, code.co_name,
                                            [line] if line else None, 0 if line else None))
            frame = frame.f_back
        return frames

    inspect.stack = stack
    try:
        yield
    finally:
        inspect.stack = real


def cuda_intrinsics():
    """``tvm.s_tir.tensor_intrin.cuda``: TVM's ldmatrix / mma.sync intrinsics and their layouts."""
    with cheap_frames():
        # only a tensor-core rewrite pays for it:
        # deferred: it parses ~500 TVMScript functions (2 s here, 21 s without cheap_frames)
        from tvm.s_tir.tensor_intrin import cuda

    return cuda


def cuda_source(executable) -> str:
    """The generated CUDA C source inside a module built by :func:`build`."""
    todo = list(executable.mod.imports)
    while todo:  # a Relax executable holds the CUDA module one level further down
        module = todo.pop(0)
        if module.kind == "cuda":
            return str(module.inspect_source(""))
        todo.extend(module.imports)
    raise ValueError("the built module holds no CUDA device code")


def nvcc_path() -> str | None:
    """``nvcc`` on PATH (a CUDA toolkit), or None."""
    return shutil.which("nvcc")


def compile_cuda_source(source: str, target, compiler: str, cuda_path: str) -> bytes:
    """CUDA C ``source`` compiled by ``compiler`` ("nvrtc" or "nvcc") into a cubin for
    ``target``'s ``arch`` (e.g. sm_80), with the headers under ``cuda_path``.

    TVM's NVRTC path finds headers through the ``CUDA_PATH`` variable alone, so it is set for
    the call and restored after it. `tirbyoc.offloading.cuda_toolchain` picks the compiler.
    """
    saved = os.environ.get("CUDA_PATH")
    os.environ["CUDA_PATH"] = cuda_path
    try:
        with make_target(target):
            return bytes(nvcc.compile_cuda(source, target_format="cubin", compiler=compiler))
    finally:
        if saved is None:
            del os.environ["CUDA_PATH"]
        else:
            os.environ["CUDA_PATH"] = saved


def get_global_func(name: str):
    return tvm.get_global_func(name, allow_missing=True)


def cuda_available() -> bool:
    """Whether TVM sees a CUDA device (false on machines without a GPU or driver)."""
    try:
        return bool(tvm.cuda(0).exist)
    except Exception:  # no driver library: TVM raises instead of answering
        return False


def relax_vm(executable, device):
    """A Relax VM for ``executable``. A module whose every PrimFunc became a library call has
    no compiled TIR, only an empty C host module that TVM would try to export and reload
    (which fails for a loaded library in ``external_mods``); run its module directly then."""

    mod = executable.mod
    kinds = [m.kind for m in mod._collect_from_import_tree(lambda m: True)]
    if "library" in kinds and "c" in kinds and "llvm" not in kinds:
        return relax.VirtualMachine(mod, device)
    return relax.VirtualMachine(executable, device)


def is_host_target(target) -> bool:
    """Whether ``target`` (a Target or a target dict) compiles to code for this CPU: kind
    ``llvm`` or ``c`` with no ``mtriple`` of another architecture (``mtriple=hexagon`` is
    LLVM code for a Hexagon DSP, not for this machine)."""
    target = make_target(target)
    if str(target.kind.name) not in ("llvm", "c"):
        return False
    triple = str(target.attrs.get("mtriple") or "")
    return not triple or triple.split("-")[0] == platform.machine()


# Builtins a packed call's arguments are made of (``T.call_packed(f, buf)`` passes
# ``tvm_stack_make_array(buffer_data(buf), shape, strides, ndim, dtype, elem_offset)``).
MAKE_ARRAY = "tirx.tvm_stack_make_array"
BUFFER_DATA = "tirx.buffer_data"
ACCESS_PTR = "tirx.tvm_access_ptr"  # (type_annotation(dtype), data, offset, extent, rw mask)
CALL_PACKED = "tirx.tvm_call_packed"


def call_name(call) -> str:
    """The name of a call's operator ("" for a call of a function value)."""
    return str(getattr(call.op, "name", ""))


def with_call_args(call, args):
    """``call`` with ``args`` in place of its arguments."""
    return PrimCall(call.op, args, call.attrs, call.ty_args, call.span, call.ty)


def register_tir_pipeline(name: str, after, before=list) -> None:
    """Register, as TIR pipeline ``name`` (for ``tvm.compile(..., tir_pipeline=name)``),
    the passes ``before`` returns (on the scheduled functions, blocks and their annotations
    still there), TVM's default lowering, then the passes ``after`` returns, run before the
    host finalisation (``LowerTVMBuiltin``): where a target's own memory or runtime calls are
    lowered that TVM's pipeline has no hook for."""

    def pipeline():
        default, finalize_host, finalize_device = s_tir_pipeline.default_s_tir_pipeline()
        return tvm.transform.Sequential([*before(), default, *after()]), finalize_host, finalize_device

    tirx.compilation_pipeline.PIPELINE_MAP[name] = pipeline


def with_external_mods(mod, modules):
    """``mod`` with ``modules`` (runtime modules) added to its ``external_mods`` attribute,
    each once, for ``tvm.compile`` to link."""
    libs = list((mod.attrs or {}).get("external_mods", []))
    for module in modules:
        if not any(m.same_as(module) for m in libs):
            libs.append(module)
    return mod.with_attr("external_mods", libs) if libs else mod


# -- TVM 0.27's statement tree (blocks are ``s_tir.SBlock``; 0.26 called them ``tir.Block``) --
# Walks use tvm_ffi.structural_walk (typed callbacks over the object graph); `child_stmts` names
# the statement kinds that hold other statements. Declarations (intrinsic checks) and the IR
# readers both use them.
_CHILD_FIELDS = ("body", "then_case", "else_case", "init")


def child_stmts(stmt) -> list:
    """The statements directly inside ``stmt`` (a realize's block counts as its child)."""
    if stmt is None:
        return []
    if isinstance(stmt, tirx.SeqStmt):
        return list(stmt.seq)
    if isinstance(stmt, s_tir.SBlockRealize):
        return [stmt.block]
    out = []
    for name in _CHILD_FIELDS:
        child = getattr(stmt, name, None)
        if isinstance(child, tirx.Stmt):
            out.append(child)
    return out


def iter_blocks(stmt, *, include_self: bool = True) -> Iterator["s_tir.SBlock"]:
    """Every ``SBlock`` under ``stmt`` in pre-order (the block's init included)."""
    found: list = []
    tvm_ffi.structural_walk(stmt, (s_tir.SBlock, found.append), order="pre")
    if found and not include_self and found[0].same_as(stmt):
        found = found[1:]
    return iter(found)


def root_block(func) -> "s_tir.SBlock | None":
    """The root block of a schedulable PrimFunc, or None if its body is not one."""
    body = func.body
    if isinstance(body, s_tir.SBlockRealize):
        return body.block
    return None


def child_blocks(block) -> list:
    """Blocks directly nested in ``block``'s body (not in deeper blocks)."""
    out: list = []

    def visit(node):
        out.append(node)
        return tvm_ffi.WalkResult.SKIP  # a deeper block belongs to this one

    tvm_ffi.structural_walk(block.body, (s_tir.SBlock, visit), order="pre")
    return out


def iter_stores(stmt) -> Iterator:
    """Every ``BufferStore`` under ``stmt`` (block inits included), in pre-order."""
    found: list = []
    tvm_ffi.structural_walk(stmt, (tirx.BufferStore, found.append), order="pre")
    return iter(found)


# -- compiling and loading C code for extern libraries ---------------------------------------
def ffi_build_paths() -> tuple[list[str], str]:
    """(include directories, library directory) of TVM FFI's C API (``tvm/ffi/c_api.h``,
    dlpack, ``libtvm_ffi``), for C code that registers packed functions."""
    info = tvm_ffi.libinfo
    return ([info.find_include_path(), info.find_dlpack_include_path()],
            os.path.dirname(info.find_libtvm_ffi()))


def create_shared(output: str, sources: list[str], options: list[str], compiler: str) -> None:
    """Compile and link ``sources`` into the shared library ``output`` (TVM's ``cc``)."""
    cc.create_shared(output, sources, options=options, cc=compiler)


def load_module(path: str):
    """A TVM runtime module from a shared library."""
    return tvm.runtime.load_module(path)
