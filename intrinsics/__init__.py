"""tirbyoc's accelerator template library (import name ``tirbyoc_intrinsics``).

One module a template, each a set of declarations built with tirbyoc's public API and
exposed as ``TEMPLATE`` through the ``tirbyoc.templates`` entry-point group. Template modules
import TVMScript inside their builders so that listing templates never parses TVMScript.

Template modules must not use ``from __future__ import annotations``: TVMScript then cannot
see closure variables used only in buffer annotations (a generator's ``scope`` or ``dtype``).
"""
