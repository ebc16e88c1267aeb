"""The benchmarks of `make bench`, one module per stage, kept apart from the runtime packages.

Run one from the repository's root: `python -m benchmarks.join_engine`."""
