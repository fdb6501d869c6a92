"""Declare a new GEMM accelerator, run a model on it in the simulator, read the report.

"npu8": a 2 x 8 x 32 int8 GEMM core (2 rows of 8 inputs against 32 outputs per cycle), 16 KiB
of input, 64 KiB of weight and 32 KiB of accumulator scratchpad, a 16-byte/cycle DMA with a
100-cycle latency, at 400 MHz. Its intrinsics are the same tile operations VTA's are (GEMM,
reset, DMA load/store), declared at this core's shapes with the `vta` module's builders, and
they run in `tirbyoc.sim` with this core's timing. tirbyoc then tiles every convolution and
dense layer of an int8 CNN onto the core, plans the scratchpads, verifies the result bit for bit
against TVM's build, and reports the simulated cycles.

    python examples/new_accelerator.py
"""

from tirbyoc import IntrinsicGroup, Runtime, Scope, Template, run_model
from tirbyoc.sim import Simulator, config_for
from tirbyoc_intrinsics.vta import ACC, INP, WGT, dma, fill_zero, gemm

NAME, BATCH, BLOCK_IN, BLOCK_OUT = "npu8", 2, 8, 32


SCRATCHPADS = (Scope(INP, 16 * 1024, 16, "input scratchpad"),
               Scope(WGT, 64 * 1024, 16, "weight scratchpad"),
               Scope(ACC, 32 * 1024, 16, "accumulator scratchpad"))


def npu8() -> Template:
    core = gemm(BATCH, BLOCK_IN, BLOCK_OUT, prefix=NAME)  # acc[2, 32] += inp[2, 8] . wgt[32, 8]
    return Template(
        name=NAME,
        target={"kind": "llvm"},  # the host drives the simulator
        runtime=Runtime.SIMULATOR,
        groups=(IntrinsicGroup(
            "gemm", compute=core,
            init=fill_zero(BATCH * BLOCK_OUT, prefix=NAME),
            loads=(dma("load", BATCH, BLOCK_IN, "int8", INP, prefix=NAME),
                   dma("load", BLOCK_OUT, BLOCK_IN, "int8", WGT, prefix=NAME)),
            store=dma("store", BATCH, BLOCK_OUT, "int32", ACC, prefix=NAME)),),
        scopes=SCRATCHPADS,
        # capacities and scope names come from the scopes: planner and simulator agree
        simulator=Simulator(config_for(SCRATCHPADS, core_macs=BATCH * BLOCK_IN * BLOCK_OUT,
                                       alu_lanes=BATCH * BLOCK_OUT, dma_bytes_per_cycle=16,
                                       dma_latency=100, clock_mhz=400)),
        doc="2x8x32 int8 GEMM core with 16/64/32 KiB scratchpads",
    )


def main():
    result = run_model("builtin:cnn_int8", [npu8()], repeat=1)
    print(result.table())
    return result


if __name__ == "__main__":
    main()
