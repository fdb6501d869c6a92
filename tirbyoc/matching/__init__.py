"""Layer 3, matching: a workload block and a candidate intrinsic in, a `Match` or a typed
`Mismatch` out. Never rewrites IR, never raises on a workload."""
