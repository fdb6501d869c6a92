"""What a template needs of the machine, as data: `requires_cpu`.

A template's ``requires`` is a callable answering "can this template's code run here, and if
not, why not" (None: it can). For a CPU template the answer is always the same question - does
this CPU have these instruction-set features - and the same sentence; `requires_cpu` asks it
once, from the features named (LLVM's names, as `tirbyoc.decl.host.host_cpu_features` reports
them, ``/proc/cpuinfo``'s flags included), so a template declares::

    requires=requires_cpu("avx512vnni", what="AVX-512 VNNI",
                          instead="-t x86_vnni_emulated runs the same rewrite ...")

The CPU is read when the check runs, not when the template is declared: declaring stays free
of TVM, and a template module imports on any machine.
"""

from __future__ import annotations

from typing import Callable, Optional


def requires_cpu(*features: str, what: str | None = None, instruction: str | None = None,
                 instead: str | None = None,
                 also: Callable[[], Optional[str]] | None = None) -> Callable[[], Optional[str]]:
    """A ``Template.requires`` that is None where this CPU has every one of ``features``, else
    ``"this CPU lacks <what> (<instruction or the features missing>)[; <instead>]"``;
    ``what`` defaults to the features missing. ``also``: a further check asked once the
    features are there (Linux granting AMX's tile state), its answer returned as it is. The
    callable keeps ``features`` (listings)."""
    if not features:
        raise ValueError("requires_cpu needs at least one feature")

    def check() -> Optional[str]:
        from tirbyoc.decl.host import host_cpu_features  # deferred: reading the CPU loads TVM's LLVM

        have = host_cpu_features()
        missing = [f for f in features if f not in have]
        if not missing:
            return also() if also is not None else None
        why = f"this CPU lacks {what or ', '.join(missing)} ({instruction or ', '.join(missing)})"
        return f"{why}; {instead}" if instead else why

    check.features = features
    return check


__all__ = ["requires_cpu"]
