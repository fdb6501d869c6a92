"""Idempotent registration with ``tvm.s_tir.TensorIntrin``.

TVM's registry raises on a second registration unless told to override, and overriding
would silently replace someone else's intrinsic. Here registering the same (desc, impl)
twice is a no-op and a different pair under a taken name is a `RegistrationConflict`.
"""

from __future__ import annotations

from tirbyoc._tvm import TensorIntrin, structural_equal
from tirbyoc.errors import RegistrationConflict


def register_tensor_intrin(name: str, desc, impl) -> None:
    existing = TensorIntrin.get(name, allow_missing=True)
    if existing is not None:
        if structural_equal(existing.desc, desc) and structural_equal(existing.impl, impl):
            return
        raise RegistrationConflict(
            f"tensor intrinsic {name!r} is already registered with a different description "
            "or implementation; give the new declaration another name"
        )
    TensorIntrin.register(name, desc, impl)
