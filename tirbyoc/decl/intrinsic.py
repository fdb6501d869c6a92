"""`Intrinsic`: one declaration of a tensor intrinsic.

An intrinsic is declared once: its signature (operands with dtype, scope and the layout its
implementation can read), its iteration axes, its role, its cost, and a builder that writes
the description (semantics) and implementation PrimFuncs in TVMScript. The signature is
plain data, so templates can be listed without parsing TVMScript (which costs ~20 ms a
function); the PrimFuncs are built on first use and then checked against the signature and
each other (`tirbyoc.decl.intrinsic_check`).
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field
from math import prod
from typing import Callable, Iterable

from tirbyoc.decl.extern import PackedFunction
from tirbyoc.decl.layout import Layout
from tirbyoc.decl.tensor_core import TensorCoreKernel
from tirbyoc.dtypes import dtype_bytes, is_valid_dtype
from tirbyoc.errors import IntrinsicError

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


class Role(str, enum.Enum):
    """What an intrinsic does inside a tensorized computation."""

    COMPUTE = "compute"  # the reduction core (dot product, GEMM tile, MMA)
    INIT = "init"  # zero or fill an accumulator
    LOAD = "load"  # copy / DMA into a scope the compute reads
    STORE = "store"  # copy / DMA out of the accumulator's scope
    ALU = "alu"  # elementwise work on the accumulator (add, max, shift, clip)

    def __str__(self) -> str:
        return self.value


DENSE = Layout()


@dataclass(frozen=True)
class Operand:
    """One buffer of an intrinsic's signature, in parameter order."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    scope: str = "global"
    layout: Layout = DENSE

    def __post_init__(self):
        object.__setattr__(self, "shape", tuple(self.shape))
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise IntrinsicError(f"operand name {self.name!r} is not an identifier")
        if not self.shape or any(
            isinstance(s, bool) or not isinstance(s, int) or s <= 0 for s in self.shape
        ):
            raise IntrinsicError(
                f"operand {self.name!r}: shape {self.shape!r} must be a non-empty tuple of "
                "positive ints"
            )
        if not is_valid_dtype(self.dtype):
            raise IntrinsicError(f"operand {self.name!r}: dtype {self.dtype!r} is not a TVM dtype")
        if not isinstance(self.layout, Layout):
            raise IntrinsicError(f"operand {self.name!r}: layout must be a tirbyoc.Layout")
        tile = self.layout.tile
        if tile is not None and (len(tile) != len(self.shape) or any(s % t for s, t in zip(self.shape, tile))):
            raise IntrinsicError(f"operand {self.name!r}: packing tile {tile} does not divide its shape "
                                 f"{self.shape} dimension by dimension")

    @property
    def stored_shape(self) -> tuple[int, ...]:
        """The shape of the implementation's buffer: the declared one, or its packed form."""
        return self.layout.packed_shape(self.shape)

    @property
    def nbytes(self) -> int:
        return prod(self.shape) * dtype_bytes(self.dtype)


@dataclass(frozen=True)
class Axis:
    """One iterator of the description's leaf block: name, extent, ``"S"`` or ``"R"``."""

    name: str
    extent: int
    kind: str = "S"

    def __post_init__(self):
        if self.kind not in ("S", "R"):
            raise IntrinsicError(
                f"axis {self.name!r}: kind {self.kind!r} must be 'S' (spatial) or 'R' (reduction)"
            )
        if isinstance(self.extent, bool) or not isinstance(self.extent, int) or self.extent <= 0:
            raise IntrinsicError(f"axis {self.name!r}: extent {self.extent!r} must be a positive int")


@dataclass(frozen=True)
class Cost:
    """What one call costs: cycles and bytes moved (None: derive from the operands)."""

    cycles: float = 1.0
    bytes_moved: int | None = None

    def __post_init__(self):
        if self.cycles is None or self.cycles < 0:
            raise IntrinsicError(f"cost cycles {self.cycles!r} must be >= 0")
        if self.bytes_moved is not None and self.bytes_moved < 0:
            raise IntrinsicError(f"cost bytes_moved {self.bytes_moved!r} must be >= 0")


Builder = Callable[[], tuple[object, object]]


class Intrinsic:
    """A tensor intrinsic declaration.

    Parameters
    ----------
    name : str
        Globally unique, dotted (``"x86_vnni.dot_16x4_u8i8i32"``); also the name it is
        registered under with ``tvm.s_tir.TensorIntrin``.
    role : Role or str
    operands : sequence of Operand
        The signature, in the order of the PrimFuncs' parameters.
    axes : sequence of Axis or (name, extent, kind) tuples
        The description's leaf-block iterators, in order.
    build : callable returning (desc, impl)
        Writes both PrimFuncs with ``@T.prim_func(s_tir=True)``. Called once, on first use.
    cost : Cost
    doc : str
        One line for listings.
    """

    def __init__(
        self,
        name: str,
        role: Role | str,
        operands: Iterable[Operand],
        axes: Iterable[Axis | tuple],
        build: Builder,
        *,
        cost: Cost | None = None,
        doc: str = "",
    ):
        if not isinstance(name, str) or not _NAME.match(name):
            raise IntrinsicError(f"intrinsic name {name!r} must be dotted identifiers")
        try:
            self.role = Role(role)
        except ValueError:
            raise IntrinsicError(
                f"intrinsic {name!r}: role {role!r} is not one of "
                f"{', '.join(r.value for r in Role)}"
            ) from None
        self.name = name
        self.operands = tuple(operands)
        if not self.operands or not all(isinstance(o, Operand) for o in self.operands):
            raise IntrinsicError(f"intrinsic {name!r}: operands must be a non-empty list of Operand")
        names = [o.name for o in self.operands]
        if len(set(names)) != len(names):
            raise IntrinsicError(f"intrinsic {name!r}: duplicate operand names {names}")
        self.axes = tuple(a if isinstance(a, Axis) else Axis(*a) for a in axes)
        if not self.axes:
            raise IntrinsicError(f"intrinsic {name!r}: declare at least one axis")
        unit = [a.name for a in self.axes if a.extent == 1]
        if unit:
            raise IntrinsicError(
                f"intrinsic {name!r}: axes {unit} have extent 1; TVM's tensorize cannot match "
                "unit-extent description loops. Drop the axis and index that dimension with 0"
            )
        if len({a.name for a in self.axes}) != len(self.axes):
            raise IntrinsicError(f"intrinsic {name!r}: duplicate axis names")
        if not callable(build):
            raise IntrinsicError(f"intrinsic {name!r}: build must be a callable returning (desc, impl)")
        self.cost = cost or Cost()
        self.doc = doc
        self._build = build
        self._funcs: tuple[object, object] | None = None

    # -- signature, no TVM needed -------------------------------------------------------
    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(a.extent for a in self.axes)

    @property
    def iter_kinds(self) -> str:
        return "".join(a.kind for a in self.axes)

    @property
    def dtypes(self) -> dict[str, str]:
        return {o.name: o.dtype for o in self.operands}

    @property
    def scopes(self) -> dict[str, str]:
        return {o.name: o.scope for o in self.operands}

    @property
    def bytes_moved(self) -> int:
        if self.cost.bytes_moved is not None:
            return self.cost.bytes_moved
        return sum(o.nbytes for o in self.operands)

    @property
    def macs(self) -> int:
        """Multiply-accumulates per call for a compute intrinsic (0 for the others)."""
        return prod(self.shape) if self.role is Role.COMPUTE else 0

    def operand(self, name: str) -> Operand:
        for o in self.operands:
            if o.name == name:
                return o
        raise KeyError(f"intrinsic {self.name!r} has no operand {name!r}; it has {list(self.dtypes)}")

    # -- the PrimFuncs, built and checked on first use --------------------------------
    def _funcs_checked(self):
        if self._funcs is None:
            # deferred: `import tirbyoc` stays free of TVM (importing it costs ~1.3 s)
            from tirbyoc.decl.bf16_pointers import bf16_pointers_as_bits
            from tirbyoc.decl.intrinsic_check import check_intrinsic

            try:
                funcs = self._build()
            except IntrinsicError:
                raise
            except Exception as err:  # TVMScript parse errors and the like
                raise IntrinsicError(
                    f"intrinsic {self.name!r}: its builder failed: {type(err).__name__}: {err}"
                ) from err
            if not (isinstance(funcs, tuple) and len(funcs) == 2):
                raise IntrinsicError(
                    f"intrinsic {self.name!r}: builder must return (desc, impl), got {type(funcs).__name__}"
                )
            check_intrinsic(self, *funcs)
            self._funcs = (funcs[0], bf16_pointers_as_bits(funcs[1]))
        return self._funcs

    @property
    def desc(self):
        """The description PrimFunc (validated)."""
        return self._funcs_checked()[0]

    @property
    def impl(self):
        """The implementation PrimFunc (validated)."""
        return self._funcs_checked()[1]

    def fresh_desc(self):
        """A new copy of the description with its own Buffer objects (for workloads)."""
        self._funcs_checked()
        return self._build()[0]

    def validate(self) -> "Intrinsic":
        """Build the PrimFuncs now and check them; raise `IntrinsicError` on disagreement."""
        self._funcs_checked()
        return self

    def register(self) -> str:
        """Register with ``tvm.s_tir.TensorIntrin`` (idempotent); return the name."""
        # deferred: `import tirbyoc` stays free of TVM (importing it costs ~1.3 s)
        from tirbyoc.decl.packed_desc import packed_description
        from tirbyoc.decl.tvm_registry import register_tensor_intrin

        desc, impl = self._funcs_checked()
        register_tensor_intrin(self.name, packed_description(desc, self.operands), impl)
        return self.name

    @classmethod
    def from_prim_funcs(
        cls,
        name: str,
        role: Role | str,
        desc,
        impl,
        *,
        layouts: dict[str, Layout] | None = None,
        cost: Cost | None = None,
        doc: str = "",
    ) -> "Intrinsic":
        """Declare an intrinsic from ready PrimFuncs; signature derived and checked now."""
        # deferred: `import tirbyoc` stays free of TVM (importing it costs ~1.3 s)
        from tirbyoc.decl.intrinsic_check import signature_of

        operands, axes = signature_of(name, desc, layouts or {})
        intrin = cls(name, role, operands, axes, lambda: (desc, impl), cost=cost, doc=doc)
        return intrin.validate()

    def __repr__(self) -> str:
        return f"Intrinsic({self.name!r}, {self.role.value}, shape={self.shape})"


class AxisExtents(dict):
    """What a group's ``resize`` is given: the compute intrinsic's axis -> extent (``{"vi":
    1000, "vj": 17, "vk": 300}``), and in ``fused`` each axis's workload iterators' extents,
    outer to inner, where the matcher fused several into it (a convolution's (kh, kw, c) into
    one reduction: ``{"vk": (3, 3, 64)}``), so a kernel can tell a window from a plain K."""

    def __init__(self, extents: dict, fused: dict | None = None):
        super().__init__(extents)
        self.fused = dict(fused or {})


@dataclass(frozen=True)
class IntrinsicGroup:
    """The intrinsics that together tensorize one computation, in TVM's own shape
    (``MultiLevelTilingTensorCore``'s ``init / load_a / load_b / compute / store``).

    ``epilogue``: elementwise ALU steps the device can apply to the accumulator before it
    is stored, in the order it applies them. A chain of blocks - the compute followed by
    any in-order subsequence of these steps (GEMM, bias add, ReLU, shift-and-clip) - is
    matched as one fused offload (`tirbyoc.match_chains`).

    ``resize``: for library calls that take any size, a function from the compute
    intrinsic's axis extents (an `AxisExtents`: ``{"vi": 1000, "vj": 17, "vk": 300}``, with the
    fused iterators' extents beside) to a group declared for exactly those extents. The
    matcher matches the declared (tile-sized) group; the rewrite engine then asks for the
    exact-size group so a block becomes one library call with no padding. ``resize_pads``:
    the re-declared group keeps a fixed tile along some axes (AMX: 32 x 32 outputs, the whole
    reduction per call), which the block is padded to.

    ``packed``: a `PackedFunction` computing this group's whole computation. When a PrimFunc
    is nothing but that computation over its own parameters (one block, zero init, every
    operand addressed in place, no padding), the Relax bridge replaces its ``call_tir`` with
    ``R.call_dps_packed`` of this function and attaches the library to the module.

    ``kernel``: for a GPU group, the fast tensor-core kernel its computation is scheduled as
    where one of its block tiles fits (`tirbyoc.decl.tensor_core.TensorCoreKernel`); the
    group's own intrinsics (one warp per block) take the shapes it does not.
    """

    name: str
    compute: Intrinsic
    init: Intrinsic | None = None
    loads: tuple[Intrinsic, ...] = field(default_factory=tuple)
    store: Intrinsic | None = None
    epilogue: tuple[Intrinsic, ...] = field(default_factory=tuple)
    resize: Callable[[dict], "IntrinsicGroup"] | None = field(default=None, compare=False)
    packed: PackedFunction | None = field(default=None, compare=False)
    resize_pads: bool = False
    kernel: TensorCoreKernel | None = field(default=None, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "loads", tuple(self.loads))
        object.__setattr__(self, "epilogue", tuple(self.epilogue))
        expect = [("compute", self.compute, Role.COMPUTE), ("init", self.init, Role.INIT),
                  ("store", self.store, Role.STORE)]
        expect += [("loads", i, Role.LOAD) for i in self.loads]
        expect += [("epilogue", i, Role.ALU) for i in self.epilogue]
        for slot, intrin, role in expect:
            if intrin is None:
                continue
            if not isinstance(intrin, Intrinsic):
                raise IntrinsicError(f"group {self.name!r}: {slot} must be an Intrinsic, got {intrin!r}")
            if intrin.role is not role:
                raise IntrinsicError(
                    f"group {self.name!r}: {slot} slot holds {intrin.name!r} whose role is "
                    f"{intrin.role.value}, expected {role.value}"
                )
        if self.packed is not None and not isinstance(self.packed, PackedFunction):
            raise IntrinsicError(f"group {self.name!r}: packed must be a PackedFunction, got {self.packed!r}")
        if self.kernel is not None and not isinstance(self.kernel, TensorCoreKernel):
            raise IntrinsicError(f"group {self.name!r}: kernel must be a TensorCoreKernel, got {self.kernel!r}")
        if self.resize is not None and not callable(self.resize):
            raise IntrinsicError(f"group {self.name!r}: resize must be callable, got {self.resize!r}")

    def members(self) -> tuple[Intrinsic, ...]:
        out = [self.compute]
        if self.init:
            out.append(self.init)
        out += self.loads
        if self.store:
            out.append(self.store)
        out += self.epilogue
        return tuple(out)
