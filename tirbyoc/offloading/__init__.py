"""Layer 5, offload and verification: apply matches to functions, fall back when TVM refuses a
rewrite, and check every rewritten function against the untouched one on this machine."""
