"""The Spark joiner's progress, from Structured Streaming's progress updates and the sink's counters,
reported through the shared reporter (`pipeline_core.progress`).

Spark reports each micro-batch (and, while idle, every 10 s) as a StreamingQueryProgress; the query keeps
the latest hundred. At each report the updates since the previous one give the input rows and the longest
batch, the latest one the state size and the end offsets of the last batch, which is what the checkpoint
commits. The input lag is what lies beyond those in the input partitions now: their latest offsets, asked
of the broker at the report, minus the end offsets. (The updates' own `latestOffset` is what Spark saw when
it planned the batch: a batch that takes everything then available shows no lag however long it runs.)

Spark's Kafka source reads with `failOnDataLoss=false`, so records deleted before a batch read them, a topic
deleted or its offsets going back only show as warnings in the JVM's log. The updates say it too, and
`batch_loss` counts it (see `pipeline_core.data_loss` for the standalone consumers' side).
"""
from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql.streaming import StreamingQuery
from pyspark.sql.streaming.listener import StreamingQueryProgress

from local_stream_buffer.clock import clock_fault_points, clock_fault_totals
from pipeline_core.broker_offsets import OffsetsLookup
from pipeline_core.data_loss import Partition, deleted_unread
from pipeline_core.progress import ConsumerCounters, Observation

from .sink import SinkCounters

log = logging.getLogger(__name__)

# How the shared reporter's log line names the counters here.
LABELS = {"records_in": "rows in", "records_out": "joins out"}
# How long a report waits for the broker's latest offsets; without an answer the lag is unknown.
LATEST_OFFSETS_TIMEOUT_S = 2.0


@dataclass
class SparkJoinerCounters(ConsumerCounters):
    """records in: input rows of the micro-batches; records out and dead letters: what the sink committed."""

    batches: int = 0  # micro-batches the sink committed
    skipped_batches: int = 0  # batches whose input was all committed before: they only rebuilt state


def end_offsets(update: Mapping[str, Any], which: str = "endOffset") -> dict[Partition, int] | None:
    """The end offset (or `which` offset) of the update's batch in every input partition; None when it has none."""
    ends: dict[Partition, int] = {}
    for source in update.get("sources") or []:
        end = source.get(which)
        if isinstance(end, dict):
            for topic, partitions in end.items():
                ends.update(((topic, int(partition)), int(offset)) for partition, offset in partitions.items())
    return ends or None


@dataclass(frozen=True)
class BatchLoss:
    """What a micro-batch lost outside the job's control."""

    skipped: int = 0  # records gone before they were read, or that the source went past (see batch_loss)
    offset_resets: int = 0  # partitions whose offsets went back (the topic recreated or truncated)
    topics_deleted: frozenset[str] = frozenset()  # topics gone, or whose offsets went back


def batch_loss(update: Mapping[str, Any], previous_ends: Mapping[Partition, int] | None,
               earliest_offsets: OffsetsLookup) -> BatchLoss:
    """The loss a batch's update shows against the end offsets of the batch before (None: none known).

    * A topic of the previous ends missing from the batch's ends was deleted. A partition whose end lies below
      its start (or whose start lies below the previous end) went back: the topic was recreated (or
      truncated), and Spark's source goes on from the lower of the two, past the records the new partition
      held below it (from its log start, `earliest_offsets`).
    * A start beyond the previous end skipped the records between.
    * Fewer input rows than the offset ranges hold: transaction markers and aborted records take offsets too,
      so only the records of the ranges below each partition's log start count as deleted unread, at most the
      rows missing.

    The log starts are asked of the broker only when rows are missing or offsets went back.
    """
    ends = end_offsets(update)
    if ends is None:
        return BatchLoss()
    starts = end_offsets(update, "startOffset") or {}
    previous = previous_ends or {}
    deleted = frozenset(topic for topic, _ in previous) - {topic for topic, _ in ends}
    skipped = 0
    went_back: dict[Partition, int] = {}  # partition -> the offset the source goes on from
    ranges: dict[Partition, tuple[int, int]] = {}
    for partition, end in ends.items():
        start = starts.get(partition, previous.get(partition))
        before = previous.get(partition)
        if start is None:
            continue  # a new partition: read from its start
        if end < start or (before is not None and start < before):
            went_back[partition] = min(start, end)
            continue
        if before is not None and start > before:
            skipped += start - before
        ranges[partition] = (start, end)
    rows = sum(int(source.get("numInputRows") or 0) for source in update.get("sources") or [])
    missing = sum(end - start for start, end in ranges.values()) - rows
    if missing > 0 or went_back:
        earliest = earliest_offsets([*ranges, *went_back]) or {}
        if missing > 0:
            skipped += min(missing, sum(deleted_unread(start, end, earliest[partition])
                                        for partition, (start, end) in ranges.items() if partition in earliest))
        # A recreated topic starts at 0 unless the broker says otherwise.
        skipped += sum(max(resume - earliest.get(partition, 0), 0) for partition, resume in went_back.items())
    return BatchLoss(skipped, len(went_back), deleted | {topic for topic, _ in went_back})


def input_lag(ends: Mapping[Partition, int], latest: Mapping[Partition, int]) -> int | None:
    """Records beyond the committed end offsets: latest minus end offset, summed over the partitions the
    broker answered for; None if it answered for none."""
    behind = [max(latest[partition] - end, 0) for partition, end in ends.items() if partition in latest]
    return sum(behind) if behind else None


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

    def __init__(self, counters: SparkJoinerCounters, sink: SinkCounters, latest_offsets: OffsetsLookup,
                 earliest_offsets: OffsetsLookup | None = None,
                 sink_waiting_for: Callable[[], str | None] = lambda: None) -> None:
        self.counters = counters
        self._sink_waiting_for = sink_waiting_for  # "Kafka" while the sink's transaction or producer waits for it
        self.query: StreamingQuery | None = None
        self._sink = sink
        self._latest_offsets = latest_offsets
        self._earliest_offsets = earliest_offsets or (lambda _partitions: None)
        self._seen: tuple[str, str] = ("", "")  # runId and timestamp of the latest update read
        self._latest: dict[str, int | float | None] = {}  # what the latest updates said, until newer ones do
        self._ends: dict[Partition, int] | None = None  # the last batch's end offsets
        self._ends_batch: int | None = None  # the id of that batch
        self._loss_counted: tuple[Any, Any] | None = None  # run and batch id of the last update counted
        self.query_failures = 0  # the query failed and was restarted from the checkpoint (the main loop counts)
        self._batches_seen = 0  # batches the sink had committed at the last observation
        self._failures_before = 0  # query failures before the last batch committed

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
            self._count_loss(update)
            ends = end_offsets(update)
            if ends:
                self._ends, self._ends_batch = ends, update.get("batchId")
            size = state_size(update)
            if size is not None:
                latest["state_rows"], latest["state_bytes"] = size
        counters.records_out, counters.dead_letters = sink.joins, sink.dead_letters
        counters.batches, counters.skipped_batches = sink.batches, sink.skipped_batches
        lag = None
        waiting_for = self._sink_waiting_for()
        if self._ends is not None:
            broker = self._latest_offsets(self._ends)
            lag = input_lag(self._ends, broker) if broker is not None else None
            if broker is None and waiting_for is None:
                # A broker that does not say where the input ends cannot feed the query either: the lag is
                # unknown, not zero, and the job waits for Kafka.
                waiting_for = "Kafka (the input's end offsets unanswered)"
        if counters.batches != self._batches_seen:
            self._batches_seen, self._failures_before = counters.batches, self.query_failures
        failing = self.query_failures - self._failures_before
        if failing and waiting_for is None:
            # A query that fails again and again may do so before any update tells the lag: work waits on it anyway.
            waiting_for = f"its query (failed {failing} times since its last batch)"
        return Observation(lag=lag, waiting_for=waiting_for,
                           values={"batch_id": latest.get("batch_id"), "batch_seconds": longest,
                                   "processed_rows_per_s": latest.get("processed_rows_per_s"),
                                   "state_rows": latest.get("state_rows"), "state_bytes": latest.get("state_bytes"),
                                   **clock_fault_totals(sink.clock_faults)},
                           machines=clock_fault_points(sink.clock_faults))

    def _count_loss(self, update: Mapping[str, Any]) -> None:
        """Count and log what the update's batch lost outside the job's control (see `batch_loss`)."""
        batch = (update.get("runId"), update.get("batchId"))
        if batch == self._loss_counted:
            return  # an idle update repeats the last batch
        self._loss_counted = batch
        # Only the batch right after the last one seen continues its offsets. A batch whose update never came
        # (the query failed after committing it, as a restarted query's first batch does with Spark 4.1.1's
        # Kafka source) leaves a gap between the two that is no skip.
        follows = self._ends_batch is not None and update.get("batchId") == self._ends_batch + 1
        loss = batch_loss(update, self._ends if follows else None, self._earliest_offsets)
        counters = self.counters
        counters.records_skipped += loss.skipped
        counters.offset_resets += loss.offset_resets
        counters.topics_deleted += len(loss.topics_deleted)
        if loss.topics_deleted:
            log.warning("batch %s: input topic %s was deleted (or recreated: offsets went back in %d partitions); "
                        "Spark's Kafka source goes on from its checkpoint's offsets, past what the new topic holds "
                        "below them, and what was not read of the old one is gone", update.get("batchId"),
                        ", ".join(sorted(loss.topics_deleted)), loss.offset_resets)
        if loss.skipped:
            log.warning("batch %s: %d input records skipped unread (deleted by retention, or below the checkpoint's "
                        "offsets in a recreated topic); Spark's Kafka source went on past them (failOnDataLoss=false)",
                        update.get("batchId"), loss.skipped)
