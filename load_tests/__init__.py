"""Load generation and benchmarks: Locust file, benchmark harness, dataset loaders."""
