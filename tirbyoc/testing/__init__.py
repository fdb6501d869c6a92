"""Layer 8, testing tools that ship with the library: the differential fuzzer and the TVMScript
workload generators the tests and benchmarks share."""
