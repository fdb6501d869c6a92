"""What this machine can run: the public questions a template's ``requires`` asks.

Templates declare with the public API only; these answers come from TVM (LLVM's view of this
CPU, the CUDA driver), whose spelling lives in `tirbyoc._tvm`.
"""

from __future__ import annotations

import shutil

from tirbyoc._tvm import cpuinfo_flags, cuda_available, host_cpu_features, host_target, host_target_spec

# (program, Debian package): what running Hexagon code under QEMU takes
HEXAGON_TOOLS = (("qemu-hexagon", "qemu-user"), ("clang-16", "clang-16"), ("ld.lld-16", "lld-16"))
HEXAGON_INSTALL = "apt-get install -y qemu-user clang-16 lld-16"
HEXAGON_EMULATED_CPUS = ("hexagonv66", "hexagonv67")  # what QEMU 7.2's hexagon user mode runs


def hexagon_emulator_missing(mcpu: str | None = None) -> str | None:
    """Why code for the Hexagon ``mcpu`` (default: any this QEMU runs) cannot run here: a
    DSP generation QEMU 7.2 does not emulate, or the programs that run Hexagon code (QEMU's
    user mode, the compiler and linker of the harness) missing, with the command that
    installs them; None when it can."""
    if mcpu is not None and mcpu not in HEXAGON_EMULATED_CPUS:
        return (f"mcpu={mcpu} is built only: qemu-hexagon (QEMU 7.2) runs HVX "
                f"{' and '.join(c.removeprefix('hexagon') for c in HEXAGON_EMULATED_CPUS)} code")
    missing = [f"{prog} (package {pkg})" for prog, pkg in HEXAGON_TOOLS if shutil.which(prog) is None]
    if not missing:
        return None
    return (f"{', '.join(missing)} not installed: `{HEXAGON_INSTALL}` (Debian, as root) lets "
            "tirbyoc run Hexagon code under qemu-hexagon")


__all__ = ["HEXAGON_EMULATED_CPUS", "HEXAGON_INSTALL", "HEXAGON_TOOLS", "cpuinfo_flags", "cuda_available",
           "hexagon_emulator_missing",
           "host_cpu_features", "host_target", "host_target_spec"]
