"""The Spark joiner's progress, from Structured Streaming's progress updates and the sink's counters,
reported through the shared reporter (`pipeline_core.progress`).

Spark reports each micro-batch (and, while idle, every 10 s) as a StreamingQueryProgress; the query keeps
the latest hundred. At each report the updates since the previous one give the input rows and the longest
batch, the latest one the state size and the end offsets of the last batch, which is what the checkpoint
commits. The input lag is what lies beyond those in the input partitions now: their latest offsets, asked
of the broker at the report, minus the end offsets. (The updates' own `latestOffset` is what Spark saw when
it planned the batch: a batch that takes everything then available shows no lag however long it runs.)
"""
from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import IsolationLevel, KafkaException, TopicPartition
from confluent_kafka.admin import OffsetSpec
from pyspark.sql.streaming import StreamingQuery
from pyspark.sql.streaming.listener import StreamingQueryProgress

from pipeline_core.kafka_clients import admin_client
from pipeline_core.progress import Observation, StageCounters

from .sink import SinkCounters

log = logging.getLogger(__name__)

# How the shared reporter's log line names the counters here.
LABELS = {"records_in": "rows in", "records_out": "joins out"}
# How long a report waits for the broker's latest offsets; without an answer the lag is unknown.
LATEST_OFFSETS_TIMEOUT_S = 2.0

Partition = tuple[str, int]
# Asks for the latest offsets of these partitions; None when the broker does not answer.
LatestOffsets = Callable[[Iterable[Partition]], dict[Partition, int] | None]


@dataclass
class SparkJoinerCounters(StageCounters):
    """records in: input rows of the micro-batches; records out and dead letters: what the sink committed."""

    batches: int = 0  # micro-batches the sink committed
    skipped_batches: int = 0  # batches whose input was all committed before: they only rebuilt state


def end_offsets(update: Mapping[str, Any]) -> dict[Partition, int] | None:
    """The end offset of the update's batch in every input partition; None when it has none (yet)."""
    ends: dict[Partition, int] = {}
    for source in update.get("sources") or []:
        end = source.get("endOffset")
        if isinstance(end, dict):
            for topic, partitions in end.items():
                ends.update(((topic, int(partition)), int(offset)) for partition, offset in partitions.items())
    return ends or None


def input_lag(ends: Mapping[Partition, int], latest: Mapping[Partition, int]) -> int | None:
    """Records beyond the committed end offsets: latest minus end offset, summed over the partitions the
    broker answered for; None if it answered for none."""
    behind = [max(latest[partition] - end, 0) for partition, end in ends.items() if partition in latest]
    return sum(behind) if behind else None


class BrokerOffsets:
    """The latest offsets of input partitions, as a read_committed reader sees them, in one request."""

    def __init__(self, bootstrap_servers: str, timeout_s: float = LATEST_OFFSETS_TIMEOUT_S) -> None:
        self._admin = admin_client(bootstrap_servers)
        self._timeout_s = timeout_s

    def __call__(self, partitions: Iterable[Partition]) -> dict[Partition, int] | None:
        wanted = {TopicPartition(topic, partition): OffsetSpec.latest() for topic, partition in partitions}
        if not wanted:
            return None
        latest: dict[Partition, int] = {}
        try:
            futures = self._admin.list_offsets(wanted, isolation_level=IsolationLevel.READ_COMMITTED,
                                               request_timeout=self._timeout_s)
            for position, future in futures.items():
                latest[(position.topic, position.partition)] = future.result().offset
        except KafkaException as error:
            log.warning("input lag unknown: the broker did not give the latest offsets (%s)", error.args[0])
            return None
        return latest


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

    def __init__(self, counters: SparkJoinerCounters, sink: SinkCounters, latest_offsets: LatestOffsets) -> None:
        self.counters = counters
        self.query: StreamingQuery | None = None
        self._sink = sink
        self._latest_offsets = latest_offsets
        self._seen: tuple[str, str] = ("", "")  # runId and timestamp of the latest update read
        self._latest: dict[str, int | float | None] = {}  # what the latest updates said, until newer ones do
        self._ends: dict[Partition, int] | None = None  # the last batch's end offsets

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
            self._ends = end_offsets(update) or self._ends
            size = state_size(update)
            if size is not None:
                latest["state_rows"], latest["state_bytes"] = size
        counters.records_out, counters.dead_letters = sink.joins, sink.dead_letters
        counters.batches, counters.skipped_batches = sink.batches, sink.skipped_batches
        lag = None
        if self._ends is not None:
            broker = self._latest_offsets(self._ends)
            lag = input_lag(self._ends, broker) if broker is not None else None
        return Observation(lag=lag,
                           values={"batch_id": latest.get("batch_id"), "batch_seconds": longest,
                                   "processed_rows_per_s": latest.get("processed_rows_per_s"),
                                   "state_rows": latest.get("state_rows"), "state_bytes": latest.get("state_bytes")})
