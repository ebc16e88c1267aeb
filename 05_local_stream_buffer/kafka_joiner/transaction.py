"""The joiner's transactions: one open at a time, committed with the consumed positions.

A transaction is batched by time (`interval_s`) or size (`max_records`), never one per join. Its offsets
go in with the consumer group metadata (`send_offsets_to_transaction`, KIP-447), so an instance whose
partitions moved cannot commit any more.

Every transactional call goes through the pipeline's one transactional call policy
(`pipeline_core.transactional`): bounded, a retriable answer asked again for as long as Kafka is away (the
heartbeat says the joiner waits for it) unless the joiner is stopping. One that requires an abort aborts, and
a fatal one (the producer fenced), a call that outlived its bound or an abort that failed replace the producer:
a new producer with the same transactional id fences the old one and aborts its open transaction, so nothing
of it ever commits; the caller goes back to the last commit either way.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from pipeline_core.kafka_clients import TRANSACTIONAL_CALL_TIMEOUT_S, KafkaCallWedged
from pipeline_core.transactional import TransactionalProducer

from .progress import JoinerStats

log = logging.getLogger(__name__)

KAFKA_TIMEOUT_S = TRANSACTIONAL_CALL_TIMEOUT_S
# Longest pause between two attempts of a call Kafka answered with a retriable error at once: the joiner asks
# again for as long as Kafka stays away, so this bounds how late it notices Kafka back.
_MAX_RETRY_PAUSE_S = 0.5


class Transaction:
    """The producer and its open transaction, and what it carries so far.

    :param new_producer: a transactional producer of this instance's transactional id (a replacement too).
    :param while_waiting: called while a call waits and between attempts (the progress report).
    """

    def __init__(self, new_producer: Callable[[], Producer], consumer: Consumer, stats: JoinerStats,
                 interval_s: float, max_records: int, while_waiting: Callable[[], object] | None = None,
                 stopping: Callable[[], bool] = lambda: False) -> None:
        self._kafka = TransactionalProducer(new_producer, call_timeout_s=KAFKA_TIMEOUT_S,
                                            max_retry_pause_s=_MAX_RETRY_PAUSE_S, while_waiting=while_waiting)
        self._consumer = consumer
        self._stats = stats
        self._interval_s = interval_s
        self._max_records = max_records
        self._stopping = stopping
        self.open = False
        self.started = 0.0  # time.monotonic() of begin()
        self.records = 0  # records consumed or joined in it
        self.append_times: list[int] = []  # per output: append time of its completing record

    @property
    def producer(self) -> Producer:
        return self._kafka.producer

    @property
    def waiting_for(self) -> str | None:
        """"Kafka" while a transactional call goes unanswered or a commit keeps failing."""
        return self._kafka.waiting_for

    def initialise(self, timeout_s: float = KAFKA_TIMEOUT_S) -> None:
        """`init_transactions` (one bounded attempt): aborts the open transaction of an earlier producer with this
        transactional id and fences it."""
        self._kafka.call(lambda producer: producer.init_transactions(timeout_s), "init_transactions", timeout_s)

    def begin(self) -> None:
        self.producer.begin_transaction()
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
        """Commit everything produced with `offsets`; False if it was aborted instead (then nothing of it
        is visible, and the caller goes back to the last commit)."""
        try:
            if offsets:
                metadata = self._consumer.consumer_group_metadata()
                self._kafka.until_done(
                    lambda producer: producer.send_offsets_to_transaction(offsets, metadata, KAFKA_TIMEOUT_S),
                    "send_offsets_to_transaction", stopping=self._stopping)
            self._kafka.until_done(lambda producer: producer.commit_transaction(KAFKA_TIMEOUT_S), "commit_transaction",
                                   stopping=self._stopping)
        except KafkaException as exception:
            error = exception.args[0]
            if error.txn_requires_abort():
                log.warning("transaction aborted (%s): going back to the last commit", error)
                self.abort()
            else:
                self._replace_producer(str(error))
            return False
        except KafkaCallWedged as wedged:
            self._replace_producer(str(wedged))
            return False
        finally:
            self._kafka.waiting_for = None
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

    def abort(self, replace_on_failure: bool = True) -> None:
        """Abort the open transaction. Should Kafka fail the abort (the producer fenced, in a fatal state, or
        its call wedged), the producer is replaced, which aborts it as well: either way nothing of it commits.
        Without `replace_on_failure` (the joiner exits) the failure is raised: the broker aborts the transaction
        after its timeout, and a restart with this transactional id at once."""
        try:
            self._kafka.call(lambda producer: producer.abort_transaction(KAFKA_TIMEOUT_S), "abort_transaction")
        except (KafkaException, KafkaCallWedged) as error:
            if not replace_on_failure:
                self._closed()
                raise
            self._replace_producer(f"the abort failed: {error}")
            return
        finally:
            self._kafka.waiting_for = None
        self._closed()

    def abort_on_exit(self) -> None:
        """Abort the open transaction as the joiner exits after a failure: outputs and state changes of records whose
        positions were not yet counted would commit with stale offsets, and on restart those records would meet their
        own state again (out_of_order dead letters)."""
        try:
            self.abort(replace_on_failure=False)
        except (KafkaException, KafkaCallWedged) as error:
            # Fenced, the broker gone, or the abort refused (INVALID_TXN_STATE right after a produce, librdkafka
            # issue 4849): the broker aborts the transaction itself (at once when this instance id restarts, else
            # after the transaction timeout); nothing of it ever commits.
            log.warning("could not abort the open transaction after a failure: %s", error)

    def _closed(self) -> None:
        self.open = False
        self.append_times.clear()
        self._stats.aborted += 1

    def _replace_producer(self, why: str) -> None:
        """A new producer with this transactional id: its `init_transactions` fences the current one and
        aborts the open transaction. The old one is dropped on a thread of its own: a call of it may still
        wait, and destroying a client waits for its broker threads."""
        self._closed()
        if self._stopping():
            # No new producer to stop with: the broker aborts the transaction after its timeout, and a restart
            # with this transactional id at once.
            log.warning("stopping with the transaction unfinished (%s): nothing of it commits", why)
            return
        log.warning("replacing the transactional producer (%s): the new one aborts the open transaction and "
                    "fences the old one; going back to the last commit", why)
        self._stats.producers_replaced += 1
        self._kafka.renew(lambda: self._kafka.until_done(
            lambda producer: producer.init_transactions(KAFKA_TIMEOUT_S), "init_transactions", stopping=self._stopping))

