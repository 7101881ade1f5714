"""Benchmarks. Each `bench_*.py` module has a `main()` that measures the candidate and its
baseline in the same run and prints ratios; absolute timings vary on shared machines."""
