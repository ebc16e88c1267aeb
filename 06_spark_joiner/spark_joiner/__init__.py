"""The deterministic join of local_stream_buffer as a PySpark Structured Streaming job, exactly once.

machine.data (Spark's Kafka source) -> validate and route (mapInArrow) -> keyed join in Spark's RocksDB
state (transformWithStateInPandas, one group per hash bucket, the engine's vectorised batch path) ->
machine.out and machine.dlq in one Kafka transaction per micro-batch (foreachBatch).
"""
