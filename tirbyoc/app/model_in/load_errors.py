"""The errors of loading a model file (`tirbyoc.app.model_in.loaders`, `tirbyoc.app.model_in.torch_export`)."""

from __future__ import annotations

from tirbyoc.errors import ModelError, TirbyocError


class LoadError(TirbyocError):
    """A workload file that cannot be loaded (missing, malformed, raises at import, ...)."""


class ModelImportError(LoadError, ModelError):
    """TVM's importer (or torch.export, or the model file's own code) failed on the model
    (exit code 3, where a file tirbyoc cannot use is a usage error, 2)."""
