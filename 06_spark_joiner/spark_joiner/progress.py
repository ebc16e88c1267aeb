"""The Spark joiner's progress, from Structured Streaming's progress updates and the sink's counters,
reported through the shared reporter (`pipeline_core.progress`).

Spark reports each micro-batch (and, while idle, every 10 s) as a StreamingQueryProgress; the query keeps
the latest hundred. At each report the updates since the previous one give the input rows, the longest
batch, and, from the latest, the state size and the input lag: per Kafka partition the latest offset Spark
saw minus the end offset of the last batch (what its checkpoint commits), summed.
"""
from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql.streaming import StreamingQuery
from pyspark.sql.streaming.listener import StreamingQueryProgress

from pipeline_core.progress import Observation, StageCounters

from .sink import SinkCounters

# How the shared reporter's log line names the counters here.
LABELS = {"records_in": "rows in", "records_out": "joins out"}


@dataclass
class SparkJoinerCounters(StageCounters):
    """records in: input rows of the micro-batches; records out and dead letters: what the sink committed."""

    batches: int = 0  # micro-batches the sink committed
    skipped_batches: int = 0  # replayed batch ids it had committed before a restart


def input_lag(update: Mapping[str, Any]) -> int | None:
    """Records in the input partitions beyond the update's batch: latest minus end offset, summed."""
    lag, known = 0, False
    for source in update.get("sources") or []:
        latest, end = source.get("latestOffset"), source.get("endOffset")
        if not isinstance(latest, dict) or not isinstance(end, dict):
            continue
        for topic, partitions in latest.items():
            ends = end.get(topic) or {}
            for partition, offset in partitions.items():
                if partition in ends:
                    lag += max(int(offset) - int(ends[partition]), 0)
                    known = True
    return lag if known else None


def state_size(update: Mapping[str, Any]) -> tuple[int, int] | None:
    """Rows and bytes of memory in the state store, over every stateful operator; None without any."""
    operators = update.get("stateOperators") or []
    if not operators:
        return None
    return (sum(int(operator.get("numRowsTotal") or 0) for operator in operators),
            sum(int(operator.get("memoryUsedBytes") or 0) for operator in operators))


def batch_seconds(update: Mapping[str, Any]) -> float | None:
    """How long the update's micro-batch took, trigger to commit."""
    milliseconds = (update.get("durationMs") or {}).get("triggerExecution")
    return milliseconds / 1000 if milliseconds is not None else None


class QueryProgress:
    """The progress of the running query (`query`, replaced on a restart) as the reporter's observation."""

    def __init__(self, counters: SparkJoinerCounters, sink: SinkCounters) -> None:
        self.counters = counters
        self.query: StreamingQuery | None = None
        self._sink = sink
        self._seen: tuple[str, str] = ("", "")  # runId and timestamp of the latest update read
        self._latest: dict[str, int | float | None] = {}  # what the latest updates said, until newer ones do

    def observe(self) -> Observation:
        updates = self.new_updates(self.query.recentProgress if self.query is not None else [])
        return self.observation(updates)

    def new_updates(self, recent: Sequence[Any]) -> list[dict[str, Any]]:
        """The updates after the latest one read before, as plain JSON (a restarted query is a new run)."""
        run, since = self._seen
        fresh = [update for update in recent if update["runId"] != run or update["timestamp"] > since]
        if fresh:
            self._seen = (fresh[-1]["runId"], fresh[-1]["timestamp"])
        # The JSON keeps the sources' offsets as objects; the Python progress objects turn them into text.
        return [json.loads(update.json) if isinstance(update, StreamingQueryProgress) else dict(update)
                for update in fresh]

    def observation(self, updates: Iterable[Mapping[str, Any]]) -> Observation:
        """Counters and gauges from the new `updates` (oldest first) and the sink's counters."""
        counters, sink, latest = self.counters, self._sink, self._latest
        longest = None
        for update in updates:
            counters.records_in += int(update.get("numInputRows") or 0)
            seconds = batch_seconds(update)
            if seconds is not None and update.get("numInputRows"):
                longest = max(longest or 0.0, seconds)
                latest["processed_rows_per_s"] = float(update.get("processedRowsPerSecond") or 0.0)
            latest["batch_id"] = update.get("batchId")
            lag = input_lag(update)
            if lag is not None:
                latest["lag"] = lag
            size = state_size(update)
            if size is not None:
                latest["state_rows"], latest["state_bytes"] = size
        counters.records_out, counters.dead_letters = sink.joins, sink.dead_letters
        counters.batches, counters.skipped_batches = sink.batches, sink.skipped_batches
        lag = latest.get("lag")
        return Observation(lag=int(lag) if lag is not None else None,
                           values={"batch_id": latest.get("batch_id"), "batch_seconds": longest,
                                   "processed_rows_per_s": latest.get("processed_rows_per_s"),
                                   "state_rows": latest.get("state_rows"), "state_bytes": latest.get("state_bytes")})
