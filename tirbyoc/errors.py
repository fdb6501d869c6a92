"""Exceptions tirbyoc raises on bad declarations and bad input.

Every message says what is wrong, where (intrinsic, template, buffer, field) and, where it
can, how to fix it. Matching never raises: it returns reasons instead.
"""


class TirbyocError(Exception):
    """Base class of every error tirbyoc raises on purpose. ``exit_code``: what the command
    line exits with (2: a usage error - bad arguments, files, templates or targets)."""

    exit_code = 2


def last_line(err: BaseException) -> str:
    """The last line of an exception's message (TVM puts its own message at the end of a C++
    traceback), or the exception's type when the message is empty."""
    text = str(err).strip()
    return text.splitlines()[-1] if text else type(err).__name__


def schedule_error_line(err: BaseException) -> str:
    """The line of a TVM schedule error that says what went wrong (its "Error message" or
    "ScheduleError" line), else `last_line`."""
    text = str(err).strip().splitlines()
    line = next((ln for ln in text if "Error message" in ln or ln.startswith("ScheduleError")), None)
    return line.strip() if line else last_line(err)


class ModelError(TirbyocError):
    """TVM itself could not import or build the user's model, before any offload: the
    model or TVM is at fault, not tirbyoc's rewrite. The command line exits with 3."""

    exit_code = 3


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
