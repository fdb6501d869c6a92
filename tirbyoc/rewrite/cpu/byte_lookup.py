"""A vector of lookups into a 256-entry byte table as two ``vpermi2b`` and a blend.

A QDQ model's activation chains become 256-entry tables (`tirbyoc.relax.byte_tables`) looked
up in an integer core's write-back: ``out[i] = table[q[i]]`` with ``q`` a vector of 16 bytes
the write-back just computed. LLVM has no byte gather; it extracts each index, loads and
inserts each byte (three instructions an element: 630 ``vpinsrb`` in BERT's FFN1 write-back).
AVX-512 VBMI's ``vpermi2b`` looks 64 bytes up in a 128-entry table held in two registers;
two of them (entries 0-127, 128-255) and a blend on each index's top bit look up the whole
table:

    lo  = vpermi2b(table[0:64],    idx, table[64:128])     # uses idx & 127
    hi  = vpermi2b(table[128:192], idx, table[192:256])
    out = idx >= 128 ? hi : lo

the table's four vectors loaded once per vector of lookups (LLVM keeps them in registers
across an unrolled write-back). A lookup of fewer than 64 lanes is widened with zeros and
its lanes taken back. Run after TVM's lowering (loops are vectors then), for a function whose
target has ``avx512vbmi`` (AMD Zen 4 and later, Intel Ice Lake and later); anything else is
left as TVM lowers it. The values are the table's: a lookup is exact.
"""

from __future__ import annotations

from tirbyoc._tvm import TensorLoad, expr_dtype, isa_features, tirx, tvm_ffi

TABLE_ENTRIES = 256
REGISTER_BYTES = 64
VPERMI2B = "llvm.x86.avx512.vpermi2var.qi.512"


def _lanes(dtype: str) -> int:
    return int(dtype.split("x")[1]) if "x" in dtype else 1


def _is_table(buffer) -> bool:
    """A flat 256-entry 8-bit buffer."""
    shape = [getattr(d, "value", None) for d in buffer.shape]
    return shape == [TABLE_ENTRIES] and str(buffer.dtype) in ("uint8", "int8")


def _byte_index(index, lanes: int):
    """``index`` (a vector of table positions, 0 to 255) as ``uint8 x lanes``: the byte it was
    widened from where it is a cast of one, else narrowed (every position fits a byte)."""
    if isinstance(index, tirx.Cast) and expr_dtype(index.value) == f"uint8x{lanes}":
        return index.value
    return tirx.Cast(f"uint8x{lanes}", index)


def _widened(vec, lanes: int):
    """``vec`` (``uint8 x lanes``) as 64 lanes, the lanes past ``lanes`` zero."""
    if lanes == REGISTER_BYTES:
        return vec
    zeros = tirx.Broadcast(tirx.const(0, "uint8"), REGISTER_BYTES - lanes)
    return tirx.Shuffle([vec, zeros], [tirx.const(i, "int32") for i in range(REGISTER_BYTES)])


def _as(dtype: str, vec):
    """``vec`` read as ``dtype`` (the same bytes)."""
    return vec if expr_dtype(vec) == dtype else tirx.reinterpret(dtype, vec)


def _table_vector(table, k: int, index_dtype: str):
    """Entries ``64 k`` to ``64 k + 63`` of ``table``, one vector."""
    start = tirx.const(k * REGISTER_BYTES, index_dtype)
    return tirx.BufferLoad(table, [tirx.Ramp(start, tirx.const(1, index_dtype), REGISTER_BYTES)])


def vbmi_lookup(load):
    """``load`` (a vector load from a 256-entry byte table at a vector of positions) as two
    ``vpermi2b`` and a blend, or None where it is not such a load."""
    dtype = expr_dtype(load)
    lanes = _lanes(dtype)
    if lanes < 2 or lanes > REGISTER_BYTES or len(load.indices) != 1 or not _is_table(load.source):
        return None
    index = load.indices[0]
    if isinstance(index, tirx.Ramp) or _lanes(expr_dtype(index)) != lanes:
        return None
    wide = _widened(_byte_index(index, lanes), lanes)
    vec = f"int8x{REGISTER_BYTES}"
    part = [_as(vec, _table_vector(load.source, k, expr_dtype(index).split("x")[0])) for k in range(4)]
    lo = tirx.call_llvm_pure_intrin(vec, VPERMI2B, part[0], _as(vec, wide), part[1])
    hi = tirx.call_llvm_pure_intrin(vec, VPERMI2B, part[2], _as(vec, wide), part[3])
    top = tirx.Broadcast(tirx.const(128, "uint8"), REGISTER_BYTES)
    picked = tirx.Select(wide >= top, hi, lo)
    if lanes < REGISTER_BYTES:
        picked = tirx.Shuffle([picked], [tirx.const(i, "int32") for i in range(lanes)])
    return _as(dtype, picked)


def _has_vbmi(func) -> bool:
    target = func.attrs.get("target") if func.attrs is not None else None
    return target is not None and "avx512vbmi" in isa_features(target)


def vector_byte_lookups(func):
    """``func`` (lowered: loops vectorized) with each vector lookup into a 256-entry byte table
    as `vbmi_lookup` computes it, where its target has AVX-512 VBMI."""
    if not isinstance(func, tirx.PrimFunc) or not _has_vbmi(func):
        return func

    def rewrite(load):
        found = vbmi_lookup(load)
        return load if found is None else found

    body = tvm_ffi.structural_map(func.body, [(TensorLoad, rewrite)])
    return func if body.same_as(func.body) else func.with_body(body)


__all__ = ["VPERMI2B", "vbmi_lookup", "vector_byte_lookups"]
