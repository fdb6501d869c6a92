"""`Layout`: how an intrinsic's implementation addresses an operand (dense, row-strided,
packed in tiles)."""

from __future__ import annotations

from dataclasses import dataclass

from tirbyoc.errors import IntrinsicError


@dataclass(frozen=True)
class Layout:
    """How the implementation addresses an operand's window.

    ``dense``: the window is read as one contiguous row-major block (strides are the compact
    ones), e.g. a 64-byte vector load. ``row_strided``: rows may be apart (leading strides
    are passed to the implementation) but each innermost row is contiguous. ``alignment``:
    byte alignment of the window's first element.

    A matcher must never hand a dense-only implementation a strided window: TVM's own
    ``tensorize`` accepts it and the result is silently wrong.
    """

    dense: bool = True
    alignment: int = 1
    tile: tuple[int, ...] | None = None

    def __post_init__(self):
        a = self.alignment
        if isinstance(a, bool) or not isinstance(a, int) or a <= 0 or a & (a - 1):
            raise IntrinsicError(f"layout alignment {a!r} must be a positive power of two (bytes)")
        if self.tile is not None:
            tile = tuple(self.tile)
            if not tile or any(isinstance(t, bool) or not isinstance(t, int) or t <= 0 for t in tile):
                raise IntrinsicError(f"layout tile {self.tile!r} must be a non-empty tuple of positive ints")
            if not self.dense:
                raise IntrinsicError("a packed layout is dense: its tiles lie one after another")
            object.__setattr__(self, "tile", tile)

    @classmethod
    def row_strided(cls, alignment: int = 1) -> "Layout":
        return cls(dense=False, alignment=alignment)

    @classmethod
    def packed(cls, tile: tuple[int, ...], alignment: int = 1) -> "Layout":
        """The implementation reads the operand packed in ``tile``-shaped blocks, tile-major:
        an (n, k) operand with ``tile=(16, 4)`` is stored [n/16, k/4, 16, 4] (VNNI's and AMX's
        weight layout). The description indexes the operand as it is declared, (n, k); the
        implementation's buffer has the packed shape, and TVM's tensorize is given the
        description with this layout applied (`Intrinsic.register`)."""
        return cls(dense=True, alignment=alignment, tile=tuple(tile))

    def packed_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The stored shape of an operand of ``shape`` (itself unless packed)."""
        if self.tile is None:
            return tuple(shape)
        return tuple(s // t for s, t in zip(shape, self.tile)) + self.tile

    def pack_map(self):
        """(dims...) -> (dims // tile..., dims % tile...): the packing as a function of indices."""
        tile = self.tile

        def fn(*xs):
            return [x // t for x, t in zip(xs, tile)] + [x % t for x, t in zip(xs, tile)]

        return fn

    def describe(self) -> str:
        kind = "dense" if self.dense else "row-strided"
        if self.tile is not None:
            kind = f"packed in {'x'.join(map(str, self.tile))} tiles"
        return kind if self.alignment == 1 else f"{kind}, {self.alignment}B-aligned"


__all__ = ["Layout"]
