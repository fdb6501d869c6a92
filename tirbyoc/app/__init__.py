"""Layer 7, the application: the command line, `run`, sweeps, loaders for user models, built-in
models and the reports a person reads."""
