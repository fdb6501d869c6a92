"""tirbyoc's accelerator template library (import name ``tirbyoc_intrinsics``).

One module a template, each a set of declarations built with tirbyoc's public API and
exposed as ``TEMPLATE`` through the ``tirbyoc.templates`` entry-point group. Template modules
import TVMScript inside their builders so that listing templates never parses TVMScript.
"""
