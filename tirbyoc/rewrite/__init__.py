"""Layer 4, rewrite: a `Match` in, scheduled TIR out, as a pipeline of named stages built from
TVM schedule primitives (`tensorize.tensorize` is the entry point)."""
