"""vta: a VTA-style GEMM accelerator with scratchpads, DMA and an ALU.

The core computes acc[BATCH, BLOCK_OUT] += inp[BATCH, BLOCK_IN] . wgt[BLOCK_OUT, BLOCK_IN]
(int8 x int8 -> int32) on operands held in three scratchpads (input, weight, accumulator),
filled and drained by DMA loads and stores; the ALU applies add, max, shift and clip to the
accumulator. Defaults are VTA's published configuration (1x16x16, 32 / 256 / 128 KiB).

Implementations call the simulator runtime (``tirbyoc.sim.*`` packed functions) with the
operand windows as DLTensors.
"""

from dataclasses import asdict, dataclass, replace
from functools import cache
from typing import Optional

from tirbyoc.sim import Simulator, config_for
from tirbyoc import (BlockALU, BlockDMA, Call, Cost, Intrinsic, IntrinsicGroup, Layout, Operand, Role, Runtime, Scope,
                     Template, declare, tile_copy_signature, zero_fill_signature)

NAME = "vta"
INP, WGT, ACC = "local.inp_buffer", "local.wgt_buffer", "local.acc_buffer"
SCOPE_ID = {INP: 0, WGT: 1, ACC: 2}  # tirbyoc.sim's scratchpad ids (input, weight, accumulator)
TARGET = {"kind": "llvm", "num-cores": 2}


@cache
def gemm(batch: int, block_in: int, block_out: int, in_dtype: str = "int8",
         wgt_dtype: str = "int8", acc_dtype: str = "int32", prefix: str = NAME) -> Intrinsic:
    """acc[batch, block_out] += inp[batch, block_in] . wgt[block_out, block_in], operands
    row-strided (a scratchpad tile keeps its window's layout: one block DMA fills it, and the
    core reads each intrinsic tile inside it at the tile's stride).

    With batch 1 the description has no batch loop: TVM's tensorize cannot match a
    unit-extent loop of a description (it drops unit iterators from the workload side).
    """
    operands = [Operand("A", (batch, block_in), in_dtype, INP, Layout.row_strided()),
                Operand("B", (block_out, block_in), wgt_dtype, WGT, Layout.row_strided()),
                Operand("C", (batch, block_out), acc_dtype, ACC, Layout.row_strided())]
    axes = ([] if batch == 1 else [("i", batch, "S")]) + [("j", block_out, "S"), ("k", block_in, "R")]

    def semantics(T, A, B, C, *at):
        i, j, k = (0, *at) if batch == 1 else at
        return C[i, j] + T.cast(A[i, k], acc_dtype) * T.cast(B[j, k], acc_dtype)

    return declare(f"{prefix}.gemm_{batch}x{block_in}x{block_out}", Role.COMPUTE, (operands, axes), semantics,
                   Call(lambda T, A, B, C: T.call_packed("tirbyoc.sim.gemm", C, A, B)), block="gemm",
                   cost=Cost(cycles=1, bytes_moved=0),
                   doc=f"GEMM core: acc[{batch},{block_out}] += inp[{batch},{block_in}] . wgt[{block_out},{block_in}]^T")


@cache
def fill_zero(lanes: int, acc_dtype: str = "int32", prefix: str = NAME) -> Intrinsic:
    """acc[lanes] = 0 (VTA's GEMM reset) on a flattened accumulator tile."""
    return declare(f"{prefix}.reset_{lanes}", Role.INIT, zero_fill_signature(lanes, acc_dtype, ACC),
                   lambda T, C, i: T.cast(0, acc_dtype), Call(lambda T, C: T.call_packed("tirbyoc.sim.fill_zero", C)),
                   accumulate=False, block="reset", cost=Cost(cycles=1, bytes_moved=0), doc="zero an accumulator tile")


@cache
def dma(direction: str, rows: int, cols: int, dtype: str, scope: str, out_dtype: Optional[str] = None,
        prefix: str = NAME) -> Intrinsic:
    """DMA a rows x cols tile: ``load`` DRAM -> ``scope``, ``store`` ``scope`` -> DRAM.

    A store may narrow (``out_dtype``, e.g. int32 accumulator -> int8 output), as VTA's
    store unit writes the low bits of each (already clipped) accumulator value. A one-row
    tile is declared 1-D (TVM's tensorize cannot match unit-extent description loops).
    """
    src_scope, dst_scope = ("global", scope) if direction == "load" else (scope, "global")
    dst_dtype = out_dtype or dtype
    symbol = "tirbyoc.sim.dma_" + direction
    shape = (cols,) if rows == 1 else (rows, cols)
    short = scope.split(".")[-1].replace("_buffer", "")
    suffix = f"_{dst_dtype}" if out_dtype else ""
    scope_id = SCOPE_ID[scope]
    # a 2-D tile passes its row strides (the tile-copy family's operands are row-strided)
    return declare(f"{prefix}.{direction}_{short}_{rows}x{cols}_{dtype}{suffix}",
                   Role.LOAD if direction == "load" else Role.STORE,
                   tile_copy_signature(shape, dtype, src_scope, dst_scope, dst_dtype=dst_dtype),
                   lambda T, S, D, *at: T.cast(S[at], dst_dtype),
                   Call(lambda T, S, D: T.call_packed(symbol, D, S, scope_id)), accumulate=False, block="copy",
                   cost=Cost(cycles=rows),
                   doc=f"DMA {direction} {rows}x{cols} {dtype} "
                       f"{'DRAM -> ' + scope if direction == 'load' else scope + ' -> DRAM'}")


_ALU = {
    "add": lambda T, x, y: x + y,
    "max": lambda T, x, y: T.max(x, y),
}


@cache
def alu_binary(op: str, lanes: int, acc_dtype: str = "int32", prefix: str = NAME) -> Intrinsic:
    """z[i] = op(x[i], y[i]) for ``op`` in add / max on flattened accumulator tiles."""
    fn = _ALU[op]
    return declare(f"{prefix}.alu_{op}_{lanes}", Role.ALU,
                   ([Operand(n, (lanes,), acc_dtype, ACC) for n in "XYZ"], [("i", lanes, "S")]),
                   lambda T, X, Y, Z, i: fn(T, X[i], Y[i]),
                   Call(lambda T, X, Y, Z: T.call_packed("tirbyoc.sim.alu_" + op, Z, X, Y)), accumulate=False,
                   block="alu", cost=Cost(cycles=1, bytes_moved=0), doc=f"ALU {op} on accumulator tiles")


def _alu_unary(short: str, lanes: int, acc_dtype: str, fn, call, cycles: int, doc: str,
               prefix: str = NAME) -> Intrinsic:
    """z[i] = fn(x[i]) on the accumulator; ``call(T, Z, X)`` is the simulator call."""
    return declare(f"{prefix}.{short}", Role.ALU,
                   ([Operand("X", (lanes,), acc_dtype, ACC), Operand("Z", (lanes,), acc_dtype, ACC)],
                    [("i", lanes, "S")]),
                   lambda T, X, Z, i: fn(T, X[i]), Call(lambda T, X, Z: call(T, Z, X)), accumulate=False,
                   block="alu", cost=Cost(cycles=cycles, bytes_moved=0), doc=doc)


@cache
def alu_relu(lanes: int, acc_dtype: str = "int32", prefix: str = NAME) -> Intrinsic:
    """z[i] = max(x[i], 0): the ALU's max with an immediate 0 (ReLU)."""
    return _alu_unary(f"alu_relu_{lanes}", lanes, acc_dtype,
                      lambda T, x: T.max(x, T.cast(0, acc_dtype)),
                      lambda T, Z, X: T.call_packed("tirbyoc.sim.alu_relu", Z, X),
                      1, "ALU max(acc, 0) (ReLU)", prefix)


@cache
def alu_shift_clip(lanes: int, shift: int = 8, lo: int = -128, hi: int = 127,
                   acc_dtype: str = "int32", prefix: str = NAME) -> Intrinsic:
    """acc = clip(acc >> shift, lo, hi): VTA's requantization epilogue (shift and clip)."""
    return _alu_unary(
        f"alu_shift_clip_{lanes}_s{shift}", lanes, acc_dtype,
        lambda T, x: T.max(T.min(T.shift_right(x, T.cast(shift, acc_dtype)), T.cast(hi, acc_dtype)),
                           T.cast(lo, acc_dtype)),
        lambda T, Z, X: T.call_packed("tirbyoc.sim.alu_shift_clip", Z, X, shift, lo, hi),
        2, f"ALU clip(acc >> {shift}, {lo}, {hi})", prefix)


@dataclass(frozen=True)
class VtaConfig:
    """A VTA-style core, validated when made; the defaults are VTA's own.
    ``block_dma``: the DMA moves a whole scratchpad tile per instruction, as VTA's load and
    store do (False: one DMA per intrinsic tile, the mapping before block DMA).
    ``double_buffer``: input and weight tiles get two versions each (half of each scratchpad
    per tile), so loads overlap the GEMMs as with VTA's virtual threads (needs block DMA).
    ``fused_epilogue``: the ALU runs the elementwise blocks after a core (bias, requantization,
    ReLU) on the accumulator tile and the store narrows, as VTA does (needs block DMA)."""

    batch: int = 1
    block_in: int = 16
    block_out: int = 16
    inp_kib: int = 32
    wgt_kib: int = 256
    acc_kib: int = 128
    in_dtype: str = "int8"
    wgt_dtype: str = "int8"
    acc_dtype: str = "int32"
    dma_bytes_per_cycle: int = 8
    dma_latency: int = 64
    clock_mhz: int = 100
    block_dma: bool = True
    double_buffer: bool = True
    fused_epilogue: bool = True
    name: str = NAME

    def __post_init__(self):
        _check(asdict(self))


def make_template(config: Optional[VtaConfig] = None, **changes) -> Template:
    """A VTA-style template from ``config`` (VTA's own by default) with ``changes`` applied
    (the parameters a sweep varies: ``make_template(block_in=32, inp_kib=64)``)."""
    c = replace(config or VtaConfig(), **changes)
    batch, block_in, block_out, name = c.batch, c.block_in, c.block_out, c.name
    in_dtype, wgt_dtype, acc_dtype = c.in_dtype, c.wgt_dtype, c.acc_dtype
    params = asdict(c)  # the generator parameters, as the template records them
    core = gemm(batch, block_in, block_out, in_dtype, wgt_dtype, acc_dtype, prefix=name)
    group = IntrinsicGroup(
        "gemm",
        compute=core,
        init=fill_zero(batch * block_out, acc_dtype, prefix=name),
        loads=(dma("load", batch, block_in, in_dtype, INP, prefix=name),
               dma("load", block_out, block_in, wgt_dtype, WGT, prefix=name)),
        store=dma("store", batch, block_out, acc_dtype, ACC, out_dtype=in_dtype, prefix=name),
        epilogue=(alu_binary("add", batch * block_out, acc_dtype, prefix=name),
                  alu_binary("max", batch * block_out, acc_dtype, prefix=name),
                  alu_relu(batch * block_out, acc_dtype, prefix=name),
                  alu_shift_clip(batch * block_out, acc_dtype=acc_dtype, prefix=name)),
    )
    scopes = (Scope(INP, c.inp_kib * 1024, 16, "input scratchpad"),
              Scope(WGT, c.wgt_kib * 1024, 16, "weight scratchpad"),
              Scope(ACC, c.acc_kib * 1024, 16, "accumulator scratchpad"))
    return Template(
        name=name,
        target=TARGET,
        runtime=Runtime.SIMULATOR,
        groups=(group,),
        scopes=scopes,
        # loading an accumulator tile (a bias), and storing one without narrowing (int32
        # outputs; the group's store narrows to the input dtype after shift-and-clip)
        extra=(dma("load", batch, block_out, acc_dtype, ACC, prefix=name),
               dma("store", batch, block_out, acc_dtype, ACC, prefix=name)),
        requires=_requires,
        block_dma=BlockDMA("tirbyoc.sim.dma_load", "tirbyoc.sim.dma_store",
                           {scope: (SCOPE_ID[scope],) for scope in SCOPE_ID},
                           doc="VTA load/store: rows at a stride per instruction",
                           double_buffer=(INP, WGT) if c.double_buffer else ()) if c.block_dma else None,
        block_alu=BlockALU("tirbyoc.sim.alu_imm", "tirbyoc.sim.alu_tensor", ACC,
                           doc="VTA's ALU: add, max, min, shift right over an accumulator tile")
        if c.block_dma and c.fused_epilogue else None,
        simulator=Simulator(config_for(
            scopes, core_macs=batch * block_in * block_out, alu_lanes=batch * block_out,
            dma_bytes_per_cycle=c.dma_bytes_per_cycle, dma_latency=c.dma_latency, clock_mhz=c.clock_mhz)),
        doc=f"VTA-style {batch}x{block_in}x{block_out} int8 GEMM core with scratchpads, DMA and ALU",
        factory=make_template,
        params=params,
        timing_params=("dma_bytes_per_cycle", "dma_latency", "clock_mhz"),
    )


def _check(params: dict) -> None:
    for pname, least in [(p, 1) for p in ("batch", "block_in", "block_out", "inp_kib", "wgt_kib", "acc_kib",
                                          "dma_bytes_per_cycle", "clock_mhz")] + [("dma_latency", 0)]:
        value = params[pname]
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            kind = "positive" if least else "non-negative"
            raise ValueError(f"vta parameter {pname} must be a {kind} int, got {value!r}")
    for pname in ("block_dma", "double_buffer", "fused_epilogue"):
        if not isinstance(params[pname], bool):
            raise ValueError(f"vta parameter {pname} must be true or false, got {params[pname]!r}")


def _requires() -> Optional[str]:
    from tirbyoc import sim

    return sim.unavailable_reason()


TEMPLATE = make_template()
