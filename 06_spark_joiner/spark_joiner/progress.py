"""One readable log line per interval from Structured Streaming's query progress and the sink's counters."""
from __future__ import annotations

import logging

from pyspark.sql.streaming import StreamingQuery

from .sink import SinkCounters

log = logging.getLogger("spark_joiner.progress")


def log_progress(query: StreamingQuery, counters: SinkCounters) -> None:
    progress = query.lastProgress
    if not progress:
        log.info("waiting for the first micro-batch; joins out %d, dead letters %d", counters.joins,
                 counters.dead_letters)
        return
    state = progress.get("stateOperators") or [{}]
    log.info(
        "batch %s: %d rows in, %.0f rows/s in, %.0f rows/s processed, batch %.2f s, "
        "state %s buckets / %.1f MB; joins out %d, dead letters %d, replayed batches skipped %d",
        progress["batchId"], progress["numInputRows"], progress.get("inputRowsPerSecond") or 0.0,
        progress.get("processedRowsPerSecond") or 0.0, progress["durationMs"].get("triggerExecution", 0) / 1000,
        state[0].get("numRowsTotal", 0), state[0].get("memoryUsedBytes", 0) / 1e6,
        counters.joins, counters.dead_letters, counters.skipped_batches,
    )
