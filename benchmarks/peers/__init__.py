"""The peers `python -m benchmarks.join_peers` measures beside this project's joiners.

`pairs`: the pairs each join semantics gives and how a peer's output compares with the engine's;
`workload`: the input, as the stream connector writes it, in several interleavings;
`spark_interval`: Spark's own stream-stream interval join; `quix_asof`: Quix Streams' as-of join.
"""
