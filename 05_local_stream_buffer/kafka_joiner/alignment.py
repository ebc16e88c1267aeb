"""Input alignment while a backlog is caught up (input partitioned by key only).

A thing's two joined quantities usually come from two partitions. Catching up a backlog partition by
partition would run one stream far ahead of the other (partitions hold different numbers of keys), piling
up pending records until the pending limit forces them, and forcing follows arrival, which a rebuild need
not reproduce. Pausing the partitions ahead keeps both streams of a key close, like Kafka Streams picking
the partition with the oldest record. Live input is never held back: its partitions advance together,
and a partition at its end does not count.
"""
from __future__ import annotations

import time
from collections.abc import Callable

from confluent_kafka import Consumer, KafkaException, TopicPartition

_NOTHING_DELIVERED = -1  # the append time an input partition counts with before its first record
_FIRST_RECORD_WAIT_S = 5.0  # how long after an assignment a partition yet to deliver holds the others back


class InputAlignment:
    """Keeps the input partitions within `align_ms` of append time of each other while they have a backlog.

    :param positions: per input partition, the next offset to read (what was consumed).
    :param append_times: per input partition, the append time of its last consumed record.
    :param owned: the owned partitions, each with the offset it started from (-2: the beginning).
    """

    def __init__(self, consumer: Consumer, input_topic: str, align_ms: int, positions: dict[int, int],
                 append_times: dict[int, int], owned: Callable[[], list[tuple[TopicPartition, int]]]) -> None:
        self._consumer = consumer
        self._topic = input_topic
        self._align_ms = align_ms
        self._positions = positions
        self._append_times = append_times
        self._owned = owned
        self.paused: set[int] = set()
        self._assigned_at = 0.0  # time.monotonic() of the last assignment

    def assigned(self, partitions: list[TopicPartition]) -> None:
        """An assignment of `partitions` happened: partitions yet to deliver may hold the others back for a while.
        Its input partitions start unpaused: librdkafka keeps a partition's pause through its revocation, so one
        paused here before and given back would otherwise stay paused, unknown to `paused`."""
        self._assigned_at = time.monotonic()
        fresh = [TopicPartition(self._topic, p.partition) for p in partitions
                 if p.topic == self._topic and p.partition not in self.paused]
        if fresh:
            self._consumer.resume(fresh)

    def align(self) -> None:
        """Pause the input partitions too far ahead of the one furthest behind, resume the others."""
        topic = self._topic
        consumer = self._consumer
        behind: dict[int, int] = {}
        for partition, append_time in self._append_times.items():
            if partition in self.paused:
                behind[partition] = append_time
                continue
            try:
                _low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), cached=True)
            except KafkaException:
                continue
            if high > self._positions.get(partition, high):
                behind[partition] = append_time
        if time.monotonic() - self._assigned_at < _FIRST_RECORD_WAIT_S:
            behind.update(self._yet_to_deliver())
        floor = min((t for p, t in behind.items() if p not in self.paused), default=None)
        if floor is None:
            ahead: set[int] = set()
        else:
            ahead = {p for p, t in behind.items() if t > floor + self._align_ms}
        if ahead - self.paused:
            consumer.pause([TopicPartition(topic, p) for p in ahead - self.paused])
        if self.paused - ahead:
            consumer.resume([TopicPartition(topic, p) for p in self.paused - ahead])
        self.paused = ahead

    def _yet_to_deliver(self) -> dict[int, int]:
        """Right after an assignment, a partition's first fetch can come tens of thousands of records after
        the others'. While it has not delivered and its lag is unknown or positive, the others wait for it,
        as Kafka Streams waits for such a partition; for a while only, so that a partition without a leader,
        or whose last offsets are a transaction's markers, stops nothing."""
        waiting = {}
        for owned, start in self._owned():
            if owned.topic != self._topic or owned.partition in self._append_times:
                continue
            try:
                low, high = self._consumer.get_watermark_offsets(owned, cached=True)
            except KafkaException:
                continue
            if high < 0 or high > (start if start >= 0 else low):
                waiting[owned.partition] = _NOTHING_DELIVERED
        return waiting

    def paused_partitions(self) -> set[tuple[str, int]]:
        """The input partitions paused for being ahead, as (topic, partition)."""
        return {(self._topic, partition) for partition in self.paused}

    def drop(self, partition: int) -> None:
        """An input partition is no longer ours."""
        self.paused.discard(partition)

    def resume_all(self) -> None:
        """Going back to the last commit: the reloaded state starts unaligned, so nothing stays paused."""
        if self.paused:
            self._consumer.resume([TopicPartition(self._topic, p) for p in self.paused])
        self.paused = set()

