"""The joiner's transactions: one open at a time, committed with the consumed positions, retried while
the error is retriable, aborted when Kafka says so.

A transaction is batched by time (`interval_s`) or size (`max_records`), never one per join. Its offsets
go in with the consumer group metadata (`send_offsets_to_transaction`, KIP-447), so an instance whose
partitions moved cannot commit any more.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from .progress import JoinerStats

log = logging.getLogger(__name__)

KAFKA_TIMEOUT_S = 30.0
_COMMIT_ATTEMPTS = 5


class Transaction:
    """The producer's open transaction and what it carries so far."""

    def __init__(self, producer: Producer, consumer: Consumer, stats: JoinerStats, interval_s: float,
                 max_records: int) -> None:
        self._producer = producer
        self._consumer = consumer
        self._stats = stats
        self._interval_s = interval_s
        self._max_records = max_records
        self.open = False
        self.started = 0.0  # time.monotonic() of begin()
        self.records = 0  # records consumed or joined in it
        self.append_times: list[int] = []  # per output: append time of its completing record

    def begin(self) -> None:
        self._producer.begin_transaction()
        self.open = True
        self.started = time.monotonic()
        self.records = 0

    def due(self, now: float | None = None) -> bool:
        """True once the open transaction reached its interval or size."""
        if now is None:
            now = time.monotonic()
        return now - self.started >= self._interval_s or self.records >= self._max_records

    def wait_s(self, longest: float) -> float:
        """How long to wait for input: no longer than the open transaction has until it is due."""
        if not self.open:
            return longest
        return min(longest, max(self.started + self._interval_s - time.monotonic(), 0.0))

    def commit(self, offsets: list[TopicPartition]) -> bool:
        """Commit everything produced with `offsets`; False if Kafka aborted it instead (then nothing of it
        is visible, and the caller goes back to the last commit)."""
        try:
            if offsets:
                _retry(lambda: self._producer.send_offsets_to_transaction(
                    offsets, self._consumer.consumer_group_metadata(), KAFKA_TIMEOUT_S))
            _retry(lambda: self._producer.commit_transaction(KAFKA_TIMEOUT_S))
        except KafkaException as exception:
            error = exception.args[0]
            if not error.txn_requires_abort():
                raise
            log.warning("transaction aborted (%s): going back to the last commit", error)
            self.abort()
            return False
        self.open = False
        stats = self._stats
        stats.transactions += 1
        if self.append_times:
            committed_ms = time.time() * 1000
            stats.latencies_ms.extend(committed_ms - append for append in self.append_times)
            stats.records_out += len(self.append_times)
            stats.last_commit_at = time.monotonic()
            self.append_times.clear()
        return True

    def abort(self) -> None:
        """Abort the open transaction. Even if Kafka fails the abort (the producer fenced or in a fatal
        state), the transaction counts as closed: nothing may commit it afterwards (the broker aborts it)."""
        try:
            self._producer.abort_transaction(KAFKA_TIMEOUT_S)
        finally:
            self.open = False
            self.append_times.clear()
            self._stats.aborted += 1


def _retry(call: Callable[[], None]) -> None:
    for attempt in range(_COMMIT_ATTEMPTS):
        try:
            call()
            return
        except KafkaException as exception:
            if not exception.args[0].retriable() or attempt == _COMMIT_ATTEMPTS - 1:
                raise
            log.info("retrying after %s", exception.args[0])
