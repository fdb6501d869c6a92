"""Exceptions tirbyoc raises on bad declarations and bad input.

Every message says what is wrong, where (intrinsic, template, buffer, field) and, where it
can, how to fix it. Matching never raises: it returns reasons instead.
"""


class TirbyocError(Exception):
    """Base class of every error tirbyoc raises on purpose."""


class DeclarationError(TirbyocError, ValueError):
    """An intrinsic, scope or template declaration is inconsistent."""


class IntrinsicError(DeclarationError):
    """An intrinsic's description, implementation or metadata disagree."""


class ScopeError(DeclarationError):
    """A memory scope is malformed or an operand does not fit it."""


class TemplateError(DeclarationError):
    """A template is malformed."""


class RegistrationConflict(TirbyocError):
    """Two different declarations were registered under one name."""


class UnknownTemplateError(TirbyocError, KeyError):
    """A template name that no registry entry or entry point provides."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class ExternLibraryError(TirbyocError):
    """An extern library could not be compiled, loaded or lacks a declared symbol."""


class RewriteError(TirbyocError):
    """A match could not be turned into TIR; says which step failed and why. `tirbyoc.offload`
    catches it and leaves the block to TVM's default lowering."""


class VerificationError(TirbyocError):
    """A function could not be built or run for verification (not: it computed wrong
    numbers, which `tirbyoc.verify` reports as a failed `Verification`)."""
