"""`tirbyoc run`: both builds (TVM's of the untouched model, the offloaded one) made for the
target `targets` completes, run, compared and timed (`run`), each offloaded function timed
alone (`profiling`), ONNX Runtime beside them (`reference`), and what a run reports
(`result`). Imports the model_in room."""
