"""Layer 1, declarations: what a vendor writes - intrinsics, scopes, extern libraries, templates
and the registry that finds them. Imports nothing of tirbyoc but the root (errors, dtypes, _tvm)."""
