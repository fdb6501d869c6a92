"""The x86_vnni template the tests run: the real one where this CPU has AVX-512 VNNI, else
``x86_vnni_emulated`` - the same declarations and rewrite with ``vpdpbusd`` as portable vector
code - so that what tirbyoc does for VNNI is built, run and verified on every CPU. Tests of the
instruction itself (its code, its speed) use `needs_native`."""

import pytest

import tirbyoc

NATIVE = tirbyoc.get_template("x86_vnni")
VNNI = NATIVE if NATIVE.runs_here() else tirbyoc.get_template("x86_vnni_emulated")
NAME = VNNI.name
needs_native = pytest.mark.skipif(not NATIVE.runs_here(), reason=str(NATIVE.unavailable_reason()))
