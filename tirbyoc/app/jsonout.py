"""Strict JSON for everything tirbyoc prints or writes: no NaN, no Infinity."""

from __future__ import annotations

import json
import math


def finite(obj):
    """``obj`` with every NaN or infinite float replaced by None: JSON has no NaN, and a
    reader's parser (``jq``, JavaScript) rejects Python's ``NaN`` / ``Infinity``."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    return obj


def dumps(obj) -> str:
    """Strict JSON of ``obj`` (non-finite numbers as null)."""
    return json.dumps(finite(obj), indent=2, allow_nan=False)


__all__ = ["dumps", "finite"]
