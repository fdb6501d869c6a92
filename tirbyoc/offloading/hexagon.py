"""Hexagon code that runs: build a PrimFunc for Hexagon, link it with a freestanding harness,
run it under ``qemu-hexagon``.

TVM 0.27 builds HVX code (vrmpy included) for an ``llvm`` target with ``mtriple=hexagon``,
``mcpu=hexagonv66`` or ``v67`` and ``+hvx-length128b``; its ``hexagon`` kind and v68+ abort
LLVM on vrmpy. The object TVM writes holds ``__tvm_ffi_main``, the packed entry point TVM
FFI calls. ``csrc/hexagon_harness.c`` stands in for everything around it — the arguments
(DLTensors behind TVM FFI ``Any`` values), the workspace allocator, error reporting, VTCM (a
region of the template's capacity, overflow an error) and the Hexagon DMA engine (a checked
copy into VTCM) — with Linux system calls and no C library. ``clang-16``/``ld.lld-16`` link
the two into a static Hexagon executable, and QEMU's user mode (Debian's ``qemu-user``, QEMU
7.2: HVX v66/v67) runs it on files of the arguments' bytes. Every program is invoked with an
argument list, never through a shell.

``global.vtcm`` allocations are lowered by tirbyoc's pipeline (`PIPELINE`): TVM's own
lowering emits a call into its Hexagon runtime that its host lowering then rejects for an
``llvm`` target; here they become calls to the harness's VTCM allocator.
"""

from __future__ import annotations

import atexit
import functools
import hashlib
import shutil
import struct
import subprocess
import tempfile
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np

from tirbyoc._tvm import (
    PrimCall,
    ffi_build_paths,
    make_target,
    register_tir_pipeline,
    structural_equal,
    tirx,
    tvm,
    tvm_ffi,
)
from tirbyoc.decl.host import HEXAGON_EMULATED_CPUS as EMULATED_CPUS
from tirbyoc.decl.host import HEXAGON_INSTALL, hexagon_emulator_missing
from tirbyoc.errors import VerificationError, last_line

VTCM = "global.vtcm"
DEFAULT_VTCM_BYTES = 4 * 1024 * 1024
PIPELINE = "tirbyoc_hexagon"
RUN_TIMEOUT_S = 600
_HARNESS = "hexagon_harness.c"


def is_hexagon(target) -> bool:
    """Whether ``target`` generates Hexagon code (kind ``hexagon``, or ``llvm`` with a
    Hexagon ``mtriple``)."""
    target = make_target(target)
    return str(target.kind.name) == "hexagon" or \
        str(target.attrs.get("mtriple") or "").startswith("hexagon")


def cannot_run(target) -> str | None:
    """Why code built for the Hexagon ``target`` cannot run here (None: it can)."""
    target = make_target(target)
    mcpu = str(target.attrs.get("mcpu") or "")
    if str(target.kind.name) == "hexagon":
        return ("TVM's `hexagon` target kind aborts this TVM's LLVM on HVX vrmpy code; use an "
                "`llvm` target with mtriple=hexagon and mcpu=hexagonv66 (the hexagon_hvx "
                "template's default)")
    return hexagon_emulator_missing(mcpu or "none")


def emulator_name(target) -> str:
    """How a run is named in reports: ``qemu-hexagon (HVX v66)``."""
    mcpu = str(make_target(target).attrs.get("mcpu") or "").removeprefix("hexagon")
    return f"qemu-hexagon (HVX {mcpu})"


# ------------------------------------------------------------------------- building
def _vtcm_alloc_to_region(func, _mod, _ctx):
    """TVM's ``nd_mem_alloc_with_scope("global.vtcm", ...)`` -> the harness's VTCM allocator
    (a ``DeclBuffer`` whose data it returns), sized from the buffer it declares."""

    def rewrite(decl):
        data = decl.data
        if not (isinstance(data, PrimCall) and str(getattr(data.op, "name", "")).endswith(
                "nd_mem_alloc_with_scope") and str(data.args[0].value) == VTCM):
            return decl
        buf = decl.buffer
        nbytes = int(np.prod([int(d) for d in buf.shape])) * tvm_ffi.dtype(str(buf.dtype)).itemsize
        alloc = tirx.call_extern("handle", "TirbyocHexagonVTCMAlloc", tirx.const(nbytes, "uint64"))
        return tirx.DeclBuffer(buf, data=alloc, span=decl.span)

    return func.with_body(tvm_ffi.structural_map(func.body, [(tirx.DeclBuffer, rewrite)]))


register_tir_pipeline(PIPELINE, lambda: [tirx.transform.prim_func_pass(_vtcm_alloc_to_region,
                                                                       opt_level=0)])


def build_object(func, target, path: Path) -> None:
    """TVM's build of ``func`` for the Hexagon ``target``, as an ELF object at ``path``."""
    if func.attrs is None or "global_symbol" not in func.attrs:
        func = func.with_attr("global_symbol", "main")
    try:
        executable = tvm.compile(func, target=make_target(target), tir_pipeline=PIPELINE)
    except Exception as err:  # noqa: BLE001 - TVM raises many types; say which build failed
        raise VerificationError(f"building the function for Hexagon failed: {last_line(err)}") from err
    executable.mod.write_to_file(str(path))


@functools.cache
def _workdir() -> Path:
    path = Path(tempfile.mkdtemp(prefix="tirbyoc-hexagon-"))
    atexit.register(shutil.rmtree, path, True)
    return path


@functools.cache
def harness_object(mcpu: str) -> Path:
    """The harness compiled for ``mcpu`` (once per process and CPU)."""
    source = resources.files("tirbyoc.offloading").joinpath("csrc", _HARNESS).read_text()
    out = _workdir() / f"harness-{mcpu}-{hashlib.sha256(source.encode()).hexdigest()[:12]}.o"
    src = _workdir() / _HARNESS
    src.write_text(source)
    includes, _ = ffi_build_paths()
    _tool(["clang-16", "--target=hexagon-unknown-linux-musl", f"-mcpu={mcpu}", "-mhvx",
           "-mhvx-length=128b", "-ffreestanding", "-fno-builtin", "-nostdlib", "-O2",
           *[f"-I{d}" for d in includes], "-c", str(src), "-o", str(out)], "compiling the harness")
    return out


_PROGRAMS: dict = {}  # (structural hash, target) -> [(function, linked program)]


def _program(func, target) -> Path:
    """``func`` built for ``target`` and linked with the harness, once per process: a model
    calls the same PrimFunc at several sites, and each call runs the same program."""
    target = make_target(target)
    key = (tvm_ffi.structural_hash(func), str(target))
    for known, path in _PROGRAMS.get(key, ()):
        if structural_equal(known, func):
            return path
    path = _workdir() / f"program-{sum(map(len, _PROGRAMS.values()))}.elf"
    with tempfile.TemporaryDirectory(dir=_workdir()) as tmp:
        build_object(func, target, Path(tmp) / "kernel.o")
        _tool(["ld.lld-16", "-static", "-o", str(path), str(harness_object(str(target.attrs["mcpu"]))),
               str(Path(tmp) / "kernel.o")], "linking the Hexagon program")
    _PROGRAMS.setdefault(key, []).append((func, path))
    return path


def _tool(argv: list[str], what: str) -> subprocess.CompletedProcess:
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise VerificationError(f"{what} failed ({argv[0]}): {(done.stderr or done.stdout).strip()[-800:]}")
    return done


# -------------------------------------------------------------------------- running
@dataclass(frozen=True)
class HexagonRun:
    """One run under QEMU: every argument after the call, the VTCM high-water mark."""

    arrays: list
    vtcm_high_water: int
    seconds: float
    emulator: str


class HexagonRunError(VerificationError):
    """The program did not run to its end. ``crashed``: the generated code itself failed
    (an error it reported, a fault, VTCM overflow) rather than the tools around it."""

    def __init__(self, message: str, crashed: bool):
        super().__init__(message)
        self.crashed = crashed


def _encode(arrays, scopes, vtcm_bytes: int) -> bytes:
    parts = [b"TBYH", struct.pack("<III", 1, len(arrays), vtcm_bytes)]
    for arr, scope in zip(arrays, scopes):
        dt = tvm_ffi.dtype(str(arr.dtype))
        data = np.ascontiguousarray(arr).tobytes()
        parts += [struct.pack("<BBHIII", dt.type_code, dt.bits, dt.lanes, arr.ndim,
                              1 if scope == VTCM else 0, 0),
                  struct.pack(f"<{arr.ndim}q", *arr.shape), struct.pack("<Q", len(data)), data,
                  b"\0" * (-len(data) % 8)]
    return b"".join(parts)


_EXIT = {2: "the function reported an error", 3: "VTCM or memory exhausted",
         4: "the harness could not read its input", 5: "a DMA copy outside its buffers"}


def run(func, target, arrays: list[np.ndarray], vtcm_bytes: int = DEFAULT_VTCM_BYTES) -> HexagonRun:
    """Build ``func`` for the Hexagon ``target``, run it once under qemu-hexagon on copies of
    ``arrays`` (one per parameter, in order), and return them all afterwards."""
    reason = cannot_run(target)
    if reason is not None:
        raise HexagonRunError(reason, crashed=False)
    program = _program(func, target)
    with tempfile.TemporaryDirectory(dir=_workdir()) as tmp:
        tmp = Path(tmp)
        scopes = [str(p.scope()) for p in func.params]
        (tmp / "in.bin").write_bytes(_encode(arrays, scopes, vtcm_bytes))
        t0 = time.perf_counter()
        try:
            done = subprocess.run(["qemu-hexagon", str(program), str(tmp / "in.bin"),
                                   str(tmp / "out.bin")], capture_output=True, text=True,
                                  timeout=RUN_TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired:
            raise HexagonRunError(f"qemu-hexagon did not finish in {RUN_TIMEOUT_S} s", crashed=True) from None
        seconds = time.perf_counter() - t0
        if done.returncode != 0:
            what = _EXIT.get(done.returncode, f"exit status {done.returncode} (a fault in the generated code?)")
            raise HexagonRunError(f"under qemu-hexagon: {what}: {done.stderr.strip()[-600:]}",
                                  crashed=done.returncode not in (4,))
        raw = (tmp / "out.bin").read_bytes()
    out, offset = [], 0
    for arr in arrays:
        n = arr.nbytes
        out.append(np.frombuffer(raw[offset:offset + n], dtype=arr.dtype).reshape(arr.shape).copy())
        offset += n
    high = int(done.stdout.split("vtcm_high_water", 1)[1].split()[0]) if "vtcm_high_water" in done.stdout else 0
    return HexagonRun(out, high, seconds, emulator_name(target))


__all__ = ["EMULATED_CPUS", "HEXAGON_INSTALL", "HexagonRun", "HexagonRunError", "build_object",
           "cannot_run", "emulator_name", "is_hexagon", "run"]
