"""Memory scopes: where an intrinsic's operands live and how much room there is.

A scope is TVM's storage-scope string (``"global"``, ``"global.vtcm"``,
``"local.acc_buffer"``, ``"wmma.matrix_a"``) plus the two facts a rewrite needs to respect:
its capacity in bytes and the alignment of anything placed in it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from math import prod

from tirbyoc.dtypes import dtype_bytes
from tirbyoc.errors import ScopeError

_SCOPE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


@dataclass(frozen=True)
class Scope:
    """A memory scope of an accelerator or library.

    Parameters
    ----------
    name : str
        TVM storage scope, e.g. ``"global.vtcm"``.
    capacity : int or None
        Size in bytes; ``None`` for memory that is not a bounded scratchpad (DRAM).
    alignment : int
        Byte alignment that every buffer placed in this scope must have (a power of two).
    doc : str
        One line on what the memory is.
    """

    name: str
    capacity: int | None = None
    alignment: int = 1
    doc: str = ""

    def __post_init__(self):
        if not isinstance(self.name, str) or not _SCOPE_NAME.match(self.name):
            raise ScopeError(
                f"scope name {self.name!r} is not a TVM storage scope: use dotted identifiers "
                "such as 'global', 'global.vtcm' or 'local.acc_buffer'"
            )
        if self.capacity is not None:
            if isinstance(self.capacity, bool) or not isinstance(self.capacity, int):
                raise ScopeError(
                    f"scope {self.name!r}: capacity must be an int number of bytes or None, "
                    f"got {self.capacity!r}"
                )
            if self.capacity <= 0:
                raise ScopeError(
                    f"scope {self.name!r}: capacity is {self.capacity} bytes; it must be "
                    "positive (use None for unbounded memory)"
                )
        if (
            isinstance(self.alignment, bool)
            or not isinstance(self.alignment, int)
            or self.alignment <= 0
            or self.alignment & (self.alignment - 1)
        ):
            raise ScopeError(
                f"scope {self.name!r}: alignment {self.alignment!r} must be a positive power "
                "of two (bytes)"
            )

    @property
    def bounded(self) -> bool:
        return self.capacity is not None

    def check_fits(self, buffer: str, shape, dtype: str) -> None:
        """Raise `ScopeError` if a buffer of ``shape`` x ``dtype`` exceeds the capacity."""
        nbytes = prod(int(s) for s in shape) * dtype_bytes(dtype)
        if self.capacity is not None and nbytes > self.capacity:
            raise ScopeError(
                f"buffer {buffer!r} ({tuple(shape)} x {dtype} = {nbytes} bytes) does not fit "
                f"scope {self.name!r} of {self.capacity} bytes; shrink the tile or enlarge "
                "the scope"
            )


GLOBAL = Scope("global", None, 1, "host or device main memory")
