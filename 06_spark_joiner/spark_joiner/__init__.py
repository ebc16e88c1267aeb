"""The deterministic join of local_stream_buffer as a PySpark Structured Streaming job, exactly once.

machine.data (Spark's Kafka source) -> validate and route, column by column (mapInArrow) -> keyed join in
Spark's RocksDB state (transformWithStateInPandas, one group per bucket, the engine's keyed batch join),
output records built column by column -> machine.out and machine.dlq in one Kafka transaction per
micro-batch (foreachBatch).
"""
