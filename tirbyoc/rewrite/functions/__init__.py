"""Passes over a whole offloaded function, run as its named steps
(`tirbyoc.offloading.function_steps`) or in its lowering: copies of a parameter read in
place (`in_place`), scratchpad tiles double-buffered (`double_buffer`), GPU nests bound to
threads (`gpu_threads`). Imports the foundation room."""
