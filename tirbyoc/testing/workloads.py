"""Workload generators: schedulable PrimFuncs (matmul, batched matmul, conv2d) written as
TVMScript text so that shapes, dtypes, layouts, loop orders and index expressions vary
freely. Tests, benchmarks and examples build their workloads here."""
from dataclasses import dataclass, fields

import tvm.script


def parse(src: str):
    """A PrimFunc from TVMScript source defining one ``@T.prim_func(s_tir=True)`` (no import
    header: ``from_source`` provides ``T``)."""

    return tvm.script.from_source(src)


def _cast(expr: str, to: str, frm: str) -> str:
    return expr if to == frm else f'T.Cast("{to}", {expr})'


@dataclass(frozen=True)
class MatmulForm:
    """How `matmul` writes its block: layouts, loop order, where the init is."""

    trans_a: bool = False  # A is [k, m]
    trans_b: bool = False  # B is [n, k]
    order: str = "ijk"  # the loops, outermost first
    init: str = "inside"  # "inside": T.init(); "outside": a block of its own before; "none"
    swap_mul: bool = False  # B * A
    batch: int | None = None  # a leading batch dimension of this extent
    symbolic: bool | str = False  # extents known only at run time, as letters of "mnk" (True: "m")


@dataclass(frozen=True)
class ConvForm:
    """How `conv2d` writes its block: layout, stride, dilation, dtypes."""

    layout: str = "NCHW"  # NCHW/OIHW or NHWC/HWIO
    stride: int = 1
    dilation: int = 1
    dtype: str = "float32"  # the input's
    acc: str = "float32"  # the output's
    wdtype: str | None = None  # the weight's (None: ``dtype``)


def _form(record, changes: dict, caller: str):
    """``record()`` with the fields ``changes`` names; an unknown name is a TypeError."""
    names = [f.name for f in fields(record)]
    unknown = sorted(set(changes) - set(names))
    if unknown:
        raise TypeError(f"{caller}() got unknown option(s) {', '.join(unknown)}; it takes {', '.join(names)}")
    return record(**changes)


def matmul(m, n, k, a="float32", b="float32", c="float32", **form):
    """C[(b,) m, n] (+)= A[(b,) m, k] * B[(b,) k, n]; ``form`` (`MatmulForm`'s fields) moves
    layouts, loops and init. ``symbolic``: the extents known only at run time, as letters of
    ``"mnk"`` (True: ``"m"``); each becomes a size variable (``rows``, ``cols``, ``depth``) and
    its number is unused."""
    f = _form(MatmulForm, form, "matmul")
    trans_a, trans_b, order, init, swap_mul, batch, symbolic = (
        f.trans_a, f.trans_b, f.order, f.init, f.swap_mul, f.batch, f.symbolic)
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


def conv2d(n, c, h, w, oc, kh, kw, **form):
    """A direct conv2d block (no padding block) in NCHW/OIHW or NHWC/HWIO; ``form``:
    `ConvForm`'s fields."""
    f = _form(ConvForm, form, "conv2d")
    layout, stride, dilation, dtype, acc = f.layout, f.stride, f.dilation, f.dtype, f.acc
    wdtype = f.wdtype or dtype
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
