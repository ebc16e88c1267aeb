"""The peers `python -m benchmarks.join_peers` measures beside this project's joiners.

`pairs`: the pairs each join semantics gives and how a peer's output compares with the engine's;
`workload`: the input, as the stream connector writes it, in several interleavings and with bounded disorder;
`spark_interval`: Spark's own stream-stream interval join, in the bench's Spark session;
`quix_asof` (Quix Streams' as-of join), `flink_sql` (PyFlink SQL's interval and temporal joins) and
`pathway_asof` (Pathway's as-of joins): scripts that run in virtualenvs of their own (`venvs`), started and
measured by `subprocess_peer`, sharing only `peer_io` (standard library) with the bench.
"""
