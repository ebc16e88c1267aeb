"""The streaming query: Kafka source -> route -> keyed join in Spark state -> transactional sink."""
from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from local_stream_buffer.spec_changes import fingerprints
from local_stream_buffer.specs import load_join_specs
from pipeline_core.kafka_clients import REQUEST_TIMEOUT_MS, java_security_options

from .parse import KAFKA_COLUMNS, PACKED_SCHEMA, RecordRouter
from .processor import OUTPUT_SCHEMA, BucketJoinProcessor
from .settings import SparkJoinerSettings
from .sink import TransactionalBatchSink
from .state_layout import IDLE_RELEASE_LAYOUT, STATE_LAYOUT

QUERY_NAME = "spark_joiner"
# Spark's Kafka source names its consumer groups <prefix>-<query id>-...; the sink's group and transactional id
# start with `spark-joiner.` (settings.sink_transactional_id): on a secure Kafka, one prefixed group ACL covers both.
SOURCE_GROUP_PREFIX = "spark-joiner"


# Hadoop's FileContext API, which Structured Streaming uses for checkpoint files by default, sets each new
# file's permissions and resolves links on rename by starting `chmod` and `readlink` processes when Hadoop's
# native library is absent (as with pip's pyspark): several per micro-batch, from a JVM with a large heap.
# The FileSystem API writes local files with Java's own calls. Either keeps the write-then-rename protocol.
CHECKPOINT_FILE_MANAGER = "spark.sql.streaming.checkpointFileManagerClass"
FILE_SYSTEM_CHECKPOINTS = "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"


def start_query(spark: SparkSession, settings: SparkJoinerSettings, sink: TransactionalBatchSink) -> StreamingQuery:
    """Start the join query; it resumes from ``settings.checkpoint_dir`` when that holds a checkpoint, and
    rebuilds its state from the input's beginning when not (see `sink`)."""
    specs = load_join_specs(settings.join_specs)
    committed = sink.resume(settings.input_topic, str(settings.checkpoint_dir), list(fingerprints(specs)))
    if is_local_path(str(settings.checkpoint_dir)):
        spark.conf.set(CHECKPOINT_FILE_MANAGER, FILE_SYSTEM_CHECKPOINTS)
    routed = kafka_source(spark, settings).mapInArrow(RecordRouter(settings.join_specs, settings.buckets), PACKED_SCHEMA)
    joined = routed.groupBy("bucket").transformWithStateInPandas(
        statefulProcessor=BucketJoinProcessor(settings.join_specs, settings.input_topic,
                                              settings.max_pending_per_side, committed=committed,
                                              max_join_keys=settings.max_join_keys or None,
                                              spec_starts=sink.spec_starts),
        outputStructType=OUTPUT_SCHEMA,
        outputMode="Append",
        # Timers for the idle release. Spark then runs a micro-batch at every trigger, input or not: only then.
        timeMode="ProcessingTime" if releases_idle(settings) else "None",
    )
    return (
        joined.writeStream.queryName(QUERY_NAME)
        .foreachBatch(sink)
        .option("checkpointLocation", str(settings.checkpoint_dir))
        .trigger(processingTime=f"{int(settings.trigger_s * 1000)} milliseconds")
        .start()
    )


def releases_idle(settings: SparkJoinerSettings) -> bool:
    """Whether a join spec releases quiet streams (``idle_release_s``): the query then keeps timers."""
    return any(spec.idle_release_s is not None for spec in load_join_specs(settings.join_specs))


def state_layout(settings: SparkJoinerSettings) -> str:
    """The layout of the join's state, recorded beside the checkpoint (`checkpoint.prepare_checkpoint`): turning the
    idle release on or off changes the query's time mode, so the state is rebuilt then."""
    return IDLE_RELEASE_LAYOUT if releases_idle(settings) else STATE_LAYOUT


def has_started(query: StreamingQuery) -> bool:
    """The query's first trigger is done: its first micro-batch ran (on a new checkpoint it runs at once, input or
    not, and creates the state store and the Python workers), or a resumed query found no input to run on."""
    return query.lastProgress is not None or query.status["message"] == "Waiting for data to arrive"


# How long Spark's Kafka clients (the driver's offset reader, the executors' consumers) wait on one node before they
# ask another, as every client of the pipeline (`pipeline_core.kafka_clients.REQUEST_TIMEOUT_MS`). With the Java
# clients' defaults (30 s a request, 60 s a call, each retried by Spark) the source held the query for about 70 s of
# a Kafka node's freeze beyond what the stream connector was held, long after the node's partitions led from the
# others (measured on the cluster, docs/reliability.md).
FROZEN_NODE_TIMEOUTS = {
    "kafka.request.timeout.ms": str(REQUEST_TIMEOUT_MS),
    "kafka.default.api.timeout.ms": str(2 * REQUEST_TIMEOUT_MS),
    "kafka.socket.connection.setup.timeout.ms": str(REQUEST_TIMEOUT_MS // 2),
    "kafka.socket.connection.setup.timeout.max.ms": str(REQUEST_TIMEOUT_MS),
}


def kafka_source(spark: SparkSession, settings: SparkJoinerSettings) -> DataFrame:
    """The input records as the job reads them: value, partition and offset of each, from Spark's Kafka source."""
    reader = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", settings.kafka_bootstrap_servers)
        .options(**java_security_options(settings))  # holds the password: never logged
        .option("subscribe", settings.input_topic)
        # The partition count each record was placed by (pipeline_core.partitioning.PLACEMENT_HEADER), see parse.
        .option("includeHeaders", "true")
        .option("groupIdPrefix", SOURCE_GROUP_PREFIX)
        .option("startingOffsets", "earliest")
        # Only committed input; the connector writes without transactions, so this changes nothing there.
        .option("kafka.isolation.level", "read_committed")
        # Records past retention are gone for every reader: go on rather than stop the pipeline. The progress
        # updates show what was lost, and the joiner counts it (progress.batch_loss).
        .option("failOnDataLoss", "false")
        .options(**FROZEN_NODE_TIMEOUTS)
    )
    if settings.max_offsets_per_trigger > 0:
        reader = reader.option("maxOffsetsPerTrigger", settings.max_offsets_per_trigger)
    return reader.load().select(*KAFKA_COLUMNS)


def is_local_path(path: str) -> bool:
    """A path without a URI scheme (or with ``file:``): the checkpoint is on this machine's file system."""
    scheme, colon, _ = path.partition(":")
    return not colon or scheme == "file" or "/" in scheme
