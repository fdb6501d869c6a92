"""tirbyoc: bring your own codegen at the TIR level.

Declare tensor intrinsics and accelerator templates (`Intrinsic`, `Template`), find the
blocks of TensorIR PrimFuncs they can compute, and offload those blocks.

``import tirbyoc`` is cheap: TVM is imported only when IR is built or inspected.
"""

from __future__ import annotations

import importlib

from tirbyoc.decl.alu import BlockALU
from tirbyoc.decl.dma import BlockDMA
from tirbyoc.decl.extern import ExternLibrary, PackedFunction
from tirbyoc.decl.declare import Call, Fill, Vector, call_impl, declare, description, vector_impl, vector_intrinsic
from tirbyoc.decl.families import (dot_product, dot_product_desc, dot_product_semantics, dot_product_signature,
                                   tile_copy_desc, tile_copy_signature, zero_fill, zero_fill_desc, zero_fill_signature)
from tirbyoc.decl.intrinsic import DENSE, Axis, Cost, Intrinsic, IntrinsicGroup, Layout, Operand, Role
from tirbyoc.decl.registry import get_template, register_template, template_names, templates
from tirbyoc.decl.variants import VectorVariant, variants
from tirbyoc.decl.requirements import requires_cpu
from tirbyoc.decl.scope import GLOBAL, Scope
from tirbyoc.decl.tensor_core import BlockTiling, TensorCoreKernel
from tirbyoc.decl.template import Runtime, Template
from tirbyoc.errors import (
    DeclarationError,
    ExternLibraryError,
    IntrinsicError,
    RegistrationConflict,
    RewriteError,
    ScopeError,
    TemplateError,
    TirbyocError,
    UnknownTemplateError,
    VerificationError,
)

__version__ = "0.1.0"

# The matcher and the application import TVM; load them on first use so that ``import tirbyoc``
# stays cheap.
_LAZY = {
    "match": "matching.matcher", "explain": "matching.matcher", "Match": "matching.results",
    "AxisMap": "matching.results", "OperandMap": "matching.results", "BlockResult": "matching.results",
    "Mismatch": "matching.results",
    "match_chains": "matching.chain", "ChainMatch": "matching.chain",
    "tensorize": "rewrite.block.tensorize", "Rewritten": "rewrite.block.tensorize",
    "offload": "offloading.offloader", "Offloaded": "offloading.offloader",
    "verify": "offloading.verification", "Verification": "offloading.verification", "relax_vm": "_tvm",
    "PIPELINE": "offloading.lowering", "self_check": "offloading.selfcheck",
    # the application's front door: what README, docs, examples and benchmarks call
    "run_model": "app.running.run", "RunOptions": "app.options", "build_library": "app.building.deploy",
    "build_model": "app.model_in.models", "quantize": "app.model_in.models", "import_onnx": "app.model_in.loaders",
    "sweep": "app.sweeping.sweep", "search_model": "app.sweeping.sweep", "legalized_model": "app.model_in.legalize",
}


def __getattr__(name):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tirbyoc' has no attribute {name!r}")

    return getattr(importlib.import_module(f".{module}", __name__), name)


__all__ = [
    "Axis", "BlockALU", "Call", "Fill", "Vector", "call_impl", "declare", "BlockDMA", "BlockTiling", "Cost", "DENSE", "DeclarationError", "ExternLibrary", "ExternLibraryError", "GLOBAL", "PackedFunction",
    "Intrinsic", "IntrinsicError", "IntrinsicGroup", "Layout", "Operand", "RegistrationConflict",
    "RewriteError", "Role", "Runtime", "Scope", "ScopeError", "TensorCoreKernel", "Template", "TemplateError", "TirbyocError",
    "UnknownTemplateError", "VectorVariant", "VerificationError", "description", "dot_product", "dot_product_desc",
    "dot_product_semantics", "dot_product_signature", "get_template",
    "register_template", "requires_cpu", "template_names", "templates", "tile_copy_desc", "tile_copy_signature",
    "variants", "vector_impl", "vector_intrinsic", "zero_fill", "zero_fill_desc", "zero_fill_signature",
    *_LAZY,
]
