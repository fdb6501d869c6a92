"""What this machine can run: the public questions a template's ``requires`` asks.

Templates declare with the public API only; these answers come from TVM (LLVM's view of this
CPU, less the features the machine hides; the CUDA driver), whose spelling lives in
`tirbyoc._tvm`. `host_target` is the target code for this CPU is built for.
"""

from __future__ import annotations

import functools
import platform
import shutil

from tirbyoc._tvm import ISA_PREFIXES, codegen, cuda_available, tvm


@functools.cache
def cpuinfo_flags() -> frozenset[str]:
    """The CPU flags Linux reports (``/proc/cpuinfo``: ``amx_int8``, ``avx512_bf16``, ...);
    empty elsewhere. LLVM derives its view of the host from the CPU's model name, which a
    virtual machine may report as an older one (an Emerald Rapids guest reads as
    ``rocketlake``, without AMX or AVX512_BF16): the kernel's flags are what the CPU runs."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


# /proc/cpuinfo flags LLVM spells otherwise (beyond `_llvm_feature`'s underscores)
_CPUINFO_ALIASES = {"pni": "sse3", "sse4_1": "sse4.1", "sse4_2": "sse4.2", "bmi1": "bmi", "sha_ni": "sha",
                    "pclmulqdq": "pclmul", "abm": "lzcnt", "rdrand": "rdrnd", "3dnowprefetch": "prfchw"}


def _llvm_feature(flag: str) -> str:
    """A /proc/cpuinfo flag in LLVM's spelling: ``amx_int8`` -> ``amx-int8``,
    ``avx512_bf16`` -> ``avx512bf16``, ``avx_vnni`` -> ``avxvnni``, ``sse4_1`` -> ``sse4.1``."""
    if flag in _CPUINFO_ALIASES:
        return _CPUINFO_ALIASES[flag]
    return flag.replace("_", "-") if flag.startswith("amx_") else flag.replace("_", "")


def host_cpu_features() -> set[str]:
    """The LLVM feature names of the CPU this process runs on (``avx512vnni``, ...): LLVM's
    view of the host (`host_target`, less what the kernel does not report) and the features
    the kernel reports (`cpuinfo_flags`)."""

    return {str(f) for f in codegen.llvm_get_cpu_features(host_target())} | {
        _llvm_feature(f) for f in cpuinfo_flags()}


def hidden_features(cpu: str, flags) -> tuple[str, ...]:
    """The instruction-set features LLVM's CPU model ``cpu`` has that the kernel's ``flags``
    (`cpuinfo_flags`) do not report, in LLVM's spelling. LLVM names the host by its family and
    model, and a virtual machine may hide features of that model: an AMD EPYC Zen 4 guest
    without AVX-512 reads as ``znver4``, and code built for plain ``znver4`` dies on its first
    AVX-512 instruction (SIGILL)."""
    have = {_llvm_feature(f) for f in flags}
    model = tvm.target.Target({"kind": "llvm", "mcpu": cpu})
    return tuple(sorted(str(f) for f in codegen.llvm_get_cpu_features(model)
                        if str(f).startswith(ISA_PREFIXES) and str(f) not in have))


@functools.cache
def _host_spec() -> tuple[str, tuple[str, ...]]:
    """(LLVM's name of this CPU, the features of that model this machine hides)."""
    cpu = str(codegen.llvm_get_system_cpu())
    flags = cpuinfo_flags()
    if not flags or platform.machine() not in ("x86_64", "AMD64"):  # no flags to read: LLVM's view
        return cpu, ()
    return cpu, hidden_features(cpu, flags)


def host_target_spec() -> dict:
    """This CPU as an LLVM target dict: its ``mcpu`` and, where the machine hides features
    of that CPU model (`_host_spec`), an ``mattr`` turning them off."""
    cpu, hidden = _host_spec()
    return {"kind": "llvm", "mcpu": cpu, **({"mattr": [f"-{f}" for f in hidden]} if hidden else {})}


def host_target() -> "tvm.target.Target":
    """This CPU as an LLVM target: code built for it runs here (`host_target_spec`)."""
    return tvm.target.Target(host_target_spec())


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
           "hidden_features", "host_cpu_features", "host_target", "host_target_spec"]
