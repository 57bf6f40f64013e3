"""statekit benchmarks (pytest-benchmark); see docs/benchmarks.md and ``make bench``."""
