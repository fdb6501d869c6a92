"""tirbyoc: bring your own codegen at the TIR level.

Declare tensor intrinsics and accelerator templates (`Intrinsic`, `Template`), find the
blocks of TensorIR PrimFuncs they can compute, and offload those blocks.

``import tirbyoc`` is cheap: TVM is imported only when IR is built or inspected.
"""

from __future__ import annotations

from .errors import (
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
from .extern import ExternLibrary, PackedFunction
from .intrinsic import DENSE, Axis, Cost, Intrinsic, IntrinsicGroup, Layout, Operand, Role
from .registry import get_template, register_template, template_names, templates
from .scope import GLOBAL, Scope
from .template import Runtime, Template

__version__ = "0.1.0"

# The matcher imports TVM; load it on first use so that ``import tirbyoc`` stays cheap.
_LAZY = {
    "match": "matcher", "explain": "matcher", "Match": "matcher", "AxisMap": "matcher",
    "OperandMap": "matcher", "BlockResult": "matcher", "match_chains": "chain", "ChainMatch": "chain",
    "tensorize": "rewrite", "Rewritten": "rewrite", "offload": "offloading", "Offloaded": "offloading",
    "verify": "verification", "Verification": "verification", "relax_vm": "_tvm",
}


def __getattr__(name):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tirbyoc' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f".{module}", __name__), name)


__all__ = [
    "Axis", "Cost", "DENSE", "DeclarationError", "ExternLibrary", "ExternLibraryError", "GLOBAL", "PackedFunction",
    "Intrinsic", "IntrinsicError", "IntrinsicGroup", "Layout", "Operand", "RegistrationConflict",
    "RewriteError", "Role", "Runtime", "Scope", "ScopeError", "Template", "TemplateError", "TirbyocError",
    "UnknownTemplateError", "VerificationError", "get_template", "register_template", "template_names", "templates",
    *_LAZY,
]
