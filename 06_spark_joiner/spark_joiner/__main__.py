"""``python -m spark_joiner``: run the join as a Structured Streaming job until SIGTERM/SIGINT."""
from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from pyspark.errors import StreamingQueryException

from pipeline_core import credentials
from pipeline_core.broker_offsets import BrokerOffsets
from pipeline_core.kafka_clients import admin_client, security_config
from pipeline_core.lifecycle import exit_on_thread_failure, process_stop_signal
from pipeline_core.logs import announce_ready, configure_logging
from pipeline_core.progress import ProgressReporter
from pipeline_core.runtime import tune_gc_for_streaming
from pipeline_core.settings import load_settings
from pipeline_core.topics import partition_count

from .checkpoint import prepare_checkpoint
from .job import has_started, start_query, state_layout
from .progress import LABELS, LATEST_OFFSETS_TIMEOUT_S, QueryProgress, SparkJoinerCounters
from .session import spark_session, under_spark_submit
from .settings import SparkJoinerSettings
from .sink import TransactionalBatchSink

log = logging.getLogger("spark_joiner")


def main(argv: Sequence[str] | None = None, prog: str = "python -m spark_joiner") -> int:
    configure_logging()
    logging.getLogger("py4j").setLevel(logging.WARNING)  # one line per callback otherwise
    settings = load_settings(SparkJoinerSettings, argv, prog=prog,
                             environ=credentials.environ_for("spark-joiner"))
    stop = process_stop_signal()
    exit_on_thread_failure()
    prepare_checkpoint(settings.checkpoint_dir, settings.buckets, settings.shuffle_partitions, state_layout(settings))
    # Before the JVM starts: a missing topic, or a broker that does not come up, ends the start with a clear
    # message instead of a query that waits on its own.
    security = security_config(settings)
    admin = admin_client(settings.kafka_bootstrap_servers, **security)
    for topic in (settings.input_topic, settings.output_topic, settings.dlq_topic):
        partition_count(admin, topic, settings.kafka_startup_deadline_s)
    log.info("starting Spark (%s); checkpoint %s", "spark-submit's master" if under_spark_submit() else settings.master,
             settings.checkpoint_dir)
    # The sink's start (fencing, its last batch id) meets the coordinators of a just started broker, which may
    # take seconds to answer: it waits for them while the JVM starts.
    with ThreadPoolExecutor(1, thread_name_prefix="sink-start") as starting:
        sink_started = starting.submit(TransactionalBatchSink, settings.kafka_bootstrap_servers, settings.output_topic,
                                       settings.dlq_topic, settings.sink_transactional_id(),
                                       settings.kafka_startup_deadline_s, security,
                                       settings.kafka_transaction_timeout_s)
        spark = spark_session(settings.master, shuffle_partitions=settings.shuffle_partitions,
                              driver_memory=settings.driver_memory)
        sink = sink_started.result()
    master = spark.sparkContext.master  # spark-submit's under spark-submit, else --master
    broker_offsets = BrokerOffsets(settings.kafka_bootstrap_servers, LATEST_OFFSETS_TIMEOUT_S, security=security)
    query_progress = QueryProgress(SparkJoinerCounters(), sink.counters, broker_offsets.latest, broker_offsets.earliest,
                                   sink_waiting_for=lambda: sink.waiting_for)
    progress = ProgressReporter.for_stage("spark_joiner", query_progress.counters, settings,
                                          observe=query_progress.observe, logger=log, labels=LABELS,
                                          progress_counters=("batches",))
    # A restarted query's resume() may wait minutes for Kafka: the heartbeat says what it waits for meanwhile.
    sink.while_waiting = progress.maybe_report
    query = query_progress.query = start_query(spark, settings, sink)
    tune_gc_for_streaming()  # the sink unpacks and produces every output record in this process
    ready = False
    restarts = 0
    try:
        while not stop.is_set():
            try:
                query.awaitTermination(0.5)
            except StreamingQueryException:
                pass  # handled below, through query.exception()
            if not ready and has_started(query):
                # Only now: the first micro-batch creates the state store and starts the Python workers, which
                # took longer than every later batch; the first input then meets a running job.
                announce_ready(log, f"spark joiner: {settings.input_topic} -> {settings.output_topic} "
                                    f"on {master}")
                ready = True
            progress.maybe_report()
            if query.isActive:
                continue
            error = query.exception()
            if error is None:
                break
            # Spark 4.1.1's Kafka source fails the first batch replayed from the offset log after a crash
            # (a NullPointerException in its progress metrics, apache/spark#55236) once the batch itself
            # is committed. Restarting the query from the checkpoint resumes cleanly.
            restarts += 1
            query_progress.query_failures += 1
            if restarts > settings.max_query_restarts:
                log.error("query failed %d times, giving up: %s", restarts, error)
                return 1
            log.warning("query failed, restarting it from the checkpoint (%d of at most %d): %s", restarts,
                        settings.max_query_restarts, str(error).splitlines()[0][:300])
            query = query_progress.query = start_query(spark, settings, sink)
        log.info("stopping: %d batches committed, %d joins, %d dead letters", sink.counters.batches,
                 sink.counters.joins, sink.counters.dead_letters)
        query.stop()  # an interrupted batch is neither in Kafka nor in the checkpoint: it runs again
        return 0
    finally:
        progress.close()
        sink.close()
        spark.stop()


if __name__ == "__main__":
    sys.exit(main())
