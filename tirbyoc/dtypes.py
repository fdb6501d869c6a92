"""Dtype helpers that need no TVM import (listing must stay fast)."""

from __future__ import annotations

import re

_BITS = {"int": {4, 8, 16, 32, 64}, "uint": {1, 4, 8, 16, 32, 64}, "float": {16, 32, 64},
         "bfloat": {16}}
_DTYPE = re.compile(r"^(int|uint|float|bfloat|bool)(\d*)(x\d+)?$")


def parse_dtype(dtype: str) -> tuple[str, int, int]:
    """Split ``"int8x4"`` into ``("int", 8, 4)``; raise ValueError on anything else."""
    m = _DTYPE.match(str(dtype))
    if not m:
        raise ValueError(f"{dtype!r} is not a TVM scalar or vector dtype (e.g. 'int8', 'float16')")
    kind, bits, lanes = m.group(1), m.group(2), m.group(3)
    if kind == "bool":
        return "bool", 8, int(lanes[1:]) if lanes else 1
    if not bits:
        raise ValueError(f"{dtype!r} has no bit width")
    if int(bits) not in _BITS[kind]:
        raise ValueError(f"{dtype!r}: TVM has no {bits}-bit {kind}; widths are {sorted(_BITS[kind])}")
    return kind, int(bits), int(lanes[1:]) if lanes else 1


def dtype_bytes(dtype: str) -> int:
    kind, bits, lanes = parse_dtype(dtype)
    return max(1, bits // 8) * lanes


def is_valid_dtype(dtype: str) -> bool:
    try:
        parse_dtype(dtype)
    except ValueError:
        return False
    return True


def is_float(dtype: str) -> bool:
    return parse_dtype(dtype)[0] in ("float", "bfloat")


def numpy_dtype(dtype: str):
    """The numpy dtype holding TVM's ``dtype``: numpy's own, or ml_dtypes' ``bfloat16`` (the
    type TVM's runtime tensors take and give for bfloat16; ml_dtypes comes with TVM)."""
    import numpy as np  # deferred: listing templates imports this module and needs no numpy

    if str(dtype) == "bfloat16":
        import ml_dtypes  # deferred: as numpy

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(str(dtype))
