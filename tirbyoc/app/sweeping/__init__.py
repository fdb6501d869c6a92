"""`tirbyoc sweep`: template variants run over a search space (`search_space`) as a strategy
proposes them (`strategies`: the grid, random, TPE, NSGA-II) and an engine runs them
(`engines`: local processes, Dask), each point by `sweep.run_point`, streamed to a results
file (`sweep_results`), judged by `objectives`, reported by `sweep_report`. Imports the
model_in and running rooms."""
