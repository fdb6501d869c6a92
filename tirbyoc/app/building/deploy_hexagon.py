"""`tirbyoc build` for a Hexagon DSP: the offloaded model as Hexagon code for TVM's Hexagon
runtime, which loads it on the device (through its RPC server or an app that embeds it).

TVM builds the whole Relax executable for the Hexagon target (the VM's code and the
kernels; the weights are constants inside), which gives Hexagon ELF objects: ``lib0.o`` (the
functions) and ``devc.o`` (the executable and its constants). This machine can link them but
not run them - QEMU runs single offloaded functions (that is how each was verified), not
TVM's runtime - so the artifact is one of:

* ``PATH.tar``: the two objects, and the link command that turns them into the shared object
  (``ld.lld``, or the Hexagon SDK's ``hexagon-link``, which takes the same arguments);
* ``PATH.so``: that shared object, linked here with ``ld.lld-16``.

The manifest lists the symbols the library takes from the device's process (TVM FFI's C
API, the C library, the compiler's runtime routines): the linker's own list of what it left
unresolved.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tirbyoc._tvm import s_tir, tirx, tvm, tvm_ffi
from tirbyoc.errors import TirbyocError
from tirbyoc.offloading.hexagon import VTCM
from tirbyoc.offloading.lowering import PIPELINE

LINKER = "ld.lld-16"
FORMATS = {".so": "Hexagon shared object", ".tar": "Hexagon objects (tar) and their link command"}


@dataclass(frozen=True)
class HexagonArtifact:
    """What was written: its kind, the link command (run here for ``.so``), the symbols the
    device's process must provide."""

    kind: str
    link: list[str]
    undefined: list[str] | None  # None: not linked here (no ld.lld-16)


def _vtcm_users(mod) -> list[str]:
    """The PrimFuncs of ``mod`` that stage tiles in VTCM."""
    users = []
    for gv, func in mod.functions.items():
        if not isinstance(func, tirx.PrimFunc):
            continue
        found: list = []
        tvm_ffi.structural_walk(func, (s_tir.SBlock, found.append), order="pre")
        if any(str(b.scope()) == VTCM for block in found for b in block.alloc_buffers):
            users.append(gv.name_hint)
    return users


def check_deployable(mod, libraries: list) -> None:
    """Refuse, with what to do, what a Hexagon library built here cannot carry."""
    users = _vtcm_users(mod)
    if users:
        raise TirbyocError(
            f"{len(users)} offloaded function(s) ({', '.join(users[:3])}) stage tiles in VTCM; a "
            "deployed library would need TVM's Hexagon VTCM allocator, which this TVM builds only "
            "for its `hexagon` target kind (whose LLVM aborts on vrmpy). Build with a template "
            "that does not stage in VTCM, or run the model under QEMU: tirbyoc run -t hexagon_hvx")
    if libraries:
        raise TirbyocError(f"the offloaded model calls extern libraries ({', '.join(libraries)}); "
                           "tirbyoc links extern C code only into libraries for this CPU")


def _link_command(output: str, objects: list[str]) -> list[str]:
    return [LINKER, "-shared", "-o", output, *objects]


def _undefined(stderr: str) -> list[str]:
    return sorted(set(re.findall(r"undefined symbol: (\S+)", stderr)))


def _link(output: str, objects: list[str]) -> list[str]:
    """Link ``objects`` into the shared object ``output``; the symbols left for the loader."""
    if shutil.which(LINKER) is None:
        raise TirbyocError(f"{LINKER} is not installed: `apt-get install -y lld-16` (Debian, as "
                           "root), or write PATH.tar and link it with the Hexagon SDK's hexagon-link")
    done = subprocess.run([*_link_command(output, objects), "--warn-unresolved-symbols",
                           "--unresolved-symbols=report-all"], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise TirbyocError(f"linking the Hexagon library failed ({LINKER}): {done.stderr.strip()[-800:]}")
    return _undefined(done.stderr)


def export_hexagon(mod, target, output: Path) -> HexagonArtifact:
    """Compile the offloaded Relax ``mod`` for the Hexagon ``target`` and write ``output``
    (``.so`` or ``.tar``, see the module docstring)."""
    if output.suffix not in FORMATS:
        raise TirbyocError(f"{output}: a Hexagon library is PATH.so (linked here) or PATH.tar "
                           "(the objects and their link command)")
    exe = tvm.compile(mod, target=target, tir_pipeline=PIPELINE)
    output.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="tirbyoc-hexagon-build-") as work:
        tar = Path(work) / "objects.tar"
        exe.export_library(str(tar))
        with tarfile.open(tar) as archive:
            names = sorted(m.name for m in archive.getmembers() if m.name.endswith(".o"))
            archive.extractall(work, filter="data")
        if output.suffix == ".tar":
            shutil.copyfile(tar, output)
            so = output.with_suffix(".so").name
            undefined = _link(str(Path(work) / so), [str(Path(work) / n) for n in names]) \
                if shutil.which(LINKER) else None
            return HexagonArtifact(FORMATS[".tar"], _link_command(so, names), undefined)
        undefined = _link(str(output), [str(Path(work) / n) for n in names])
        return HexagonArtifact(FORMATS[".so"], _link_command(output.name, names), undefined)


__all__ = ["FORMATS", "HexagonArtifact", "check_deployable", "export_hexagon"]
