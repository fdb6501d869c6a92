"""Layer 4, rewrite: a `Match` in, scheduled TIR out, as a pipeline of named stages built from
TVM schedule primitives (`block.tensorize.tensorize` is the entry point). In rooms by role,
each importing only the rooms before it (`tests/test_layers.py`):

    foundation < functions < cpu < block < rest_schedule

``foundation`` (steps, the rewrite's state, the stage order and its runner), ``functions``
(passes over a whole offloaded function), ``cpu`` (the CPU schedule family: register blocks,
weight layout, the fused write-back), ``block`` (the per-block stages and their planners) and
``rest_schedule`` (the schedule of what no template took)."""
