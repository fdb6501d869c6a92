"""Workloads for `tirbyoc match examples/gemm_workloads.py --object NAME`.

Three blocks a user might bring: an int8 dense layer with transposed weights (VNNI, VTA),
an fp32 matmul with odd sizes (BLAS, padded), and a fused GEMM + bias + ReLU chain.
"""

from tvm.script import ir as I
from tvm.script import tirx as T


@I.ir_module
class Workloads:
    @T.prim_func(s_tir=True)
    def dense_int8(A: T.Buffer((64, 256), "uint8"), W: T.Buffer((128, 256), "int8"),
                   C: T.Buffer((64, 128), "int32")):
        for i, j, k in T.grid(64, 128, 256):
            with T.sblock("dense"):
                vi, vj, vk = T.axis.remap("SSR", [i, j, k])
                with T.init():
                    C[vi, vj] = 0
                C[vi, vj] = C[vi, vj] + T.Cast("int32", A[vi, vk]) * T.Cast("int32", W[vj, vk])

    @T.prim_func(s_tir=True)
    def matmul_odd(A: T.Buffer((17, 63), "float32"), B: T.Buffer((63, 65), "float32"),
                   C: T.Buffer((17, 65), "float32")):
        for k, i, j in T.grid(63, 17, 65):
            with T.sblock("matmul"):
                vk, vi, vj = T.axis.remap("RSS", [k, i, j])
                with T.init():
                    C[vi, vj] = T.float32(0)
                C[vi, vj] = C[vi, vj] + B[vk, vj] * A[vi, vk]

    @T.prim_func(s_tir=True)
    def dense_bias_relu(A: T.Buffer((1, 64), "int8"), W: T.Buffer((32, 64), "int8"),
                        bias: T.Buffer((32,), "int32"), out: T.Buffer((1, 32), "int32")):
        C = T.sblock_alloc_buffer((1, 32), "int32")
        D = T.sblock_alloc_buffer((1, 32), "int32")
        for i, j, k in T.grid(1, 32, 64):
            with T.sblock("dense"):
                vi, vj, vk = T.axis.remap("SSR", [i, j, k])
                with T.init():
                    C[vi, vj] = 0
                C[vi, vj] = C[vi, vj] + T.Cast("int32", A[vi, vk]) * T.Cast("int32", W[vj, vk])
        for i, j in T.grid(1, 32):
            with T.sblock("bias"):
                vi, vj = T.axis.remap("SS", [i, j])
                D[vi, vj] = C[vi, vj] + bias[vj]
        for i, j in T.grid(1, 32):
            with T.sblock("relu"):
                vi, vj = T.axis.remap("SS", [i, j])
                out[vi, vj] = T.max(D[vi, vj], 0)
