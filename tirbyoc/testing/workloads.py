"""Workload generators: schedulable PrimFuncs (matmul, batched matmul, conv2d) written as
TVMScript text so that shapes, dtypes, layouts, loop orders and index expressions vary
freely. Tests, benchmarks and examples build their workloads here."""
import tvm.script


def parse(src: str):
    """A PrimFunc from TVMScript source defining one ``@T.prim_func(s_tir=True)`` (no import
    header: ``from_source`` provides ``T``)."""

    return tvm.script.from_source(src)


def _cast(expr: str, to: str, frm: str) -> str:
    return expr if to == frm else f'T.Cast("{to}", {expr})'


def matmul(m, n, k, a="float32", b="float32", c="float32", *, trans_a=False, trans_b=False,
           order="ijk", init="inside", swap_mul=False, batch=None, symbolic: bool | str = False):
    """C[(b,) m, n] (+)= A[(b,) m, k] * B[(b,) k, n]; options move layouts, loops and init.
    ``symbolic``: the extents known only at run time, as letters of ``"mnk"`` (True: ``"m"``);
    each becomes a size variable (``rows``, ``cols``, ``depth``) and its number is unused."""
    dims = "m" if symbolic is True else (symbolic or "")
    size_vars = {"m": "rows", "n": "cols", "k": "depth"}
    m, n, k = (size_vars[d] if d in dims else v for d, v in zip("mnk", (m, n, k)))
    pre = "vb, " if batch else ""
    lead = (batch,) if batch else ()
    ashape = lead + ((k, m) if trans_a else (m, k))
    bshape = lead + ((n, k) if trans_b else (k, n))
    cshape = lead + (m, n)
    aidx = f"{pre}vk, vi" if trans_a else f"{pre}vi, vk"
    bidx = f"{pre}vj, vk" if trans_b else f"{pre}vk, vj"
    ea, eb = _cast(f"A[{aidx}]", c, a), _cast(f"B[{bidx}]", c, b)
    prod = f"{eb} * {ea}" if swap_mul else f"{ea} * {eb}"
    ext = {"i": m, "j": n, "k": k, "b": batch}
    loops = ("b" if batch else "") + order
    names = ", ".join(f"l{x}" for x in loops)
    kinds = {"i": "spatial", "j": "spatial", "k": "reduce", "b": "spatial"}
    axes = "\n".join(f"                v{x} = T.axis.{kinds[x]}({ext[x]}, l{x})" for x in loops)
    init_in = (f"                with T.init():\n                    C[{pre}vi, vj] = T.cast(0, \"{c}\")\n"
               if init == "inside" else "")
    init_out = ""
    if init == "outside":
        grid = ", ".join(str(e) for e in cshape)
        ivars = ", ".join(f"u{d}" for d in range(len(cshape)))
        init_out = (f"        for {ivars} in T.grid({grid}):\n"
                    f"            with T.sblock(\"C_init\"):\n"
                    f"                {ivars.replace('u', 'w')} = T.axis.remap(\"{'S' * len(cshape)}\", [{ivars}])\n"
                    f"                C[{ivars.replace('u', 'w')}] = T.cast(0, \"{c}\")\n")
    shape = lambda dims: "(" + ", ".join(map(str, dims)) + ("," if len(dims) == 1 else "") + ")"  # noqa: E731
    sizes = "".join(f"\n    {size_vars[d]} = T.int32()" for d in "mnk" if d in dims)
    head = (f'''def main(a: T.handle, b: T.handle, c: T.handle):{sizes}
    A = T.match_buffer(a, {shape(ashape)}, "{a}")
    B = T.match_buffer(b, {shape(bshape)}, "{b}")
    C = T.match_buffer(c, {shape(cshape)}, "{c}")''' if dims else
            f'def main(A: T.Buffer({shape(ashape)}, "{a}"), B: T.Buffer({shape(bshape)}, "{b}"), '
            f'C: T.Buffer({shape(cshape)}, "{c}")):')
    src = f'''
@T.prim_func(s_tir=True)
{head}
    with T.sblock("root"):
{init_out}        for {names} in T.grid({", ".join(str(ext[x]) for x in loops)}):
            with T.sblock("C"):
{axes}
{init_in}                C[{pre}vi, vj] = C[{pre}vi, vj] + {prod}
'''
    return parse(src)


def conv2d(n, c, h, w, oc, kh, kw, *, layout="NCHW", stride=1, dilation=1, dtype="float32",
           acc="float32", wdtype=None):
    """A direct conv2d block (no padding block) in NCHW/OIHW or NHWC/HWIO."""
    wdtype = wdtype or dtype
    oh = (h - dilation * (kh - 1) - 1) // stride + 1
    ow = (w - dilation * (kw - 1) - 1) // stride + 1
    hy, wx = f"vy * {stride} + vry * {dilation}", f"vx * {stride} + vrx * {dilation}"
    if layout == "NCHW":
        dshape, wshape, oshape = (n, c, h, w), (oc, c, kh, kw), (n, oc, oh, ow)
        didx, widx, oidx = f"vn, vrc, {hy}, {wx}", "vf, vrc, vry, vrx", "vn, vf, vy, vx"
    else:
        dshape, wshape, oshape = (n, h, w, c), (kh, kw, c, oc), (n, oh, ow, oc)
        didx, widx, oidx = f"vn, {hy}, {wx}, vrc", "vry, vrx, vrc, vf", "vn, vy, vx, vf"
    prod = f"{_cast(f'D[{didx}]', acc, dtype)} * {_cast(f'W[{widx}]', acc, wdtype)}"
    src = f'''
@T.prim_func(s_tir=True)
def main(D: T.Buffer({dshape}, "{dtype}"), W: T.Buffer({wshape}, "{wdtype}"), O: T.Buffer({oshape}, "{acc}")):
    for n, f, y, x, rc, ry, rx in T.grid({n}, {oc}, {oh}, {ow}, {c}, {kh}, {kw}):
        with T.sblock("conv"):
            vn, vf, vy, vx, vrc, vry, vrx = T.axis.remap("SSSSRRR", [n, f, y, x, rc, ry, rx])
            with T.init():
                O[{oidx}] = T.cast(0, "{acc}")
            O[{oidx}] = O[{oidx}] + {prod}
'''
    return parse(src)
