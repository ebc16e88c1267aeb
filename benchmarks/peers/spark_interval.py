"""Spark's own stream-stream join, set up as Spark's guide recommends for joining two event streams in time.

An inner join of the speed and the torque stream of each machine and axis, on event time within the spec's
delta_time (``torque.t BETWEEN speed.t - delta AND speed.t + delta``), a watermark on each input so Spark
can drop old state, and Spark's Kafka sink. It reads ``machine.data`` exactly as the project's Spark job
does (``spark_joiner.job.kafka_source``) and writes output records of the engine's shape, without the
``case`` and ``id`` fields, which this join has no notion of.

What Spark gives here: each micro-batch's input exactly once into the join state (checkpointed offsets
and state), but the Kafka sink is at-least-once: a micro-batch that wrote its records and then failed
before its commit is written again on restart. Spark offers no transactional Kafka sink.
"""
from __future__ import annotations

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery
from pyspark.sql.types import DoubleType, StringType, StructField, StructType

from local_stream_buffer.specs import AXIS_PLACEHOLDER, JoinSpec

from spark_joiner.job import kafka_source
from spark_joiner.settings import SparkJoinerSettings

QUERY_NAME = "spark_interval_join"
RECORD_SCHEMA = StructType([
    StructField("thing", StringType()),
    StructField("quantity", StringType()),
    StructField("phenomenonTime", DoubleType()),
    StructField("result", DoubleType()),
])
STATE_STORE_PROVIDER = "spark.sql.streaming.stateStore.providerClass"
# Spark's default store, in the JVM's memory. Its guide suggests RocksDB for millions of keys; this join has a
# few keys with many rows each, which it reads one by one for every arriving row: RocksDB point reads made it
# two to four times slower here.
IN_MEMORY_STATE_STORE = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"
# The engine's named formulas (local_stream_buffer.formulas) as SQL, over the left and right result.
FORMULA_SQL = {
    "power": "2 * pi() / 60 * left_result * right_result",
    "product": "left_result * right_result",
    "difference": "left_result - right_result",
    "ratio": "left_result / nullif(right_result, 0)",
}


def quantity_regex(pattern: str, axis_pattern: str) -> str:
    """A Java regular expression for a spec's quantity pattern, its axis as group 1 (none: the empty group)."""
    if AXIS_PLACEHOLDER not in pattern:
        return rf"^\Q{pattern}\E()$"
    prefix, suffix = pattern.split(AXIS_PLACEHOLDER, 1)
    return rf"^\Q{prefix}\E({axis_pattern})\Q{suffix}\E$"


def _side(records: DataFrame, spec: JoinSpec, pattern: str, name: str, watermark: str) -> DataFrame:
    """One input stream of the join: the records of ``pattern``, with their axis and event time, watermarked."""
    axis = F.regexp_extract("quantity", quantity_regex(pattern, spec.axis_pattern), 1)
    return (records.where(F.col("quantity").rlike(quantity_regex(pattern, spec.axis_pattern)))
            .select(F.col("thing").alias(f"{name}_thing"), axis.alias(f"{name}_axis"),
                    F.col("quantity").alias(f"{name}_quantity"),
                    F.col("phenomenonTime").alias(f"{name}_ms"), F.col("result").alias(f"{name}_result"),
                    F.timestamp_micros(F.round(F.col("phenomenonTime") * 1000).cast("long")).alias(f"{name}_t"))
            .withWatermark(f"{name}_t", watermark))


def _output(joined: DataFrame, spec: JoinSpec) -> DataFrame:
    """Output records of the engine's shape, keyed by thing."""
    prefix, _, suffix = spec.output.partition(AXIS_PLACEHOLDER)
    output_quantity: Column = (F.concat(F.lit(prefix), F.col("left_axis"), F.lit(suffix))
                               if AXIS_PLACEHOLDER in spec.output else F.lit(spec.output))
    side = {name: F.struct(F.col(f"{name}_quantity").alias("quantity"),
                           F.col(f"{name}_ms").alias("phenomenonTime"),
                           F.col(f"{name}_result").alias("result")) for name in ("left", "right")}
    record = F.struct(F.col("left_thing").alias("thing"), output_quantity.alias("quantity"),
                      ((F.col("left_ms") + F.col("right_ms")) / 2).alias("phenomenonTime"),
                      F.expr(FORMULA_SQL[spec.formula]).alias("result"),
                      side["left"].alias("left"), side["right"].alias("right"))
    return joined.select(F.col("left_thing").alias("key"), F.to_json(record).alias("value"))


def interval_join(spark: SparkSession, settings: SparkJoinerSettings, specs: tuple[JoinSpec, ...],
                  watermark_s: float) -> DataFrame:
    """The joined output records of every spec, as a streaming frame of (key, value)."""
    records = (kafka_source(spark, settings)
               .select(F.from_json(F.col("value").cast("string"), RECORD_SCHEMA).alias("record"))
               .select("record.*").where(F.col("phenomenonTime").isNotNull() & F.col("result").isNotNull()))
    watermark = f"{int(watermark_s * 1000)} milliseconds"
    outputs = []
    for spec in specs:
        if spec.delta_time_s is None:
            raise ValueError(f"join '{spec.name}': an interval join needs a delta_time_s to bound its state")
        left = _side(records, spec, spec.left, "left", watermark)
        right = _side(records, spec, spec.right, "right", watermark)
        delta = F.expr(f"INTERVAL {int(spec.delta_time_s * 1000)} MILLISECONDS")
        joined = left.join(right, (F.col("left_thing") == F.col("right_thing"))
                           & (F.col("left_axis") == F.col("right_axis"))
                           & (F.col("right_t") >= F.col("left_t") - delta)
                           & (F.col("right_t") <= F.col("left_t") + delta), "inner")
        outputs.append(_output(joined, spec))
    union = outputs[0]
    for other in outputs[1:]:
        union = union.unionByName(other)
    return union


def start_interval_join(spark: SparkSession, settings: SparkJoinerSettings, specs: tuple[JoinSpec, ...],
                        watermark_s: float) -> StreamingQuery:
    """Start the interval join into Spark's Kafka sink (``settings.output_topic``), checkpointed in
    ``settings.checkpoint_dir``, with the trigger and batch size of ``settings``, on Spark's default state store.

    The session's store (RocksDB, which the project's job needs) is set back once the query has started with
    its own: a query keeps the settings it started with."""
    query = (interval_join(spark, settings, specs, watermark_s).writeStream.queryName(QUERY_NAME)
             .format("kafka")
             .option("kafka.bootstrap.servers", settings.kafka_bootstrap_servers)
             .option("topic", settings.output_topic)
             .option("checkpointLocation", str(settings.checkpoint_dir))
             .outputMode("append")
             .trigger(processingTime=f"{int(settings.trigger_s * 1000)} milliseconds"))
    session_store = spark.conf.get(STATE_STORE_PROVIDER)
    spark.conf.set(STATE_STORE_PROVIDER, IN_MEMORY_STATE_STORE)
    try:
        return query.start()
    finally:
        spark.conf.set(STATE_STORE_PROVIDER, session_store)
