"""CUDA kernels compiled to GPU machine code on machines without a GPU.

TVM's build of a CUDA target stops at CUDA C source on a machine without a GPU. That source is
only half of the evidence that a kernel is built for real GPUs: the CUDA compiler must accept
it, and its machine code (SASS) must hold the instructions the template promises (tensor-core
``HMMA`` / ``IMMA`` for cuda_mma, not a scalar fallback). Neither needs a GPU or a toolkit
install: NVRTC (through ``cuda-bindings``), the CUDA headers and ``nvdisasm`` come as pip
wheels (``pip install 'tirbyoc[cuda]'``). The headers lie in four wheels; TVM looks for them
under one ``CUDA_PATH`` (``include/``, ``targets/<triple>/include/`` and its ``cccl/``), so
`wheel_cuda_home` lays them out as one, with links, in a folder of this process.

Order of preference: ``CUDA_PATH`` when set, then NVRTC with the wheels' headers, then
``nvcc`` on ``PATH`` (a CUDA toolkit).
"""

from __future__ import annotations

import atexit
import functools
import importlib.util
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tirbyoc._tvm import compile_cuda_source, nvcc_path

CUDA_EXTRA = "pip install 'tirbyoc[cuda]'"
# wheel package (under site-packages/nvidia) -> its include folder's place in the layout
_HEADER_WHEELS = ("cuda_runtime", "cuda_nvcc", "cuda_nvrtc")
_CCCL_WHEEL = "cuda_cccl"
_TRIPLE = "x86_64-linux"
# a SASS line: /*0150*/  @P0 HMMA.16816.F32 R4, R12, R16, R4 ;
_SASS_OP = re.compile(r"^\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)")
TENSOR_CORE_PREFIXES = ("HMMA", "IMMA", "HGMMA", "IGMMA", "QGMMA")


@dataclass(frozen=True)
class Toolchain:
    """How CUDA source becomes machine code here: ``compiler`` ("nvrtc" or "nvcc") and the
    ``cuda_path`` it reads headers from."""

    compiler: str
    cuda_path: str

    def describe(self) -> str:
        return f"{self.compiler} (headers from {self.cuda_path})"


def _nvidia_wheels() -> Path | None:
    """site-packages/nvidia, where NVIDIA's CUDA wheels install, or None."""
    spec = importlib.util.find_spec("nvidia")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _has_nvrtc() -> bool:
    return importlib.util.find_spec("cuda") is not None and \
        importlib.util.find_spec("cuda.bindings") is not None


@functools.cache
def wheel_cuda_home() -> str | None:
    """A CUDA_PATH made of the header wheels' folders (links, in a temporary folder removed
    at exit), or None when a header wheel is missing."""
    root = _nvidia_wheels()
    if root is None:
        return None
    folders = [root / name / "include" for name in _HEADER_WHEELS]
    cccl = root / _CCCL_WHEEL / "include"
    if not all(f.is_dir() for f in folders) or not cccl.is_dir():
        return None
    home = Path(tempfile.mkdtemp(prefix="tirbyoc-cuda-"))
    atexit.register(shutil.rmtree, home, ignore_errors=True)
    include = home / "include"
    include.mkdir()
    for folder in folders:
        for entry in folder.iterdir():
            if entry.name != "__pycache__" and not (include / entry.name).exists():
                (include / entry.name).symlink_to(entry)
    (include / "cccl").symlink_to(cccl)
    (home / "targets" / _TRIPLE).mkdir(parents=True)
    (home / "targets" / _TRIPLE / "include").symlink_to(include)
    return str(home)


def toolchain() -> Toolchain | None:
    """The CUDA compiler this machine has (see the module's order of preference), or None."""
    set_path = os.environ.get("CUDA_PATH")
    if set_path:
        return Toolchain("nvrtc" if _has_nvrtc() else "nvcc", set_path)
    home = wheel_cuda_home() if _has_nvrtc() else None
    if home is not None:
        return Toolchain("nvrtc", home)
    nvcc = nvcc_path()
    if nvcc is not None:
        return Toolchain("nvcc", str(Path(nvcc).resolve().parent.parent))
    return None


def unavailable_reason() -> str | None:
    """Why CUDA source cannot be compiled here (and how to fix it), or None when it can."""
    if toolchain() is not None:
        return None
    return (f"no CUDA compiler here: `{CUDA_EXTRA}` installs NVRTC and the CUDA headers as "
            "wheels (no GPU or toolkit needed), or put a CUDA toolkit's nvcc on PATH")


def compile_cubin(source: str, target) -> bytes:
    """CUDA C ``source`` compiled into a cubin (GPU machine code) for ``target``'s ``arch``."""
    chain = toolchain()
    if chain is None:
        raise RuntimeError(unavailable_reason())
    return compile_cuda_source(source, target, chain.compiler, chain.cuda_path)


def disassembler() -> list[str] | None:
    """The command that prints a cubin's SASS: ``nvdisasm`` (the wheel's, or on PATH), else
    ``cuobjdump -sass``; None without either."""
    root = _nvidia_wheels()
    found = sorted(root.glob("cu*/bin/nvdisasm")) if root is not None else []
    if found:
        return [str(found[-1])]
    if shutil.which("nvdisasm"):
        return ["nvdisasm"]
    if shutil.which("cuobjdump"):
        return ["cuobjdump", "-sass"]
    return None


def sass(cubin: bytes) -> str:
    """The SASS (GPU assembly) of a cubin, as the disassembler prints it."""
    command = disassembler()
    if command is None:
        raise RuntimeError(f"no CUDA disassembler here: `{CUDA_EXTRA}` installs nvdisasm")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kernel.cubin"
        path.write_bytes(cubin)
        done = subprocess.run([*command, str(path)], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{command[0]} failed on the cubin: {done.stderr.strip()[:400]}")
    return done.stdout


def opcodes(assembly: str) -> set[str]:
    """Every instruction mnemonic (with its modifiers, e.g. ``HMMA.16816.F32``) in SASS text."""
    return {m.group(1) for m in map(_SASS_OP.match, assembly.splitlines()) if m}


def tensor_core_ops(assembly: str) -> list[str]:
    """The tensor-core MMA instructions in SASS text (HMMA for fp16 / bf16, IMMA for int8,
    the warpgroup GMMA forms on Hopper), sorted."""
    return sorted(op for op in opcodes(assembly) if op.startswith(TENSOR_CORE_PREFIXES))


def machine_code_note(source: str, target) -> str:  # target: a tvm.target.Target
    """What became of a kernel's CUDA C on this machine, for a report: compiled by which
    compiler for which architecture, with which tensor-core instructions ("" without a
    compiler). A source the compiler rejects raises: the kernel would not build for a GPU."""
    chain = toolchain()
    if chain is None:
        return ""
    arch = target.attrs.get("arch")
    cubin = compile_cubin(source, target)
    if disassembler() is None:
        return f"; compiled by {chain.compiler} to {arch} machine code"
    mma = tensor_core_ops(sass(cubin))
    return (f"; compiled by {chain.compiler} to {arch} machine code with "
            + (f"tensor-core {', '.join(mma)}" if mma else "no tensor-core instruction"))


__all__ = ["CUDA_EXTRA", "TENSOR_CORE_PREFIXES", "Toolchain", "compile_cubin", "disassembler", "machine_code_note",
           "opcodes",
           "sass", "tensor_core_ops", "toolchain", "unavailable_reason", "wheel_cuda_home"]
