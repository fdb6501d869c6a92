"""tirbyoc's TIR pipeline: TVM's default lowering, then the passes an offloaded function needs
that TVM has no hook for. Every build of offloaded code goes through it (`PIPELINE`, for
``tvm.compile(..., tir_pipeline=PIPELINE)``); a function without tirbyoc's attributes comes
out as TVM's default pipeline leaves it.

* `tirbyoc.rewrite.double_buffer.version_tiles`: two versions of each scratchpad tile the
  rewrite marked for double buffering.
"""

from __future__ import annotations

from tirbyoc._tvm import register_tir_pipeline, tirx
from tirbyoc.rewrite.double_buffer import version_tiles

PIPELINE = "tirbyoc"


def tirbyoc_passes() -> list:
    """The passes run after TVM's default lowering (before its host finalisation)."""
    return [tirx.transform.prim_func_pass(version_tiles, opt_level=0, name="tirbyoc.VersionTiles")]


register_tir_pipeline(PIPELINE, tirbyoc_passes)

__all__ = ["PIPELINE", "tirbyoc_passes"]
