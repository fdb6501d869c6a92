"""The tests' workloads come from the library's generators, plus shapes they cannot write."""

from tirbyoc.testing.workloads import conv2d, matmul, parse  # noqa: F401


def symbolic_matmul(dtype: str = "float32", acc: str = "float32"):
    """C[n, 64] = A[n, 64] @ B[64, 64] with a symbolic n: no static extent for axis i."""
    a, b = (f'T.Cast("{acc}", A[vi, vk])', f'T.Cast("{acc}", B[vk, vj])') if dtype != acc else ("A[vi, vk]", "B[vk, vj]")
    return parse(f'''
@T.prim_func(s_tir=True)
def main(a: T.handle, B: T.Buffer((64, 64), "{dtype}"), c: T.handle):
    n = T.int32()
    A = T.match_buffer(a, (n, 64), "{dtype}")
    C = T.match_buffer(c, (n, 64), "{acc}")
    for i, j, k in T.grid(n, 64, 64):
        with T.sblock("C"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                C[vi, vj] = T.{acc}(0)
            C[vi, vj] = C[vi, vj] + {a} * {b}
''')


def shared_weight_matmul(batch: int, m: int, n: int, k: int, dtype: str = "float16", acc: str = "float32"):
    """C[b, m, n] = A[b, m, k] @ W[k, n]: one weight for the whole batch (a projection as
    Relax legalizes it, ``batch`` 1 included)."""
    return parse(f'''
@T.prim_func(s_tir=True)
def main(A: T.Buffer(({batch}, {m}, {k}), "{dtype}"), W: T.Buffer(({k}, {n}), "{dtype}"),
         C: T.Buffer(({batch}, {m}, {n}), "{acc}")):
    for b, i, j, r in T.grid({batch}, {m}, {n}, {k}):
        with T.sblock("C"):
            vb, vi, vj, vk = T.axis.remap("SSSR", [b, i, j, r])
            with T.init():
                C[vb, vi, vj] = T.{acc}(0)
            C[vb, vi, vj] = C[vb, vi, vj] + T.Cast("{acc}", A[vb, vi, vk]) * T.Cast("{acc}", W[vk, vj])
''')
