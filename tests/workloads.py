"""The tests' workloads come from the library's generators, plus shapes they cannot write."""

from tirbyoc.testing.workloads import conv2d, matmul, parse  # noqa: F401


def symbolic_matmul():
    """C[n, 64] = A[n, 64] @ B[64, 64] with a symbolic n: no static extent for axis i."""
    return parse('''
@T.prim_func(s_tir=True)
def main(a: T.handle, B: T.Buffer((64, 64), "float32"), c: T.handle):
    n = T.int32()
    A = T.match_buffer(a, (n, 64), "float32")
    C = T.match_buffer(c, (n, 64), "float32")
    for i, j, k in T.grid(n, 64, 64):
        with T.sblock("C"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                C[vi, vj] = T.float32(0)
            C[vi, vj] = C[vi, vj] + A[vi, vk] * B[vk, vj]
''')
